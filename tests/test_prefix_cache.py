"""Prefix caching: chained block hashes against a token-level radix tree.

With a shared system prompt the block cache finds at most what the radix tree finds (it reuses
whole blocks only), and exactly as much at block size 1. A hit never covers a prompt's last
token; freed blocks stay cached and are evicted least recently freed first, a sequence's tail
before its head, and only once no never-cached block is free.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from hydra import compose, initialize_config_module

from kvbench.core.radix import RadixTree, radix_hit_rate
from kvbench.core.sequence import Request, Sequence
from kvbench.core.workload import generate
from kvbench.executors.cost_model import CostModelExecutor
from kvbench.plugins.allocators.paged import PagedAllocator
from kvbench.scenarios.build import build_engine, load_specs
from kvbench.scenarios.run import run_point


def test_radix_tree_matches_token_by_token_across_split_edges():
    tree = RadixTree()
    tree.insert([1, 2, 3, 4])
    tree.insert([1, 2, 5])  # splits the edge after [1, 2]
    assert tree.match([1, 2, 3, 9]) == 3
    assert tree.match([1, 2, 5, 6]) == 3
    assert tree.match([1, 2, 3, 4, 5]) == 4
    assert tree.match([7, 1]) == 0


def test_radix_hit_rate_never_covers_the_last_prompt_token():
    assert radix_hit_rate([[1, 2, 3], [1, 2, 3]]) == pytest.approx(2 / 6)


def shared_prefix_config(block_size: int, extra=()):
    overrides = [
        "workload=uniform",
        "workload.num_requests=40",
        "workload.rate=inf",
        "workload.input_len=40",
        "workload.output_len=8",
        "workload.prefix_len=50",
        "workload.num_prefixes=3",
        "+allocator=paged",
        f"allocator.block_size={block_size}",
        "allocator.prefix_caching=true",
        "progress=false",
        *extra,
    ]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        return compose("bench", overrides=overrides)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_block_hash_hit_rate_is_at_most_the_radix_trees_and_equal_at_block_size_1(block_size):
    cfg = shared_prefix_config(block_size)
    model, hardware = load_specs(cfg)
    requests = generate(dict(cfg.workload), 0, model.max_model_len)
    engine = build_engine(cfg, model, 200_000, lambda allocator: CostModelExecutor(model, hardware))
    block_rate = engine.run(requests)["prefix_hit_rate"]
    radix_rate = radix_hit_rate(r.prompt_tokens for r in requests)
    assert 0.3 < block_rate <= radix_rate
    if block_size == 1:
        assert block_rate == radix_rate


def test_real_engine_reports_both_hit_rates_and_they_agree_at_block_size_1():
    cfg = shared_prefix_config(
        1,
        ["scenario=serve", "model=tiny", "workload.num_requests=8", "workload.input_len=10", "workload.prefix_len=20"],
    )
    row = run_point(cfg)[0]
    assert row["prefix_hit_rate"] == row["prefix_hit_rate_radix"] > 0.3


def admitted(pool: PagedAllocator, tokens) -> Sequence:
    seq = Sequence(
        len(pool.block_tables) + 100 * pool.prefix_query_tokens,
        Request(0, 0.0, len(tokens), 4),
        len(tokens),
        token_ids=list(tokens),
    )
    assert pool.admit(seq)
    assert pool.grow(seq, seq.num_tokens - seq.num_computed)
    seq.num_computed = seq.num_tokens
    return seq


def test_a_hit_never_covers_the_last_prompt_token():
    pool = PagedAllocator(num_slots=64, max_model_len=64, block_size=4, watermark=0.0, prefix_caching=True)
    admitted(pool, range(16))
    assert admitted(pool, range(16)).num_cached == 12  # the 4th block holds the last token
    assert admitted(pool, range(17)).num_cached == 16


def test_freed_blocks_stay_cached_and_the_tail_is_evicted_first():
    pool = PagedAllocator(num_slots=32, max_model_len=64, block_size=4, watermark=0.0, prefix_caching=True)
    pool.free(admitted(pool, range(12)))  # 3 full blocks, freed tail first
    pool.free(admitted(pool, np.arange(100, 120)))  # the 5 never-cached blocks went first
    assert len(pool.pool.cached) == 8 and not pool.pool.free
    admitted(pool, np.arange(200, 204))  # evicts the least recently freed: the first's tail
    assert admitted(pool, list(range(12)) + [7]).num_cached == 8


def test_cached_blocks_count_as_free_until_hit():
    pool = PagedAllocator(num_slots=32, max_model_len=64, block_size=4, watermark=0.0, prefix_caching=True)
    pool.free(admitted(pool, range(12)))
    assert pool.accounting().free == 32
    admitted(pool, range(13))
    assert pool.accounting().token == 13  # three revived blocks and one new token


def test_a_refused_head_hashes_its_prompt_once_however_often_it_is_refused(monkeypatch):
    """The head of the queue, refused for want of blocks, is tried again every step: its whole
    prefix was hashed again each time (15 % of a cached run's loop). Its lookups still see what
    was cached since. One entry is kept, the last sequence's looked up, and goes once it is
    admitted: a queue emptied some other way (a profile's timer clears its own) leaves no more."""
    import kvbench.plugins.allocators.paged as paged

    hashed = []
    real = paged.hash_block
    monkeypatch.setattr(paged, "hash_block", lambda parent, block: hashed.append(1) or real(parent, block))
    pool = PagedAllocator(num_slots=32, max_model_len=64, block_size=4, watermark=0.0, prefix_caching=True)
    running = admitted(pool, range(100, 124))  # 6 of the 8 blocks
    waiting = Sequence(999, Request(1, 0.0, 17, 4), 17, token_ids=list(range(17)))
    hashed.clear()
    for _ in range(5):
        assert not pool.admit(waiting)  # 5 blocks wanted, 2 free
    assert len(hashed) == 1  # its first block, not cached: the lookup stops there, and is kept
    pool.free(running)
    admitted(pool, range(12))  # caches the waiting prompt's first three blocks
    hashed.clear()
    assert pool.admit(waiting) and waiting.num_cached == 12
    assert len(hashed) == 4  # another's lookup took the one entry kept: hashed again, to its first miss
    assert pool._waiting_chain == (-1, [])  # admitted: its hashes are its blocks' now


HASHES_OF_A_PROMPT = """
import numpy as np
from kvbench.plugins.allocators.block_pool import BlockPool
from kvbench.plugins.allocators.hybrid_attention import AttentionManager
from kvbench.plugins.allocators.paged import PagedAllocator
from kvbench.core.sequence import Request, Sequence
tokens = list(np.arange(64) * 7919 % 50_000)
pool = PagedAllocator(256, 256, block_size=16, prefix_caching=True)
seq = Sequence(0, Request(0, 0.0, 64, 4), 64, token_ids=tokens)
assert pool.admit(seq) and pool.grow(seq, 64)
window = AttentionManager("window", BlockPool(8), 16, 1)
print(pool._hashes[0], window.chain(tokens, 4))
"""


def test_block_hashes_are_equal_in_processes_with_different_hash_seeds():
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run(
            [sys.executable, "-c", HASHES_OF_A_PROMPT], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(run.stdout)
    assert len(outputs) == 1
    paged, window = eval(outputs.pop().replace("] [", "], ["))
    assert len(paged) == len(window) == 4 and not set(paged) & set(window)  # kinds never collide


def test_evicting_one_of_two_blocks_with_the_same_content_keeps_it_findable():
    """The second prompt recomputes the first's last block (a hit never covers the last token),
    so two blocks hold tokens 4..7; when the first copy is evicted the second still serves it."""
    pool = PagedAllocator(num_slots=16, max_model_len=64, block_size=4, watermark=0.0, prefix_caching=True)
    first = admitted(pool, range(8))
    second = admitted(pool, range(8))
    assert second.num_cached == 4
    last_of_first = pool.block_tables[first.seq_id][1]
    pool.free(first)  # its last block is free but named; its first is still held by `second`
    other = admitted(pool, np.arange(100, 108))  # the one never-named free block, then it
    assert pool.block_tables[other.seq_id][1] == last_of_first
    pool.free(other)
    assert admitted(pool, list(range(8)) + [9]).num_cached == 8


def test_a_lookup_finds_the_oldest_copy_once_the_first_is_evicted():
    """Three prompts alike leave three blocks holding tokens 4..7 (each recomputes the last); once
    the first is evicted, a lookup takes the second, as vLLM's hash map gives its oldest surviving
    entry (the newest diverged from vLLM where that copy was freed and the other kept)."""
    pool = PagedAllocator(num_slots=20, max_model_len=64, block_size=4, watermark=0.0, prefix_caching=True)
    first, second, third = (admitted(pool, range(8)) for _ in range(3))
    copies = [pool.block_tables[seq.seq_id][1] for seq in (first, second, third)]
    assert len(set(copies)) == 3
    for seq in (first, second, third):
        pool.free(seq)
    other = admitted(pool, np.arange(100, 108))  # the never-named free block, then the first copy
    assert copies[0] in pool.block_tables[other.seq_id]
    again = admitted(pool, list(range(8)) + [9])
    assert again.num_cached == 8 and pool.block_tables[again.seq_id][1] == copies[1]


@pytest.mark.parametrize(
    "system",
    [
        ["+allocator=paged"],
        ["+allocator=hybrid", "model=gpt-oss-like", "hardware=h100-sxm", "engine.kv_cache_bytes=4e8"],
    ],
    ids=["paged", "hybrid"],
)
def test_a_preempted_request_finding_its_own_blocks_again_is_no_prefix_hit(system, tmp_path):
    """The hit rate is over each request's first admission (vLLM counts a preempted request's
    lookups apart): re-admitted victims finding their own prompt and output cached lifted it
    above the radix tree's bound on the workload's prompts."""
    import pandas as pd

    from kvbench import cli

    from helpers.cli import in_process

    pressed = [] if len(system) > 1 else ["engine.kv_cache_bytes=2.5e9"]
    args = [*system, *pressed, "allocator.prefix_caching=true", "workload.prefix_len=200", "workload.num_prefixes=4"]
    run = [*args, "workload.num_requests=300", "plots=false", "progress=false", f"hydra.run.dir={tmp_path}"]
    assert in_process(lambda: cli.main(run)).returncode == 0
    row = pd.read_csv(tmp_path / "metrics.csv").iloc[0]
    requests = pd.read_json(tmp_path / "requests.jsonl", lines=True)
    assert row["preemptions"] > 20
    assert row["prefix_hit_rate"] == pytest.approx(requests["cached_tokens"].sum() / requests["input_len"].sum())
    assert 0.2 < row["prefix_hit_rate"] <= row["prefix_hit_rate_radix"]
    assert (requests["cached_tokens"] < requests["input_len"]).all()  # never the last prompt token


def test_blocks_swapped_back_in_are_found_by_a_later_prompt_once_their_first_copies_are_gone():
    """A's four full blocks are swapped out, their pool copies evicted by C, then swapped back in:
    they held the prompt again, but were never named, so D with A's prompt found nothing."""
    block = 4
    allocator = PagedAllocator(10 * block, 256, block_size=block, watermark=0.0, prefix_caching=True)
    allocator.enable_swap(100)
    prompt = list(range(17))  # four full blocks and one token

    def seq(seq_id, tokens):
        return Sequence(seq_id, Request(seq_id, 0.0, len(tokens), 8, np.array(tokens)), len(tokens), token_ids=tokens)

    a = seq(0, prompt)
    assert allocator.admit(a) and allocator.grow(a, 17)
    a.num_computed = 17
    assert allocator.swap_out([a])
    c = seq(1, [100 + t for t in range(40)])  # takes every block, the evictable copies of A's among them
    assert allocator.admit(c) and allocator.grow(c, 40)
    c.num_computed = 40
    allocator.free(c)
    assert allocator.swap_in([a])
    d = seq(2, list(prompt))
    assert allocator.admit(d) and d.num_cached == 16
    assert allocator.block_table(d)[:4] == allocator.block_table(a)[:4]  # the swapped-in blocks, shared


def test_blocks_an_undone_admission_named_are_not_found_by_the_next():
    """The scheduler names a prompt's full blocks when it grows the sequence, before the forward
    writes them. An admission undone before its step ran (a group whose last sample did not
    fit) leaves blocks nobody computed: free_unrun takes them out of the cache, where free keeps
    a finished sequence's blocks findable."""
    pool = PagedAllocator(num_slots=64, max_model_len=64, block_size=4, watermark=0.0, prefix_caching=True)
    undone = Sequence(1, Request(0, 0.0, 13, 4), 13, token_ids=list(range(13)))
    assert pool.admit(undone) and pool.grow(undone, 13)  # names 3 blocks; num_computed stays 0
    pool.free_unrun([undone])
    assert not pool.pool.cached and len(pool.pool.free) == 16 and not pool.pool.evictable
    assert admitted(pool, range(13)).num_cached == 0
    pool.free(admitted(pool, range(100, 113)))  # a computed one's blocks stay findable
    assert admitted(pool, range(100, 113)).num_cached == 12


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_a_growth_undone_by_preempting_its_group_leaves_its_block_unfindable(preemption):
    """A group's member grows into a full block (named), then the round preempts the group itself
    before the step runs: swapped out, the block kept its name and a later admission hit a token
    nobody computed (8 tokens found where 7 were computed); freed, it is unnamed too."""
    from kvbench.core.scheduler import Batch, Scheduler
    from kvbench.core.sequence import SeqStatus

    pool = PagedAllocator(num_slots=64, max_model_len=64, block_size=4, watermark=0.0, prefix_caching=True)
    pool.enable_swap(64)
    scheduler = Scheduler(pool, preemption=preemption)
    grown = Sequence(1, Request(0, 0.0, 7, 4), 7, token_ids=list(range(8)))
    assert pool.admit(grown) and pool.grow(grown, 7)
    grown.num_computed, grown.num_tokens, grown.status = 7, 8, SeqStatus.RUNNING  # one token sampled
    scheduler._run(grown)
    scheduler.num_running_seqs += 1
    assert pool.grow(grown, 1)  # its 8th token fills block 1, which is named
    scheduler.preempt(grown, Batch(), unrun=True)
    assert (pool.swapped_blocks > 0) == (preemption == "swap")
    later = Sequence(2, Request(1, 0.0, 9, 4), 9, token_ids=list(range(9)))
    assert pool.admit(later) and later.num_cached == 4  # block 0 only: its 4 tokens were computed


def test_a_preempted_requests_recompute_does_not_count_what_its_prefix_hit_found_again():
    """A request preempted by recompute that finds its own freed blocks cached on readmission
    recomputes only the rest: its attention work (recomputed_pairs, which prices the modelled
    recompute time) must drop the found tokens' pairs, as recomputed_tokens drops the tokens."""
    from kvbench.core.scheduler import Batch, Scheduler

    pool = PagedAllocator(num_slots=64, max_model_len=64, block_size=4, watermark=0.0, prefix_caching=True)
    scheduler = Scheduler(pool)
    seq = Sequence(1, Request(0, 0.0, 10, 4), 10, token_ids=list(range(10)))
    scheduler.add(seq)
    assert scheduler.schedule().num_tokens == 10  # the prompt; blocks 0 and 1 (tokens 0-7) are named
    seq.num_tokens, seq.token_ids = 11, list(range(11))  # one token sampled
    scheduler.preempt(seq, Batch())
    assert (scheduler.recomputed_tokens, scheduler.recomputed_pairs) == (10, 55)  # 1 + ... + 10
    readmitted = scheduler.schedule()
    assert seq.num_computed == 11 and readmitted.num_tokens == 3  # 8 found again: 8, 9 and the new 10
    # only tokens 8 and 9 are recomputed: 2 tokens attending to 9 and 10 keys = 55 - (1 + ... + 8)
    assert (scheduler.recomputed_tokens, scheduler.recomputed_pairs) == (2, 19)
    # the lookup counts apart from the prefix hit rate (vLLM's preempted hits): 8 found, 10 queried once
    assert (pool.preempted_hit_tokens, pool.prefix_hit_tokens, pool.prefix_query_tokens) == (8, 0, 10)


class SamplesIds:
    """A simulated step that samples token ids no other token has, as a model with distinct
    outputs would: what a simulated run's stand-ins must decide as. Beams continue from the rows
    the engine's generator draws, as a simulated run's do."""

    simulated, needs_sequences = True, True

    def __init__(self):
        self.engine, self.fresh = None, itertools.count(10**6)

    def pick(self, seq):
        request = seq.request
        if seq.num_computed < seq.num_tokens or (seq.group and seq is not seq.group[0] and request.beam_width > 1):
            return None  # a prefill chunk; a beam other than the root (the root's row steps them all)
        if request.width > 1 and seq.group is None:  # the prompt is done: each sample's first token
            return [
                (0, next(self.fresh), 0.0) if request.beam_width > 1 else next(self.fresh) for _ in range(seq.width)
            ]
        if request.beam_width > 1:
            rows = self.engine.rng.integers(request.width, size=request.width)
            return [(int(row), next(self.fresh), 0.0) for row in rows]
        return next(self.fresh)

    def execute(self, batch):
        from kvbench.executors.base import StepResult

        return StepResult(0.01, [self.pick(s) for s in batch.seqs])


class SamplesNothing:
    """A simulated step that, as the cost models, reads the batch's totals and samples no ids."""

    simulated, needs_sequences = True, False

    def execute(self, batch):
        from kvbench.executors.base import StepResult

        return StepResult(0.01)


@pytest.mark.parametrize(
    "system",
    [
        ["+allocator=paged", "allocator.watermark=0"],
        ["+allocator=paged", "engine.preemption=swap", "allocator.watermark=0"],
        ["+allocator=hybrid", "model=gpt-oss-like", "hardware=h100-sxm"],
        ["+allocator=paged", "workload.n=2"],
        ["+allocator=paged", "workload.beam_width=3"],
    ],
    ids=["paged", "paged-swap", "hybrid", "parallel", "beams"],
)
def test_a_simulated_run_s_stand_in_ids_decide_as_distinct_real_ids(system):
    """A simulated run has no token ids. Its prefix cache found none of a preempted request's own
    blocks (vLLM's finds them: its 300 ShareGPT requests at once made 486 preemptions instead of
    471). Named by stand-ins, the blocks decide as a run with ids: every prompt and every sampled
    token distinct (the lazy decode of one, the eager loop of the other)."""
    import dataclasses

    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose(
            "bench",
            overrides=[*system, "allocator.prefix_caching=true", "workload.num_requests=120", "workload.rate=inf"],
        )
    model, _ = load_specs(cfg)
    requests = generate(dict(cfg.workload), 0, model.max_model_len)
    fed = [dataclasses.replace(r, prompt_tokens=np.arange(r.prompt_len) + 10**9 * (r.request_id + 1)) for r in requests]
    pool = 6 * max(r.prompt_len + r.output_len for r in requests) * (2 if "beam" in str(system) else 1)

    def run(executor, requests):
        engine = build_engine(cfg, model, pool, lambda allocator: executor)
        executor.engine = engine
        row = engine.run(requests)
        return row, engine.allocator

    (ids, with_ids), (stand_ins, without) = run(SamplesIds(), fed), run(SamplesNothing(), requests)
    assert ids["preemptions"] > 10
    keys = ["steps", "preemptions", "recomputed_tokens", "swapped_blocks", "completed", "median_e2el_ms"]
    assert {k: stand_ins[k] for k in keys} == {k: ids[k] for k in keys}
    assert without.prefix_hit_tokens == with_ids.prefix_hit_tokens == 0  # no two requests share a token
    assert without.preempted_hit_tokens == with_ids.preempted_hit_tokens
    if "engine.preemption=swap" not in system:
        assert without.preempted_hit_tokens > 0  # the victims found their own blocks again
