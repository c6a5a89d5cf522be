"""The lecture's sizing and reservation examples, and each allocator's accounting."""

import random

import pytest

from kvbench.arith import cdiv
from kvbench.core.spec import ModelSpec
from kvbench.errors import UserError
from kvbench.plugins.allocators.contiguous import ContiguousAllocator, OracleAllocator
from kvbench.plugins.allocators.hybrid import HybridAllocator
from kvbench.plugins.allocators.paged import PagedAllocator
from kvbench.plugins.allocators.placement import BuddySpace, FirstFitSpace
from kvbench.plugins.allocators.pow2 import Pow2Allocator

OPT_13B = ModelSpec("opt-13b", 40, 5120, 40, 40, 128, 12.85e9, 2048, "fp16")
LLAMA_3_8B = ModelSpec("llama-3-8b", 32, 4096, 32, 8, 128, 8.03e9, 8192, "bf16")


def test_kv_bytes_per_token_opt_13b_is_800_kib():
    assert OPT_13B.kv_bytes_per_token == 819_200 == 800 * 1024


def test_kv_bytes_per_token_llama_3_8b_is_128_kib_and_a_16_token_block_is_2_mib():
    assert LLAMA_3_8B.kv_bytes_per_token == 131_072
    assert 16 * LLAMA_3_8B.kv_bytes_per_token == 2 * 1024 * 1024


def test_a_12_gib_pool_holds_15728_opt_13b_token_slots():
    assert (12 * 1024**3) // OPT_13B.kv_bytes_per_token == 15_728


def grown(allocator, seq):
    """Admit `seq` and store all its tokens, as prefill would."""
    assert allocator.admit(seq)
    assert allocator.grow(seq, seq.num_tokens)
    seq.num_computed = seq.num_tokens
    return seq


# The lecture's example (100-token prompt, 300-token output, max 2048, block 16) under each
# estimate and placement: Pow2 reserves min(100 + 512, 2048) = 612 -> 39 blocks, which the
# buddy system holds as a 64-block chunk; Oracle reserves 400 -> 25 blocks -> a 32-block chunk.
LECTURE_HELD = [
    (ContiguousAllocator, "buddy", 2048),
    (Pow2Allocator, "buddy", 1024),
    (OracleAllocator, "buddy", 512),
    (ContiguousAllocator, "first_fit", 2048),
    (Pow2Allocator, "first_fit", 624),
    (OracleAllocator, "first_fit", 400),
]


@pytest.mark.parametrize("cls, placement, held", LECTURE_HELD)
def test_lecture_reservation_times_placement_after_150_of_300_output_tokens(cls, placement, held, seq_factory):
    allocator = cls(num_slots=16 * 1024, max_model_len=2048, block_size=16, placement=placement)
    seq = grown(allocator, seq_factory(100, 300, generated=150))
    assert allocator.capacity(seq) == held
    acc = allocator.accounting()
    assert (acc.token, acc.reserved) == (250, 150)  # its last sampled token included
    overshoot = {"contiguous": 2048 - 400, "pow2": 612 - 400, "oracle": 0}[cls.name]
    assert acc.internal == overshoot
    assert acc.rounding == held - 400 - overshoot
    assert acc.free == 16 * 1024 - held


def test_paged_lecture_example_holds_256_slots_its_tail_is_rounding(seq_factory):
    allocator = PagedAllocator(num_slots=16 * 1024, max_model_len=2048, block_size=16)
    seq = grown(allocator, seq_factory(100, 300, generated=150))
    assert allocator.capacity(seq) == 256 == 16 * cdiv(250, 16)
    acc = allocator.accounting()
    assert (acc.token, acc.reserved, acc.internal, acc.rounding) == (250, 6, 0, 0)  # 6 slots it will fill
    done = grown(allocator, seq_factory(100, 5))  # 104 tokens stored at its end, 112 slots held
    done.num_tokens = 104
    assert allocator.grow(done, 4)
    assert allocator.accounting().rounding == 112 - 104


def test_oracle_reserves_what_the_request_produces_and_nothing_more(seq_factory):
    allocator = OracleAllocator(num_slots=1024, max_model_len=2048, placement="first_fit")
    grown(allocator, seq_factory(100, 300))
    acc = allocator.accounting()
    assert (acc.token, acc.reserved, acc.internal, acc.rounding) == (100, 300, 0, 0)
    assert acc.free == 1024 - 400


def test_contiguous_max_counts_reservation_beyond_the_final_length_as_internal(seq_factory):
    allocator = ContiguousAllocator(num_slots=4096, max_model_len=2048)
    grown(allocator, seq_factory(100, 300))
    acc = allocator.accounting()
    assert (acc.token, acc.reserved, acc.internal, acc.rounding, acc.free) == (100, 300, 2048 - 400, 0, 2048)


