"""Where a reservation goes in a linear slot space: first-fit holes or the paper's buddy system.

A placement hands out ranges of whole blocks and takes them back. `held(length)` is what it
really sets aside for a request of `length` slots, so the slots beyond `length` are rounding the
placement itself causes (a buddy chunk's padding); everything it leaves between ranges is
external fragmentation, observed, never estimated.

Each space counts its changes (`version`: a range placed or released), so that a caller can
tell that a request it could not place still cannot be placed.
"""

from __future__ import annotations

import bisect
import heapq

from kvbench.arith import cdiv
from kvbench.errors import UserError

PLACEMENTS = ("buddy", "first_fit")


class LazyHeap:
    """A min-heap whose entries may go stale (what they name changed since they were pushed):
    `top` skips the stale ones it meets, as `live(entry)` tells, and `push` rebuilds the heap
    from `entries()` once it is mostly stale, so it stays O(live entries) and every change costs
    O(log n) amortized. Both placements keep their free space's smallest entry so."""

    def __init__(self, live, entries):
        self.live, self.entries = live, entries
        self.heap = sorted(entries())

    def push(self, entry, num_live: int) -> None:
        if len(self.heap) > 2 * num_live + 64:  # mostly stale: rebuilt from the live ones
            self.heap = sorted(self.entries())
        else:
            heapq.heappush(self.heap, entry)

    def top(self):
        """The smallest live entry; None where there is none."""
        heap, live = self.heap, self.live
        while heap and not live(heap[0]):
            heapq.heappop(heap)
        return heap[0] if heap else None


class FirstFitSpace:
    """Holes of a linear space of `size` slots; allocation takes the lowest hole that fits.

    It walks the holes from the lowest, O(holes) where the one that fits lies far up; a request
    that no hole fits is refused in O(log n) from a heap of the holes by length (the queue's head
    is such a request while the pool is full, asked again after every release)."""

    def __init__(self, size: int):
        self.starts = [0]  # sorted hole starts
        self.lengths = {0: size}
        self.version = 0
        # the holes by length, as (-length, start): an entry holds while `lengths` still says so
        lengths = self.lengths
        self._by_length = LazyHeap(
            lambda entry: lengths.get(entry[1]) == -entry[0], lambda: [(-n, s) for s, n in lengths.items()]
        )

    def _hole(self, start: int, length: int) -> None:
        self.lengths[start] = length
        self._by_length.push((-length, start), len(self.lengths))

    def _largest(self) -> int:
        top = self._by_length.top()
        return -top[0] if top else 0

    def held(self, length: int) -> int:
        return length

    def allocate(self, length: int) -> int | None:
        if length > self._largest():
            return None
        for start in self.starts:  # one entry per hole, from the lowest
            hole = self.lengths[start]
            if hole >= length:
                i = bisect.bisect_left(self.starts, start)
                del self.starts[i]
                del self.lengths[start]
                if hole > length:
                    self.starts.insert(i, start + length)
                    self._hole(start + length, hole - length)
                self.version += 1
                return start
        return None

    def release(self, start: int, length: int) -> None:
        self.version += 1
        i = bisect.bisect_left(self.starts, start)
        if i < len(self.starts) and start + length == self.starts[i]:  # merge with the next hole
            nxt = self.starts.pop(i)
            length += self.lengths.pop(nxt)
        if i > 0:
            prev = self.starts[i - 1]
            if prev + self.lengths[prev] == start:  # merge with the previous hole
                self._hole(prev, self.lengths[prev] + length)
                return
        self.starts.insert(i, start)
        self._hole(start, length)


class BuddySpace:
    """Buddy system over `num_blocks` blocks of `block_size` slots; addresses are in slots.

    The largest chunk is 2^max_order blocks (the paper's: max_model_len slots, 128 blocks of 16
    for OPT). The pool is cut into aligned arenas: as many largest chunks as fit, then the rest
    by its binary digits, largest first; buddies never merge across arenas.
    """

    def __init__(self, num_blocks: int, block_size: int, max_order: int):
        self.block_size = block_size
        self.free_lists: list[set[int]] = [set() for _ in range(max_order + 1)]
        # each order's free chunks as a heap too, for the lowest in O(log n) rather than a scan of
        # the set (min() of 262,144 free chunks took 4 ms an admission); a chunk merged away stays
        # in its heap, stale, until met or rebuilt
        self._heaps = [LazyHeap(free.__contains__, lambda free=free: free) for free in self.free_lists]
        self.arena_order: dict[int, int] = {}  # arena start block -> its order
        self.version = 0
        start = 0
        for _ in range(num_blocks >> max_order):
            self._add_arena(start, max_order)
            start += 1 << max_order
        rest = num_blocks - start
        for order in reversed(range(max_order)):
            if rest & (1 << order):
                self._add_arena(start, order)
                start += 1 << order
        self._arena_starts = sorted(self.arena_order)

    def _add_arena(self, start: int, order: int) -> None:
        self._free(start, order)
        self.arena_order[start] = order

    def _free(self, block: int, order: int) -> None:
        free = self.free_lists[order]
        free.add(block)
        self._heaps[order].push(block, len(free))

    def _lowest(self, order: int) -> int:
        """The lowest free chunk of `order` (there is one), taken off its free list."""
        block = self._heaps[order].top()
        self.free_lists[order].remove(block)  # its entry, stale now, goes when next met
        return block

    def _order(self, length: int) -> int:
        return (cdiv(length, self.block_size) - 1).bit_length()

    def held(self, length: int) -> int:
        return (1 << self._order(length)) * self.block_size

    def allocate(self, length: int) -> int | None:
        """Start slot of a 2^k-block chunk holding `length` slots, or None."""
        order = self._order(length)
        for have in range(order, len(self.free_lists)):
            if self.free_lists[have]:
                block = self._lowest(have)  # lowest address first, like first-fit
                while have > order:  # split, keeping the lower half
                    have -= 1
                    self._free(block + (1 << have), have)
                self.version += 1
                return block * self.block_size
        return None

    def release(self, start: int, length: int) -> None:
        self.version += 1
        block, order = start // self.block_size, self._order(length)
        arena = self._arena_starts[bisect.bisect_right(self._arena_starts, block) - 1]
        arena_order = self.arena_order[arena]
        while order < arena_order:
            buddy = arena + ((block - arena) ^ (1 << order))
            if buddy not in self.free_lists[order]:
                break
            self.free_lists[order].remove(buddy)  # its heap entry goes when next met (_lowest)
            block = min(block, buddy)
            order += 1
        self._free(block, order)


def make_space(placement: str, num_blocks: int, block_size: int, max_model_len: int):
    """The placement `allocator.placement` names, over `num_blocks` blocks."""
    if placement == "first_fit":
        return FirstFitSpace(num_blocks * block_size)
    if placement == "buddy":
        largest = cdiv(max_model_len, block_size)  # blocks of the longest reservation
        return BuddySpace(num_blocks, block_size, (largest - 1).bit_length())
    raise UserError(f"allocator.placement={placement!r} is not one of {', '.join(PLACEMENTS)}")
