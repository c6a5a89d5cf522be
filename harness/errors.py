"""The one error path of bench, bench-compare and bench-report: one line on stderr, exit code 2.

`UserError` is what kvbench raises for bad input. `one_line(err)` turns it, or an error of the
file system (missing, unreadable, read-only, full, a file where a directory should be) or of a
file's contents, into the line a person at the terminal reads; `exit_with(err)` prints it and
exits 2; `guarded_stdout` keeps a console closed early from costing more than the console.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import errno
import os
import sys
from typing import NoReturn

EXIT_BAD_INPUT = 2
EXIT_CRASHED = 1  # what Python itself exits with on an uncaught exception
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """Something the person at the terminal asked for is wrong; the message says what is allowed."""


# file errors a user can fix, with what to do about them
FILE_ADVICE = {
    errno.ENOSPC: "the disk is full; free space and re-run (finished points are kept)",
    errno.EDQUOT: "the disk quota is exceeded; free space and re-run (finished points are kept)",
    errno.EROFS: "the file system is read-only; choose another directory (hydra.run.dir / hydra.sweep.dir)",
    errno.EACCES: "permission denied; choose a directory you can write (hydra.run.dir / hydra.sweep.dir)",
    errno.EPERM: "permission denied; choose a directory you can write (hydra.run.dir / hydra.sweep.dir)",
    errno.ENOTDIR: "a file is where a directory should be",
    errno.EEXIST: "a file is where a directory should be",
    errno.EISDIR: "a directory is where a file should be",
    errno.ENOENT: "it does not exist",
    errno.EPIPE: "the output was closed early (a pipe)",
}
CONTENT_ERRORS = (csv.Error, UnicodeDecodeError)


def one_line(err: BaseException) -> str:
    """The message of an error kvbench reports without a traceback, on a single line."""
    if isinstance(err, OSError):
        where = err.filename or "a results file"
        advice = FILE_ADVICE.get(err.errno, err.strerror or str(err))
        text = f"cannot use {where}: {advice}"
    elif isinstance(err, UnicodeDecodeError):
        text = f"a file is not UTF-8 text (byte {err.start}); give a CSV, YAML or JSON file"
    else:
        text = str(err) or type(err).__name__
    return " ".join(text.split())


def exit_with(err: BaseException) -> NoReturn:
    """Print `error: ...` on a line of its own (after any progress bar) and exit 2."""
    _leave(f"error: {one_line(err)}", EXIT_BAD_INPUT)


def exit_crashed(line: str) -> NoReturn:
    """A bug, its traceback logged already: `error: ...` on a line of its own, and exit 1."""
    _leave(f"error: {line}", EXIT_CRASHED)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a scheduler's time limit, a closed terminal), raised where the process
    is, so that it ends as Ctrl-C does: temporary files removed, finished points kept, one line."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def end_on_termination() -> None:
    """SIGTERM and SIGHUP raise Terminated in the main thread (their default kills the process
    where it stands: a sweep's half-written spool left behind, no line said)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def terminate(signum, frame):
        signal.signal(signum, signal.SIG_IGN)  # a second one must not cut the cleanup short
        raise Terminated(signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:  # one a caller set stays its own
            signal.signal(signum, terminate)


def exit_interrupted(kept: str, err: BaseException | None = None) -> NoReturn:
    """Ctrl-C: one line saying what was kept, and exit 130 (128 + SIGINT, as a shell reports it);
    SIGTERM or SIGHUP (`err` a Terminated): the same, exit 128 + its number."""
    if isinstance(err, Terminated):
        import signal

        _leave(f"terminated by {signal.Signals(err.signum).name}: {kept}", 128 + err.signum)
    _leave(f"interrupted: {kept}", EXIT_INTERRUPTED)


def _leave(line: str, code: int) -> NoReturn:
    _close_progress_bars()
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)
    sys.exit(code)


def _close_progress_bars() -> None:
    """A bar left open by an interrupted loop would have the error line glued to its end."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None:
        for bar in list(getattr(tqdm.tqdm, "_instances", ())):
            bar.close()


class GuardedStdout:
    """sys.stdout that outlives its reader: a console closed early (`bench -m ... | head -1`) or
    a full device (`> /dev/full`) drops the rest of the console output, with one line on stderr
    that says so, instead of raising from whatever printed or logged next (a sweep's summary
    callback: its error was swallowed, so a sweep with a failed point exited 0). The run's
    files and its exit code are what they would have been."""

    def __init__(self, stream, say: bool = True):
        self._stream = stream
        self.say = say  # stderr's own loss is said nowhere
        self.lost: OSError | None = None

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                return self._stream.write(text)
            except OSError as err:
                self._lose(err)
        return len(text)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self._stream.flush()
            except OSError as err:
                self._lose(err)

    def _lose(self, err: OSError) -> None:
        self.lost = err
        with contextlib.suppress(OSError, ValueError, AttributeError):  # what is still buffered goes nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        if not self.say:
            return
        why = "was closed early (a pipe)" if err.errno == errno.EPIPE else f"cannot be written ({err.strerror})"
        print(
            f"note: the standard output {why}: the rest of the console output is dropped "
            f"(files written and the exit code are not affected)",
            file=sys.stderr,
            flush=True,
        )

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout():
    """A command's console, stdout and stderr, as GuardedStdout for as long as it runs (a
    context manager, or a decorator of the command's main): with
    `2>&1 | head -1` the error line of a failed sweep went to the closed pipe too, and its
    BrokenPipeError became a warning and exit 0."""
    if isinstance(sys.stdout, GuardedStdout) or sys.stdout is None or sys.stderr is None:
        yield
        return
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = GuardedStdout(before[0]), GuardedStdout(before[1], say=False)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, GuardedStdout):
                stream.flush()
        if isinstance(sys.stdout, GuardedStdout):
            sys.stdout = before[0]
        if isinstance(sys.stderr, GuardedStdout):
            sys.stderr = before[1]


def reportable(err: BaseException) -> bool:
    return isinstance(err, (UserError, OSError, *CONTENT_ERRORS))


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (`error: PROG: ...`) with exit code 2, and
    which knows kvbench's --version."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from kvbench import __version__

        self.add_argument("--version", action="version", version=f"kvbench {__version__}")

    def error(self, message: str):
        exit_with(UserError(f"{self.prog}: {message} (see {self.prog} --help)"))
