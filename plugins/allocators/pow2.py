"""Orca(Pow2): a buddy allocator over `block_size`-token blocks, reservations rounded to 2^k blocks.

The paper's baseline reserves prompt + output rounded up to a power of two of 16-token blocks,
capped at max_model_len (a power of two of blocks for OPT). Placement is a real buddy system: a
free list per order, splitting on allocation, merging with the buddy on free, so the external
fragmentation it shows is real.
"""

from __future__ import annotations

from kvbench.core.sequence import Sequence
from kvbench.plugins.allocators.contiguous import ReservingAllocator


class BuddySpace:
    """Buddy system over `num_blocks` blocks of `block_size` slots; addresses are in slots.

    A pool that is not a power of two is cut into aligned power-of-two arenas (its binary
    digits, largest first); buddies never merge across arenas.
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free_lists: list[set[int]] = [set() for _ in range(max(num_blocks, 1).bit_length())]
        self.arena_order: dict[int, int] = {}  # arena start block -> its order
        start = 0
        for order in reversed(range(len(self.free_lists))):
            if num_blocks & (1 << order):
                self.free_lists[order].add(start)
                self.arena_order[start] = order
                start += 1 << order
        self._arena_starts = sorted(self.arena_order)

    def _arena_of(self, block: int) -> tuple[int, int]:
        start = max(s for s in self._arena_starts if s <= block)  # at most one per bit of the pool
        return start, self.arena_order[start]

    def allocate(self, length: int) -> int | None:
        """Start slot of a 2^k-block range holding `length` slots, or None."""
        blocks = -(-length // self.block_size)
        order = (blocks - 1).bit_length()
        for have in range(order, len(self.free_lists)):
            if self.free_lists[have]:
                block = min(self.free_lists[have])  # lowest address first, like first-fit
                self.free_lists[have].remove(block)
                while have > order:  # split, keeping the lower half
                    have -= 1
                    self.free_lists[have].add(block + (1 << have))
                return block * self.block_size
        return None

    def release(self, start: int, length: int) -> None:
        block = start // self.block_size
        order = (-(-length // self.block_size) - 1).bit_length()
        arena, arena_order = self._arena_of(block)
        while order < arena_order:
            buddy = arena + ((block - arena) ^ (1 << order))
            if buddy not in self.free_lists[order]:
                break
            self.free_lists[order].remove(buddy)
            block = min(block, buddy)
            order += 1
        self.free_lists[order].add(block)


class Pow2Allocator(ReservingAllocator):
    """Orca(Pow2): buddy allocator, prompt + output rounded up to 2^k blocks."""

    name = "pow2"

    def _make_space(self):
        return BuddySpace(self.num_slots // self.block_size, self.block_size)

    def footprint(self, request_len: int) -> int:
        blocks = -(-request_len // self.block_size)
        # For OPT's 2048 = 128 blocks the paper's cap at max_model_len is a power of two already.
        return (1 << (blocks - 1).bit_length()) * self.block_size

    def reservation(self, seq: Sequence) -> int:
        return self.footprint(seq.request.max_tokens)
