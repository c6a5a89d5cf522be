"""A slower real engine without editing it, for the gate's own tests: with this folder first on
PYTHONPATH and KVBENCH_TEST_SLOWDOWN=F set, every ModelExecutor.execute takes (1 + F) times as
long (tests/slowdown.py), from the moment the interpreter starts.

    bench-compare --against main --current-env PYTHONPATH=tests/slowdown_site \\
        --current-env KVBENCH_TEST_SLOWDOWN=0.4 scenario=serve model=tiny ...
"""

import os
import sys
from pathlib import Path

factor = float(os.environ.get("KVBENCH_TEST_SLOWDOWN", "0") or 0)
if factor:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from slowdown import slowed

    from kvbench.executors.model_executor import ModelExecutor

    ModelExecutor.execute = slowed(ModelExecutor.execute, factor)
    sys.stderr.write(f"sitecustomize: ModelExecutor.execute slowed by {factor:.0%}\n")
