"""PagedAttention's allocator: fixed-size blocks, per-sequence block tables, allocation on demand.

Blocks are handed out from a free queue when a sequence's last block fills up, shared between
sequences through reference counts (fork), copied on write when a shared, partly filled last
block is appended to, and returned when their count drops to zero. Every operation touches only
the blocks it hands out or takes back.

Prefix caching (`prefix_caching`, vLLM's scheme): a full block is named by the chained hash of
its parent block's hash and its own token ids. Admission reuses the longest run of cached blocks
that starts the sequence, never covering its last token (whose logits are needed). A freed
block keeps its hash and waits, least recently freed first, in a queue of evictable blocks; a
sequence frees its tail first, so its tail is evicted first. Never-cached free blocks are handed
out before any cached one is evicted.

Swapping (`enable_swap`): a preempted request's computed blocks are copied to a CPU pool of the
same block size, a block shared within the request once, and copied back when it resumes.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from kvbench.core.sequence import Sequence
from kvbench.errors import UserError
from kvbench.plugins.allocators.base import KVAllocator


class PagedAllocator(KVAllocator):
    """PagedAttention: blocks on demand, block tables, ref counts, copy-on-write."""

    name = "paged"
    layout = "paged"
    supports_swap = True

    def __init__(self, num_slots: int, max_model_len: int, block_size: int = 16,
                 watermark: float = 0.01, prefix_caching: bool = False, **options):
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
        self.prefix_caching = bool(prefix_caching)
        self.block_hash: list = [None] * self.num_blocks  # set while `cached` maps the hash to it
        self.cached: dict[int, int] = {}  # block hash -> block holding those tokens
        self.evictable: OrderedDict[int, None] = OrderedDict()  # free blocks that keep a hash
        self._hashes: dict[int, list[int]] = {}  # seq_id -> chained hashes of its full blocks
        self.prefix_hit_tokens = self.prefix_query_tokens = 0
        self.enable_swap(0)

    # --- blocks --------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks) + len(self.evictable)

    def _take_block(self) -> int:
        if self.free_blocks:
            block = self.free_blocks.popleft()
        else:  # evict the least recently freed cached block
            block, _ = self.evictable.popitem(last=False)
            del self.cached[self.block_hash[block]]
            self.block_hash[block] = None
        self.ref_count[block] = 1
        self.block_fill[block] = 0
        self._allocated += self.block_size
        return block

    def _drop_block(self, block: int) -> None:
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self._token -= self.block_fill[block]
            self._allocated -= self.block_size
            if self.block_hash[block] is None:
                self.free_blocks.append(block)
            else:
                self.evictable[block] = None

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

    # --- prefix caching ------------------------------------------------------------------
    def _cached_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Cached blocks (and their hashes) that hold the sequence's first tokens, in order."""
        tokens, bs = seq.token_ids, self.block_size
        blocks, hashes, parent = [], [], -1
        for index in range(min(seq.num_tokens - 1, len(tokens)) // bs):
            parent = hash((parent, tuple(tokens[index * bs:(index + 1) * bs])))
            block = self.cached.get(parent)
            if block is None:
                break
            blocks.append(block)
            hashes.append(parent)
        return blocks, hashes

    def _cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Name the sequence's blocks that are full once `num_tokens` tokens are stored."""
        hashes, tokens, bs = self._hashes[seq.seq_id], seq.token_ids, self.block_size
        table = self.block_tables[seq.seq_id]
        for index in range(len(hashes), min(num_tokens, len(tokens)) // bs):
            block_hash = hash((hashes[-1] if hashes else -1, tuple(tokens[index * bs:(index + 1) * bs])))
            hashes.append(block_hash)
            block = table[index]
            if block_hash not in self.cached and self.block_hash[block] is None:
                self.cached[block_hash] = block
                self.block_hash[block] = block_hash

    def _admit_cached(self, seq: Sequence) -> bool:
        hits, hashes = self._cached_prefix(seq)
        revived = sum(1 for block in hits if self.ref_count[block] == 0)
        need = -(-seq.num_tokens // self.block_size) - len(hits) + revived
        if self.num_free_blocks - need < self.watermark_blocks:
            return False
        for block in hits:
            if self.ref_count[block] == 0:
                del self.evictable[block]
                self._allocated += self.block_size
                self._token += self.block_fill[block]
            self.ref_count[block] += 1
        self.block_tables[seq.seq_id] = hits
        self._hashes[seq.seq_id] = hashes
        self._seq_reserved[seq.seq_id] = 0
        seq.num_computed = seq.num_cached = len(hits) * self.block_size
        self.prefix_hit_tokens += seq.num_cached
        self.prefix_query_tokens += seq.num_tokens
        self._update_reserved(seq, seq.num_computed)
        return True

    # --- the contract --------------------------------------------------------------------
    def admit(self, seq: Sequence) -> bool:
        if self.prefix_caching:
            return self._admit_cached(seq)
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
            # The slot was counted as reserved (a sequence never stores more than final_len)
            # unless the block was shared at the last count and a sibling has since copied it.
            seq_id, seq_reserved, block_fill = seq.seq_id, self._seq_reserved, self.block_fill
            block = self.block_tables[seq_id][-1]
            if self.ref_count[block] == 1 and seq_reserved[seq_id]:
                block_fill[block] += 1
                self._token += 1
                self._reserved -= 1
                seq_reserved[seq_id] -= 1
                if self.prefix_caching and block_fill[block] == self.block_size:
                    self._cache_full_blocks(seq, before + 1)
                return True
        after = before + num_tokens
        if self._blocks_needed(seq, after) > len(self.free_blocks) + len(self.evictable):
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
            self._log_copy("device", src * bs, dst * bs, bs)
            self.num_copies += 1
        while len(table) * bs < after:
            table.append(self._take_block())
        for index in range(before // bs, (after - 1) // bs + 1):
            block = table[index]
            filled = min(bs, after - index * bs)
            self._token += filled - self.block_fill[block]
            self.block_fill[block] = filled
        self._update_reserved(seq, after)
        if self.prefix_caching:
            self._cache_full_blocks(seq, after)
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        table = list(self.block_tables[parent.seq_id])
        for block in table:
            self.ref_count[block] += 1
        self.block_tables[child.seq_id] = table
        self._seq_reserved[child.seq_id] = 0
        if self.prefix_caching:
            self._hashes[child.seq_id] = list(self._hashes[parent.seq_id])
        child.num_computed = parent.num_computed
        self._update_reserved(parent, parent.num_computed)
        self._update_reserved(child, child.num_computed)

    def free(self, seq: Sequence) -> None:
        self._release(seq)
        self._hashes.pop(seq.seq_id, None)

    def _release(self, seq: Sequence) -> None:
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

    def stats(self) -> dict:
        rate = self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0
        return {**super().stats(), "prefix_hit_rate": rate}

    # --- swapping ------------------------------------------------------------------------
    def enable_swap(self, num_slots: int) -> None:
        """A CPU pool of `num_slots // block_size` blocks for swapped-out requests."""
        self.num_cpu_blocks = num_slots // self.block_size
        self.cpu_free = list(reversed(range(self.num_cpu_blocks)))  # pop() hands out the lowest
        self.cpu_ref = [0] * self.num_cpu_blocks
        self.cpu_fill = [0] * self.num_cpu_blocks
        self.cpu_tables: dict[int, list[int]] = {}

    def swap_out(self, seqs) -> bool:
        bs = self.block_size
        tables = [self.block_tables[seq.seq_id][:-(-seq.num_computed // bs)] for seq in seqs]
        if len({block for table in tables for block in table}) > len(self.cpu_free):
            return False
        to_cpu: dict[int, int] = {}
        for seq, table in zip(seqs, tables):
            for index, block in enumerate(table):
                if block not in to_cpu:
                    cpu = to_cpu[block] = self.cpu_free.pop()
                    self.cpu_fill[cpu] = min(bs, seq.num_computed - index * bs)  # computed tokens only
                    self._log_copy("out", block * bs, cpu * bs, bs)
                self.cpu_ref[to_cpu[block]] += 1
            self.cpu_tables[seq.seq_id] = [to_cpu[block] for block in table]
            self._release(seq)
        self.swapped_blocks += len(to_cpu)
        return True

    def swap_in(self, seqs) -> bool:
        """Copy a swapped request back, keeping a free block per sequence for its next token."""
        needed = {cpu for seq in seqs for cpu in self.cpu_tables[seq.seq_id]}
        if self.num_free_blocks - len(needed) - len(seqs) < self.watermark_blocks:
            return False
        bs = self.block_size
        to_device: dict[int, int] = {}
        for seq in seqs:
            table = []
            for cpu in self.cpu_tables.pop(seq.seq_id):
                block = to_device.get(cpu)
                if block is None:
                    block = to_device[cpu] = self._take_block()
                    self.block_fill[block] = self.cpu_fill[cpu]
                    self._token += self.cpu_fill[cpu]
                    self._log_copy("in", cpu * bs, block * bs, bs)
                else:
                    self.ref_count[block] += 1
                table.append(block)
                self.cpu_ref[cpu] -= 1
                if self.cpu_ref[cpu] == 0:
                    self.cpu_free.append(cpu)
            self.block_tables[seq.seq_id] = table
            self._seq_reserved[seq.seq_id] = 0
        for seq in seqs:  # once every table is back, so a shared last block is seen as shared
            self._update_reserved(seq, seq.num_computed)
        self.swapped_blocks += len(to_device)
        return True
