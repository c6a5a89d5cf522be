"""The comparison plots of a sweep: where KV memory goes (the paper's Fig. 2), throughput,
batch size and latency per point or against request rate, and normalized latency against
request rate (Fig. 12).

Points are grouped by the real key columns (sweep, allocator, every swept parameter), never by
their printed label, so two sweeps of the same allocators draw as separate bars and lines.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvbench.arith import cdiv
from kvbench.reporting.figures import LINE_STYLES, MAX_WIDTH_IN, SYSTEM_COLORS, context_title, pyplot, save_figure
from kvbench.reporting.results import in_paper_order, ok_rows, point_labels, rate_axis, table, varying_keys

plt = pyplot()

KV_PARTS = [
    ("kv_token_util", "token states", "#2b8a3e"),
    ("kv_reserved_frac", "reserved", "#f08c00"),
    ("kv_internal_frag_frac", "internal fragmentation", "#c92a2a"),
    ("kv_rounding_frac", "rounding (blocks, buddy chunks)", "#e599f7"),
    ("kv_external_frag_frac", "external fragmentation & free", "#868e96"),
]
# (column, axis label, log scale) of the throughput / latency figure
PANELS = [
    ("request_throughput", "request throughput (req/s)", False),
    ("mean_batch_size", "mean batch size (sequences)", False),
    ("median_ttft_ms", "median TTFT (ms)", True),
    ("median_tpot_ms", "median TPOT (ms)", True),
]


def _series(frame: pd.DataFrame):
    """(name, colour, line style, rows) of each group of points that share every key but rate:
    one colour per system, one line style per setting of the other keys."""
    keys = [k for k in varying_keys(frame) if k != "rate"]
    if not keys:
        yield point_labels(frame.iloc[:1], []).iloc[0], _color(frame), "-", frame
        return
    others = [k for k in keys if k != "allocator"]
    styles = {}
    for _, rows in frame.groupby(keys, sort=False, dropna=False):
        style = styles.setdefault(tuple(rows[others].iloc[0].astype(str)), LINE_STYLES[len(styles) % len(LINE_STYLES)])
        yield point_labels(rows.iloc[:1], keys).iloc[0], _color(rows), style, rows


def _color(rows: pd.DataFrame):
    return SYSTEM_COLORS.get(rows["allocator"].iloc[0]) if "allocator" in rows else None


def bar_table(frame: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, list[str]]:
    """`metric` as one row per group of points that differ only in allocator, one column per
    allocator (the paper's order), and each row's name."""
    keys = [k for k in varying_keys(frame) if k != "allocator"]
    group = frame.groupby(keys, sort=False, dropna=False).ngroup() if keys else pd.Series(0, index=frame.index)
    names = point_labels(frame, keys).groupby(group).first().tolist() if keys else [""]
    bars = pd.DataFrame({"group": group, "system": frame["allocator"], metric: frame[metric]})
    return bars.pivot(index="group", columns="system", values=metric)[list(dict.fromkeys(frame["allocator"]))], names


def _draw_bars(ax, frame: pd.DataFrame, metric: str) -> None:
    values, names = bar_table(frame, metric)
    values.plot.bar(
        ax=ax, width=0.8, legend=False, rot=0, color=[SYSTEM_COLORS.get(s, "#495057") for s in values.columns]
    )
    crowded = len(names) > 3
    ax.set_xticks(range(len(names)), names, rotation=20 if crowded else 0, ha="right" if crowded else "center")
    ax.set_xlabel("")


def _legend_below(fig, ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    rows = cdiv(len(labels), 5)
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(len(labels), 5), frameon=False)
    fig.tight_layout(rect=(0, (0.1 + 0.22 * rows) / fig.get_figheight(), 1, 1))


def kv_breakdown(frame: pd.DataFrame):
    """Stacked KV shares: one bar per point, or per rate in one panel per system in a rate sweep."""
    x = rate_axis(frame)
    groups = list(_series(frame)) if x else [("", None, "-", frame)]
    cols = min(len(groups), 2)
    rows_n = cdiv(len(groups), cols)
    bars = frame.groupby(x).ngroups if x else len(frame)
    width = min(MAX_WIDTH_IN, max(6.0, (0.45 * bars + 1.5) * cols + 2))
    fig, axes = plt.subplots(rows_n, cols, figsize=(width, 3.3 * rows_n + 1.2), squeeze=False, sharey=True)
    for ax, (name, _, _, rows) in zip(axes.flat, groups):
        labels = pd.to_numeric(rows[x]).map("{:g}".format) if x else point_labels(rows)
        shares = rows[[key for key, _, _ in KV_PARTS]].apply(pd.to_numeric, errors="coerce").fillna(0) * 100
        shares.columns = [text for _, text, _ in KV_PARTS]
        shares.plot.bar(ax=ax, stacked=True, width=0.8, legend=False, color=[color for *_, color in KV_PARTS])
        for bars in ax.containers:
            shown = [f"{v:.0f}" if v >= 8 else "" for v in bars.datavalues]
            ax.bar_label(bars, labels=shown, label_type="center", fontsize=7, color="white")
        ax.set_xticks(range(len(rows)), list(labels), rotation=0 if x else 20, ha="center" if x else "right")
        ax.set_ylim(0, 100)
        ax.set_title(name, fontsize=10)
        if x:
            ax.set_xlabel("request rate (req/s)")
    for ax in axes.flat[len(groups) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("% of KV slots (time-averaged)")
    fig.suptitle(
        f"Where KV memory goes: {context_title(frame)}\n"
        "(the five categories of docs/paper.md; the paper files rounding under external & other)",
        fontsize=11,
    )
    _legend_below(fig, axes.flat[0])
    return fig


def throughput_latency(frame: pd.DataFrame):
    """Throughput, batch size and latency medians: lines against rate in a rate sweep, else
    grouped bars (one group per setting, one bar per system)."""
    x = rate_axis(frame)
    panels = [p for p in PANELS if p[0] in frame and frame[p[0]].notna().any()]
    fig, axes = plt.subplots(1, len(panels), figsize=(MAX_WIDTH_IN, 3.9), squeeze=False)
    for ax, (metric, text, log) in zip(axes.flat, panels):
        if x:
            _lines(ax, frame, metric, markersize=3)
        else:
            _draw_bars(ax, frame, metric)
        ax.set_ylabel(text)
        values = pd.to_numeric(frame[metric], errors="coerce")
        if log and values.min() > 0 and values.max() > 20 * values.min():  # latencies that span decades
            ax.set_yscale("log")
    fig.suptitle(f"Throughput and latency: {context_title(frame)}", fontsize=11)
    _legend_below(fig, axes.flat[0])
    return fig


def _lines(ax, frame: pd.DataFrame, metric: str, **style) -> None:
    for name, color, line, rows in _series(frame):
        ax.plot(pd.to_numeric(rows["rate"]), rows[metric], line, marker="o", color=color, label=name, **style)
    ax.set_xlabel("request rate (req/s)")


def latency_vs_rate(frame: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(8, 4.8))
    _lines(ax, frame, "normalized_latency_s_per_tok")
    ax.set_ylabel("normalized latency (s/token)")
    ax.set_yscale("log")
    ax.set_title(f"Normalized latency against request rate\n{context_title(frame)}", fontsize=11)
    ax.legend(fontsize=8)
    return fig


def draw_all(rows, out: Path) -> list[Path]:
    """Every plot the rows support; scenarios without serving metrics contribute their own. A
    single point gets its KV breakdown; the throughput / latency panels need two points to compare."""
    frame = ok_rows(table(rows))
    out = Path(out)
    written = []
    if "kv_token_util" in frame:
        serving = in_paper_order(frame[frame["kv_token_util"].notna()])
        if len(serving):
            written.append(save_figure(kv_breakdown(serving), out / "kv_breakdown.png"))
            if len(serving) > 1:  # one point's would be a bar per panel: the console table, drawn
                written.append(save_figure(throughput_latency(serving), out / "throughput_latency.png"))
            if rate_axis(serving):
                written.append(save_figure(latency_vs_rate(serving), out / "latency_vs_rate.png"))
    if "latency_us_p50" in frame:
        kernel = frame[frame["latency_us_p50"].notna()]
        if len(kernel):
            from kvbench.reporting.kernel_plots import latency_vs_context

            written.append(latency_vs_context(kernel, out))
    return written
