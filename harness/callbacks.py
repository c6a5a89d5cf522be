"""Hydra callback: when a sweep ends, gather every point into summary.csv and draw the plots."""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("kvbench")


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from kvbench.report import summarize

        sweep_dir = Path(config.hydra.sweep.dir)
        written = summarize(sweep_dir)
        for path in written:
            log.info("wrote %s", path)
