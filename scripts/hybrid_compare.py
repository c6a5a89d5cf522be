"""Hybrid models in simulation: paged-as-full vs a static partition vs one shared pool.

For each hybrid shape (gpt-oss-like, gemma-3-like, qwen3-next-like) it serves the same
long-context workload (prompts of 8k-24k tokens, all arriving at once) with +allocator=hybrid
under each `allocator.policy`, and writes a table (CSV + markdown on stdout) and a plot of
the maximum number of requests served at once, throughput and KV waste.

    python scripts/hybrid_compare.py --out results/hybrid_compare [--requests 600]

Waste is the share of the KV pool that holds nothing a layer will read again: internal
fragmentation (stale window tokens, per-token KV of linear layers sized as attention), rounding
(block and page padding) and what is left free; reserved slots are about to be used and are not
waste.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from hydra import compose, initialize_config_module  # noqa: E402
from script_checks import checked, run_main, writable_folder  # noqa: E402

from kvbench.errors import ArgumentParser  # noqa: E402
from kvbench.reporting.results import write_atomic, write_bytes_atomic, write_csv  # noqa: E402
from kvbench.scenarios.run import run_point  # noqa: E402

MODELS = {  # model -> hardware overrides (qwen3-next-like's 160 GB of bf16 weights need two GPUs)
    "gpt-oss-like": ["hardware=h200"],
    "gemma-3-like": ["hardware=h200"],
    "qwen3-next-like": ["hardware=h200", "hardware.num_gpus=2"],
}
POLICIES = {"as_full": "paged-as-full", "static": "static partition", "shared": "hybrid (shared)"}
COLUMNS = [
    "model",
    "policy",
    "max_batch_size",
    "mean_batch_size",
    "request_throughput",
    "output_throughput",
    "kv_token_util",
    "kv_internal_frag_frac",
    "kv_rounding_frac",
    "waste_pct",
    "preemptions",
]


def workload(args) -> list[str]:
    return [
        "workload=uniform",
        f"workload.input_len={args.input_len}",
        "workload.range_ratio=0.5",
        f"workload.output_len={args.output_len}",
        "workload.rate=inf",
        f"workload.num_requests={args.requests}",
        "scheduler.chunked_prefill=true",
        "scheduler.max_num_batched_tokens=8192",
        "scheduler.max_num_seqs=1024",
        "progress=false",
    ]


def run_all(args) -> list[dict]:
    rows = []
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        for model, hardware in MODELS.items():
            for policy in POLICIES:
                cfg = compose(
                    "bench",
                    overrides=[
                        f"model={model}",
                        *hardware,
                        "+allocator=hybrid",
                        f"allocator.policy={policy}",
                        *workload(args),
                    ],
                )
                row = run_point(checked(cfg))[0]
                row["waste_pct"] = 100 * (1 - row["kv_token_util"] - row["kv_reserved_frac"])
                rows.append(row)
                print(
                    f"{model:16s} {policy:8s} max batch {row['max_batch_size']:4d}  "
                    f"{row['output_throughput']:8.1f} tok/s  waste {row['waste_pct']:5.1f}%",
                    flush=True,
                )
    return rows


def markdown(rows: list[dict]) -> str:
    head = (
        "| model | policy | max concurrent | mean batch | req/s | tok/s | token util | "
        "internal frag | rounding | waste | preemptions |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['model']} | {POLICIES[r['policy']]} | {r['max_batch_size']} | "
            f"{r['mean_batch_size']:.1f} | {r['request_throughput']:.3f} | "
            f"{r['output_throughput']:.0f} | {100 * r['kv_token_util']:.1f}% | "
            f"{100 * r['kv_internal_frag_frac']:.1f}% | {100 * r['kv_rounding_frac']:.1f}% | {r['waste_pct']:.1f}% | "
            f"{r['preemptions']} |"
        )
    return "\n".join(lines) + "\n"


def lengths(input_len: int) -> str:
    """The prompt lengths workload(): uniform within half the mean either side, `8k-24k`."""
    low, high = input_len - input_len // 2, input_len + input_len // 2

    def short(n: int) -> str:
        return f"{n / 1024:g}k" if n >= 1024 and n % 1024 == 0 else str(n)

    return f"{short(low)}-{short(high)}"


def plot(rows: list[dict], path: Path, input_len: int) -> None:
    metrics = [
        ("max_batch_size", "max concurrent requests"),
        ("output_throughput", "output tokens / s"),
        ("waste_pct", "KV waste %"),
    ]
    fig, axes = plt.subplots(1, len(metrics), figsize=(14, 4))
    models, width = list(MODELS), 0.27
    for ax, (key, title) in zip(axes, metrics):
        for i, policy in enumerate(POLICIES):
            values = [next(r[key] for r in rows if r["model"] == m and r["policy"] == policy) for m in models]
            ax.bar([x + (i - 1) * width for x in range(len(models))], values, width, label=POLICIES[policy])
        ax.set_xticks(range(len(models)), models, fontsize=8)
        ax.set_title(title)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(POLICIES), fontsize=8)
    fig.suptitle(
        f"hybrid models, prompts of uniform {lengths(input_len)} tokens, all requests at t=0, H200 "
        f"(qwen3-next-like: 2 x H200)"
    )
    fig.subplots_adjust(bottom=0.2)  # the legend below the panels, not over the first one's bars
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_bytes_atomic(path, buffer.getvalue())


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/hybrid_compare", help="the folder to write into")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--input-len", type=int, default=16384)
    parser.add_argument("--output-len", type=int, default=512)
    args = parser.parse_args()
    args.out = writable_folder(args.out, "--out")  # before the runs, not after them
    rows = run_all(args)
    write_csv(args.out / "hybrid_compare.csv", [{k: r[k] for k in COLUMNS} | r for r in rows])
    table = markdown(rows)
    write_atomic(args.out / "hybrid_compare.md", table)
    plot(rows, args.out / "hybrid_compare.png", args.input_len)
    print(table)
    print(f"wrote {args.out}/hybrid_compare.csv, .md, .png")


if __name__ == "__main__":
    run_main(main)
