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
        from kvbench.reporting.console import sweep_table
        from kvbench.reporting.report import summarize
        from kvbench.reporting.results import collect
        from kvbench.reporting.winners import verdict_settings

        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            for path in summarize(sweep_dir, plots=config.get("plots", "auto") is not False):
                log.info("wrote %s", path)
            rows = collect(sweep_dir)
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
        baseline, _, slo = verdict_settings(rows, sweep_dir)
        print(sweep_table(rows, slo, baseline))
        failed = rows[rows["status"] == "failed"] if "status" in rows else rows.iloc[:0]
        for row in failed.itertuples():
            log.warning("point %s failed: %s", row.point, row.reason)
        if len(failed):
            first = f"{failed['point'].iloc[0]}: {failed['reason'].iloc[0]}"
            if len(failed) == len(rows):
                exit_with(UserError(f"every point of the sweep failed; the first, {first}"))
            exit_with(
                UserError(
                    f"{len(failed)} of {len(rows)} points of the sweep failed (their rows are in "
                    f"summary.csv); the first, {first}"
                )
            )
