"""The `bench` command's entry point: kvbench.cli.main, with a helper process started first.

What a run does last needs the slow imports: a single run draws its figure (matplotlib, about
half a second, as long as a short simulated run), a sweep's end writes summary.csv, its plots
and report.html and prints its table (pandas and matplotlib, about a second). So before it
imports Hydra, `bench` starts a helper (`python -m kvbench.reporting.helper run|sweep`) that
loads them on the other core while Hydra composes and the points run. At the end the run sends
it the job (JSON on its stdin: a run's rows and folder, or the sweep's folder) and waits for the
result (JSON on its stdout: the files written, a sweep's table and failed points), so everything
is there when `bench` returns, as it was when the run did it itself.

The config is not composed yet, so the command line decides: no helper for help or a printed
config, nor for a single run that sets `plots` to anything but true; and none on a single core,
where the helper's imports would wait for the run's. A helper the run does not use is stopped
when `bench` ends. The run does the job itself wherever there is no helper, or the helper
failed (it could not start, died, or answered anything but a result whose files exist): a job
that fails in the helper fails again in the run, with the run's own error. kvbench.cli.main
called in-process (the tests) does everything itself. After a single run that succeeded,
`bench` ends without the interpreter's teardown (`leave`). docs/design.md has the measurements.
"""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("kvbench")
# Hydra's flags after which `bench` runs nothing
RUNS_NOTHING = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "--version"}
RUNS_NOTHING_PREFIXES = ("--cfg=", "--info=", "--shell-completion", "-sc")
SWEEP_FLAGS = {"-m", "--multirun"}

_helper: Helper | None = None  # the helper of this process's `bench`, until its job is done


def helper_kind(args: list[str]) -> str | None:
    """The helper `bench ARGS` wants, as far as its command line says: `sweep`, `run` or none."""
    if any(arg in RUNS_NOTHING or arg.startswith(RUNS_NOTHING_PREFIXES) for arg in args):
        return None
    if any(arg in SWEEP_FLAGS for arg in args):
        return "sweep"  # its end writes summary.csv and report.html, plots or not
    for arg in args:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "plots" and value.strip().lower() != "true":
            return None  # a single run that draws nothing
    return "run"


class Helper:
    """The helper process, loading its imports from the start: `send` hands it the job,
    `result` waits for what it did, `close` stops it. Before the job, a single run's request
    log (kvbench.core.request_log) may `tell` it to follow a spool and `ask` it to finish.
    Messages are JSON lines on its stdin; each answer is a JSON line on its stdout."""

    def __init__(self, kind: str):
        import tempfile

        self.kind = kind
        # its errors go to a file: a pipe nobody reads while the run goes on could fill and stall it
        self._errors = tempfile.TemporaryFile("w+")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "kvbench.reporting.helper", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
        )
        self.sent = False

    def tell(self, message: dict) -> bool:
        """Hand the helper a message before its job; False where it could not take it."""
        import json

        try:
            self._process.stdin.write(json.dumps(message) + "\n")
            self._process.stdin.flush()
        except (OSError, ValueError) as err:  # a helper that died
            log.debug("the helper took no message (%s)", err)
            return False
        return True

    def ask(self, message: dict, timeout_s: float) -> dict | None:
        """`tell` it `message` and wait up to `timeout_s` for its answer; None where it gave none."""
        import json
        import select

        if not self.tell(message):
            return None
        try:
            ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
            answer = json.loads(self._process.stdout.readline()) if ready else None
        except (OSError, ValueError) as err:  # it died before it answered
            log.debug("the helper gave no answer (%s)", err)
            return None
        if answer is None:
            log.debug("the helper gave no answer in %.0f s", timeout_s)
        return answer

    def send(self, job: dict) -> None:
        """Hand the helper its one job; it works on it while the run goes on."""
        import json

        self.sent = True
        try:
            self._process.stdin.write(json.dumps(job, default=_plain) + "\n")
            self._process.stdin.close()
        except (OSError, ValueError, TypeError) as err:  # a helper that died, a row JSON cannot hold
            log.debug("the helper took no job (%s)", err)
        self._process.stdin = None  # closed: communicate() must not flush it

    def result(self) -> dict | None:
        """What the helper did with the job sent, once it is done; None where it failed."""
        import json

        try:
            said, _ = self._process.communicate()
            done = json.loads(said) if self._process.returncode == 0 else None
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            done = None
            self._errors.write(str(err))
        if isinstance(done, dict) and all(Path(path).is_file() for path in done.get("written", ())):
            return done
        self.close()
        self._errors.seek(0)
        errors = self._errors.read().strip().splitlines() or ["?"]
        log.debug("the helper failed (%s); the run does its job itself", errors[-1])
        return None

    def close(self) -> None:
        """Stop the helper if it is still there (a run that ended without handing it its job)."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()


def _plain(value):
    """JSON for what a row may hold besides str, int, float and None (numpy scalars, paths)."""
    return value.item() if hasattr(value, "item") else str(value)


def current() -> Helper | None:
    """The helper of this process's `bench`, while its job is not yet handed over."""
    return _helper if _helper is not None and not _helper.sent else None


def run_helper() -> Helper | None:
    """The helper of this process's single run (`bench` without -m), while it has no job yet."""
    helper = current()
    return helper if helper is not None and helper.kind == "run" else None


def helper_does(job: dict) -> dict | None:
    """`job` done by the helper, where there is one and it did it; else None (do it yourself)."""
    helper = current()
    if helper is None:
        return None
    helper.send(job)
    return helper.result()


def usable_cpus() -> int:
    """The cores this process may run on: on one, a helper only adds its start (0.1 s, measured)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def main() -> None:
    global _helper
    # Start-up makes objects that live to the end (modules, the config): collect young objects
    # every 10,000 allocations, not 700 (its collections: 0.036 -> 0.028 s; engine.few_collections)
    gc.set_threshold(10_000, *gc.get_threshold()[1:])
    # numpy's OpenBLAS starts a thread per core when it is imported, and they spin a while: 0.12 s
    # of CPU per process here, taken from the other process on two cores (a 10-request run's wall
    # time 1.04 -> 0.94 s, median of 8 alternating runs). kvbench's numpy work calls nothing that
    # BLAS threads would speed up (vector arithmetic, fits of a few columns); torch has its own
    # (MKL, OpenMP) and does not read this. Set before anything imports numpy, the helper
    # inherits it; a value the user set stands.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    kind = helper_kind(sys.argv[1:]) if usable_cpus() > 1 else None
    try:
        _helper = Helper(kind) if kind else None
    except OSError as err:  # no process to be had: the run does everything itself
        log.debug("no helper (%s)", err)
    from kvbench import cli
    from kvbench.errors import end_on_termination

    end_on_termination()  # SIGTERM / SIGHUP end the run as Ctrl-C does, not where it stands
    try:
        cli.main()
    finally:
        if _helper is not None:
            _helper.close()
            _helper = None
    if cli.single_run_done:
        leave()


def leave() -> None:
    """End `bench` after a single run that succeeded, without the interpreter's teardown (its
    modules' and objects' clean-up: 0.05-0.09 s here, a tenth of a short run). Everything the
    run wrote is closed by then; the logs and the console are flushed here. Not where torch was
    loaded (serve, kernel, profile: its worker pools shut down at exit), nor after a sweep (a
    launcher's workers do too) or an error, which exit as usual."""
    if "torch" in sys.modules:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":  # python -m kvbench.launch: the module cli imports holds the helper
    from kvbench.launch import main as bench

    bench()
