"""The paper's figures as kvbench draws them: Fig. 2 in the paper's four categories (rounding
hatched inside "external fragmentation & other"), Fig. 12's latency curves with each system's
knee at the latency target, and Fig. 14 / 15's blocks saved by sharing against the paper's ranges."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kvbench.reporting.figures import save_figure  # noqa: E402
from kvbench.reporting.paper import FIG14_15, PAPER_ORDER, SHARING, SYSTEMS, number  # noqa: E402

COLORS = {
    "token states": "#2b8a3e",
    "reservation": "#f08c00",
    "internal fragmentation": "#c92a2a",
    "external fragmentation & other": "#868e96",
}


def _mean(rows: list[dict], key: str) -> float:
    values = [number(r, key) for r in rows]
    return sum(values) / len(values)


def fig2_breakdown(rows: list[dict], out: Path) -> Path:
    """One bar per system; the rounding part of "external & other" is hatched."""
    systems = [a for a in PAPER_ORDER if any(r.get("allocator") == a for r in rows)]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, allocator in enumerate(systems):
        mine = [r for r in rows if r.get("allocator") == allocator]
        parts = [
            ("token states", _mean(mine, "kv_token_util"), None),
            ("reservation", _mean(mine, "kv_reserved_frac"), None),
            ("internal fragmentation", _mean(mine, "kv_internal_frag_frac"), None),
            ("external fragmentation & other", _mean(mine, "kv_rounding_frac"), "//"),
            ("external fragmentation & other", _mean(mine, "kv_external_frag_frac"), None),
        ]
        bottom = 0.0
        for name, share, hatch in parts:
            value = 100 * share
            ax.bar(
                i,
                value,
                bottom=bottom,
                color=COLORS[name],
                hatch=hatch,
                edgecolor="white",
                label=name if i == 0 and hatch is None else None,
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
    ax.set_title("Where KV memory goes, in the paper's Fig. 2 categories")
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
    workloads = sorted({r.get("workload") for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        series = defaultdict(lambda: defaultdict(list))
        for r in rows:
            if r.get("workload") == workload:
                series[r.get("allocator")][number(r, "rate")].append(number(r, "normalized_latency_s_per_tok"))
        for allocator in [a for a in PAPER_ORDER if a in series]:
            rates = sorted(series[allocator])
            (line,) = ax.plot(
                rates,
                [sum(series[allocator][x]) / len(series[allocator][x]) for x in rates],
                marker="o",
                label=SYSTEMS[allocator],
            )
            knee = capacity.get((workload, allocator))
            if knee is not None:
                ax.axvline(knee, color=line.get_color(), linestyle=":", linewidth=1)
        ax.axhline(slo, color="black", linestyle="--", linewidth=1, label=f"target {slo:g} s/token")
        ax.set_yscale("log")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("normalized latency (s/token)")
        ax.set_title(f"OPT-13B, {workload}: capacity = rate at the target (dotted)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out / "fig12_latency.png")


def sharing_savings(points: dict, out: Path) -> Path:
    """One panel per sharing mode: % of blocks saved against the width, per workload, over the
    paper's range for that workload (shaded)."""
    fig, axes = plt.subplots(1, len(SHARING), figsize=(10, 4), squeeze=False)
    for ax, (mode, (name, knob)) in zip(axes[0], SHARING.items()):
        for workload in dict.fromkeys(w for w, m in FIG14_15 if m == mode):
            mine = {width: rows for (w, m, width), rows in points.items() if (w, m) == (workload, mode)}
            if not mine:
                continue
            widths = sorted(mine)
            (line,) = ax.plot(
                widths, [100 * _mean(mine[x], "kv_blocks_saved_frac") for x in widths], marker="o", label=workload
            )
            low, high = FIG14_15[(workload, mode)]
            ax.axhspan(low, high, color=line.get_color(), alpha=0.15, label=f"{workload}: paper {low:g}-{high:g} %")
        ax.set_xticks(sorted({width for _, m, width in points if m == mode}))
        ax.set_xlabel(knob)
        ax.set_ylabel("% of KV blocks saved by sharing")
        ax.set_ylim(0, 100)
        ax.set_title(f"OPT-13B, {name}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out / "fig14_15_sharing.png")
