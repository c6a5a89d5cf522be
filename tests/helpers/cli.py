"""A command's body run in this process, held to the bad-input contract: exit code 2, one line
on stderr that starts `error: `, no traceback. In-process runs spare each case the seconds a new
interpreter spends importing torch; a few subprocess cases in the suite prove the entry points."""

from __future__ import annotations

import contextlib
import io

import pytest
from hydra.core.global_hydra import GlobalHydra


def refused(run) -> str:
    """Run a command's body; it must exit 2 with one stderr line and no traceback. Returns the line."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        with pytest.raises(SystemExit) as exit_info:
            try:
                run()
            finally:
                GlobalHydra.instance().clear()
    text = err.getvalue()
    assert exit_info.value.code == 2, text + out.getvalue()
    assert "Traceback" not in text
    lines = text.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]
