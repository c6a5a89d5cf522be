"""The lecture's sharing experiments: parallel samples and beams share their blocks.

n samples of an L-token prompt share its blocks; each writer of the shared, partly filled last
block copies it first, so the request makes n - 1 copies, and none when L is a multiple of the
block size. Beams fork and free through reference counts and hold fewer blocks than the same
beams each keeping its own. The simulator runs the same sharing without tokens. What sharing
saves is every row's `kv_blocks_saved_frac`: 1 - blocks held / blocks the block tables name.
"""

from __future__ import annotations

import numpy as np
import pytest
from hydra import compose, initialize_config_module

from kvbench.core.recorder import Recorder
from kvbench.core.scheduler import Batch
from kvbench.core.sequence import Request, Sequence
from kvbench.core.workload import generate
from kvbench.executors.cost_model import CostModelExecutor
from kvbench.plugins.allocators.base import KVAccounting
from kvbench.plugins.allocators.paged import PagedAllocator
from kvbench.scenarios.build import build_engine, load_specs

from helpers.engine import SAMPLED, make_requests, run_engine


@pytest.mark.parametrize("prompt_len, copies", [(10, 3), (12, 0), (13, 3), (16, 0)])
def test_n_samples_of_a_prompt_make_n_minus_1_copies(prompt_len, copies):
    request = Request(0, 0.0, prompt_len, 6, np.arange(prompt_len), n=4)
    row, engine = run_engine([request], block_size=4, sampling=SAMPLED)
    assert row["copies"] == copies


def test_two_samples_of_a_40_token_prompt_share_its_blocks_until_they_write():
    """Block 16: the prompt fills blocks 0 and 1 and half of block 2. Forked, both tables name all
    three: 6 named, 3 held, half saved. The first sample to write the half-full block copies it
    (6 named, 4 held); once both have filled their own and started a fourth block, only blocks 0
    and 1 are shared (8 named, 6 held)."""
    pool = PagedAllocator(num_slots=16 * 16, max_model_len=256, block_size=16)
    request = Request(0, 0.0, 40, 20, n=2)
    first = Sequence(1, request, 40)
    assert pool.admit(first) and pool.grow(first, 40)
    first.num_computed = 40
    second = Sequence(2, request, 40, parent=first)
    pool.fork(first, second)

    def saved() -> float:
        acc = pool.accounting()
        return 1 - acc.held / acc.named

    assert pool.block_table(first) == pool.block_table(second)
    assert saved() == 1 / 2
    for step in range(1, 10):
        for seq in (first, second):
            assert pool.grow(seq, 1)
            seq.num_computed += 1
        if step == 1:
            assert pool.num_copies == 1 and saved() == 1 - 4 / 6
    assert pool.block_table(first)[:2] == pool.block_table(second)[:2]
    assert not set(pool.block_table(first)[2:]) & set(pool.block_table(second)[2:])
    assert saved() == 1 - 6 / 8


def test_the_saved_fraction_is_held_over_named_blocks_each_averaged_over_the_window():
    """1 s with 3 of 6 named blocks held, then 3 s with 4 of 6: 1 - (3 + 12) / (6 + 18)."""

    class Pool:  # what the recorder reads of an allocator
        def __init__(self, held: int):
            self.acc = KVAccounting(256, held * bs - 8, 0, 0, rounding=8, named=6 * bs)

        def accounting(self):
            return self.acc

        def kv_slots(self):
            return self.acc.slots()

    recorder = Recorder(warmup_frac=0.0)
    bs = 16
    recorder.watch(Pool(0))
    for end, dt, held in ((1.0, 1.0, 3), (4.0, 3.0, 4)):
        recorder.on_step(end, dt, 2, Pool(held), 0.0)
    row = recorder.summary(1, last_admit_s=0.0, first_arrival_s=0.0)
    assert row["kv_blocks_saved_frac"] == pytest.approx(1 - 15 / 24)


def test_beams_hold_fewer_blocks_than_unshared_beams():
    log: list = []

    def on_step(batch, pool):
        log.append((pool.accounting().held, pool.accounting().named))

    row, _ = run_engine(make_requests(3, beam_width=4, output_len=12), block_size=4, on_step=on_step)
    assert row["kv_blocks_saved_frac"] > 0.2  # the prompt and the common history are held once
    assert all(held <= named for held, named in log)


def test_a_reserving_allocator_shares_nothing():
    row, _ = run_engine(make_requests(3, n=4, output_len=12), "contiguous", num_slots=96 * 12)
    assert row["kv_blocks_saved_frac"] == 0.0


