"""The kernel scenario's plot: attention latency and achieved bandwidth against context length.

One line per backend / layout / batch size (and whatever else the sweep varied). Interpreter
runs are drawn dashed and labelled: they check the sweep, they are not performance.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvbench.reporting.figures import MAX_WIDTH_IN, save_figure, subplots

SERIES_KEYS = ("backend", "allocator", "layout", "graph", "dtype", "model", "window")


def _interpreted(frame: pd.DataFrame) -> pd.Series:
    flags = frame["interpreted"] if "interpreted" in frame else pd.Series(False, index=frame.index)
    return flags.astype(str).str.lower().isin(["true", "1"])


def series_label(row: pd.Series, keys: list[str], interpreted: bool) -> str:
    # once each: a paged allocator's layout is `paged` too ("paged paged B=4")
    parts = list(dict.fromkeys(f"{k}={row[k]}" if k == "window" else str(row[k]) for k in keys))
    spec = str(row.get("batch_spec", ""))
    # a batch with prompts is named by its spec: B=6 alone would hide that 2 of them are prefills
    parts.append(f"B={int(row['num_seqs'])}" + (f" ({spec})" if "p" in spec else ""))
    return " ".join(parts) + (" (interpreted)" if interpreted else "")


def latency_vs_context(frame: pd.DataFrame, out_dir: Path) -> Path:
    frame = frame.assign(_interpreted=_interpreted(frame))
    keys = [k for k in SERIES_KEYS if k in frame and frame[k].astype(str).nunique() > 1] or ["backend"]
    fig, (lat, bw) = subplots(1, 2, figsize=(MAX_WIDTH_IN, 4.5))
    for _, points in frame.groupby([*keys, "num_seqs", "_interpreted"], sort=True, dropna=False):
        points = points.sort_values("context_len")
        interpreted = bool(points["_interpreted"].iloc[0])
        name = series_label(points.iloc[0], keys, interpreted)
        style = "--" if interpreted else "-"
        lat.plot(points["context_len"], points["latency_us_p50"], style, marker="o", label=name)
        bw.plot(points["context_len"], points["achieved_gbps"], style, marker="o", label=name)
    for ax in (lat, bw):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length per sequence (tokens)")
        ax.set_yscale("log")
    lat.set_ylabel("attention latency p50 (us, one layer)")
    bw.set_ylabel("achieved bandwidth (GB/s)")
    profiles = frame["roofline_hardware"].dropna().unique() if "roofline_hardware" in frame else []
    if len(profiles) == 1:
        peak = (frame["achieved_gbps"] / frame["roofline_frac"]).iloc[0]
        if peak == peak:
            bw.axhline(peak, color="grey", linestyle=":", label=f"{profiles[0]} peak")
    named = {c: "/".join(map(str, frame[c].dropna().unique())) if c in frame else "?" for c in ("model", "device")}
    title = f"Attention latency against context: {named['model']} on {named['device']}"
    if frame["_interpreted"].any():
        title += " (dashed: Triton interpreter on CPU, not performance)"
    fig.suptitle(title)
    bw.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    return save_figure(fig, Path(out_dir) / "latency_vs_context.png")
