"""What every kvbench figure shares: an Agg canvas, one colour per system, a title naming what
was measured, and atomic PNG writing.

matplotlib is not imported here: a report, bench-compare or a console table use the titles and
colours without drawing, and loading matplotlib costs about half a second (the drawing modules
load it through `subplots()`). Figures are made with matplotlib's object API, each on an Agg
canvas of its own (`subplots`), never through pyplot: a headless tool needs none of pyplot's
global figure registry (no figure to close, none kept alive) or backend selection. The PNGs
are byte-identical to pyplot's. Its import is a little shorter without pyplot (10 alternating
fresh imports: medians 0.55 s with, 0.51 s without), but a single run's helper, started,
handed its job and drawing it, showed no difference (10 alternating: medians 0.846 s and
0.838 s, spreads 0.64-0.95 s and 0.59-0.95 s). pandas' bar plots, which the sweep's figures
use, load pyplot themselves; the figures they draw into are still these."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kvbench.arith import cdiv
from kvbench.reporting.results import write_bytes_atomic

if TYPE_CHECKING:
    import pandas as pd

# Figures stay within ~1,400 px (12.5 in at 110 dpi) so a report page shows them unscaled.
DPI = 110
MAX_WIDTH_IN = 12.5
SYSTEM_COLORS = {
    "contiguous": "#c92a2a",
    "pow2": "#e67700",
    "oracle": "#5f3dc4",
    "paged": "#1971c2",
    "hybrid": "#2b8a3e",
}
LINE_STYLES = ("-", "--", ":", "-.")
# The KV breakdown's legend (five entries in one row) and two-line title need about 8.4 in at
# their font sizes: a breakdown at least this wide holds everything it draws, uncropped.
KV_MIN_WIDTH_IN = 8.8
# One bar's breakdown (a single run's figure) is laid out by fixed margins, in inches (left,
# right, bottom, top): what tight_layout finds for it, whose measuring of every text took half
# of the figure's time (0.21 -> 0.11 s a figure, drawn and encoded, on a 2-core host). Its one
# label is not rotated, so only its width varies, and the margins hold whatever it says.
ONE_BAR_MARGINS_IN = (0.72, 0.15, 0.86, 0.72)
# (column, legend text, colour) of the KV breakdown's stacked shares, bottom to top
KV_PARTS = [
    ("kv_token_util", "token states", "#2b8a3e"),
    ("kv_reserved_frac", "reserved", "#f08c00"),
    ("kv_internal_frag_frac", "internal fragmentation", "#c92a2a"),
    ("kv_rounding_frac", "rounding (blocks, buddy chunks)", "#e599f7"),
    ("kv_external_frag_frac", "external fragmentation & free", "#868e96"),
]


def subplots(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] | None = None, **kwargs):
    """(figure, axes) as pyplot.subplots makes them (`kwargs`: sharey, squeeze, ...), the figure
    on an Agg canvas of its own."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def context_title(frame: pd.DataFrame | Mapping[str, list]) -> str:
    """`opt-13b on a100-40gb, sharegpt workload (simulate)`: what every point of `frame` (a
    DataFrame, or columns as lists) measured."""

    def values_of(cells) -> str:
        return "/".join(map(str, dict.fromkeys(v for v in cells if v is not None and v == v and v != "")))  # NaN

    def values(column: str) -> str:
        return values_of(frame[column]) if column in frame else "?"

    # a kernel's or a profile's points read no workload (and a profile no hardware): left out
    hardware, workload = values("hardware"), values("workload")
    if "scenario" in frame and "device" in frame:  # measured: on the device it ran on, not a hardware profile
        scenarios, devices = list(frame["scenario"]), list(frame["device"])
        hardware_of = list(frame["hardware"]) if "hardware" in frame else [None] * len(scenarios)
        hardware = values_of([h if s == "simulate" else d for s, h, d in zip(scenarios, hardware_of, devices)])
    on = f" on {hardware}" if hardware else ""
    load = f", {workload} workload" if workload else ""
    rate = values("rate") if "rate" in frame else ""
    if load and rate and "/" not in rate:  # one offered load for every point: say which
        load += " with all requests at once" if rate == "inf" else f" at {float(rate):g} req/s"
    return f"{values('model')}{on}{load} ({values('scenario')})"