def test_first_fit_leaves_external_fragmentation_that_blocks_a_request(seq_factory):
    allocator = OracleAllocator(num_slots=300, max_model_len=300, block_size=1, placement="first_fit")
    a, b, c = (grown(allocator, seq_factory(50, 50)) for _ in range(3))  # 100 slots each
    allocator.free(a)
    allocator.free(c)
    big = seq_factory(100, 50)  # 150 slots: 200 are free, but in two holes of 100
    assert allocator.num_free_slots == 200
    assert not allocator.admit(big)
    assert allocator.external_frag_waits == 1
    allocator.free(b)
    assert allocator.admit(big)


def test_a_request_exactly_the_size_of_the_scattered_free_slots_waits_on_fragmentation(seq_factory):
    """200 free slots in two holes of 100 and a request of exactly 200: the slots are there, not
    in one piece, which is external fragmentation (a `>` counted it as a plain lack of room)."""
    allocator = OracleAllocator(num_slots=300, max_model_len=300, block_size=1, placement="first_fit")
    a, _, c = (grown(allocator, seq_factory(50, 50)) for _ in range(3))
    allocator.free(a)
    allocator.free(c)
    assert allocator.num_free_slots == 200
    assert not allocator.admit(seq_factory(100, 100)) and allocator.external_frag_waits == 1
    assert not allocator.admit(seq_factory(101, 100)) and allocator.external_frag_waits == 1  # 201: no room


@pytest.mark.parametrize("cls", [PagedAllocator, HybridAllocator])
def test_a_placement_is_refused_by_an_allocator_that_places_no_reservation(cls):
    with pytest.raises(UserError, match="placement='buddy' cannot be used with"):
        cls(num_slots=1024, max_model_len=2048, model=OPT_13B, placement="buddy")


def test_an_unknown_placement_names_the_known_ones():
    with pytest.raises(UserError, match="placement='best_fit' is not one of buddy, first_fit"):
        Pow2Allocator(num_slots=1024, max_model_len=2048, placement="best_fit")


def test_the_buddy_system_s_largest_chunk_is_max_model_len(seq_factory):
    allocator = ContiguousAllocator(num_slots=16 * 300, max_model_len=2048)  # 300 blocks
    space = allocator._space
    assert sorted(space.arena_order.values()) == [2, 3, 5, 7, 7]  # 128 + 128 + 32 + 8 + 4
    assert [allocator.admit(seq_factory(10, 10)) for _ in range(3)] == [True, True, False]


def test_buddy_blocks_merge_back_into_one_arena(seq_factory):
    allocator = Pow2Allocator(num_slots=16 * 64, max_model_len=1024)
    seqs = [grown(allocator, seq_factory(8, 8)) for _ in range(64)]  # 8 + 8 slots -> one block each
    assert allocator.num_free_slots == 0
    for seq in seqs:
        allocator.free(seq)
    assert allocator._space.free_lists[6] == {0}  # one free block of 2^6 blocks again
    whole = seq_factory(1000, 24)
    assert allocator.admit(whole)


def test_the_buddy_system_takes_the_lowest_free_chunk_as_a_scan_of_its_free_list_would():
    """Its free chunks are heaps with stale entries (chunks merged away) popped late: it must hand
    out what min() over each free list would, through merges, splits and heap rebuilds."""

    class Scanning(BuddySpace):
        def _lowest(self, order):
            block = min(self.free_lists[order])
            self.free_lists[order].remove(block)
            return block

    rng = random.Random(0)
    spaces = [BuddySpace(300, 16, 7), Scanning(300, 16, 7)]
    held, most = [], [0] * 8  # each order's most free chunks so far
    for _ in range(20_000):
        most = [max(m, len(free)) for m, free in zip(most, spaces[0].free_lists)]
        # chunks merged away stay in a heap until popped or rebuilt: bounded by the most it held
        assert all(len(heap.heap) <= 2 * m + 65 for heap, m in zip(spaces[0]._heaps, most))
        if held and (rng.random() < 0.5 or len(held) > 60):
            start, length = held.pop(rng.randrange(len(held)))
            for space in spaces:
                space.release(start, length)
        else:
            length = 16 * rng.choice([1, 1, 1, 2, 3, 5, 8, 20, 64, 128])
            starts = [space.allocate(length) for space in spaces]
            assert starts[0] == starts[1]
            if starts[0] is not None:
                held.append((starts[0], length))
    assert spaces[0].free_lists == spaces[1].free_lists


def test_first_fit_refuses_by_its_largest_hole_as_a_walk_of_every_hole_would():
    """Its holes by length are a heap with stale entries (holes split or merged since): whatever
    it places or refuses, a walk over every hole places or refuses the same."""

    class Walking(FirstFitSpace):
        def _largest(self):
            return float("inf")

    rng = random.Random(1)
    spaces = [FirstFitSpace(4000), Walking(4000)]
    held, most = [], 0  # the most holes so far
    for _ in range(20_000):
        most = max(most, len(spaces[0].lengths))
        assert len(spaces[0]._by_length.heap) <= 2 * most + 65  # holes split or merged since: bounded
        if held and (rng.random() < 0.45 or len(held) > 80):
            start, length = held.pop(rng.randrange(len(held)))
            for space in spaces:
                space.release(start, length)
        else:
            length = rng.choice([1, 7, 16, 40, 100, 333, 900])
            starts = [space.allocate(length) for space in spaces]
            assert starts[0] == starts[1]
            if starts[0] is not None:
                held.append((starts[0], length))
    assert spaces[0].lengths == spaces[1].lengths


