"""The one error path of bench, bench-compare and bench-report: one line on stderr, exit code 2.

`UserError` is what kvbench raises for bad input. `one_line(err)` turns it, or an error of the
file system (missing, unreadable, read-only, full, a file where a directory should be) or of a
file's contents, into the line a person at the terminal reads; `exit_with(err)` prints it and
exits 2; `entry_point` wraps a command's main so that nothing it refuses shows a traceback.
"""

from __future__ import annotations

import argparse
import csv
import errno
import functools
import sys
from typing import NoReturn

EXIT_BAD_INPUT = 2
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


def exit_interrupted(kept: str) -> NoReturn:
    """Ctrl-C: one line saying what was kept, and exit 130 (128 + SIGINT, as a shell reports it)."""
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


def reportable(err: BaseException) -> bool:
    return isinstance(err, (UserError, OSError, *CONTENT_ERRORS))


def entry_point(main):
    """A console command's main: every reportable error is one line on stderr and exit code 2."""

    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as err:
            if not reportable(err):
                raise
            exit_with(err)

    return run


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (`error: PROG: ...`) with exit code 2, and
    which knows kvbench's --version."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from kvbench import __version__

        self.add_argument("--version", action="version", version=f"kvbench {__version__}")

    def error(self, message: str):
        exit_with(UserError(f"{self.prog}: {message} (see {self.prog} --help)"))
