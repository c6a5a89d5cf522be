"""Orca(Pow2): reserve the prompt plus the output length rounded up to a power of two.

The artifact rounds the estimate of the *output* and then adds the prompt; the placement
(buddy by default) rounds the whole reservation up again to a power of two of blocks.
"""

from __future__ import annotations

from kvbench.plugins.allocators.contiguous import ReservingAllocator


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


class Pow2Allocator(ReservingAllocator):
    """Orca(Pow2): the output estimate is the next power of two of the true output length."""

    name = "pow2"

    def estimate(self, output_len: int) -> int:
        return next_pow2(output_len)
