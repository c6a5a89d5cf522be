"""A single run's figure; run as a module, the helper process that draws it (kvbench.launch).

A single run leaves one figure beside its metrics.csv, `kv_breakdown.png`: one stacked bar of
where its KV memory went (figures.kv_figure, the sweep's figure for one point). It is drawn
from the run's row with matplotlib alone: loading pandas for one row would cost more than a
short simulated run. Any other rows (a kernel scenario's) go to plots.draw_all.

matplotlib itself takes about half a second to import, as long as a short run's whole
simulation: `bench` therefore starts `python -m kvbench.reporting.run_figure` as it starts
(kvbench.launch), which imports matplotlib on another core while the run goes on, then reads
the job (the rows and their folder, JSON on stdin), draws it and prints the files it wrote.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from kvbench.reporting.figures import KV_PARTS, context_title, kv_figure, save_figure
from kvbench.reporting.results import cell_text


def _share(value) -> float:
    """A KV fraction as a per-cent bar height: a missing or non-finite one draws as 0 (as the
    sweep's figure fills them)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return value * 100 if math.isfinite(value) else 0.0


def breakdown_of_row(row: dict):
    """The KV breakdown of one point, from its row."""
    label = cell_text(row["allocator"]) if "allocator" in row else "point"
    shares = [[_share(row.get(key))] for key, _, _ in KV_PARTS]
    return kv_figure([("", [label], shares)], rates=False, title=context_title({k: [v] for k, v in row.items()}))


def draw_run(rows: list[dict], out: Path) -> list[Path]:
    """A single run's figures beside its metrics.csv; the files written."""
    if len(rows) == 1 and "latency_us_p50" not in rows[0]:
        (row,) = rows
        value = row.get("kv_token_util")
        if row.get("status", "ok") != "ok" or not isinstance(value, (int, float)) or value != value:
            return []  # no serving metrics: nothing to draw
        return [save_figure(breakdown_of_row(row), Path(out) / "kv_breakdown.png")]
    from kvbench.reporting.plots import draw_all

    return draw_all(rows, out)


def _serve() -> None:
    """The helper's side: import matplotlib while the run goes on, then read the job, draw it,
    name the files written, and leave without the interpreter's teardown. (Drawing a figure to
    throw away while waiting, to load the fonts, came too late: a 10-request run sends its job
    before that figure is done.)"""
    from kvbench.reporting.figures import pyplot

    pyplot()
    job = sys.stdin.read()
    if job:  # else the run ended without drawing
        job = json.loads(job)
        for path in draw_run(job["rows"], Path(job["out"])):
            print(path)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    _serve()
