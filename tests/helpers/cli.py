"""A command's body run in this process: `in_process` returns what a finished process would
(exit code, stdout, stderr); `refused` holds it to the bad-input contract: exit code 2, one line
on stderr that starts `error: `, no traceback. In-process runs spare each case the seconds a new
interpreter spends importing torch; a few subprocess cases in the suite prove the entry points."""

from __future__ import annotations

import contextlib
import io
import subprocess

from hydra.core.global_hydra import GlobalHydra


def in_process(run, args=()) -> subprocess.CompletedProcess:
    """Run a command's body (a main() that exits or returns) with its output captured."""
    err, out = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            run()
        except SystemExit as exit_info:
            code = 0 if exit_info.code is None else exit_info.code
        finally:
            GlobalHydra.instance().clear()
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def refused(run) -> str:
    """Run a command's body; it must exit 2 with one stderr line and no traceback. Returns the line."""
    result = in_process(run)
    text = result.stderr
    assert result.returncode == 2, text + result.stdout
    assert "Traceback" not in text, text
    lines = text.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]
