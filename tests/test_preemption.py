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
