"""What the scripts in this folder check before they compute, and how they fail.

An output they could not write is bad input, said in one line before minutes of work, not a
traceback after it; a point's config is checked as `bench` checks it (kvbench.schema), so a
script never runs what the command would refuse. Errors kvbench can name end the script with
one line and exit code 2, as `bench` does.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from kvbench.errors import UserError, exit_with, reportable
from kvbench.reporting.results import path_given


def writable_folder(path: Path | str, option: str) -> Path:
    """`path` as a folder the script may write into (made if missing)."""
    folder = path_given(path, option, "a folder to write into")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{option} {path} cannot be made a folder ({err.strerror}): give another") from None
    try:  # a file made and removed: os.access passes where writing fails (root, or /proc)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise UserError(f"{option} {path} is not writable ({err.strerror}): give another folder") from None
    return folder


def writable_file(path: Path | str, option: str) -> Path:
    """`path` as a file the script may write (its folder made if missing; not a folder itself)."""
    file = path_given(path, option, "a file name")
    if file.is_dir() or str(path).endswith(("/", os.sep)):  # `out/sub/` means a folder, whether or not it is one
        raise UserError(f"{option} {path} is a folder: give a file name")
    writable_folder(file.parent if str(file.parent) else ".", f"{option}'s folder")
    return file


def checked(cfg):
    """`cfg` checked as `bench` checks a point's config; UserError (one line) where it would refuse it."""
    from kvbench import schema

    schema.settle_whole_numbers(cfg, schema.validate(cfg))
    return cfg


def run_main(main: Callable[[], object]) -> None:
    """Run a script's main: an error kvbench can name is one line and exit code 2."""
    try:
        code = main()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as err:  # noqa: BLE001 (a bug keeps its traceback: reportable says which)
        from kvbench.schema.hydra_errors import hydra_line

        line = hydra_line(err)
        if line is None and not reportable(err):
            raise
        exit_with(UserError(line) if line is not None else err)
    sys.exit(code if isinstance(code, int) else 0)
