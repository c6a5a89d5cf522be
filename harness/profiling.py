"""`profile=true`: a torch profiler trace of a serve or kernel run, as Chrome trace JSON beside metrics.csv.

The trace is gzipped (trace.json.gz): a serve run of a few requests records ~10^5-10^6 operator
events, hundreds of MB of plain JSON. chrome://tracing and https://ui.perfetto.dev open it as it
is. Only scenarios that run torch operators are profiled: a simulated run has none to show.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from omegaconf import DictConfig

from kvbench.errors import UserError

PROFILED_SCENARIOS = ("serve", "kernel")
TRACE_NAME = "trace.json.gz"


@contextlib.contextmanager
def chrome_trace(path: Path):
    """Profile the body (CPU, and CUDA when present); write the trace only if the body finished."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        yield prof
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.partial{path.suffix}")  # same suffix: torch gzips on ".gz"
    try:
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def profiled(cfg: DictConfig, out_dir: Path):
    """The context a point runs in: a trace when `profile=true`, nothing otherwise."""
    if not cfg.get("profile", False):
        return contextlib.nullcontext()
    scenario = cfg.scenario.name
    if scenario not in PROFILED_SCENARIOS:
        raise UserError(
            f"profile=true traces torch operators, and scenario={scenario} runs none; "
            f"use it with scenario={' or scenario='.join(PROFILED_SCENARIOS)}"
        )
    return chrome_trace(Path(out_dir) / TRACE_NAME)
