"""Fig. 19 of the PagedAttention paper: preemption by swapping vs by recomputation, per block size.

Simulated OPT-13B / A100-40GB serving ShareGPT-like lengths under memory pressure, paged blocks
of 1..256 tokens, each with engine.preemption=swap and =recompute. Reported: the modelled time
the run spent swapping (per copy latency x copies + bytes / PCIe bandwidth, a copy per block,
layer and K / V) or recomputing (the re-prefill FLOPs), per preemption, and the end-to-end
normalized latency. With --real, a few block sizes on the real engine (the tiny model on this
machine), where the measured swap time stands beside the model's.

    python scripts/preemption_sweep.py [--real] [--out results/preemption.csv]
"""

from __future__ import annotations

import sys

from hydra import compose, initialize_config_module
from script_checks import checked, run_main, writable_file

from kvbench.errors import ArgumentParser
from kvbench.reporting.results import write_csv
from kvbench.scenarios.run import run_point

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SIMULATED = ["workload=sharegpt", "workload.rate=4", "workload.duration_s=200"]
REAL = ["scenario=serve", "model=tiny", "scenario.num_requests=32", "scenario.kv_cache_tokens=2048"]
REAL_BLOCK_SIZES = (4, 16, 64)


def point(overrides: list[str]) -> dict:
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        return run_point(checked(compose("bench", overrides=[*overrides, "+allocator=paged", "progress=false"])))[0]


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="also measure a few block sizes on the real engine")
    parser.add_argument("--out", default="results/preemption.csv", help="the CSV to write (default: %(default)s)")
    args = parser.parse_args()
    out = writable_file(args.out, "--out")  # before the points, not after them
    sweeps = [("simulate", SIMULATED, BLOCK_SIZES)]
    if args.real:
        sweeps.append(("serve (tiny, cpu)", REAL, REAL_BLOCK_SIZES))
    rows = []
    print(
        f"{'engine':18} {'block':>5} {'mode':>9} {'preempt':>8} {'model ms/preempt':>17} "
        f"{'measured swap ms/preempt':>25} {'norm. latency s/tok':>20}"
    )
    for label, overrides, block_sizes in sweeps:
        for block_size in block_sizes:
            for mode in ("swap", "recompute"):
                row = point([*overrides, f"allocator.block_size={block_size}", f"engine.preemption={mode}"])
                preemptions = max(row["preemptions"], 1)
                model_s = row["swap_time_model_s"] + row["recompute_time_model_s"]
                measured = row.get("swap_time_s")
                rows.append(
                    {"engine": label, "mode": mode, "model_ms_per_preemption": 1e3 * model_s / preemptions, **row}
                )
                shown = f"{1e3 * measured / preemptions:25.3f}" if measured and mode == "swap" else f"{'-':>25}"
                print(
                    f"{label:18} {block_size:5d} {mode:>9} {row['preemptions']:8d} "
                    f"{1e3 * model_s / preemptions:17.3f} {shown} {row['normalized_latency_s_per_tok']:20.4f}",
                    flush=True,
                )
    write_csv(out, rows)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    run_main(main)
