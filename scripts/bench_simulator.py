"""Wall time of the simulator itself: 10,000 ShareGPT requests (all at t=0) per allocator.

    python scripts/bench_simulator.py [--requests 10000] [--allocators paged,contiguous]

Prints, per allocator, the wall time, simulated steps, and scheduler + allocator microseconds
per step (the part of the loop that runs for every sequence every step).
"""

import time

from hydra import compose, initialize_config_module
from script_checks import checked, run_main

from kvbench.errors import ArgumentParser
from kvbench.scenarios.run import run_point


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--allocators", default="paged,contiguous,oracle,pow2")
    args = parser.parse_args()
    names = args.allocators.split(",")
    if "" in names or len(set(names)) < len(names):
        parser.error(f"--allocators {args.allocators!r}: give each allocator once, comma-separated")
    configs = {}
    for allocator in names:  # every point checked as bench checks it, before the first one runs
        with initialize_config_module("kvbench.conf", version_base="1.3"):
            cfg = compose(
                "bench",
                overrides=[
                    f"+allocator={allocator}",
                    "workload.rate=inf",
                    f"workload.num_requests={args.requests}",
                    "progress=false",
                ],
            )
        configs[allocator] = checked(cfg)
    print(f"{'allocator':<12}{'wall_s':>8}{'steps':>9}{'mean_batch':>12}{'sched_us/step':>15}{'us/token':>13}")
    for allocator, cfg in configs.items():
        start = time.perf_counter()
        row = run_point(cfg)[0]
        wall = time.perf_counter() - start
        # a generated token is one sequence's step (mean_batch_size is time-weighted: no count)
        print(
            f"{allocator:<12}{wall:>8.2f}{row['steps']:>9}{row['mean_batch_size']:>12.1f}"
            f"{row['schedule_us_per_step']:>15.1f}{1e6 * wall / max(row['total_output_tokens'], 1):>13.2f}"
        )


if __name__ == "__main__":
    run_main(main)
