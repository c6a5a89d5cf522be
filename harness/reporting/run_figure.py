"""A single run's figure, drawn from its row without pandas.

A single run leaves one figure beside its metrics.csv, `kv_breakdown.png`: one stacked bar of
where its KV memory went (figures.kv_figure, the sweep's figure for one point). It is drawn
from the run's row with matplotlib alone: loading pandas for one row would cost more than a
short simulated run. Any other rows (a kernel scenario's) go to plots.draw_all.
`bench`'s helper process draws it (kvbench.launch, kvbench.reporting.helper), or the run itself.
"""

from __future__ import annotations

import math
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
        # laid out to hold its legend and title: saved uncropped, one render (figures.save_figure)
        return [save_figure(breakdown_of_row(row), Path(out) / "kv_breakdown.png", crop=False)]
    from kvbench.reporting.plots import draw_all

    return draw_all(rows, out)
