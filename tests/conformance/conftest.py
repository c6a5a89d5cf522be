"""The conformance harness lives in scripts/vllm_conformance.py (it is also a command); the tests
import it from there."""

import sys
from pathlib import Path

SCRIPTS = str(Path(__file__).resolve().parents[2] / "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)
