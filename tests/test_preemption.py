"""Preemption by recompute and by swap: nothing is lost, and the traffic is counted and modelled.

Swapping moves a request's computed blocks to a bounded CPU pool and back: the bytes and copies
are counted, a pool that cannot hold one request is refused up front, and a full pool falls
back to recompute. Its modelled time is copies x per-copy latency + bytes / PCIe bandwidth, so
small blocks (many copies) swap slowly while recompute's cost does not depend on block size.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from hydra import compose, initialize_config_module

from kvbench.arith import cdiv
from kvbench.core.sequence import Request
from kvbench.core.spec import Hardware
from kvbench.errors import UserError
from kvbench.executors.cost_model import copies_per_block, swap_time_s
from kvbench.reporting.console import run_table
from kvbench.scenarios.run import run_point

from helpers.engine import GREEDY, SPEC, alone, make_requests, outputs, run_engine


def test_lecture_swap_out_of_1000_tokens_takes_about_6_ms():
    hardware = Hardware(
        "lecture", hbm_bytes_per_s=1e12, peak_flops=1e15, memory_bytes=8e10, pcie_bytes_per_s=25e9, copy_latency_s=10e-6
    )
    blocks = cdiv(1000, 16)
    assert blocks == 63
    seconds = swap_time_s(hardware, blocks, 1000 * 128 * 1024)  # one copy per block
    assert seconds == pytest.approx(0.63e-3 + 5.24e-3, rel=0.01)


def test_swap_counts_every_block_it_moves_and_recomputes_nothing():
    row, engine = run_engine(make_requests(6), num_slots=96, preemption="swap", swap_slots=400)
    assert row["preemptions"] > 0 and row["recomputed_tokens"] == 0 and row["swap_fallbacks"] == 0
    # every swapped-out block comes back: out and in are counted alike
    assert row["swapped_blocks"] % 2 == 0 and row["swapped_blocks"] > 0
    assert engine.executor.swap_s > 0


def test_a_full_swap_pool_falls_back_to_recompute_without_losing_tokens():
    requests = make_requests(8, output_len=20)
    one_request = cdiv(max(r.max_tokens for r in requests), 4) * 4
    row, engine = run_engine(requests, num_slots=96, preemption="swap", swap_slots=one_request)
    assert row["swapped_blocks"] > 0 and row["recomputed_tokens"] > 0
    # some preemptions found the pool full and recomputed (nothing else recomputes under swap); the console says so
    assert 0 < row["swap_fallbacks"] < row["preemptions"]
    assert f"swap pool full: {row['swap_fallbacks']} of {row['preemptions']} preemptions recomputed" in run_table(
        {**row, "scenario": "serve"}
    )
    got = outputs(engine)
    for r in requests:
        assert got[r.request_id][0][1] == alone(r, GREEDY)


def test_a_swap_pool_smaller_than_one_request_is_refused():
    with pytest.raises(UserError, match="swap pool .* cannot hold one"):
        run_engine(make_requests(2), num_slots=96, preemption="swap", swap_slots=8)


def simulate(block_size: int, preemption: str) -> dict:
    overrides = [
        "+allocator=paged",
        f"allocator.block_size={block_size}",
        f"engine.preemption={preemption}",
        "workload.duration_s=60",
        "workload.rate=6",
        "progress=false",
    ]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        return run_point(compose("bench", overrides=overrides))[0]


def test_simulated_swap_costs_more_per_byte_at_small_blocks_and_recompute_does_not_swap():
    small, large = simulate(1, "swap"), simulate(64, "swap")
    recompute = simulate(16, "recompute")
    for row in (small, large):
        assert row["preemptions"] > 0 and row["recomputed_tokens"] == 0
        assert row["swap_copies"] == row["swapped_blocks"] * 2 * 40  # K and V of OPT-13B's 40 layers
        assert row["swapped_bytes"] == row["swapped_blocks"] * row["block_size"] * 819_200
    per_byte = [row["swap_time_model_s"] / row["swapped_bytes"] for row in (small, large)]
    assert per_byte[0] > 5 * per_byte[1]
    assert recompute["swapped_bytes"] == 0 and recompute["recompute_time_model_s"] > 0


def test_copies_per_block_are_k_and_v_of_every_attention_layer():
    assert copies_per_block(SPEC) == 4


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["workload.n=0"], "workload.n=0 must be >= 1"),
        (["workload.beam_width=0"], "workload.beam_width=0 must be >= 1"),
        (["workload.prefix_len=4096"], "prefix_len=4096 must be shorter than max_model_len"),
        (["+allocator=paged", "engine.preemption=swap", "engine.swap_space_bytes=1e6"], "swap pool"),
        (["scenario=serve", "model=tiny", "+backend=triton_paged"], "backend triton_paged cannot run here: "),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(overrides, message, tmp_path):
    result = subprocess.run(
        ["bench", *overrides, "progress=false"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": _venv_bin(), "HOME": str(tmp_path)},
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def _venv_bin() -> str:
    import os
    import sys

    return os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"])


def test_a_recomputed_request_longer_than_the_token_budget_runs_alone():
    """Without chunked prefill, a request preempted with prompt + output past the token budget
    comes back in a step of its own (its 80 tokens in a budget of 64), rather than never."""
    from kvbench.core.engine import Engine
    from kvbench.core.scheduler import Scheduler
    from kvbench.executors.base import StepResult
    from kvbench.plugins.allocators.paged import PagedAllocator

    steps = []

    class Totals:
        simulated, needs_sequences = True, False

        def execute(self, batch):
            steps.append((batch.num_tokens, len(batch)))
            return StepResult(1e-3)

    allocator = PagedAllocator(160, 256, block_size=16, watermark=0.0)  # 10 blocks: 2 x 80 tokens
    scheduler = Scheduler(allocator, max_num_seqs=4, max_num_batched_tokens=64, preemption="recompute")
    requests = [Request(i, 0.0, 50, 60, np.arange(50) + 50 * i) for i in range(2)]
    row = Engine(scheduler, Totals(), progress=False).run(requests)
    assert row["completed"] == 2 and row["preemptions"] == 1
    assert (80, 1) in steps  # the recompute: prompt 50 + 30 generated, alone
    assert all(tokens <= 64 for tokens, size in steps if size > 1)


class StepLog:
    """A simulated executor that records each step's batch (request ids in order, tokens fed)
    and reads its sequences, so the scheduler's full paths run (no lazy decode)."""

    simulated, needs_sequences = True, True

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.steps = []  # (request ids in batch order, tokens fed, request ids swapped out)

    def execute(self, batch):
        from kvbench.executors.base import StepResult

        swapped = [seq.request.request_id for seq in self.scheduler.swapped]
        self.steps.append(([seq.request.request_id for seq in batch.seqs], batch.num_tokens, swapped))
        return StepResult(1e-3)


