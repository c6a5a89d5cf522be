"""PagedAttention's allocator: fixed-size blocks, per-sequence block tables, allocation on demand.

Blocks are handed out from a free queue when a sequence's last block fills up, shared between
sequences through reference counts (fork), copied on write when a shared, partly filled last
block is appended to, and returned when their count drops to zero. Every operation touches only
the blocks it hands out or takes back.

Prefix caching (`prefix_caching`, vLLM's scheme): a full block is named by the chained hash of
its parent block's hash and its own token ids (block_pool). Admission reuses the longest run of
cached blocks that starts the sequence, never covering its last token (whose logits are
needed). Freed blocks keep their content until the pool evicts them (block_pool states the order).

Decode steps cost no call: whenever a sequence's last block is its own, the allocator grants the
sequence room (`Sequence.room`) for the single tokens that block still takes and that the
sequence will really produce. The scheduler takes that room itself; the totals are counted at
once (`took_room`), a block that the room filled is named when it fills (`room_ran_out`),
each block's fill and each sequence's reservation when anything else touches the
sequence (`_settle`).

Sharing is counted as it happens: `num_named_blocks` is the length of every block table summed,
kept where a table is made, grows, is forked, given back, swapped out or in, so the blocks
sharing saves (named less held) cost no pass over the tables.

Swapping (`enable_swap`): a preempted request's computed blocks are copied to a CPU pool of the
same block size, a block shared within the request once, and copied back when it resumes.
"""

from __future__ import annotations

from collections import deque

from kvbench.arith import cdiv
from kvbench.core.sequence import Sequence
from kvbench.errors import UserError
from kvbench.plugins.allocators.base import KVAllocator
from kvbench.plugins.allocators.block_pool import ROOT_HASH, BlockPool, extend_hashes, hash_block


