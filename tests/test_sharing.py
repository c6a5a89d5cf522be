"""The lecture's sharing experiments: parallel samples and beams share their blocks.

n samples of an L-token prompt share its blocks; each writer of the shared, partly filled last
block copies it first, so the request makes n - 1 copies, and none when L is a multiple of the
block size. Beams fork and free through reference counts and hold fewer blocks than the same
beams each keeping its own. The simulator runs the same sharing without tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
from hydra import compose, initialize_config_module

from kvbench.core.sequence import Request
from kvbench.core.workload import generate
from kvbench.executors.cost_model import CostModelExecutor
from kvbench.scenarios.build import build_engine, load_specs

from helpers.engine import SAMPLED, make_requests, run_engine


@pytest.mark.parametrize("prompt_len, copies", [(10, 3), (12, 0), (13, 3), (16, 0)])
def test_n_samples_of_a_prompt_make_n_minus_1_copies(prompt_len, copies):
    request = Request(0, 0.0, prompt_len, 6, np.arange(prompt_len), n=4)
    row, engine = run_engine([request], block_size=4, sampling=SAMPLED)
    assert row["copies"] == copies


def blocks_held(log: list):
    """on_step hook: (physical blocks in use, blocks the live sequences' tables name)."""

    def on_step(batch, pool):
        held = (pool.num_slots - pool.accounting().free) // pool.block_size
        log.append((held, sum(len(table) for table in pool.block_tables.values())))

    return on_step


def test_beams_hold_fewer_blocks_than_unshared_beams():
    log: list = []
    run_engine(make_requests(3, beam_width=4, output_len=12), block_size=4, on_step=blocks_held(log))
    held, named = map(sum, zip(*log))
    assert held < 0.8 * named  # the prompt and the common history are held once
    assert all(h <= n for h, n in log)


def test_beam_search_copies_less_with_paging_than_with_contiguous_ranges():
    requests = make_requests(3, beam_width=4, output_len=12)
    paged, _ = run_engine(requests, block_size=4)
    contiguous, _ = run_engine(requests, "contiguous", num_slots=96 * 12)
    assert paged["copies"] < contiguous["copies"]


def test_a_request_counts_its_width_against_max_num_seqs():
    sizes: list = []
    run_engine(make_requests(4, beam_width=3), max_num_seqs=5, on_step=lambda batch, pool: sizes.append(len(batch)))
    assert max(sizes) == 3  # a second 3-beam request would make 6 sequences


@pytest.mark.parametrize("n, beam_width", [(4, 1), (1, 4)])
def test_simulated_samples_and_beams_share_blocks(n, beam_width):
    overrides = [
        "workload=alpaca",
        "workload.num_requests=60",
        f"workload.n={n}",
        f"workload.beam_width={beam_width}",
        "+allocator=paged",
        "progress=false",
    ]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=overrides)
    model, hardware = load_specs(cfg)
    log: list = []
    engine = build_engine(cfg, model, 4096, lambda allocator: CostModelExecutor(model, hardware))
    execute = engine.executor.execute
    hook = blocks_held(log)
    engine.executor.execute = lambda batch: (hook(batch, engine.allocator), execute(batch))[1]
    row = engine.run(generate(dict(cfg.workload), 0, model.max_model_len))
    assert row["completed"] == 60
    held, named = map(sum, zip(*log))
    assert held < named