def serve_simulated(requests, num_slots, block_size=4, swap_slots=0, **scheduler_options):
    """Serve `requests` through the engine with a StepLog executor; returns (row, its steps)."""
    from kvbench.core.engine import Engine
    from kvbench.core.scheduler import Scheduler
    from kvbench.plugins.allocators.paged import PagedAllocator

    allocator = PagedAllocator(num_slots, 256, block_size=block_size, watermark=0.0)
    if swap_slots:
        allocator.enable_swap(swap_slots)
    scheduler = Scheduler(allocator, **scheduler_options)
    log = StepLog(scheduler)
    row = Engine(scheduler, log, progress=False).run(requests)
    return row, log.steps


def test_a_swapped_out_request_comes_back_before_a_new_one_is_admitted():
    """A new arrival that fits the pool while a swapped-out request does not yet must wait behind
    it; admitting it ahead (the swapped queue not checked) let new work overtake the victim."""
    # 8 blocks of 4. R0 and R1: 12-token prompts (3 blocks), 20 outputs; R2: 3 tokens, held
    # back by max_num_seqs=2. Step 1 prefills R0 and R1; steps 2-5 decode them to 16 computed
    # tokens (4 blocks each, the pool full). Step 6: R0 needs a 5th block, R1 (newest) is
    # swapped out (4 blocks). R1's swap-in needs 4 + 1 blocks while R0 holds 5 and grows to 8:
    # it comes back only once R0 has finished (32 tokens: 19 decodes, steps 2-20), in step 21,
    # and R2 (1 block, which fit from step 7 on) is admitted in that same step, behind it.
    requests = [Request(i, 0.0, 12, 20, np.arange(12) + 12 * i) for i in range(2)]
    requests.append(Request(2, 0.0, 3, 2, np.arange(3) + 100))
    row, steps = serve_simulated(requests, 32, swap_slots=64, max_num_seqs=2, preemption="swap")
    assert row["completed"] == 3 and row["preemptions"] == 1 and row["swap_fallbacks"] == 0
    swapped = [number for number, (_, _, out) in enumerate(steps, 1) if out == [1]]
    assert swapped == list(range(6, 21)) and row["swapped_blocks"] == 4 + 4  # out in step 6, in in 21
    first_step_of_r2 = next(number for number, (ids, _, _) in enumerate(steps, 1) if 2 in ids)
    assert first_step_of_r2 == 21 and steps[20][0] == [1, 2]  # R1 back first, then R2 behind it


