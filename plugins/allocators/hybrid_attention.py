"""The hybrid allocator's manager of one layer group of an attention kind: block tables over
the shared page pool.

Prefix caching (vLLM's scheme, per group): a full block is named by the chained hash of its
parent block's hash and its own token ids (block_pool), chained from a root of its own per layer
kind and group, so groups that share a pool never find each other's pages. Across groups a hit
must suit every one: full attention needs every block of the prefix, a window layer only the
blocks its next query reads (the W - 1 tokens before it), and the hit length is a multiple of
the block size.
"""

from __future__ import annotations

from kvbench.arith import cdiv
from kvbench.core.spec import LAYER_KINDS
from kvbench.plugins.allocators.block_pool import ROOT_HASH, BlockPool, extend_hashes


class AttentionManager:
    """Block tables of one attention kind over a page pool.

    `keep` > 0: only a sequence's last `keep` tokens are read again (a window layer, or a linear
    layer sized as full attention; a window's next query is one of its W, so W - 1 stored tokens
    are read again); older tokens still held are stale, i.e. internal fragmentation. `release`:
    blocks that fall wholly before what the next step reads go back to the pool, so a window
    layer holds at most ceil(W / B) + 1 blocks after a decode step.
    Counters (pages held, tokens filled, stale, reserved) are kept incrementally; a shared page
    is counted once, except in `num_named`: the live (not released) entries of every table, a
    shared page once per table. A token of a shared page is stale once every holder has passed
    it: a prefix hit puts a sequence whose window still reads a page beside one that has moved
    on, so a shared page keeps its holders' stale counts (`holders`; None for a page one sequence
    holds, whose count is its `page_stale`) and is as stale as the least.
    """

    def __init__(
        self,
        kind: str,
        pool: BlockPool,
        block_size: int,
        token_bytes: int,
        keep: int = 0,
        release: bool = False,
        log_copy=lambda src, dst: None,
        group: int = 0,
    ):
        self.kind, self.pool, self.block_size, self.token_bytes = kind, pool, block_size, token_bytes
        self.group = group
        self.keep, self.release, self.log_copy = keep, release, log_copy
        # stored tokens the next query reads: a window's query reads itself and the W - 1 before it
        self.reads_back = keep - 1 if kind == "window" else keep
        self.tables: dict[int, list[int]] = {}  # seq -> page per block; -1 once released
        self.first_live: dict[int, int] = {}  # seq -> index of its first block not released
        self.stale_end: dict[int, int] = {}  # seq -> positions below this are counted stale
        self.seq_reserved: dict[int, int] = {}
        self.hashes: dict[int, list] = {}  # seq -> chained hashes of its cached full blocks
        self.root_hash = ROOT_HASH + LAYER_KINDS.index(kind) + len(LAYER_KINDS) * group  # one a kind's group
        self.page_stale = [0] * len(pool.ref_count)  # per page: tokens no layer will read again
        self.holders: list[dict[int, int] | None] = [None] * len(pool.ref_count)  # a shared page: stale -> holders
        self.num_pages = self.filled = self.stale = self.reserved = self.num_copies = 0
        self.num_named = 0

    # --- pages ---------------------------------------------------------------------------
    def _take(self) -> int:
        self.num_pages += 1
        page = self.pool.take()
        self.page_stale[page] = 0
        self.holders[page] = None
        return page

    def _drop(self, page: int, stale: int) -> None:
        """A holder whose own count of stale tokens on `page` is `stale` lets go of it."""
        if self.pool.drop(page):
            self.num_pages -= 1
            self.filled -= self.pool.fill[page]
            self.stale -= self.page_stale[page]
            self.page_stale[page] = 0
            self.holders[page] = None
        else:
            self._restale(page, stale, None)

    def _restale(self, page: int, old: int | None, new: int | None) -> None:
        """One holder's stale tokens on `page` go from `old` to `new` (None: not a holder); the
        page is as stale as its least stale holder."""
        holders = self.holders[page]
        if holders is None:  # held by one sequence: its count is the page's
            holders = self.holders[page] = {self.page_stale[page]: 1}
        if old is not None:
            if holders[old] == 1:
                del holders[old]
            else:
                holders[old] -= 1
        if new is not None:
            holders[new] = holders.get(new, 0) + 1
        least = min(holders) if holders else 0
        self.stale += least - self.page_stale[page]
        self.page_stale[page] = least

    def _stale_of(self, seq_id: int, index: int) -> int:
        """How many tokens of its block `index` sequence `seq_id` has passed."""
        return min(self.block_size, max(0, self.stale_end[seq_id] - index * self.block_size))

    def _fill(self, page: int, tokens: int) -> None:
        self.filled += tokens - self.pool.fill[page]
        self.pool.fill[page] = tokens

    # --- per sequence --------------------------------------------------------------------
    def add(self, seq_id: int, table: list[int] | None = None) -> None:
        self.tables[seq_id] = table or []
        self.first_live[seq_id] = 0
        self.stale_end[seq_id] = 0
        self.seq_reserved[seq_id] = 0

    def first_needed(self, before: int) -> int:
        """The oldest position a step starting at `before` reads (its first query's window)."""
        return before - self.keep + 1 if self.release else 0

    def release_before(self, seq_id: int, position: int) -> None:
        table, bs = self.tables[seq_id], self.block_size
        i = self.first_live[seq_id]
        while i < len(table) and (i + 1) * bs <= position:
            self._drop(table[i], self._stale_of(seq_id, i))
            table[i] = -1
            self.num_named -= 1
            i += 1
        self.first_live[seq_id] = i

    def pages_needed(self, seq_id: int, before: int, after: int) -> int:
        table = self.tables[seq_id]
        need = cdiv(after, self.block_size) - len(table)
        if before % self.block_size and table and self.pool.ref_count[table[-1]] > 1:
            need += 1  # the shared partial last block is copied before it is written
        return need

    def decode_need(self, seq_id: int, before: int) -> int:
        """release_before, then pages_needed, for a step that writes position `before` alone
        (a decode step, the common one): release_before only where a block falls out."""
        if self.release:  # first_needed(before), inlined: a call a window group per decode is 17 % of a step's
            first, i = before - self.keep + 1, self.first_live[seq_id]
            if (i + 1) * self.block_size <= first and i < len(self.tables[seq_id]):
                self.release_before(seq_id, first)
        return self.pages_needed(seq_id, before, before + 1)

    def append_one(self, seq_id: int, before: int, final_len: int, token_ids: list | None = None) -> None:
        """append(seq_id, before, before + 1, ...): a decode step into its own last block takes
        this short way, whose every count changes as append's would."""
        table, bs, pool = self.tables[seq_id], self.block_size, self.pool
        offset = before % bs
        # the short way writes into its own last block: not a new block, a copy or a longer table
        if not offset or len(table) != before // bs + 1 or pool.ref_count[table[-1]] != 1:
            return self.append(seq_id, before, before + 1, final_len, token_ids)
        page, after = table[-1], before + 1
        fill = pool.fill
        self.filled += offset + 1 - fill[page]
        fill[page] = offset + 1
        if self.keep:
            frontier = after - self.reads_back
            start = self.stale_end[seq_id]
            if frontier > start:
                index = (frontier - 1) // bs
                # the one block the frontier moved in (never a released one: a window releases
                # only blocks wholly before it), held by this sequence alone: as _mark_stale
                if start > index * bs and self.holders[table[index]] is None:
                    stale_page, new = table[index], frontier - index * bs
                    self.stale += new - self.page_stale[stale_page]
                    self.page_stale[stale_page] = new
                    self.stale_end[seq_id] = frontier
                else:
                    self._mark_stale(seq_id, frontier)
        new = min(len(table) * bs, final_len) - after  # its last block is its own (above)
        new = new if new > 0 else 0
        self.reserved += new - self.seq_reserved[seq_id]
        self.seq_reserved[seq_id] = new
        if token_ids:
            hashes = self.hashes.get(seq_id)
            full = (after if after < len(token_ids) else len(token_ids)) // bs
            if hashes is None or full > len(hashes):
                self._cache_full_blocks(seq_id, token_ids, full)

    def append(self, seq_id: int, before: int, after: int, final_len: int, token_ids: list | None = None) -> None:
        """Room for positions [before, after), filled; with `token_ids`, full blocks get cached."""
        table, bs, pool = self.tables[seq_id], self.block_size, self.pool
        if before % bs and pool.ref_count[table[-1]] > 1:
            src = table[-1]
            dst = table[-1] = pool.copy_on_write(src)
            stale = self._stale_of(seq_id, len(table) - 1)
            self._restale(src, stale, None)  # still held: copy_on_write freed nothing
            self.num_pages += 1
            self.filled += pool.fill[dst]
            self.page_stale[dst] = stale
            self.holders[dst] = None
            self.stale += stale
            self.log_copy(src, dst)
            self.num_copies += 1
        while len(table) * bs < after:
            table.append(self._take())
            self.num_named += 1
        for index in range(before // bs, (after - 1) // bs + 1):
            self._fill(table[index], min(bs, after - index * bs))
        if self.keep:
            self._mark_stale(seq_id, after - self.reads_back)
        self._update_reserved(seq_id, after, final_len)
        if token_ids:
            self._cache_full_blocks(seq_id, token_ids, min(after, len(token_ids)) // bs)

    def _mark_stale(self, seq_id: int, frontier: int) -> None:
        """Positions below `frontier` will never be read again: count them stale, block by block."""
        start = self.stale_end[seq_id]
        if frontier <= start:
            return
        table, bs, holders, page_stale = self.tables[seq_id], self.block_size, self.holders, self.page_stale
        for index in range(max(start // bs, self.first_live[seq_id]), (frontier - 1) // bs + 1):
            page, new = table[index], min(bs, frontier - index * bs)
            if holders[page] is None:  # its one holder: the page is as stale as it
                self.stale += new - page_stale[page]
                page_stale[page] = new
            else:
                self._restale(page, min(bs, max(0, start - index * bs)), new)
        self.stale_end[seq_id] = frontier

    def _update_reserved(self, seq_id: int, num_tokens: int, final_len: int) -> None:
        table = self.tables[seq_id]
        # Empty slots of a shared last block belong to nobody yet: the writer copies it first.
        own = bool(table) and table[-1] >= 0 and self.pool.ref_count[table[-1]] == 1
        new = max(0, min(len(table) * self.block_size, final_len) - num_tokens) if own else 0
        self.reserved += new - self.seq_reserved[seq_id]
        self.seq_reserved[seq_id] = new

    def fork(self, parent: int, child: int, num_tokens: int, final_len: int) -> None:
        table = list(self.tables[parent])
        first = self.first_live[parent]
        for index in range(first, len(table)):  # the child has passed what its parent has
            self.pool.hold(table[index])
            self._restale(table[index], None, self._stale_of(parent, index))
        self.add(child, table)
        self.first_live[child] = first
        self.num_named += len(table) - first
        if parent in self.hashes:
            self.hashes[child] = list(self.hashes[parent])
        self.stale_end[child] = self.stale_end[parent]
        self._update_reserved(parent, num_tokens, final_len)
        self._update_reserved(child, num_tokens, final_len)

    def free(self, seq_id: int) -> None:
        table = self.tables[seq_id]
        first = self.first_live.pop(seq_id)
        self.num_named -= len(table) - first
        for index in range(len(table) - 1, first - 1, -1):  # the tail is evicted first
            self._drop(table[index], self._stale_of(seq_id, index))
        del self.tables[seq_id], self.stale_end[seq_id]
        self.reserved -= self.seq_reserved.pop(seq_id)
        self.hashes.pop(seq_id, None)

    def held_blocks(self, seq_id: int) -> int:
        return len(self.tables[seq_id]) - self.first_live[seq_id]

    def blocks_for(self, num_tokens: int, step: int = 1) -> int:
        """Blocks a sequence of `num_tokens` tokens holds while a step writes the last `step` of
        them (a window layer: the window before the step, and every token the step writes); with
        step 1, what it holds between decode steps."""
        blocks = cdiv(num_tokens, self.block_size)
        if self.release:
            blocks = min(blocks, cdiv(self.keep - 1 + step, self.block_size) + 1)
        return blocks

    def usage(self) -> tuple[int, int, int, int]:
        """(pages held, bytes of token state, bytes reserved, bytes of stale tokens): a window
        layer's tokens that have left every holder's window, on pages still held. The rest of
        what it holds is rounding: blocks' tails no token will fill, and page padding."""
        stale = self.stale * self.token_bytes
        return (self.num_pages, self.filled * self.token_bytes - stale, self.reserved * self.token_bytes, stale)

    # --- prefix caching --------------------------------------------------------------------
    def chain(self, token_ids: list, num_blocks: int, hashes: list | None = None) -> list:
        """Chained hashes of the first `num_blocks` blocks of `token_ids`, extending `hashes`."""
        return extend_hashes(list(hashes or []), token_ids, self.block_size, num_blocks, self.root_hash)

    def _cache_full_blocks(self, seq_id: int, token_ids: list, num_full: int) -> None:
        hashes = self.hashes.setdefault(seq_id, [])
        known = len(hashes)
        if num_full <= known:
            return
        extend_hashes(hashes, token_ids, self.block_size, num_full, self.root_hash)
        table, pool = self.tables[seq_id], self.pool
        for index in range(known, num_full):
            if table[index] >= 0:
                pool.name(table[index], hashes[index])

    def cached_prefix_blocks(self, hashes: list) -> int:
        """How many blocks from the start are cached (what full attention can reuse)."""
        cached = self.pool.cached
        count = 0
        while count < len(hashes) and hashes[count] in cached:
            count += 1
        return count

    def window_cached(self, hashes: list, length: int) -> bool:
        """Whether the blocks a query at position `length` reads are all cached (window layers),
        and the prefix's last block at least: a window of one token reads no earlier block, and
        a hit of nothing cached is none."""
        cached, bs = self.pool.cached, self.block_size
        first = min(max(0, self.first_needed(length)) // bs, length // bs - 1)
        return all(hashes[i] in cached for i in range(first, length // bs))

    def hit_pages(self, hashes: list, length: int) -> list[int]:
        """The cached pages a sequence starting with `length` cached tokens holds: the blocks its
        next query reads (a window layer releases the older ones at once)."""
        first = max(0, self.first_needed(length)) // self.block_size
        return [self.pool.cached[h] for h in hashes[first : length // self.block_size]]

    def adopt(self, seq_id: int, hashes: list, length: int) -> None:
        """Start `seq_id` with its first `length` tokens from cached pages (a prefix hit)."""
        pages = self.hit_pages(hashes, length)
        table = [-1] * (length // self.block_size - len(pages)) + pages
        for page in pages:  # the new holder has passed nothing yet: _mark_stale below counts it
            if self.pool.hold(page):  # revived from the free pages: held again, by it alone
                self.num_pages += 1
                self.filled += self.pool.fill[page]
                self.holders[page] = None
            else:
                self._restale(page, None, 0)
        self.add(seq_id, table)
        self.first_live[seq_id] = len(table) - len(pages)
        self.num_named += len(pages)
        self.hashes[seq_id] = hashes[: length // self.block_size]
        if self.keep:
            self._mark_stale(seq_id, length - self.reads_back)