def test_paged_allocates_a_block_only_when_the_last_one_is_full(seq_factory):
    allocator = PagedAllocator(num_slots=160, max_model_len=2048, block_size=16, watermark=0.0)
    seq = grown(allocator, seq_factory(16, 40))
    assert len(allocator.block_table(seq)) == 1
    assert allocator.grow(seq, 1)
    seq.num_computed += 1
    assert len(allocator.block_table(seq)) == 2
    for _ in range(15):
        assert allocator.grow(seq, 1)
        seq.num_computed += 1
    assert len(allocator.block_table(seq)) == 2
    assert allocator.accounting().token == 32


def test_paged_refuses_growth_when_the_pool_is_empty(seq_factory):
    allocator = PagedAllocator(num_slots=32, max_model_len=2048, block_size=16, watermark=0.0)
    seq = grown(allocator, seq_factory(32, 10))
    assert not allocator.grow(seq, 1)
    assert allocator.accounting().token == 32  # nothing changed


@pytest.mark.parametrize("prompt_len, copies", [(20, 3), (32, 0)])
def test_forked_samples_copy_a_shared_partial_last_block_n_minus_1_times(prompt_len, copies, seq_factory):
    allocator = PagedAllocator(num_slots=1600, max_model_len=2048, block_size=16, watermark=0.0)
    parent = grown(allocator, seq_factory(prompt_len, 10))
    samples = [parent]
    for _ in range(3):
        child = seq_factory(prompt_len, 10)
        allocator.fork(parent, child)
        samples.append(child)
    for seq in samples:
        assert allocator.grow(seq, 1)
        seq.num_computed += 1
    assert allocator.num_copies == copies
    assert allocator.accounting().token == prompt_len + 4 + copies * (prompt_len % 16)


@pytest.mark.parametrize("block_size", [0, -4, 257, 2.5])
def test_block_size_outside_1_to_256_is_refused(block_size):
    with pytest.raises(UserError, match="block_size"):
        PagedAllocator(num_slots=1024, max_model_len=2048, block_size=block_size)


@pytest.mark.parametrize("prompt, output, fits", [(200, 57, True), (200, 58, False)])
def test_a_request_fits_a_pool_by_the_tokens_it_stores_not_one_more(prompt, output, fits):
    """200 + 57 tokens store 256 (the last output token is sampled, never stored): 16 blocks of
    16, exactly the pool. The check before the run sized it at 257 and refused it."""
    from kvbench.core.engine import Engine
    from kvbench.core.recorder import Recorder
    from kvbench.core.scheduler import Scheduler
    from kvbench.core.sequence import Request
    from kvbench.errors import UserError

    from helpers.decisions import Totals

    allocator = PagedAllocator(256, 2048, block_size=16, watermark=0.0)
    engine = Engine(Scheduler(allocator, 8, 4096), Totals(False), Recorder(), progress=False)
    if not fits:
        with pytest.raises(UserError, match="smaller than one request: paged needs 272 slots for a 258-token request"):
            engine.run([Request(0, 0.0, prompt, output)])
        return
    row = engine.run([Request(0, 0.0, prompt, output)])
    assert row["completed"] == 1 and row["preemptions"] == 0


@pytest.mark.parametrize("slots, fits", [(1104, True), (1024, False)])
def test_a_reserving_allocator_is_sized_by_each_request_s_own_reservation(slots, fits):
    """pow2 first-fit reserves 1000 + 32 (in blocks of 16: 1,040) for a 1000 + 24-token request;
    the check before the run took the worst split of 1,024 tokens (1,536) and refused 1,104 slots."""
    from kvbench.core.engine import Engine
    from kvbench.core.recorder import Recorder
    from kvbench.core.scheduler import Scheduler
    from kvbench.core.sequence import Request
    from kvbench.errors import UserError
    from kvbench.plugins.allocators.pow2 import Pow2Allocator

    from helpers.decisions import Totals

    allocator = Pow2Allocator(slots, 2048, block_size=16, placement="first_fit")
    engine = Engine(Scheduler(allocator, 8, 4096), Totals(False), Recorder(), progress=False)
    if fits:
        assert engine.run([Request(0, 0.0, 1000, 24)])["completed"] == 1
    else:
        with pytest.raises(UserError, match="pow2 sets aside 1040 slots for a 1000 \\+ 24-token request"):
            engine.run([Request(0, 0.0, 1000, 24)])
