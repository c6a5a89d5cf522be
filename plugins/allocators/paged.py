"""PagedAttention's allocator: fixed-size blocks, per-sequence block tables, allocation on demand.

Blocks are handed out from a free queue when a sequence's last block fills up, shared between
sequences through reference counts (fork), copied on write when a shared, partly filled last
block is appended to, and returned when their count drops to zero. Every operation touches only
the blocks it hands out or takes back.
"""

from __future__ import annotations

from collections import deque

from kvbench.errors import UserError
from kvbench.plugins.allocators.base import KVAllocator
from kvbench.sequence import Sequence


class PagedAllocator(KVAllocator):
    name = "paged"
    layout = "paged"
    description = "PagedAttention: blocks on demand, block tables, ref counts, copy-on-write"

    def __init__(self, num_slots: int, max_model_len: int, block_size: int = 16,
                 watermark: float = 0.01, **options):
        super().__init__(num_slots, max_model_len, block_size, **options)
        if not 0.0 <= watermark < 1.0:
            raise UserError(f"allocator.watermark={watermark} must be in [0, 1)")
        self.num_blocks = num_slots // block_size
        self.num_slots = self.num_blocks * block_size  # a partial block at the end is unusable
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.free_blocks: deque[int] = deque(range(self.num_blocks))
        self.ref_count = [0] * self.num_blocks
        self.block_fill = [0] * self.num_blocks  # slots of the block holding token state
        self.block_tables: dict[int, list[int]] = {}
        self._seq_reserved: dict[int, int] = {}
        self.cow_copies: list[tuple[int, int]] = []  # (src, dst) the executor must copy this step

    # --- blocks --------------------------------------------------------------------------
    def _take_block(self) -> int:
        block = self.free_blocks.popleft()
        self.ref_count[block] = 1
        self.block_fill[block] = 0
        self._allocated += self.block_size
        return block

    def _drop_block(self, block: int) -> None:
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self._token -= self.block_fill[block]
            self._allocated -= self.block_size
            self.free_blocks.append(block)

    def _blocks_needed(self, seq: Sequence, after: int) -> int:
        table = self.block_tables[seq.seq_id]
        need = -(-after // self.block_size) - len(table)
        if table and seq.num_computed % self.block_size and self.ref_count[table[-1]] > 1:
            need += 1  # the shared partial last block is copied before it is written
        return need

    def _update_reserved(self, seq: Sequence, num_tokens: int) -> None:
        table = self.block_tables[seq.seq_id]
        # Empty slots of a shared last block belong to nobody yet: the writer copies it first.
        own = bool(table) and self.ref_count[table[-1]] == 1
        new = self._reserved_for(len(table) * self.block_size, num_tokens, seq.final_len) if own else 0
        self._reserved += new - self._seq_reserved[seq.seq_id]
        self._seq_reserved[seq.seq_id] = new

    # --- the contract --------------------------------------------------------------------
    def admit(self, seq: Sequence) -> bool:
        need = -(-seq.num_tokens // self.block_size)
        if len(self.free_blocks) - need < self.watermark_blocks:
            return False
        self.block_tables[seq.seq_id] = []
        self._seq_reserved[seq.seq_id] = 0
        return True

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        before = seq.num_computed
        if num_tokens == 1 and before % self.block_size:
            # The decode fast path: room in an unshared last block, which this token fills by one.
            # The slot was counted as reserved (a sequence never stores more than final_len).
            block = self.block_tables[seq.seq_id][-1]
            if self.ref_count[block] == 1:
                self.block_fill[block] += 1
                self._token += 1
                self._reserved -= 1
                self._seq_reserved[seq.seq_id] -= 1
                return True
        after = before + num_tokens
        if self._blocks_needed(seq, after) > len(self.free_blocks):
            return False
        table = self.block_tables[seq.seq_id]
        bs = self.block_size
        if before % bs and self.ref_count[table[-1]] > 1:
            src = table[-1]
            dst = self._take_block()
            self.block_fill[dst] = self.block_fill[src]
            self._token += self.block_fill[src]
            self._drop_block(src)
            table[-1] = dst
            self.cow_copies.append((src, dst))
            self.num_copies += 1
        while len(table) * bs < after:
            table.append(self._take_block())
        for index in range(before // bs, (after - 1) // bs + 1):
            block = table[index]
            filled = min(bs, after - index * bs)
            self._token += filled - self.block_fill[block]
            self.block_fill[block] = filled
        self._update_reserved(seq, after)
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        table = list(self.block_tables[parent.seq_id])
        for block in table:
            self.ref_count[block] += 1
        self.block_tables[child.seq_id] = table
        self._seq_reserved[child.seq_id] = 0
        child.num_computed = parent.num_computed
        self._update_reserved(parent, parent.num_computed)
        self._update_reserved(child, child.num_computed)

    def free(self, seq: Sequence) -> None:
        for block in reversed(self.block_tables.pop(seq.seq_id)):
            self._drop_block(block)
        self._reserved -= self._seq_reserved.pop(seq.seq_id)

    def capacity(self, seq: Sequence) -> int:
        return len(self.block_tables[seq.seq_id]) * self.block_size

    def footprint(self, request_len: int) -> int:
        return -(-request_len // self.block_size) * self.block_size

    def can_ever_admit(self, final_len: int) -> bool:
        return self.footprint(final_len) <= (self.num_blocks - self.watermark_blocks) * self.block_size

    def block_table(self, seq: Sequence) -> list[int]:
        return self.block_tables[seq.seq_id]

    def take_cow_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write (src, dst) block pairs made since the last call; the executor copies them."""
        copies, self.cow_copies = self.cow_copies, []
        return copies
