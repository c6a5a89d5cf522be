"""The paper's figures as kvbench draws them: Fig. 2 in the paper's four categories (rounding
hatched inside "external fragmentation & other"), Fig. 12's latency curves with each system's
knee at the latency target, and Fig. 14 / 15's blocks saved by sharing against the paper's ranges."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvbench.reporting.figures import SYSTEM_COLORS, legend_below, rate_axis, save_figure, subplots
from kvbench.reporting.paper import FIG2_PARTS, FIG14_15, PAPER_ORDER, SHARING, SYSTEMS, ran_on

COLORS = {
    "token states": "#2b8a3e",
    "reservation": "#f08c00",
    "internal fragmentation": "#c92a2a",
    "external fragmentation & other": "#868e96",
}


def _numbers(rows: list[dict], *columns: str) -> pd.DataFrame:
    """The text cells of `rows` as a frame, `columns` as numbers (a blank or bad cell is NaN)."""
    frame = pd.DataFrame(rows)
    return frame.assign(**{c: pd.to_numeric(frame[c], errors="coerce") for c in columns})


def _setup(frame: pd.DataFrame) -> str:
    """What the points ran, for a title: `opt-13b on a100-40gb` (the run's own, not the paper's:
    an experiment may run another model or GPU); a served point names the device it ran on, as
    paper.setup_lines does."""
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")  # a NaN cell: none
    models, places = {str(row.get("model") or "") for row in rows}, {ran_on(row) for row in rows}
    return f"{' / '.join(sorted(models - {''})) or '?'} on {' / '.join(sorted(places - {''})) or '?'}"


def fig2_breakdown(rows: list[dict], out: Path) -> Path:
    """One bar per system; the rounding part of "external & other" is hatched."""
    # the paper's categories, rounding hatched inside "external fragmentation & other"
    parts = [(name, column, "//" * (column == "kv_rounding_frac")) for name, cs in FIG2_PARTS.items() for column in cs]
    means = _numbers(rows, *(c for _, c, _ in parts)).groupby("allocator")[[c for _, c, _ in parts]].mean()
    systems = [a for a in PAPER_ORDER if a in means.index]
    fig, ax = subplots(figsize=(7, 4.2))
    for i, allocator in enumerate(systems):
        bottom = 0.0
        for (name, _, hatch), share in zip(parts, means.loc[allocator]):
            value = 100 * share
            ax.bar(
                i,
                value,
                bottom=bottom,
                color=COLORS[name],
                hatch=hatch or None,
                edgecolor="white",
                label=name if i == 0 and not hatch else None,
            )
            if value >= 4:
                ax.text(i, bottom + value / 2, f"{value:.1f}", ha="center", va="center", fontsize=8, color="white")
            bottom += value
    ax.bar(
        0,
        0,
        color=COLORS["external fragmentation & other"],
        hatch="//",
        edgecolor="white",
        label="  of which rounding (blocks, buddy chunks)",
    )
    ax.set_xticks(range(len(systems)), [SYSTEMS[a] for a in systems])
    ax.set_ylabel("% of KV cache slots (time-averaged)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Where KV memory goes ({_setup(pd.DataFrame(rows))}), in the paper's Fig. 2 categories")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    fig.text(
        0.01,
        -0.04,
        'As the paper files them, block and buddy rounding are part of "external '
        'fragmentation & other" (hatched).\nCategories: docs/paper.md.',
        fontsize=8,
        va="top",
    )
    return save_figure(fig, out / "fig2_breakdown.png")


def latency_knees(rows: list[dict], capacity: dict, slo: float, out: Path) -> Path:
    """Normalized latency against rate, per workload, with the target and each system's knee."""
    frame = _numbers(rows, "rate", "normalized_latency_s_per_tok")
    workloads = sorted(frame["workload"].unique())
    fig, axes = subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        curves = frame[frame["workload"] == workload].pivot_table(
            index="rate", columns="allocator", values="normalized_latency_s_per_tok"
        )  # the mean over seeds at each rate
        for allocator in [a for a in PAPER_ORDER if a in curves]:
            (line,) = ax.plot(
                curves[allocator].dropna(), marker="o", label=SYSTEMS[allocator], color=SYSTEM_COLORS.get(allocator)
            )  # each system's colour in every kvbench figure
            knee = capacity.get((workload, allocator))
            if knee is not None:
                ax.axvline(knee, color=line.get_color(), linestyle=":", linewidth=1)
        ax.axhline(slo, color="black", linestyle="--", linewidth=1, label=f"target {slo:g} s/token")
        ax.set_yscale("log")
        rate_axis(ax, curves.index)
        ax.set_ylabel("normalized latency (s/token)")
        ax.set_title(f"{_setup(frame)}, {workload}:\ncapacity = rate at the target (dotted)")
    legend_below(fig, axes[0][0])  # one legend under both: inside a panel it sat on vLLM's knee
    return save_figure(fig, out / "fig12_latency.png")


def sharing_savings(points: dict, out: Path) -> Path:
    """One panel per sharing mode: % of blocks saved against the width, per workload, over the
    paper's range for that workload (shaded)."""
    modes = {mode: names for mode, names in SHARING.items() if any(m == mode for _, m, _ in points)}  # that ran
    fig, axes = subplots(1, len(modes), figsize=(5 * len(modes), 4), squeeze=False)
    for ax, (mode, (name, knob)) in zip(axes[0], modes.items()):
        for workload in dict.fromkeys(w for w, m in FIG14_15 if m == mode):
            mine = {width: rows for (w, m, width), rows in points.items() if (w, m) == (workload, mode)}
            if not mine:
                continue
            widths = sorted(mine)
            (line,) = ax.plot(
                widths,
                [100 * _numbers(mine[x], "kv_blocks_saved_frac")["kv_blocks_saved_frac"].mean() for x in widths],
                marker="o",
                label=workload,
            )
            low, high = FIG14_15[(workload, mode)]
            ax.axhspan(low, high, color=line.get_color(), alpha=0.15, label=f"{workload}: paper {low:g}-{high:g} %")
        ax.set_xticks(sorted({width for _, m, width in points if m == mode}))
        ax.set_xlabel(knob)
        ax.set_ylabel("% of KV blocks saved by sharing")
        ax.set_ylim(0, 100)
        ax.set_title(f"{_setup(pd.DataFrame([r for rows in points.values() for r in rows]))}, {name}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out / "fig14_15_sharing.png")
