"""Long random admit / grow / fork / free sequences against every allocator's invariants,
under every placement a reserving allocator can use."""

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.plugins.allocators.contiguous import ContiguousAllocator, OracleAllocator
from kvbench.plugins.allocators.paged import PagedAllocator
from kvbench.plugins.allocators.placement import PLACEMENTS, BuddySpace
from kvbench.plugins.allocators.pow2 import Pow2Allocator

from conftest import make_seq

ALLOCATORS = [(cls, {"placement": p}) for cls in (ContiguousAllocator, OracleAllocator, Pow2Allocator)
              for p in PLACEMENTS] + [(PagedAllocator, {})]
OPS = st.lists(st.tuples(st.sampled_from(["admit", "grow", "grow", "grow", "fork", "free"]),
                         st.integers(0, 10_000), st.integers(1, 40)), min_size=1, max_size=80)


def occupancy(allocator) -> Counter:
    """How many owners each slot has: holes / free blocks count as one owner ('free')."""
    owners = Counter()
    if isinstance(allocator, PagedAllocator):
        bs = allocator.block_size
        used = {b for table in allocator.block_tables.values() for b in table}
        for block in list(allocator.free_blocks) + sorted(used):
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
    acc = allocator.accounting()
    parts = (acc.token, acc.reserved, acc.internal, acc.rounding, acc.free)
    assert all(p >= 0 for p in parts), parts
    assert sum(parts) == allocator.num_slots
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
                n = min(1 if pick % 3 else size, seq.final_len - seq.num_computed)
                if n > 0 and allocator.grow(seq, n):
                    seq.num_computed += n
                    seq.num_tokens = max(seq.num_tokens, seq.num_computed)
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