def test_beam_search_copies_less_with_paging_than_with_contiguous_ranges():
    requests = make_requests(3, beam_width=4, output_len=12)
    paged, _ = run_engine(requests, block_size=4)
    contiguous, _ = run_engine(requests, "contiguous", num_slots=96 * 12)
    assert paged["copies"] < contiguous["copies"]


@pytest.mark.parametrize(
    "allocator, num_slots, copied",
    [("paged", 400, 3 * 4), ("contiguous", 96 * 12, 3 * 10)],  # a 4-slot block 3 times; the 10-token prompt 3 times
)
def test_every_copy_on_the_device_reaches_the_step_that_follows_it(allocator, num_slots, copied):
    steps: list = []
    request = Request(0, 0.0, 10, 6, np.arange(10), n=4)
    row, engine = run_engine([request], allocator, num_slots, sampling=SAMPLED, on_step=lambda b, p: steps.append(b))
    assert row["copies"] == 3 and engine.allocator.copied_slots == copied
    assert sum(batch.copied_slots for batch in steps) == copied
    assert steps[0].copied_slots == 0  # the prompt's step: the samples fork after it, and copy before the next


def charged_run(allocator: str, requests: list) -> tuple[dict, object, list]:
    """A simulated run (OPT-13B on an A100-40GB, `allocator`): its row, engine, and the device
    copies each executed step was charged for."""
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=[f"+allocator={allocator}", "progress=false"])
    model, hardware = load_specs(cfg)
    charged = []

    class Charged(CostModelExecutor):
        def execute(self, batch):
            charged.append(batch.copied_slots)
            return super().execute(batch)

    engine = build_engine(cfg, model, 8192, lambda pool: Charged(model, hardware))
    return engine.run(requests), engine, charged


@pytest.mark.parametrize("long_decode", [True, False])
@pytest.mark.parametrize("output_len, copied", [(1, 0), (2, 20)])
def test_a_fork_copies_only_for_a_step_that_reads_it_and_that_step_pays_for_it(long_decode, output_len, copied):
    """A request of two samples forks after its prefill; a reserving allocator copies the
    prompt's range into the second sample's where a step will read it. With one output token
    both samples end at once and none does: the copy was made anyway (copied_bytes counted KV
    nobody read), taken by the empty schedule() before the next arrival, or by nobody where a
    steady decode ran on in a quiet stretch, never costing a step; now none is made. With two,
    the step that reads it, scheduled or quiet, pays for it. (Paged copies on write, inside the
    step that writes.)"""
    requests = [
        Request(0, 0.0, 20, 400 if long_decode else 2),  # a long decode runs on in quiet stretches
        Request(1, 0.5, 20, output_len, np.arange(20), n=2),  # forks
        Request(2, 30.0, 20, 5),  # an arrival after everything else has ended
    ]
    row, engine, charged = charged_run("contiguous", requests)
    assert row["completed"] == 3 and engine.allocator.copied_slots == copied  # the prompt's range, or none
    assert row["copies"] == (copied > 0) and sum(charged) == copied  # every copy paid for, once


@pytest.mark.parametrize("allocator", ["contiguous", "paged"])
def test_beams_that_end_are_not_forked_so_no_copy_outlives_the_last_step(allocator):
    """Beams were re-forked at the step that gave their last token: a reserving allocator copied
    KV that no step would read, counted in copied_bytes and charged to no step."""
    requests = [Request(i, 0.0, 40, 12, np.arange(40) + i, beam_width=4) for i in range(3)]
    row, engine, charged = charged_run(allocator, requests)
    assert row["completed"] == 3 and sum(charged) == engine.allocator.copied_slots


def test_a_step_pays_for_its_copies_as_their_bytes_read_and_written_once():
    """OPT-13B on A100-40GB: a 16-token block is 16 x 819,200 bytes, read and written at 75 % of
    1,555 GB/s: 22.5 us."""
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        model, hardware = load_specs(compose("bench"))
    executor = CostModelExecutor(model, hardware)
    plain = Batch(num_tokens=8, context_tokens=4000, attention_pairs=4000)
    copied = Batch(num_tokens=8, context_tokens=4000, attention_pairs=4000, copied_slots=16)
    extra = executor.execute(copied).duration_s - executor.execute(plain).duration_s
    assert extra == pytest.approx(2 * 16 * 819_200 / (0.75 * 1555e9)) == pytest.approx(22.5e-6, rel=1e-3)


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
    engine = build_engine(cfg, model, 4096, lambda allocator: CostModelExecutor(model, hardware))
    row = engine.run(generate(dict(cfg.workload), 0, model.max_model_len))
    assert row["completed"] == 60
    assert row["kv_blocks_saved_frac"] > 0
