"""Long random admit / grow / fork / free sequences against every allocator's invariants,
under every placement a reserving allocator can use."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.core.sequence import Request, Sequence
from kvbench.plugins.allocators.block_pool import BlockPool
from kvbench.plugins.allocators.contiguous import ContiguousAllocator, OracleAllocator
from kvbench.plugins.allocators.paged import PagedAllocator
from kvbench.plugins.allocators.placement import PLACEMENTS, BuddySpace
from kvbench.plugins.allocators.pow2 import Pow2Allocator

from helpers.sequences import make_seq

ALLOCATORS = [
    (cls, {"placement": p}) for cls in (ContiguousAllocator, OracleAllocator, Pow2Allocator) for p in PLACEMENTS
] + [(PagedAllocator, {})]
OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "grow", "grow", "grow", "fork", "free"]), st.integers(0, 10_000), st.integers(1, 40)
    ),
    min_size=1,
    max_size=80,
)


def grow_some(allocator, seq, pick: int, size: int) -> bool:
    """Grow `seq` by one token (most picks) or `size`, within its final length; True if it grew."""
    n = min(1 if pick % 3 else size, seq.final_len - seq.num_computed)
    if n <= 0 or not allocator.grow(seq, n):
        return False
    seq.num_computed += n
    seq.num_tokens = max(seq.num_tokens, seq.num_computed)
    return True


def occupancy(allocator) -> Counter:
    """How many owners each slot has: holes / free blocks count as one owner ('free')."""
    owners = Counter()
    if isinstance(allocator, PagedAllocator):
        bs = allocator.block_size
        used = {b for table in allocator.block_tables.values() for b in table}
        for block in list(allocator.pool.free) + list(allocator.pool.evictable) + sorted(used):
            owners.update(range(block * bs, (block + 1) * bs))
        return owners
    for start, length in allocator._range.values():
        owners.update(range(start, start + length))
    space = allocator._space
    if isinstance(space, BuddySpace):
        for order, blocks in enumerate(space.free_lists):
            for block in blocks:
                owners.update(range(block * space.block_size, (block + (1 << order)) * space.block_size))
    else:
        for start in space.starts:
            owners.update(range(start, start + space.lengths[start]))
    return owners


def check(allocator, live):
    if isinstance(allocator, PagedAllocator):
        for seq in live:  # count the room grow took without a block operation
            allocator._settle(seq)
    acc = allocator.accounting()
    parts = (acc.token, acc.reserved, acc.internal, acc.rounding, acc.free)
    assert all(p >= 0 for p in parts), parts
    assert sum(parts) == allocator.num_slots
    if isinstance(allocator, PagedAllocator):
        recount_named(allocator)
    else:
        assert acc.named == acc.held  # a reservation is nobody else's: nothing is shared
    assert abs(sum(acc.fractions()) - 1.0) < 1e-12  # the five fractions
    owners = occupancy(allocator)
    assert set(owners.values()) <= {1}, "a slot is owned twice"
    assert len(owners) == allocator.num_slots, "free + used != total"
    for seq in live:
        assert allocator.capacity(seq) >= seq.num_computed
    if isinstance(allocator, PagedAllocator):
        refs = Counter(b for table in allocator.block_tables.values() for b in table)
        for block in range(allocator.num_blocks):
            assert allocator.ref_count[block] == refs.get(block, 0)
        assert acc.token == sum(allocator.block_fill[b] for b in refs)
        assert acc.internal == 0  # paged never over-estimates: its tails are rounding
    else:
        assert acc.token == sum(seq.num_computed for seq in live)
        assert acc.internal == sum(allocator._overshoot(seq.request) for seq in live)
        if isinstance(allocator, OracleAllocator) and allocator.placement == "first_fit":
            assert acc.internal == 0


@pytest.mark.parametrize("cls, options", ALLOCATORS, ids=lambda c: getattr(c, "name", None) or "-".join(c.values()))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, block_size=st.sampled_from([1, 4, 16]))
def test_random_operations_keep_every_invariant(cls, options, ops, block_size):
    allocator = cls(num_slots=512, max_model_len=256, block_size=block_size, **options)
    live = []
    for op, pick, size in ops:
        if op == "admit" or not live:
            seq = make_seq(prompt_len=size, output_len=1 + pick % 100)
            if allocator.admit(seq):
                if allocator.grow(seq, seq.num_tokens):
                    seq.num_computed = seq.num_tokens
                    live.append(seq)
                else:
                    allocator.free(seq)
        else:
            seq = live[pick % len(live)]
            if op == "grow":
                grow_some(allocator, seq, pick, size)
            elif op == "fork":
                child = make_seq(seq.request.prompt_len, seq.request.output_len)
                child.num_tokens = seq.num_tokens
                try:
                    allocator.fork(seq, child)
                    live.append(child)
                except MemoryError:
                    pass
            else:
                live.remove(seq)
                allocator.free(seq)
        check(allocator, live)
    for seq in live:
        allocator.free(seq)
    acc = allocator.accounting()
    assert (acc.token, acc.reserved, acc.internal, acc.rounding) == (0, 0, 0, 0)


# --- the block pool under the paged allocator and every hybrid manager ------------------
POOL_OPS = st.lists(
    st.tuples(
        st.sampled_from(["take", "take", "hold", "drop", "drop", "name", "cow"]),
        st.integers(0, 10_000),
        st.integers(0, 5),
    ),
    min_size=1,
    max_size=120,
)


def check_pool(pool: BlockPool, holders: Counter, content: dict) -> None:
    """Every block is free, evictable or held, exactly once; the cache finds named content."""
    free, evictable = list(pool.free), list(pool.evictable)
    held = [b for b in range(pool.num_blocks) if pool.ref_count[b]]
    assert sorted(free + evictable + held) == list(range(pool.num_blocks))
    assert all(pool.ref_count[b] == holders[b] for b in range(pool.num_blocks))
    assert all(pool.block_hash[b] is None for b in free)
    assert all(pool.block_hash[b] is not None for b in evictable)
    registered = [pool.cached[h] for h in pool.cached] + [b for c in pool.copies.values() for b in c]
    assert sorted(registered) == sorted(b for b in range(pool.num_blocks) if pool.block_hash[b] is not None)
    for block_hash, block in pool.cached.items():
        assert pool.block_hash[block] == block_hash
    # content some block still holds is findable, in the block that holds it
    for block_hash in {pool.block_hash[b] for b in range(pool.num_blocks)} - {None}:
        assert content[pool.lookup(block_hash)] == block_hash


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=POOL_OPS, num_blocks=st.integers(1, 12), watermark=st.sampled_from([0.0, 0.25]))
def test_block_pool_keeps_its_queues_counts_and_cache_consistent(ops, num_blocks, watermark):
    pool = BlockPool(num_blocks, watermark=watermark)
    holders, content = Counter(), {}  # block -> the content hash it was named with
    for op, pick, value in ops:
        held = sorted(b for b in holders if holders[b])
        if op == "take" or not held:
            if pool.fits(1, reserve=False):
                block = pool.take()
                assert pool.fill[block] == 0 and pool.block_hash[block] is None
                holders[block] += 1
                content.pop(block, None)
            else:
                assert pool.num_free == 0
        elif op == "hold":
            block = pick % num_blocks
            if holders[block] or pool.block_hash[block] is not None:
                assert pool.hold(block) == (holders[block] == 0)
                holders[block] += 1
        elif op == "drop":
            block = held[pick % len(held)]
            holders[block] -= 1
            assert pool.drop(block) == (holders[block] == 0)
        elif op == "name":
            block = held[pick % len(held)]
            if pool.block_hash[block] is None:
                pool.name(block, value)  # few distinct values: the same content often twice
                content[block] = value
        elif op == "cow":
            shared = [b for b in held if holders[b] > 1]
            if shared and pool.fits(1, reserve=False):
                src = shared[pick % len(shared)]
                pool.fill[src] = value
                copy = pool.copy_on_write(src)
                assert pool.fill[copy] == value and copy != src
                holders[src] -= 1
                holders[copy] += 1
                content.pop(copy, None)
        check_pool(pool, holders, content)
    assert pool.fits(pool.num_free - pool.watermark_blocks, reserve=True)
    assert not pool.fits(pool.num_free - pool.watermark_blocks + 1, reserve=True)


def test_the_pool_evicts_never_named_blocks_first_then_the_least_recently_freed():
    pool = BlockPool(4)
    blocks = [pool.take() for _ in range(4)]
    pool.name(blocks[0], 10)
    pool.name(blocks[1], 11)
    for block in (blocks[1], blocks[0], blocks[3], blocks[2]):
        pool.drop(block)
    assert [pool.take() for _ in range(4)] == [blocks[3], blocks[2], blocks[1], blocks[0]]
    assert not pool.cached


# --- sharing: the running count of named blocks -----------------------------------------
SHARING_OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "append", "append", "append", "fork", "free", "swap", "recompute", "resume"]),
        st.integers(0, 10_000),
        st.integers(1, 24),
    ),
    min_size=1,
    max_size=80,
)


def recount_named(allocator: PagedAllocator) -> None:
    """The running count against a full recount: every block table's length, summed."""
    tables = allocator.block_tables.values()
    assert allocator.num_named_blocks == sum(len(table) for table in tables)
    acc = allocator.accounting()
    assert acc.named == allocator.num_named_blocks * allocator.block_size
    assert acc.held == len({block for table in tables for block in table}) * allocator.block_size
    assert acc.held <= acc.named