def test_a_step_never_feeds_more_tokens_than_the_budget_when_max_num_seqs_exceeds_it():
    """With max_num_seqs above max_num_batched_tokens, running samples can outnumber the token
    budget; the all-decode fast path (which counts no budget) must not take that step."""
    # Budget 4, max_num_seqs 16: step 1 prefills four 1-token prompts (4 tokens), each request
    # then forks into 4 samples, 16 sequences running. Each decode step fits one group of 4,
    # so each request's 2 decodes (its first of 3 tokens came from the prefill) make 1 + 4 x 2 = 9
    # steps of 4 tokens; the fast path fed all 16 sequences at once.
    requests = [Request(i, 0.0, 1, 3, np.array([i]), n=4) for i in range(4)]
    row, steps = serve_simulated(requests, 256, max_num_seqs=16, max_num_batched_tokens=4)
    assert row["completed"] == 4
    assert [tokens for _, tokens, _ in steps] == [4] * 9
    assert steps[1][0] == [0] * 4  # the oldest request's 4 samples, alone


def test_swapping_out_samples_moves_the_blocks_they_share_once():
    """Parallel samples share their prompt's blocks: a swap moves (and counts, and so charges
    PCIe bytes for) each shared block once, not once per sample holding it."""
    from kvbench.core.sequence import Sequence
    from kvbench.plugins.allocators.paged import PagedAllocator

    pool = PagedAllocator(num_slots=64, max_model_len=64, block_size=4, watermark=0.0)
    pool.enable_swap(64)
    pool.record_copies = True
    request = Request(0, 0.0, 10, 8, n=2)
    parent = Sequence(0, request, 10)
    assert pool.admit(parent) and pool.grow(parent, 10)
    parent.num_computed = 10
    child = Sequence(1, request, 10)
    pool.fork(parent, child)  # both hold blocks 0-2 (tokens 0-9)
    for seq in (parent, child):  # each writes its first token into block 2: the first copies it
        seq.num_tokens = 11
        assert pool.grow(seq, 1)
        seq.num_computed = 11
    assert pool.num_copies == 1
    # 2 shared full blocks + 2 third blocks (one each) = 4 distinct blocks, not 3 + 3 = 6
    assert pool.swap_out([parent, child])
    assert pool.swapped_blocks == 4 and [kind for kind, *_ in pool.copy_log].count("out") == 4
    assert pool.swap_in([parent, child])
    assert pool.swapped_blocks == 8 and [kind for kind, *_ in pool.copy_log].count("in") == 4


def test_recompute_time_under_tensor_parallelism_uses_every_gpus_compute():
    """Re-prefill FLOPs run on all num_gpus GPUs, as every step's do: modelling them on one GPU
    made a 4-GPU recompute look 4x slower."""
    from dataclasses import replace

    from kvbench.core.spec import ModelSpec
    from kvbench.executors.cost_model import preemption_costs

    model = ModelSpec("m", 2, 32, 4, 2, 8, num_params=1e9, max_model_len=2048)
    tp4 = Hardware("tp4", 1e12, peak_flops=1e15, memory_bytes=8e10, flops_efficiency=0.5, num_gpus=4)
    # 1000 tokens: 2 x 1e9 params x 1000 = 2e12 FLOPs (no attention pairs) at 1e15 x 0.5 x 4 = 2e15 FLOP/s
    costs = preemption_costs(model, tp4, 16, 0, 1000, 0)
    assert costs["recompute_time_model_s"] == pytest.approx(1e-3)
    one = preemption_costs(model, replace(tp4, num_gpus=1), 16, 0, 1000, 0)
    assert one["recompute_time_model_s"] == pytest.approx(4e-3)
