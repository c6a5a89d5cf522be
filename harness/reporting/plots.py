"""The comparison plots of a sweep: where KV memory goes (the paper's Fig. 2), throughput,
batch size and latency per point or against request rate, and normalized latency against
request rate (Fig. 12).

Points are grouped by the real key columns (sweep, allocator, every swept parameter), never by
their printed label, so two sweeps of the same allocators draw as separate bars and lines.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.reporting.figures import (
    KV_PARTS,
    LINE_STYLES,
    MAX_WIDTH_IN,
    SYSTEM_COLORS,
    context_title,
    kv_figure,
    legend_below,
    rate_axis,
    save_figure,
    subplots,
)
from kvbench.reporting.results import (
    SYSTEM_RANK,
    in_paper_order,
    ok_rows,
    point_labels,
    rate_curves,
    table,
    varying_keys,
)

# (column, axis label, log scale) of the throughput / latency figure
log = logging.getLogger("kvbench")

PANELS = [
    ("request_throughput", "request throughput (req/s)", False),
    ("mean_batch_size", "mean batch size (sequences)", False),
    ("median_ttft_ms", "median TTFT (ms)", True),
    ("median_tpot_ms", "median TPOT (ms)", True),
]


# what the kernel scenario's figure draws (kernel_plots.latency_vs_context)
KERNEL_COLUMNS = ("latency_us_p50", "achieved_gbps", "num_seqs", "context_len")

AUTO = object()  # a plot's curves not given: found from its frame (results.rate_curves)


def _series(frame: pd.DataFrame, keys: list[str]):
    """(name, colour, line style, rows) of each curve, the points that share the curve keys
    (`keys`, from results.rate_curves): one colour per system, one line style per setting of
    the other keys."""
    if not keys:
        yield point_labels(frame.iloc[:1], []).iloc[0], _color(frame), "-", frame
        return
    others = [k for k in keys if k != "allocator"]
    styles, curves = {}, []
    for _, rows in frame.groupby(keys, sort=False, dropna=False):
        setting = tuple(rows[others].iloc[0].astype(str))
        styles.setdefault(setting, LINE_STYLES[len(styles) % len(LINE_STYLES)])
        curves.append((setting, rows["allocator"].iloc[0] if "allocator" in rows else None, rows))
    # each setting's systems in the paper's order, whichever point came first (a failed one is not
    # here); the sort is stable, so systems outside that order keep theirs
    settings = {setting: i for i, setting in enumerate(styles)}
    for setting, _, rows in sorted(curves, key=lambda c: (settings[c[0]], SYSTEM_RANK.get(c[1], len(SYSTEM_RANK)))):
        yield point_labels(rows.iloc[:1], keys).iloc[0], _color(rows), styles[setting], rows


def _systems(frame: pd.DataFrame) -> list:
    """The frame's systems in the paper's order, any other after them as they come."""
    names = list(dict.fromkeys(frame["allocator"])) if "allocator" in frame else []
    return sorted(names, key=lambda name: SYSTEM_RANK.get(name, len(SYSTEM_RANK)))


def _color(rows: pd.DataFrame):
    return SYSTEM_COLORS.get(rows["allocator"].iloc[0]) if "allocator" in rows else None


def bar_table(frame: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, list[str]]:
    """`metric` as one row per group of points that differ only in allocator, one column per
    allocator (the paper's order), and each row's name."""
    keys = [k for k in varying_keys(frame) if k != "allocator"]
    group = frame.groupby(keys, sort=False, dropna=False).ngroup() if keys else pd.Series(0, index=frame.index)
    names = point_labels(frame, keys).groupby(group).first().tolist() if keys else [""]
    bars = pd.DataFrame({"group": group, "system": frame["allocator"], metric: frame[metric]})
    return bars.pivot(index="group", columns="system", values=metric)[_systems(frame)], names


def _draw_bars(ax, frame: pd.DataFrame, metric: str, lying: bool = False) -> None:
    values, names = bar_table(frame, metric)
    colors = [SYSTEM_COLORS.get(s, "#495057") for s in values.columns]
    if lying:  # a group of bars a line, its name to its left (the left column's panels show them)
        values.plot.barh(ax=ax, width=0.8, legend=False, color=colors)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_ylim(len(names) - 0.5, -0.5)  # the first setting on top, as a table reads
        ax.set_ylabel("")
        return
    values.plot.bar(ax=ax, width=0.8, legend=False, rot=0, color=colors)
    ax.set_xlabel("")
    # A name a line per key, level, in a font small enough for its slot (rotated, long names
    # overlap and squeeze the axes); rotated only where even 5 pt would not fit (12 settings and more).
    # Up to three names get up to 9 pt: two sweeps' `x/a, hardware=a100-40gb` overlapped at 10.
    stacked = [name.replace(", ", "\n") for name in names]
    size = _name_size(names, ax.get_position().width * ax.figure.get_figwidth())
    if names == [""]:  # one group: its bars are the systems, which the legend names
        ax.set_xticks([])
    elif size >= 5:
        ax.set_xticks(range(len(names)), stacked, fontsize=size)
    else:
        ax.set_xticks(range(len(names)), names, fontsize=6.5, rotation=30, ha="right")


def panel_width_in(cols: int) -> float:
    """The width (inches) of each of `cols` panels in a row of a MAX_WIDTH_IN figure, as
    matplotlib lays them out: 77.5 % of the figure, gaps of 0.2 panel between them."""
    return 0.775 * MAX_WIDTH_IN / (cols + 0.2 * (cols - 1))


def _name_size(names: list[str], panel_in: float) -> float:
    """The font size (pt) at which each group's name, a setting a line, fits its slot of a panel
    `panel_in` inches wide."""
    widest = max(1, *(len(line) for name in names for line in name.split(", ")))
    return min(9.0 if len(names) <= 3 else 7.0, 72 * panel_in / len(names) / (0.62 * widest))  # a character: ~0.62 em


def kv_breakdown(frame: pd.DataFrame, curves=AUTO):
    """Stacked KV shares: one bar per point, or per rate in one panel per system in a rate sweep.
    `curves`: results.rate_curves(frame), where the caller has it."""
    curves = rate_curves(frame) if curves is AUTO else curves
    x = "rate" if curves is not None else None
    keys = [k for k in varying_keys(frame) if k != "allocator"]
    settings = frame.groupby(keys, sort=False, dropna=False) if keys and "allocator" in frame else None
    if x:
        groups = [(name, rows) for name, _, _, rows in _series(frame, curves)]
    elif len(frame) > 8 and settings is not None and settings["allocator"].nunique().min() > 1:
        # many points, several systems at every setting (fig13: 2 workloads x 3 seeds x 4
        # systems): a panel per setting, a bar per system, where one panel of 24 bars would need
        # 24 rotated names (not two sweeps of one system each: their settings hold one bar)
        groups = [(point_labels(rows.iloc[:1], keys).iloc[0], rows) for _, rows in settings]
    else:
        groups = [("", frame)]
    panels = []
    for name, rows in groups:
        labels = pd.to_numeric(rows[x]).map("{:g}".format) if x else point_labels(rows, ["allocator"] if name else None)
        # a share the table lacks, or a cell left blank, draws as 0 (a single run's figure does too)
        kv = rows.reindex(columns=[key for key, _, _ in KV_PARTS])
        shares = [(pd.to_numeric(kv[key], errors="coerce").fillna(0) * 100).tolist() for key, _, _ in KV_PARTS]
        panels.append((name, list(labels), shares))
    return kv_figure(panels, rates=bool(x), title=context_title(frame))


def throughput_latency(frame: pd.DataFrame, curves=AUTO):
    """Throughput, batch size and latency medians: lines against rate in a rate sweep, else
    grouped bars (one group per setting, one bar per system). `curves`: as kv_breakdown's."""
    curves = rate_curves(frame) if curves is AUTO else curves
    x = curves is not None
    panels = [p for p in PANELS if p[0] in frame and frame[p[0]].notna().any()]
    names = [] if x else bar_table(frame, panels[0][0])[1]
    # bars of more than four settings get two panels a row: four a row leave each too narrow for their names
    rows = 2 if not x and len(panels) > 2 and len(names) > 4 else 1
    cols = -(-len(panels) // rows)
    # names that would not fit under their bars even at 5 pt (rotated, they overlapped): the bars
    # lie on their side, the names to the left of the left column's panels
    lying = not x and names != [""] and _name_size(names, panel_width_in(cols)) < 5
    if lying:
        height = 0.12 * len(names) * (1 + frame["allocator"].nunique()) + 1.2
        fig, axes = subplots(rows, cols, figsize=(MAX_WIDTH_IN, height * rows + 0.8), squeeze=False, sharey=True)
    else:
        fig, axes = subplots(rows, cols, figsize=(MAX_WIDTH_IN, 3.9 * rows), squeeze=False)
    for ax, (metric, text, log) in zip(axes.flat, panels):
        values = pd.to_numeric(frame[metric], errors="coerce")
        shown = frame
        if metric.endswith("_ms") and values.max() >= 10_000:  # queueing: seconds, not 2M ms
            values = values / 1000
            shown, text = frame.assign(**{metric: values}), text.replace("(ms)", "(s)")
        if x:
            _lines(ax, shown, metric, curves, markersize=3)
        else:
            _draw_bars(ax, shown, metric, lying)
        axis = ax.xaxis if lying else ax.yaxis  # the values'
        axis.set_label_text(text)
        if log and values.min() > 0 and values.max() > 20 * values.min():  # latencies that span decades
            (ax.set_xscale if lying else ax.set_yscale)("log")
        elif values.abs().max() >= 10_000:  # ticks of 1.5M ms, not 1.5 under a "1e6" in the corner
            from matplotlib.ticker import EngFormatter

            axis.set_major_formatter(EngFormatter(sep=""))
    fig.suptitle(f"Throughput and latency: {context_title(frame)}", fontsize=11)
    legend_below(fig, axes.flat[0])
    return fig


def _lines(ax, frame: pd.DataFrame, metric: str, curves: list[str], **style) -> None:
    rates = pd.to_numeric(frame["rate"], errors="coerce")
    frame, rates = frame[np.isfinite(rates)], rates[np.isfinite(rates)]  # rate=inf is on no line
    for name, color, line, rows in _series(frame, curves):
        ax.plot(pd.to_numeric(rows["rate"]), rows[metric], line, marker="o", color=color, label=name, **style)
    rate_axis(ax, rates)


def latency_vs_rate(frame: pd.DataFrame, curves=AUTO, slo: float | None = None):
    """Each curve's normalized latency against the rate; `slo`, the latency target the
    report's capacities are read at, dotted across."""
    fig, ax = subplots(figsize=(8, 4.8))
    _lines(ax, frame, "normalized_latency_s_per_tok", rate_curves(frame) if curves is AUTO else curves)
    if slo is not None:
        ax.axhline(slo, color="grey", linestyle=":", label=f"target {slo:g} s/token (capacity: where a curve crosses)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.set_yscale("log")
    ax.set_title(f"Normalized latency against request rate\n{context_title(frame)}", fontsize=11)
    # beside the axes: within them, a legend of many curves sat on the knees they are drawn for
    # handles long enough to show a curve's line style (seeds, block sizes) around its marker
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, handlelength=4)
    return fig


def draw_all(rows, out: Path, slo: float | None = None) -> list[Path]:
    """Every plot the rows support; scenarios without serving metrics contribute their own. A
    single point gets its KV breakdown; the throughput / latency panels need two points to compare."""
    frame = ok_rows(table(rows))
    out = Path(out)
    written = []

    def draw(name: str, figure) -> None:
        """One figure; one that fails to draw is a warning, and the others, the summary and the
        report are written without it (a layout error once lost a whole sweep's report)."""
        try:
            made = figure()  # a figure, or the path of one written already
            written.append(made if isinstance(made, Path) else save_figure(made, out / name))
        except OSError:
            raise
        except Exception as err:  # noqa: BLE001 (a drawing bug must not cost what was computed)
            log.warning("%s was not drawn: %s: %s", name, type(err).__name__, err)

    if "kv_token_util" in frame:
        serving = in_paper_order(frame[frame["kv_token_util"].notna()])
        if len(serving):
            curves = rate_curves(serving)  # found once, for every figure
            draw("kv_breakdown.png", lambda: kv_breakdown(serving, curves))
            if len(serving) > 1:  # one point's would be a bar per panel: the console table, drawn
                draw("throughput_latency.png", lambda: throughput_latency(serving, curves))
            if curves is not None:
                draw("latency_vs_rate.png", lambda: latency_vs_rate(serving, curves, slo))
    if all(c in frame for c in KERNEL_COLUMNS):  # a figure the rows support: a hand-cut table may lack them
        kernel = frame[frame["latency_us_p50"].notna()]
        if len(kernel):
            from kvbench.reporting.kernel_plots import latency_vs_context

            draw("the kernel's figure", lambda: latency_vs_context(kernel, out))
    return written