class PagedAllocator(KVAllocator):
    """PagedAttention: blocks on demand, block tables, ref counts, copy-on-write."""

    name = "paged"
    layout = "paged"
    supports_swap = True

    def __init__(
        self,
        num_slots: int,
        max_model_len: int,
        block_size: int = 16,
        watermark: float = 0.01,
        prefix_caching: bool = False,
        **options,
    ):
        super().__init__(num_slots, max_model_len, block_size, **options)
        if not 0.0 <= watermark < 1.0:
            raise UserError(f"allocator.watermark={watermark} must be in [0, 1)")
        self.num_blocks = num_slots // block_size
        self.num_slots = self.num_blocks * block_size  # a partial block at the end is unusable
        self.pool = BlockPool(self.num_blocks, watermark=watermark)
        self.watermark_blocks = self.pool.watermark_blocks
        # the pool's per-block lists, read on every decode step
        self.ref_count, self.block_fill = self.pool.ref_count, self.pool.fill
        self.block_tables: dict[int, list[int]] = {}
        self.num_named_blocks = 0  # sum of the block tables' lengths: a shared block once per table
        self._seq_reserved: dict[int, int] = {}
        self._granted: dict[int, int] = {}  # seq_id -> its room when last counted
        self.prefix_caching = bool(prefix_caching)
        self.quiet_room = not self.prefix_caching  # room_ran_out names blocks only for the cache
        # striding needs blocks of more than one token (grow_steady's) and no cache to name them
        self.stride = block_size if self.quiet_room and block_size > 1 else 0
        self._striding: deque[int] = deque()  # blocks take_striding took, not yet handed out
        self._hashes: dict[int, list[int]] = {}  # seq_id -> chained hashes of its full blocks
        # (seq_id, its blocks' hashes as far as its lookups went) of the last sequence refused: a
        # head of the queue refused step after step looks its prefix up each time, but hashes it
        # once. One entry, whoever empties the queue; dropped once that sequence is admitted.
        self._waiting_chain: tuple[int, list[int]] = (-1, [])
        self.prefix_hit_tokens = self.prefix_query_tokens = 0
        self.preempted_hit_tokens = 0  # what re-admitted victims found cached (vLLM's preempted_hits)
        self.enable_swap(0)

    # --- blocks --------------------------------------------------------------------------
    def _take_block(self) -> int:
        self._allocated += self.block_size
        return self.pool.take()

    def _blocks_needed(self, seq: Sequence, after: int) -> int:
        table = self.block_tables[seq.seq_id]
        need = cdiv(after, self.block_size) - len(table)
        if table and seq.num_computed % self.block_size and self.ref_count[table[-1]] > 1:
            need += 1  # the shared partial last block is copied before it is written
        return need

    def _update_reserved(self, seq: Sequence, num_tokens: int) -> None:
        """Recount `seq`'s reservation once it holds `num_tokens` tokens, and grant its room."""
        seq_id, table, bs = seq.seq_id, self.block_tables[seq.seq_id], self.block_size
        # Empty slots of a shared last block belong to nobody yet: the writer copies it first.
        own = bool(table) and self.ref_count[table[-1]] == 1
        new = self._reserved_for(len(table) * bs, num_tokens, seq.final_len) if own else 0
        self._reserved += new - self._seq_reserved[seq_id]
        self._seq_reserved[seq_id] = new
        # the scheduler takes room only for sequences it schedules alone (not a request's samples)
        room = min(new, bs - num_tokens % bs) if new and num_tokens % bs and seq.group is None else 0
        seq.room = self._granted[seq_id] = room

    def _settle(self, seq: Sequence) -> None:
        """Count the room `seq` took since it was last counted: its last block's fill, its reservation."""
        seq_id = seq.seq_id
        taken = self._granted.get(seq_id, 0) - seq.room
        if taken:
            self.block_fill[self.block_tables[seq_id][-1]] += taken
            self._seq_reserved[seq_id] -= taken
            self._granted[seq_id] = seq.room

    def took_room(self, num_tokens: int) -> None:
        self._token += num_tokens
        self._reserved -= num_tokens

    def room_ran_out(self, seq: Sequence) -> None:
        if self.prefix_caching:  # the room may have filled the last block: name it now
            self._settle(seq)
            table = self.block_tables[seq.seq_id]
            if self.block_fill[table[-1]] == self.block_size:
                self._name_last_block(seq, table[-1], len(table) * self.block_size)

    # --- prefix caching ------------------------------------------------------------------
    def _cached_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Cached blocks (and their hashes) that hold the sequence's first tokens, in order. The
        hashes are kept until it is admitted or another is looked up (its tokens do not change
        while it waits)."""
        tokens, bs = self.token_ids(seq, seq.num_tokens - 1), self.block_size
        if self._waiting_chain[0] != seq.seq_id:
            self._waiting_chain = (seq.seq_id, [])
        chain = self._waiting_chain[1]
        blocks, cached = [], self.pool.cached
        for parent in chain:  # hashed at an earlier try: looked up again
            block = cached.get(parent)
            if block is None:
                return blocks, chain[: len(blocks)]
            blocks.append(block)
        parent = chain[-1] if chain else ROOT_HASH
        for index in range(len(chain), min(seq.num_tokens - 1, len(tokens)) // bs):
            parent = hash_block(parent, tokens[index * bs : (index + 1) * bs])
            chain.append(parent)
            block = cached.get(parent)
            if block is None:
                break
            blocks.append(block)
        return blocks, chain[: len(blocks)]

    def _cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Name the sequence's blocks that are full once `num_tokens` tokens are stored."""
        hashes, tokens, bs = self._hashes[seq.seq_id], self.token_ids(seq, num_tokens), self.block_size
        table, known = self.block_tables[seq.seq_id], len(hashes)
        extend_hashes(hashes, tokens, bs, min(num_tokens, len(tokens)) // bs)
        for index in range(known, len(hashes)):
            self.pool.name(table[index], hashes[index])

    def _name_last_block(self, seq: Sequence, block: int, num_tokens: int) -> None:
        """`seq`'s last block `block` just filled at `num_tokens` tokens: name it (the common
        case of _cache_full_blocks, once a block on every decoding sequence's way)."""
        hashes, tokens, bs = self._hashes[seq.seq_id], self.token_ids(seq, num_tokens), self.block_size
        if len(hashes) * bs + bs != num_tokens or len(tokens) < num_tokens:
            return self._cache_full_blocks(seq, num_tokens)
        block_hash = hash_block(hashes[-1] if hashes else ROOT_HASH, tokens[num_tokens - bs : num_tokens])
        hashes.append(block_hash)
        self.pool.name(block, block_hash)

    def _admit_cached(self, seq: Sequence) -> bool:
        hits, hashes = self._cached_prefix(seq)
        pool = self.pool
        if not pool.fits(
            pool.admission_need(cdiv(seq.num_tokens, self.block_size), hits), reserve=not self.watermark_exempt
        ):
            return False
        self._waiting_chain = (-1, [])  # admitted: a running beam's tokens may change from here on
        ref_count = self.ref_count
        for block in hits:
            if ref_count[block]:  # held by a live sequence: one holder more (pool.hold, inlined)
                ref_count[block] += 1
            elif pool.hold(block):
                self._allocated += self.block_size
                self._token += self.block_fill[block]
        self.block_tables[seq.seq_id] = hits
        self.num_named_blocks += len(hits)
        self._hashes[seq.seq_id] = hashes
        self._seq_reserved[seq.seq_id] = 0
        seq.num_computed = len(hits) * self.block_size
        if not seq.num_preemptions:  # a preempted request's lookup counts apart (docs/metrics.md)
            seq.num_cached = seq.num_computed
            self.prefix_hit_tokens += seq.num_cached
            self.prefix_query_tokens += seq.num_tokens
        else:
            self.preempted_hit_tokens += seq.num_computed
        self._update_reserved(seq, seq.num_computed)
        return True

    # --- the contract --------------------------------------------------------------------
    def admit(self, seq: Sequence) -> bool:
        if self.prefix_caching:
            return self._admit_cached(seq)
        if not self.pool.fits(cdiv(seq.num_tokens, self.block_size), reserve=not self.watermark_exempt):
            return False
        self.block_tables[seq.seq_id] = []
        self._seq_reserved[seq.seq_id] = 0
        seq.room = 0
        return True

    def refuses_again(self, seq: Sequence, times: int) -> bool:
        # Without the cache admit() asks only whether the prompt's blocks are free, which room
        # leaves as it is, and a refusal counts nothing; with it, every admission is tried.
        if self.prefix_caching:
            return False
        return not self.pool.fits(cdiv(seq.num_tokens, self.block_size), reserve=not self.watermark_exempt)

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        room = seq.room
        if num_tokens == 1 and room:  # what the scheduler takes itself, when it asks
            seq.room = room - 1
            self.took_room(1)
            if room == 1:
                self.room_ran_out(seq)
            return True
        seq_id, before, bs = seq.seq_id, seq.num_computed, self.block_size
        table, pool = self.block_tables[seq_id], self.pool
        if num_tokens == 1 and len(table) * bs == before and bs > 1 and (pool.free or pool.evictable):
            seq.room = self._new_last_block(seq, table, before, room)
            return True
        if self._granted.get(seq_id, 0) != room:  # room taken since it was last counted
            self._settle(seq)
        if num_tokens == 1:  # the decode steps that end or start a block, kept short
            block_fill = self.block_fill
            if before % bs:
                block = table[-1]
                if self.ref_count[block] == 1 and self._seq_reserved[seq_id]:
                    # the token that fills the last block, which prefix caching then names
                    block_fill[block] += 1
                    self._token += 1
                    self._reserved -= 1
                    self._seq_reserved[seq_id] -= 1
                    if self.prefix_caching and block_fill[block] == bs:
                        self._name_last_block(seq, block, before + 1)
                    return True
            elif len(table) * bs == before:  # a new block with none free, or blocks of one token
                if not (pool.free or pool.evictable):
                    return False
                block = pool.take()
                table.append(block)
                self.num_named_blocks += 1
                block_fill[block] = 1
                self._allocated += bs
                self._token += 1
                self._update_reserved(seq, 1 + before)
                if self.prefix_caching:
                    self._cache_full_blocks(seq, before + 1)
                return True
        after = before + num_tokens
        if not self.pool.fits(self._blocks_needed(seq, after), reserve=False):
            return False
        table = self.block_tables[seq.seq_id]
        if before % bs and self.ref_count[table[-1]] > 1:
            src = table[-1]
            dst = table[-1] = self.pool.copy_on_write(src)
            self._allocated += bs
            self._token += self.block_fill[dst]
            self._log_copy("device", src * bs, dst * bs, bs)
            self.num_copies += 1
        new_blocks = cdiv(after, bs) - len(table)
        if new_blocks > 0:
            table += self.pool.take_blocks(new_blocks)
            self._allocated += new_blocks * bs
            self.num_named_blocks += new_blocks
        block_fill, last = self.block_fill, (after - 1) // bs
        added = 0
        for block in table[before // bs : last]:  # the blocks it fills
            added += bs - block_fill[block]
            block_fill[block] = bs
        block = table[last]  # and the one it ends in
        added += after - last * bs - block_fill[block]
        block_fill[block] = after - last * bs
        self._token += added
        self._update_reserved(seq, after)
        if self.prefix_caching:
            self._cache_full_blocks(seq, after)
        return True

    def _new_last_block(self, seq: Sequence, table: list[int], before: int, room: int) -> int:
        """The token after `before` starts a new block: a block on every decoding sequence's
        way, kept short. _settle and _update_reserved inlined: the room taken since it was last
        counted (`room` is what is left of it) filled the old last block, and the new
        reservation replaces the settled one. Returns the room granted in the new block."""
        seq_id, bs = seq.seq_id, self.block_size
        taken = self._granted.get(seq_id, 0) - room
        if taken:
            self.block_fill[table[-1]] += taken
        block = self.pool.take()
        table.append(block)
        self.num_named_blocks += 1
        self.block_fill[block] = 1
        self._allocated += bs
        self._token += 1
        new = seq.final_len - before - 1  # slots reserved in the new block: to its end, or to
        if new >= bs:  # the sequence's final length
            new = bs - 1
        elif new < 0:
            new = 0
        self._reserved += new - self._seq_reserved[seq_id] + taken
        self._seq_reserved[seq_id] = new
        self._granted[seq_id] = granted = new if seq.group is None else 0
        return granted

    def grow_steady(self, seq: Sequence, num_computed: int) -> int | None:
        # Asked only while quiet_room (no prefix cache to name the filled block) and of a steady
        # sequence, which had room: so blocks hold more than one token (grow's `bs > 1`).
        table, pool = self.block_tables[seq.seq_id], self.pool
        if len(table) * self.block_size != num_computed or not (pool.free or pool.evictable):
            return None
        return self._new_last_block(seq, table, num_computed, 0)

    def grow_steady_all(self, seqs: list[Sequence], num_computed: list[int], striding: int = 0) -> list[int] | None:
        # Taking blocks can only keep admission's pool.fits refusing, and refuses_again reads
        # nothing else: the promise holds.
        free = self.steady_blocks(seqs, num_computed)
        if free is None or free < len(seqs) + striding:
            return None
        tables, new_last_block = self.block_tables, self._new_last_block
        granted = []  # a loop, not a comprehension (block_pool.take_blocks says why)
        for seq, before in zip(seqs, num_computed):
            granted.append(new_last_block(seq, tables[seq.seq_id], before, 0))
        if striding:
            self.take_striding(striding)
        return granted

    def steady_blocks(self, seqs=(), num_computed=()) -> int | None:
        bs, tables = self.block_size, self.block_tables
        for seq, before in zip(seqs, num_computed):
            if len(tables[seq.seq_id]) * bs != before:
                return None  # its last block is not full: grow_steady would refuse it
        return self.pool.num_free

    # Striding. A steady sequence that grow_steady gave a block it will fill (a whole block's
    # room, bs - 1, granted) crosses again bs steps later, and there, of _new_last_block's work,
    # only the totals change alike for every such sequence: a block allocated, its first token,
    # a new block's reservation (the old one was all taken as room). take_striding counts those
    # for all the crossings of a step and takes their blocks; hand_striding later appends them
    # to the sequence's table with the fills _new_last_block would have left (the old last block
    # full, each handed block but the newest full, the newest holding one token). Its
    # reservation and granted room stay bs - 1 throughout, as _new_last_block leaves them.
    def crossings_ahead(self, seq: Sequence, num_computed: int) -> int:
        if not self.stride:
            return 0
        # the crossing at num_computed + k*bs is alike while the sequence fills that block whole
        return max(0, (seq.final_len - num_computed) // self.block_size - 1)

    def take_striding(self, count: int) -> bool:
        pool, bs = self.pool, self.block_size
        if pool.num_free < count:
            return False
        self._striding.extend(pool.take_blocks(count))
        self._allocated += bs * count
        self._token += count
        self._reserved += (bs - 1) * count
        self.num_named_blocks += count
        return True

    def hand_striding(self, seq: Sequence, count: int) -> None:
        table, fill, bs, taken = self.block_tables[seq.seq_id], self.block_fill, self.block_size, self._striding
        fill[table[-1]] += self._granted[seq.seq_id]  # its room in its last block, all taken (bs - 1)
        for _ in range(count - 1):
            block = taken.popleft()
            fill[block] = bs
            table.append(block)
        block = taken.popleft()
        fill[block] = 1
        table.append(block)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        self._settle(parent)
        table = list(self.block_tables[parent.seq_id])
        for block in table:
            self.ref_count[block] += 1
        self.block_tables[child.seq_id] = table
        self.num_named_blocks += len(table)
        self._seq_reserved[child.seq_id] = 0
        if self.prefix_caching:
            self._hashes[child.seq_id] = list(self._hashes[parent.seq_id])
        child.num_computed = parent.num_computed
        self._update_reserved(parent, parent.num_computed)
        self._update_reserved(child, child.num_computed)

    def free(self, seq: Sequence) -> None:
        self._release(seq)
        self._hashes.pop(seq.seq_id, None)

    def forget_unrun(self, seqs) -> None:
        # the blocks each named past its computed tokens (a sibling's hit on them lies past the
        # sibling's own count too: it was found in the same round), and its hashes of them, which
        # a swap-in would name again
        if not self.prefix_caching:
            return
        for seq in seqs:
            hashes = self._hashes.get(seq.seq_id)
            if hashes is not None:
                self.pool.unname_unrun(self.block_tables[seq.seq_id], hashes, seq.num_computed // self.block_size)

    def _release(self, seq: Sequence) -> None:
        self._settle(seq)
        table = self.block_tables.pop(seq.seq_id)
        self.num_named_blocks -= len(table)
        freed, freed_fill = self.pool.drop_blocks(table[::-1])
        self._allocated -= freed * self.block_size
        self._token -= freed_fill
        self._reserved -= self._seq_reserved.pop(seq.seq_id)
        self._granted.pop(seq.seq_id, None)
        seq.room = 0

    def capacity(self, seq: Sequence) -> int:
        return len(self.block_tables[seq.seq_id]) * self.block_size

    def footprint(self, final_len: int) -> int:
        return cdiv(final_len, self.block_size) * self.block_size

    def can_ever_admit(self, final_len: int, width: int = 1) -> bool:
        # admission keeps the watermark free even in an empty pool (by default: watermark_when_idle),
        # and ignores it where the scheduler exempts an idle pool's admissions (watermark_exempt)
        kept = 0 if self.watermark_exempt else self.watermark_blocks
        return self.footprint(final_len) * width <= (self.num_blocks - kept) * self.block_size

    def named_slots(self) -> int:
        return self.num_named_blocks * self.block_size

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
        tables = [self.block_tables[seq.seq_id][: cdiv(seq.num_computed, bs)] for seq in seqs]
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
        if not self.pool.fits(len(needed) + len(seqs), reserve=True):
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
            if self.prefix_caching:  # its full blocks hold the content they held before: cached again
                for block, block_hash in zip(table, self._hashes.get(seq.seq_id, ())):
                    self.pool.name(block, block_hash)
            self.num_named_blocks += len(table)
            self._seq_reserved[seq.seq_id] = 0
        for seq in seqs:  # once every table is back, so a shared last block is seen as shared
            self._update_reserved(seq, seq.num_computed)
        self.swapped_blocks += len(to_device)
        return True
