"""The comparison plots of a sweep: where KV memory goes (the paper's Fig. 2), throughput and
normalized latency per point, and normalized latency against request rate (Fig. 12)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kvbench.reporting.figures import number, save_figure  # noqa: E402
from kvbench.reporting.results import IDENTITY  # noqa: E402

ALLOCATOR_ORDER = ("contiguous", "pow2", "oracle", "paged", "hybrid")
KV_PARTS = [
    ("kv_token_util", "token states", "#2b8a3e"),
    ("kv_reserved_frac", "reserved", "#f08c00"),
    ("kv_internal_frag_frac", "internal fragmentation", "#c92a2a"),
    ("kv_rounding_frac", "rounding (blocks, buddy chunks)", "#e599f7"),
    ("kv_external_frag_frac", "external fragmentation & free", "#868e96"),
]


def varying_keys(rows: list[dict]) -> list[str]:
    """The columns that tell points apart. A swept `group.key` whose `key` is already an identity
    column (workload.rate -> rate, allocator.block_size -> block_size) is not named twice."""
    named = IDENTITY + ["block_size", "rate"]
    columns = dict.fromkeys(k for row in rows for k in row)
    swept = sorted(k for k in columns if "." in k and k.rsplit(".", 1)[-1] not in named)
    return [k for k in named + swept if len({r.get(k, "") for r in rows}) > 1]


def label(row: dict, keys: list[str]) -> str:
    if not keys:
        return row.get("allocator", "point")
    return ", ".join(str(row.get(k, "")) if k == "allocator" else f"{k.split('.')[-1]}={row.get(k, '')}"
                     for k in keys)



def kv_breakdown(rows: list[dict], out: Path) -> Path:
    keys = varying_keys(rows)
    names = [label(r, keys) for r in rows]
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows) + 2), 4))
    bottom = [0.0] * len(rows)
    for key, text, color in KV_PARTS:
        values = [100 * number(r, key) for r in rows]
        ax.bar(names, values, bottom=bottom, label=text, color=color)
        for i, v in enumerate(values):
            if v >= 4:
                ax.text(i, bottom[i] + v / 2, f"{v:.1f}", ha="center", va="center", fontsize=8, color="white")
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("% of KV cache slots (time-averaged)")
    ax.set_ylim(0, 100)
    ax.set_title("Where KV memory goes (the five categories of docs/paper.md)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    return save_figure(fig, out / "kv_breakdown.png")


def throughput_latency(rows: list[dict], out: Path) -> Path:
    keys = varying_keys(rows)
    names = [label(r, keys) for r in rows]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(max(10, 1.6 * len(rows) + 6), 3.8))
    a.bar(names, [number(r, "throughput_req_s") for r in rows], color="#1971c2")
    a.set_ylabel("throughput (req/s)")
    b.bar(names, [number(r, "mean_batch_size") for r in rows], color="#5f3dc4")
    b.set_ylabel("mean batch size (sequences)")
    c.bar(names, [number(r, "normalized_latency_s_per_tok") for r in rows], color="#e8590c")
    c.set_ylabel("normalized latency (s/token)")
    for ax in (a, b, c):
        plt.setp(ax.get_xticklabels(), rotation=25, ha="right")
    fig.tight_layout()
    return save_figure(fig, out / "throughput_latency.png")


def latency_vs_rate(rows: list[dict], out: Path) -> Path:
    series = defaultdict(list)
    others = [k for k in varying_keys(rows) if k not in ("rate", "workload.rate")]
    for r in rows:
        series[label(r, others)].append((number(r, "rate"), number(r, "normalized_latency_s_per_tok")))
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.set_yscale("log")
    ax.set_title("Normalized latency against request rate")
    ax.legend(fontsize=8)
    return save_figure(fig, out / "latency_vs_rate.png")


def draw_all(rows: list[dict], out: Path) -> list[Path]:
    """Every plot the rows support; scenarios without serving metrics contribute their own."""
    ok = [r for r in rows if r.get("status", "ok") == "ok"]
    # the paper's order: the more an allocator reserves, the further left
    rank = {name: i for i, name in enumerate(ALLOCATOR_ORDER)}
    serving = sorted((r for r in ok if r.get("kv_token_util") not in (None, "")),
                     key=lambda r: rank.get(r.get("allocator"), len(rank)))
    written = []
    if serving:
        written += [kv_breakdown(serving, out), throughput_latency(serving, out)]
        if len({r.get("rate") for r in serving}) > 1:
            written.append(latency_vs_rate(serving, out))
    kernel = [r for r in ok if r.get("latency_us_p50") not in (None, "")]
    if kernel:
        from kvbench.reporting.kernel_plots import latency_vs_context

        written.append(latency_vs_context(kernel, out))
    return written
