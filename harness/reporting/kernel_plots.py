"""The kernel scenario's plot: attention latency and achieved bandwidth against context length.

One line per backend / layout / batch size (and whatever else the sweep varied). Interpreter
runs are drawn dashed and labelled: they check the sweep, they are not performance.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kvbench.reporting.figures import number, save_figure  # noqa: E402

SERIES_KEYS = ("backend", "allocator", "layout", "graph", "dtype", "model", "window")


def _flag(value) -> bool:
    return str(value).lower() in ("true", "1")


def series_label(row: dict, keys: list[str]) -> str:
    parts = [f"{k}={row.get(k, '')}" if k == "window" else str(row.get(k, "")) for k in keys]
    parts.append(f"B={int(number(row, 'num_seqs'))}")
    return " ".join(parts) + (" (interpreted)" if _flag(row.get("interpreted")) else "")


def latency_vs_context(rows: list[dict], out_dir: Path) -> Path:
    keys = [k for k in SERIES_KEYS if len({str(r.get(k, "")) for r in rows}) > 1] or ["backend"]
    series = defaultdict(list)
    for row in rows:
        series[series_label(row, keys)].append(row)
    fig, (lat, bw) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, points in sorted(series.items()):
        points.sort(key=lambda r: number(r, "context_len"))
        x = [number(r, "context_len") for r in points]
        style = "--" if _flag(points[0].get("interpreted")) else "-"
        lat.plot(x, [number(r, "latency_us_p50") for r in points], style, marker="o", label=name)
        bw.plot(x, [number(r, "achieved_gbps") for r in points], style, marker="o", label=name)
    for ax in (lat, bw):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length per sequence (tokens)")
        ax.set_yscale("log")
    lat.set_ylabel("attention latency p50 (us, one layer)")
    bw.set_ylabel("achieved bandwidth (GB/s)")
    profiles = {str(r.get("roofline_hardware", "")) for r in rows} - {""}
    if len(profiles) == 1:
        peak = number(rows[0], "achieved_gbps") / number(rows[0], "roofline_frac")
        if peak == peak:
            bw.axhline(peak, color="grey", linestyle=":", label=f"{profiles.pop()} peak")
    title = "Attention latency against context"
    if any(_flag(r.get("interpreted")) for r in rows):
        title += " (dashed: Triton interpreter on CPU, not performance)"
    fig.suptitle(title)
    bw.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    return save_figure(fig, Path(out_dir) / "latency_vs_context.png")
