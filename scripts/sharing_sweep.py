"""Fig. 14 / 15 of the PagedAttention paper: the share of KV blocks that sharing saves.

Parallel sampling (n = 2, 4, 6) and beam search (width 2, 4, 6) on Alpaca-like and ShareGPT-like
lengths, simulated on OPT-13B / A100-40GB with paged blocks of 16 (the simulator's beams pick
their parents at random). With --real, a few points on the real engine: the tiny model on this
machine, Alpaca-like lengths, real beam search. Saved = 1 - blocks held / blocks the sequences'
block tables name, averaged over the run weighted by step time.

Preemption is by swap, as vLLM did for requests of several sequences: recomputing re-prefills
each sample or beam on its own, so a preempted request would lose its sharing.

    python scripts/sharing_sweep.py [--real] [--out sharing.csv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydra import compose, initialize_config_module

import kvbench.scenarios.serve
import kvbench.scenarios.simulate
from kvbench.reporting.results import write_csv
from kvbench.scenarios.run import run_point

SIMULATED = {  # workload -> overrides that keep OPT-13B's KV pool busy
    "alpaca": ["workload=alpaca", "workload.rate=20", "workload.duration_s=40"],
    "sharegpt": ["workload=sharegpt", "workload.rate=1.5", "workload.duration_s=300"],
}
REAL = ["scenario=serve", "model=tiny", "workload=alpaca", "scenario.num_requests=24"]
SHARING = [("n", 2), ("n", 4), ("n", 6), ("beam_width", 2), ("beam_width", 4), ("beam_width", 6)]


class BlockSharing:
    """Wraps an engine's executor; per step: blocks held and blocks the block tables name."""

    def __init__(self, engine):
        self.allocator, self.execute = engine.allocator, engine.executor.execute
        engine.executor.execute = self
        self.held = self.named = 0.0

    def __call__(self, batch):
        pool = self.allocator
        held = (pool.num_slots - pool.accounting().free) // pool.block_size
        named = sum(len(table) for table in pool.block_tables.values())
        result = self.execute(batch)
        self.held += held * result.duration_s
        self.named += named * result.duration_s
        return result


def measured(overrides: list[str]) -> dict:
    """Run one point with its engine's block sharing watched."""
    watchers = []

    def build(*args, **kwargs):
        engine = build_engine(*args, **kwargs)
        watchers.append(BlockSharing(engine))
        return engine

    build_engine = kvbench.scenarios.simulate.build_engine
    kvbench.scenarios.simulate.build_engine = kvbench.scenarios.serve.build_engine = build
    try:
        with initialize_config_module("kvbench.conf", version_base="1.3"):
            overrides = [*overrides, "+allocator=paged", "engine.preemption=swap", "progress=false"]
            row = run_point(compose("bench", overrides=overrides))[0]
    finally:
        kvbench.scenarios.simulate.build_engine = kvbench.scenarios.serve.build_engine = build_engine
    watch = watchers[0]
    row["blocks_saved_pct"] = 100 * (1 - watch.held / watch.named) if watch.named else 0.0
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="also measure a few points on the real engine")
    parser.add_argument("--out", default="sharing.csv")
    args = parser.parse_args()
    points = [(f"simulate/{name}", overrides) for name, overrides in SIMULATED.items()]
    if args.real:
        points.append(("serve/alpaca (tiny, cpu)", REAL))
    rows = []
    print(
        f"{'engine/workload':28} {'sharing':>14} {'blocks saved':>13} {'copies':>8} {'mean batch':>11} "
        f"{'preemptions':>12}"
    )
    for label, overrides in points:
        for knob, value in SHARING:
            if label.startswith("serve") and value == 6:
                continue
            row = measured([*overrides, f"workload.{knob}={value}"])
            rows.append({"point": label, "sharing": f"{knob}={value}", **row})
            print(
                f"{label:28} {knob + '=' + str(value):>14} {row['blocks_saved_pct']:12.1f}% "
                f"{row['copies']:8d} {row['mean_batch_size']:11.1f} {row['preemptions']:12d}",
                flush=True,
            )
    write_csv(Path(args.out), rows)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
