"""The helper process `bench` starts (kvbench.launch): the end of a run, with its imports
loaded while the run goes on, and a single run's requests.jsonl written on the other core.

    python -m kvbench.reporting.helper run|sweep

It imports what its kind of job needs (`run`: matplotlib, for a single run's figure; `sweep`:
pandas and matplotlib and the report, for a sweep's end) while it reads its messages, JSON
lines on stdin, as they come:
    {"job": "requests", "spool": SPOOL, "out": FILE}  follow a run's request spool into FILE
    {"job": "requests_end", "size": BYTES}            -> {"written": N requests, "itl": their gaps'
                                                         statistics}, once FILE is whole
    {"job": "run", "rows": [...], "out": DIR}         -> {"written": [the figure files]}
    {"job": "sweep", "dir": DIR, "plots": BOOL}       -> report.end_of_sweep's result
and prints each answer as a JSON line on stdout. The `run` or `sweep` job is its last; an
empty stdin (the run ended without one) ends it, and a spool the run never ended is dropped
(the run deletes both files). A job that fails ends it with the error on stderr and exit code 1,
and the run then does the job itself; a spool it could not follow answers {"error": ...}, and
the run converts it itself (kvbench.core.request_log). It leaves without the interpreter's
teardown, which would only add to the run's wait.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import warnings
from pathlib import Path


class _Spool:
    """A request spool followed on a thread until the run says how long it is."""

    def __init__(self, spool: str, out: str):
        from kvbench.core.request_log import follow_spool

        self.size: int | None = None
        self.dropped = False
        self.answer: dict = {}
        self._thread = threading.Thread(target=self._follow, args=(follow_spool, spool, out), daemon=True)
        self._thread.start()

    def _follow(self, follow_spool, spool: str, out: str) -> None:
        try:
            # the lines written and the run's inter-token latencies counted here (SpooledRequestLog)
            answer = follow_spool(spool, out, lambda: self.size, lambda: self.dropped)
            if answer is not None:  # here, on this core: freeing a large file takes milliseconds
                with contextlib.suppress(OSError):
                    os.unlink(spool)
            self.answer = answer or {"written": None}
        except Exception as err:  # noqa: BLE001 (any failure: the run converts the spool itself)
            self.answer = {"error": f"{type(err).__name__}: {err}"}

    def end(self, size: int) -> dict:
        self.size = size
        self._thread.join()
        return self.answer


def _read_messages(jobs: queue.SimpleQueue, answer) -> None:
    """Handle the request spool's messages as they come; queue the last job (None at the end).
    A message it cannot read ends the helper (exit 1, the reason on stderr): the run does its job."""
    try:
        _read(jobs, answer)
    except Exception as err:  # noqa: BLE001 (any malformed message: the process must not wait for ever)
        print(f"helper: a message it cannot read ({type(err).__name__}: {err})", file=sys.stderr, flush=True)
        os._exit(1)


def _read(jobs: queue.SimpleQueue, answer) -> None:
    spool = None
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("job") not in JOBS:
            raise ValueError(f"job {message.get('job')!r} is none of {', '.join(JOBS)}")
        if message["job"] == "requests":
            spool = _Spool(message["spool"], message["out"])
        elif message["job"] == "requests_end":
            answer(spool.end(message["size"]) if spool is not None else {"error": "no spool to end"})
            spool = None
        else:
            jobs.put(message)
            break
    else:
        jobs.put(None)  # stdin ended without a job
    if spool is not None:
        spool.dropped = True


JOBS = ("requests", "requests_end", "run", "sweep")


def main(kind: str) -> None:
    lock = threading.Lock()

    def answer(done: dict) -> None:
        with lock:
            print(json.dumps(done), flush=True)

    jobs: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read_messages, args=(jobs, answer), daemon=True).start()
    # matplotlib.projections imports mpl_toolkits.mplot3d to register the 3-D projection, which
    # no kvbench figure uses: marked absent in this process, it is skipped (0.035 s of the
    # helper's 0.55 s of imports; matplotlib warns that 3-D is not available, silenced here)
    sys.modules.setdefault("mpl_toolkits.mplot3d", None)
    warnings.filterwarnings("ignore", "Unable to import Axes3D")
    import matplotlib.backends.backend_agg  # noqa: F401 (matplotlib and the canvas figures.subplots draws on)
    import matplotlib.figure  # noqa: F401

    if kind == "sweep":
        import kvbench.reporting.report  # noqa: F401 (pandas, the plots, the verdict)
    else:
        import kvbench.reporting.run_figure  # noqa: F401 (the figure's module and the results' helpers)
    job = jobs.get()
    if job is not None:
        if job["job"] == "run":
            from kvbench.reporting.run_figure import draw_run

            done = {"written": [str(path) for path in draw_run(job["rows"], Path(job["out"]))]}
        else:
            from kvbench.reporting.report import end_of_sweep

            done = end_of_sweep(Path(job["dir"]), job["plots"])
        answer(done)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) > 2 or sys.argv[1:2] not in ([], ["run"], ["sweep"]):
        print(
            "usage: python -m kvbench.reporting.helper run|sweep  (bench starts it; JSON lines on stdin)",
            file=sys.stderr,
        )
        sys.exit(2)
    main(sys.argv[1] if len(sys.argv) > 1 else "run")