def start(allocator: PagedAllocator, seq: Sequence) -> bool:
    """Admit `seq` and compute its tokens (a prompt, or a recomputed sequence); False = not now."""
    if not allocator.admit(seq):
        return False
    if seq.num_computed < seq.num_tokens and not allocator.grow(seq, seq.num_tokens - seq.num_computed):
        allocator.free(seq)
        return False
    seq.num_computed = seq.num_tokens
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=SHARING_OPS, block_size=st.sampled_from([1, 4, 16]), prefix_caching=st.booleans())
def test_the_running_count_of_named_blocks_equals_a_recount(ops, block_size, prefix_caching):
    """Requests of several sequences admitted, decoded, forked, freed, preempted by swap and by
    recompute and resumed; prompts from a 2-token vocabulary, so prefix hits share blocks too."""
    allocator = PagedAllocator(num_slots=512, max_model_len=256, block_size=block_size, prefix_caching=prefix_caching)
    allocator.enable_swap(256)
    running, swapped, waiting = [], [], []  # each a list of requests' sequence groups
    ids = iter(range(10**6))
    for op, pick, size in ops:
        if op == "admit":
            tokens = [(pick >> i) & 1 for i in range(size)]
            request = Request(next(ids), 0.0, size, 1 + pick % 60, np.asarray(tokens))
            seq = Sequence(next(ids), request, size, token_ids=list(tokens))
            if start(allocator, seq):
                running.append([seq])
        elif op == "resume" and (swapped or waiting):
            queue = swapped if swapped and (pick % 2 or not waiting) else waiting
            group = queue[pick % len(queue)]
            if queue is swapped and allocator.swap_in(group):
                queue.remove(group)
                running.append(group)
            elif queue is waiting:
                started = [seq for seq in group if start(allocator, seq)]
                if len(started) == len(group):
                    queue.remove(group)
                    running.append(group)
                else:
                    for seq in started:
                        allocator.free(seq)
                        seq.num_computed = 0
        elif running and op not in ("admit", "resume"):
            group = running[pick % len(running)]
            seq = group[pick % len(group)]
            if op == "append":
                if grow_some(allocator, seq, pick, size):
                    seq.token_ids.extend([pick % 2] * (seq.num_tokens - len(seq.token_ids)))
            elif op == "fork":
                child = Sequence(next(ids), seq.request, seq.num_tokens, token_ids=list(seq.token_ids), parent=seq)
                allocator.fork(seq, child)
                group.append(child)
            elif op == "free":
                group.remove(seq)
                allocator.free(seq)
                if not group:
                    running.remove(group)
            elif op == "swap":
                if allocator.swap_out(group):
                    running.remove(group)
                    swapped.append(group)
            else:  # recompute: drop the blocks, compute every token again when resumed
                for member in group:
                    allocator.free(member)
                    member.num_computed = 0
                running.remove(group)
                waiting.append(group)
        recount_named(allocator)
    for group in running:
        for seq in group:
            allocator.free(seq)
    recount_named(allocator)
    assert allocator.num_named_blocks == 0
