"""kvbench's decode-step bookkeeping beside nano-vllm's, side by side in one process.

One step is what a server's host does around the model for N running sequences that each
decode one token: kvbench's `Scheduler.schedule()` + `Engine._advance()` (block tables, prefix
cache, token and time bookkeeping) against nano-vllm's `Scheduler.schedule()` +
`Scheduler.postprocess()` (its block manager, xxhash prefix hashes). Both run the same N
sequences (prompts of 100..115 tokens, so they cross block boundaries on different steps),
prefix caching on (nano-vllm's is always on), rounds interleaved ABBA; medians and the paired
ratio's range are printed, and written as CSV with --csv.

nano-vllm is imported from a checkout you give (`--nano-vllm PATH`, the folder that holds its
`nanovllm` package; it needs `pip install xxhash`). Only its scheduler, block manager and
sequence are loaded: its package `__init__` and its `Config` load a model, so the config is
replaced by the four fields the scheduler reads, and its block-size assertion (a multiple of
256) does not apply, which lets both run at kvbench's default of 16.

  python scripts/bench_nano.py --nano-vllm ~/src/nano-vllm
  python scripts/bench_nano.py --nano-vllm ~/src/nano-vllm --block-size 16,256 --n 64,256,1024 --csv out.csv

Bad input (no such checkout, no xxhash, a bad number) is one line, exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import os
import statistics
import sys
import time
import types
from pathlib import Path

from bench_step import PROMPT, decoding_engine
from script_checks import writable_file

from kvbench.arith import cdiv
from kvbench.errors import ArgumentParser, UserError

# nano-vllm finds a step's new block by `len(seq) % block_size == 1`, never true at 1; kvbench's
# allocators take at most 256
BLOCK_SIZES = range(2, 257)


def prompt(i: int) -> list[int]:
    return [(i * 7919 + t) % 50_000 for t in range(PROMPT + i % 16)]


def kvbench_step(num_seqs: int, block_size: int, steps: int):
    """bench_step's decode set-up, prefix caching on, as a step to time."""
    scheduler, engine, _ = decoding_engine(num_seqs, True, block_size=block_size, steps=steps)

    def step():
        batch = scheduler.schedule()
        engine._advance(batch, [1] * len(batch.seqs), 0.0)
        return len(batch.seqs)

    return step


def load_nano(path: str):
    """nano-vllm's Scheduler, Sequence and SamplingParams from the checkout at `path`, without its
    package __init__ (which loads torch and a model) and with a config of the fields the
    scheduler reads."""
    root = Path(path).expanduser()
    package = root / "nanovllm"
    if not (package / "engine" / "scheduler.py").is_file():
        raise UserError(f"--nano-vllm {path}: no nanovllm/engine/scheduler.py there; give a nano-vllm checkout")
    try:
        import xxhash  # noqa: F401  (nano-vllm's block hashes)
    except ImportError:
        raise UserError("nano-vllm's block manager needs xxhash: pip install xxhash") from None
    nanovllm = types.ModuleType("nanovllm")
    nanovllm.__path__ = [str(package)]
    config = types.ModuleType("nanovllm.config")

    @dataclasses.dataclass
    class Config:  # what nano-vllm's Scheduler reads of its Config
        max_num_batched_tokens: int
        max_num_seqs: int
        kvcache_block_size: int
        num_kvcache_blocks: int
        eos: int = -1

    config.Config = Config
    sys.modules.update({"nanovllm": nanovllm, "nanovllm.config": config})
    scheduler = importlib.import_module("nanovllm.engine.scheduler")
    sequence = importlib.import_module("nanovllm.engine.sequence")
    sampling = importlib.import_module("nanovllm.sampling_params")
    return scheduler.Scheduler, sequence.Sequence, sampling.SamplingParams, Config


