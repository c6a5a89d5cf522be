"""Hydra callback: when a sweep ends, gather every point into summary.csv and draw the plots.

A sweep whose points all failed ends with exit code 2 and the first reason (bad input, most
likely); one with some failed points exits 0 and lists them, since their rows are recorded.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("kvbench")


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from kvbench.errors import UserError
        from kvbench.reporting.console import sweep_table
        from kvbench.reporting.report import summarize
        from kvbench.reporting.results import collect

        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            written = summarize(sweep_dir)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        for path in written:
            log.info("wrote %s", path)
        rows = collect(sweep_dir)
        print(sweep_table(rows))
        failed = rows[rows["status"] == "failed"]
        for row in failed.itertuples():
            log.warning("point %s failed: %s", row.point, row.reason)
        if len(failed) and len(failed) == len(rows):
            print(f"error: every point of the sweep failed; the first: {failed['reason'].iloc[0]}",
                  file=sys.stderr)
            sys.exit(2)