def save_figure(fig, path: Path, crop: bool = True) -> Path:
    """`fig` as a PNG at `path`, written atomically. `crop`: the image is what is drawn
    (bbox_inches="tight"), which takes a second render (0.04-0.05 s for a single run's figure);
    a figure laid out to hold everything it draws (kv_figure) is saved as it is. zlib's fastest
    level: the same pixels in a file 7 % larger (a single run's breakdown: 42.9 KB, not 40.1 KB)
    for 0.02 s less a figure (0.125 -> 0.104 s of savefig, four in one process), which a short
    run waits for."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight" if crop else None, pil_kwargs={"compress_level": 1})
    write_bytes_atomic(path, buffer.getvalue())
    return path


def rate_axis(ax, rates) -> None:
    """The request rate on `ax`'s x axis, logarithmic where the rates span more than 20x (curves
    over decades of load, fig12's Alpaca at 3-96 req/s): linear, their low rates, where the
    slowest systems cross the target, lie on top of each other."""
    ax.set_xlabel("request rate (req/s)")
    if len(rates) and min(rates) > 0 and max(rates) > 20 * min(rates):
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # 2, 5, 10, 20, 50: rates, not decades
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())


def legend_below(fig, ax, margins_in: tuple[float, float, float, float] | None = None) -> None:
    """`ax`'s legend under the figure, five entries a row, the axes shrunk to make room: by
    `margins_in` (left, right, bottom, top, in inches) where given, else by tight_layout."""
    handles, labels = ax.get_legend_handles_labels()
    rows = cdiv(len(labels), 5)
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(len(labels), 5), frameon=False)
    if margins_in is None:
        fig.tight_layout(rect=(0, (0.1 + 0.22 * rows) / fig.get_figheight(), 1, 1))
        _clear_of_title(fig)
        return
    left, right, bottom, top = margins_in
    width, height = fig.get_size_inches()
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)


def _clear_of_title(fig) -> None:
    """Lower the panels where tight_layout left them under the figure's title (it spares the
    title too little room in a tall figure: four rows of panels and more)."""
    title = next((t for t in fig.texts if t.get_text() == fig.get_suptitle()), None) if fig.get_suptitle() else None
    if title is None:
        return
    renderer = fig.canvas.get_renderer()
    visible = [ax for ax in fig.axes if ax.get_visible()]
    reach = max(ax.get_tightbbox(renderer).y1 for ax in visible)  # pixels, titles of the top row included
    floor = title.get_window_extent(renderer).y0 - 0.1 * fig.dpi  # a tenth of an inch below the title
    if reach > floor:  # never onto the bottom margin: panels a little under the title beat a crash
        top = fig.subplotpars.top - (reach - floor) / fig.bbox.height
        fig.subplots_adjust(top=max(top, fig.subplotpars.bottom + 0.05))


def kv_figure(panels: list[tuple[str, list[str], list[list[float]]]], rates: bool, title: str):
    """Where KV memory goes, as stacked bars: a panel per (name, bar labels, the per-cent share of
    each of KV_PARTS per bar), two panels a row; `rates`: the bars are request rates, one panel
    per system. A sweep's figure (plots.kv_breakdown) and a single run's (run_figure) both.

    Bars whose names would not fit under them, tilted (more than a few settings each, such as
    `max_num_batched_tokens=2560, max_num_seqs=64, preemption=swap`), lie on their side instead:
    a bar a line, its name to its left, one panel a row, the figure as tall as its bars need."""
    # bars per panel: the rates swept, or every point in the one panel
    bars = len({label for _, labels, _ in panels for label in labels}) if rates else len(panels[0][1])
    one_bar = not rates and len(panels) == 1 and bars == 1
    names = [label for _, labels, _ in panels for label in labels]
    lying = not (rates or one_bar) and max(map(len, names), default=0) * 0.065 * 0.94 > 2.2  # tilted 20°: > 2.2 in
    cols = 1 if lying else min(len(panels), 2)
    rows_n = cdiv(len(panels), cols)
    if lying:
        heights = [0.3 * len(labels) + 0.9 for _, labels, _ in panels]
        fig, axes = subplots(
            rows_n, 1, figsize=(MAX_WIDTH_IN, sum(heights) + 1.4), squeeze=False, sharex=True,
            gridspec_kw={"height_ratios": heights},
        )  # fmt: skip
    else:
        width = min(MAX_WIDTH_IN, max(KV_MIN_WIDTH_IN, (0.45 * bars + 1.5) * cols + 2))
        fig, axes = subplots(rows_n, cols, figsize=(width, 3.3 * rows_n + 1.2), squeeze=False, sharey=True)
    for ax, (name, labels, shares) in zip(axes.flat, panels):
        at, start = range(len(labels)), [0.0] * len(labels)
        for (_, text, color), values in zip(KV_PARTS, shares):
            if lying:
                stack = ax.barh(at, values, 0.8, left=start, color=color, label=text)
            else:
                stack = ax.bar(at, values, 0.8, bottom=start, color=color, label=text)
            shown = [f"{v:.0f}" if v >= 8 else "" for v in values]
            ax.bar_label(stack, labels=shown, label_type="center", fontsize=7, color="white")
            start = [b + v for b, v in zip(start, values)]
        ax.set_title(name, fontsize=10)
        if lying:  # the first point on top, as a table reads
            ax.set_yticks(at, labels, fontsize=8)
            ax.set_ylim(len(labels) - 0.35, -0.65)
            ax.set_xlim(0, 100)
            continue
        level = rates or one_bar
        ax.set_xticks(at, labels, rotation=0 if level else 20, ha="center" if level else "right")
        ax.set_xlim(-0.65, len(labels) - 0.35)
        ax.set_ylim(0, 100)
        if rates:
            ax.set_xlabel("request rate (req/s)")
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1, :] if lying else axes[:, 0]:
        (ax.set_xlabel if lying else ax.set_ylabel)("% of KV slots (time-averaged)")
    fig.suptitle(
        f"Where KV memory goes: {title}\n"
        "(the five categories of docs/paper.md; the paper files rounding under external & other)",
        fontsize=11,
    )
    legend_below(fig, axes.flat[0], ONE_BAR_MARGINS_IN if one_bar else None)
    return fig
