"""The `bench` command's entry point: kvbench.cli.main, with the figure helper started first.

A single run ends by drawing its figure, and matplotlib takes about half a second to import,
as long as a short simulated run. So before it imports Hydra this starts the helper
(`python -m kvbench.reporting.run_figure`), which imports matplotlib on the other core while
Hydra composes and the run simulates; the run then sends it the rows and waits for the files,
so they are there when `bench` returns, as they were when it drew them itself. A 10-request run
takes 0.8-0.9 s so instead of 1.7 s (docs/design.md has the measurements).

The config is not composed yet, so the command line decides: a helper is started unless the
run is a sweep (which draws at its end, with pandas), asks for help or a config, or sets
`plots` to anything but true. A helper the run does not use is stopped when `bench` ends. A run
draws its figure itself wherever there is no helper: one that failed to start, died or timed
out, a `plots: true` a config file set, and kvbench.cli.main called in-process.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("kvbench")
HELPER_TIMEOUT_S = 120  # a figure takes well under a second; a hung helper is given up on
# Hydra's flags after which `bench` runs nothing, or a sweep
NO_SINGLE_RUN = {"-m", "--multirun", "-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "--version"}
NO_SINGLE_RUN_PREFIXES = ("--cfg=", "--info=", "--shell-completion", "-sc")


def draws_a_figure(args: list[str]) -> bool:
    """Whether `bench ARGS` is a single run that draws its figure, as far as the command line says."""
    for arg in args:
        if arg in NO_SINGLE_RUN or arg.startswith(NO_SINGLE_RUN_PREFIXES):
            return False
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "plots" and value.strip().lower() != "true":
            return False
    return True


class FigureHelper:
    """The helper process, importing matplotlib from the start: `send` hands it the job, `drawn`
    waits for the files, `close` stops it."""

    def __init__(self):
        self._process = subprocess.Popen(
            [sys.executable, "-m", "kvbench.reporting.run_figure"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._job = None  # (rows, folder) once sent

    @classmethod
    def start(cls) -> FigureHelper | None:
        try:
            return cls()
        except OSError as err:  # no process to be had: the run draws its figure itself
            log.debug("no figure helper (%s)", err)
            return None

    def send(self, rows: list[dict], out: Path) -> None:
        """Hand the helper its job, `rows` to draw in `out`; it draws while the run goes on."""
        import json

        self._job = rows, out
        try:
            self._process.stdin.write(json.dumps({"rows": rows, "out": str(out)}, default=_plain))
            self._process.stdin.close()
        except (OSError, ValueError, TypeError) as err:  # a helper that died, a row JSON cannot hold
            log.debug("the figure helper took no job (%s)", err)
        self._process.stdin = None  # closed: communicate() must not flush it

    def drawn(self) -> list[Path]:
        """The files the helper wrote for the job sent; drawn here instead where it failed."""
        try:
            said, errors = self._process.communicate(timeout=HELPER_TIMEOUT_S)
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            said, errors = "", str(err)
        written = [Path(line) for line in said.splitlines() if line]
        if self._process.returncode == 0 and all(path.is_file() for path in written):
            return written
        self._stop()
        log.debug("the figure helper failed (%s); drawing here", (errors.strip().splitlines() or ["no output"])[-1])
        from kvbench.reporting.run_figure import draw_run

        return draw_run(*self._job)

    def close(self) -> None:
        """Stop the helper if it is still there: at once if it has no job (a run that ended
        without drawing), else once it has written its files, so that none is left half-written."""
        if self._job is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=HELPER_TIMEOUT_S)
        self._stop()

    def _stop(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()


def _plain(value):
    """JSON for what a row may hold besides str, int, float and None (numpy scalars, paths)."""
    return value.item() if hasattr(value, "item") else str(value)


def main() -> None:
    helper = FigureHelper.start() if draws_a_figure(sys.argv[1:]) else None
    from kvbench import cli

    try:
        cli.main(figure_helper=helper)
    finally:
        if helper is not None:
            helper.close()


if __name__ == "__main__":
    main()
