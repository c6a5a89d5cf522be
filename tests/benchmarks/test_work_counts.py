"""The work counter behind the exact hot-path gate: the same code counts the same, a hidden
O(pool) scan counts thousands of lines more (these run in the test suite, not as benchmarks)."""

from __future__ import annotations

from test_hot_paths import COUNTED_STEPS, decode_step, running_scheduler
from work_counter import count_work

from kvbench.plugins.allocators.block_pool import BlockPool
from kvbench.plugins.allocators.paged import PagedAllocator


class ScanningBlockPool(BlockPool):
    """A regression a profile would miss at this size: each new block is found by a pool scan."""

    def take(self) -> int:
        next(i for i, count in enumerate(self.ref_count) if count == 0)
        return super().take()


class ScanningPagedAllocator(PagedAllocator):
    """The paged allocator on that pool. The scan goes into BlockPool.take, which every new block
    still goes through: a decode step that starts a block calls pool.take from grow directly, and
    the steps in between take room in the last block without calling the allocator at all."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool.__class__ = ScanningBlockPool  # same state; grow's aliases of its lists still hold


def lines_per_step(allocator_cls, running: int = 256) -> float:
    scheduler = running_scheduler(allocator_cls(running * 2048, 2048, block_size=16), running)
    return count_work(lambda: decode_step(scheduler), COUNTED_STEPS)[1]


def test_identical_code_counts_identical_work():
    scheduler_a = running_scheduler(PagedAllocator(256 * 2048, 2048, block_size=16))
    scheduler_b = running_scheduler(PagedAllocator(256 * 2048, 2048, block_size=16))
    assert count_work(lambda: decode_step(scheduler_a), COUNTED_STEPS) == count_work(
        lambda: decode_step(scheduler_b), COUNTED_STEPS
    )


def test_an_injected_pool_scan_is_caught_and_grows_with_the_pool_in_use():
    clean, scanning = lines_per_step(PagedAllocator), lines_per_step(ScanningPagedAllocator)
    # 256 new blocks over 16 steps, each scan walking past the ~2,000 blocks in use
    assert scanning > 3 * clean
    clean_1k, scanning_1k = lines_per_step(PagedAllocator, 1024), lines_per_step(ScanningPagedAllocator, 1024)
    assert clean_1k < 4.5 * clean  # the step itself is linear in the batch
    assert scanning_1k - clean_1k > 10 * (scanning - clean)  # the scan is batch x pool in use


def test_garbage_left_by_earlier_code_is_not_counted():
    """A finalizer that a collection runs is Python code: garbage from before the count (here
    cycles holding a weakref.finalize, as an unclosed result file leaves) must not add to it,
    even when the collection falls due inside the counted steps."""
    import gc
    import weakref

    class Cycle:
        pass

    def step(scheduler):
        gc.enable()  # from here a collection due runs at the step's next allocation
        return decode_step(scheduler)

    scheduler_a = running_scheduler(PagedAllocator(256 * 2048, 2048, block_size=16))
    scheduler_b = running_scheduler(PagedAllocator(256 * 2048, 2048, block_size=16))
    clean = count_work(lambda: step(scheduler_a), COUNTED_STEPS)
    gc.disable()
    try:
        for _ in range(2000):
            cycle = Cycle()
            cycle.me = cycle
            weakref.finalize(cycle, lambda: None)
        del cycle
        assert count_work(lambda: step(scheduler_b), COUNTED_STEPS) == clean
    finally:
        gc.enable()
