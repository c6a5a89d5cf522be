"""The helper process `bench` starts (kvbench.launch): the end of a run, with its imports
loaded while the run goes on.

    python -m kvbench.reporting.helper run|sweep

It imports what its kind of job needs (`run`: matplotlib, for a single run's figure; `sweep`:
pandas and matplotlib and the report, for a sweep's end), then reads one job, JSON on stdin:
    {"job": "run", "rows": [...], "out": DIR}      -> {"written": [the figure files]}
    {"job": "sweep", "dir": DIR, "plots": BOOL}    -> report.end_of_sweep's result
and prints the result as JSON on stdout. An empty stdin (the run ended without a job) ends it;
a job that fails ends it with the error on stderr and exit code 1, and the run then does the job
itself. It leaves without the interpreter's teardown, which would only add to the run's wait.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(kind: str) -> None:
    from kvbench.reporting.figures import pyplot

    pyplot()
    if kind == "sweep":
        import kvbench.reporting.report  # noqa: F401 (pandas, the plots, the verdict)
    job = sys.stdin.read()
    if job:
        job = json.loads(job)
        if job["job"] == "run":
            from kvbench.reporting.run_figure import draw_run

            done = {"written": [str(path) for path in draw_run(job["rows"], Path(job["out"]))]}
        else:
            from kvbench.reporting.report import end_of_sweep

            done = end_of_sweep(Path(job["dir"]), job["plots"])
        print(json.dumps(done))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "run")