def nano_step(nano, num_seqs: int, block_size: int, steps: int):
    NanoScheduler, NanoSequence, SamplingParams, Config = nano
    NanoSequence.block_size = block_size  # a class attribute: its sequences count blocks by it
    scheduler = NanoScheduler(
        Config(
            max_num_batched_tokens=num_seqs * (PROMPT + 16),
            max_num_seqs=num_seqs,
            kvcache_block_size=block_size,
            # room for every sequence to decode for the whole run (its longest prompt, `steps` tokens)
            num_kvcache_blocks=num_seqs * cdiv(PROMPT + 16 + steps + 1, block_size),
        )
    )
    for i in range(num_seqs):
        scheduler.add(NanoSequence(prompt(i), SamplingParams(max_tokens=1 << 30, ignore_eos=True)))
    seqs, prefill = scheduler.schedule()
    assert prefill and len(seqs) == num_seqs, "nano-vllm did not prefill every prompt in one step"
    scheduler.postprocess(seqs, [0] * num_seqs, prefill)

    def step():
        seqs, prefill = scheduler.schedule()
        scheduler.postprocess(seqs, [1] * len(seqs), prefill)
        return len(seqs)

    return step


def timed(step, steps: int, num_seqs: int) -> float:
    """µs per step over `steps` steps; every one must have scheduled all `num_seqs`."""
    start = time.perf_counter()
    for _ in range(steps):
        if step() != num_seqs:
            raise RuntimeError("a step did not schedule every sequence: the pool is too small")
    return (time.perf_counter() - start) / steps * 1e6


def numbers(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise UserError(f"{name} {text}: give whole numbers separated by commas") from None
    if any(v < 1 for v in values):
        raise UserError(f"{name} {text}: every value must be >= 1")
    return values


def main(argv: list | None = None) -> int:
    parser = ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--nano-vllm", required=True, metavar="PATH", help="a nano-vllm checkout")
    parser.add_argument("--n", default="64,256,1024", help="running sequences (default 64,256,1024)")
    parser.add_argument("--block-size", default="16", help="block sizes (default 16)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds a side (default 7)")
    parser.add_argument("--steps", type=int, default=48, help="steps a round (default 48)")
    parser.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    args = parser.parse_args(argv)
    try:
        sizes, blocks = numbers(args.n, "--n"), numbers(args.block_size, "--block-size")
        if args.rounds < 1 or args.steps < 1:
            raise UserError("--rounds and --steps must be >= 1")
        if any(b not in BLOCK_SIZES for b in blocks):
            raise UserError(
                f"--block-size {args.block_size}: every value must be in 2..256 (nano-vllm's and kvbench's)"
            )
        if len(set(sizes)) < len(sizes) or len(set(blocks)) < len(blocks):
            raise UserError("--n and --block-size: give each value once")
        csv = writable_file(os.path.expanduser(args.csv), "--csv") if args.csv is not None else None
        nano = load_nano(args.nano_vllm)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = []
    try:  # the rows measured are written however the run ends
        gc.disable()  # a collection inside one side's round would be charged to it
        for block_size in blocks:
            for n in sizes:
                steps = args.rounds * args.steps  # room for every round's steps
                sides = {
                    "kvbench": kvbench_step(n, block_size, steps),
                    "nano-vllm": nano_step(nano, n, block_size, steps),
                }
                times = {name: [] for name in sides}
                ratios = []
                for r in range(args.rounds):
                    order = list(sides) if r % 2 == 0 else list(sides)[::-1]  # ABBA
                    for name in order:
                        times[name].append(timed(sides[name], args.steps, n))
                    ratios.append(times["kvbench"][-1] / times["nano-vllm"][-1])
                    gc.collect()
                k, v = statistics.median(times["kvbench"]), statistics.median(times["nano-vllm"])
                rows.append(
                    {
                        "block_size": block_size,
                        "num_seqs": n,
                        "kvbench_us": round(k, 1),
                        "nano_vllm_us": round(v, 1),
                        "ratio": round(k / v, 3),
                        "ratio_min": round(min(ratios), 3),
                        "ratio_max": round(max(ratios), 3),
                    }
                )
                print(
                    f"block {block_size:4d}, N = {n:5d}: kvbench {k:8.1f} us, nano-vllm {v:8.1f} us a step: "
                    f"{k / v:.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})",
                    flush=True,
                )
    finally:
        gc.enable()
        if csv is not None and rows:
            from kvbench.reporting.results import write_csv

            write_csv(csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
