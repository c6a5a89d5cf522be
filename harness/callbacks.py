"""Hydra callback: one sweep per directory while it runs; at its end summary.csv, the plots and the report.

A sweep holds a lock on its directory from start to end, so a second sweep into the same
directory is refused instead of computing its points again or mixing two sweeps' rows. A sweep
with a failed point, or whose summary could not be written, exits 2 with one line; the
finished points' metrics.csv stay as they are either way.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from kvbench.errors import UserError, exit_with, one_line, reportable
from kvbench.sweep import SweepLock

log = logging.getLogger("kvbench")


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.lock: SweepLock | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.lock = SweepLock(Path(config.hydra.sweep.dir))
        try:
            self.lock.acquire()
        except Exception as err:
            if not reportable(err):
                raise
            exit_with(err)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from kvbench import launch

        sweep_dir = Path(config.hydra.sweep.dir)
        plots = config.get("plots", "auto") is not False
        if not any(sweep_dir.glob("*/metrics.csv")):  # every point leaves one, a failed point too
            if self.lock is not None:
                self.lock.release()
            exit_with(
                UserError(
                    "the sweep has no points: a value list on the command line is empty (range() with "
                    "start >= stop or a step of the wrong sign, a glob() that matches no option)"
                )
            )
        try:
            # done by the helper `bench` started, where there is one that did it (its imports
            # loaded while the points ran); else, or where it failed, here
            done = launch.helper_does({"job": "sweep", "dir": str(sweep_dir), "plots": plots})
            if done is None:
                from kvbench.reporting.report import end_of_sweep

                done = end_of_sweep(sweep_dir, plots)
        except UserError as err:  # bad input (report.baseline not in the sweep, ...): its own line
            exit_with(err)
        except Exception as err:
            if not reportable(err):
                raise
            exit_with(
                UserError(
                    f"the sweep's summary, plots or report in {sweep_dir} could not be written "
                    f"({one_line(err)}); its finished points are intact in */metrics.csv"
                )
            )
        finally:
            if self.lock is not None:
                self.lock.release()
        for path in done["written"]:
            log.info("wrote %s", path)
        print(done["table"])
        failed = done["failed"]
        for point, reason in failed:
            log.warning("point %s failed: %s", point, reason)
        if failed:
            first = f"{failed[0][0]}: {failed[0][1]}"
            if len(failed) == done["rows"]:
                exit_with(UserError(f"every point of the sweep failed; the first, {first}"))
            exit_with(
                UserError(
                    f"{len(failed)} of {done['rows']} points of the sweep failed (their rows are in "
                    f"summary.csv); the first, {first}"
                )
            )
