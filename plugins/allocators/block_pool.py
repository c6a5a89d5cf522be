"""The block pool every paged KV manager draws from: ref counts, fill, free queues, the prefix cache.

A block is an id in [first_block, first_block + num_blocks). Per block the pool keeps its
`ref_count` (how many sequences hold it), its `fill` (slots holding token state) and, once it
is full and prefix caching names it, its chained `block_hash`. The paged allocator and every
hybrid layer-kind manager take, share, copy on write and give back blocks only through it.

Eviction order. Free blocks wait in two queues: `free`, blocks that hold no named content, and
`evictable`, named blocks that keep their content and stay findable. `take()` hands out the
block freed longest ago from `free`; only when `free` is empty does it evict the named block
freed longest ago (least recently used: a hit revives a block and takes it out of the queue).
Sequences give their blocks back tail first, so of one sequence's blocks the tail is evicted
before the head, which keeps a shared prefix findable longest. Every operation is O(1).

The prefix cache maps a block hash to one block holding that content. Another block that
holds the same content (computed twice, e.g. a prompt's last block, which a hit never covers)
is registered as a copy; when the findable block is evicted, the oldest copy takes over its
hash (as vLLM's map, which keeps them in the order they were cached, gives its first), so
content that is still in the pool stays findable.

The block hash is `hash((parent_hash, tuple(token_ids)))`, chained from a fixed root. CPython
hashes ints (numpy integers hash equal to them) and tuples of them without the per-process salt
that str and bytes get, so the chain is identical in every process and under every
PYTHONHASHSEED (for one CPython version on 64-bit platforms). It is a 64-bit, non-cryptographic
hash: k distinct blocks collide with probability about k^2 / 2^65 (1e-8 for a million blocks),
and a collision would serve another block's KV. Token sequences crafted to collide could be
found; that is acceptable for a benchmark whose prompts are generated, not adversarial.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from operator import itemgetter

# The parent hash of a sequence's first block; managers that share a pool chain from
# ROOT_HASH + i. Small non-negative ints hash to themselves (-1 and -2 would both hash to -2).
ROOT_HASH = 0


def hash_block(parent_hash: int, token_ids) -> int:
    """The chained hash of a full block: its parent block's hash and its own token ids."""
    return hash((parent_hash, tuple(token_ids)))


def extend_hashes(hashes: list, token_ids, block_size: int, num_blocks: int, root: int = ROOT_HASH) -> list:
    """Append to `hashes` the chained hashes of blocks len(hashes) .. num_blocks - 1 of `token_ids`."""
    for index in range(len(hashes), num_blocks):
        hashes.append(
            hash_block(hashes[-1] if hashes else root, token_ids[index * block_size : (index + 1) * block_size])
        )
    return hashes


class BlockPool:
    """Blocks `first_block .. first_block + num_blocks - 1`; pools that split one KV cache take
    disjoint id ranges, so a block id names one block of the whole cache.

    Invariants: a block is in exactly one of `free`, `evictable` or held (`ref_count > 0`);
    `block_hash[b]` is set exactly for the blocks the cache knows, each either `cached[hash]` or
    in `copies[hash]`; `free` blocks have no hash.
    """

    def __init__(self, num_blocks: int, first_block: int = 0, watermark: float = 0.0):
        end = first_block + num_blocks
        self.num_blocks = num_blocks
        self.watermark_blocks = int(watermark * num_blocks)  # kept free at admission
        self.free: deque[int] = deque(range(first_block, end))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self.ref_count = [0] * end
        self.fill = [0] * end
        self.block_hash: list = [None] * end
        self.cached: dict[int, int] = {}  # block hash -> the block a lookup finds
        self.copies: dict[int, list[int]] = {}  # block hash -> other blocks with that content

    @property
    def num_free(self) -> int:
        return len(self.free) + len(self.evictable)

    def fits(self, need: int, reserve: bool) -> bool:
        """Whether `need` more blocks can be taken; `reserve` keeps the watermark free too
        (admission does, so that running sequences can still grow)."""
        return self.num_free - need >= (self.watermark_blocks if reserve else 0)

    def admission_need(self, num_blocks: int, hits: list[int]) -> int:
        """Blocks a sequence of `num_blocks` blocks takes from the free ones when it starts with
        the cached blocks `hits`: a hit on a held block costs nothing, one on a free block
        revives it, which takes it from the free ones like a new block."""
        ref_count = self.ref_count
        return num_blocks - sum(1 for block in hits if ref_count[block])

    # --- blocks --------------------------------------------------------------------------
    def take(self) -> int:
        """A block for one holder, empty: never-named free blocks first, then the LRU named one."""
        if self.free:
            block = self.free.popleft()
        else:
            block, _ = self.evictable.popitem(last=False)
            self._forget(block)
        self.ref_count[block] = 1
        self.fill[block] = 0
        return block

    def take_blocks(self, count: int) -> list[int]:
        """`count` blocks, as `count` calls of take() hand them out (a prompt's blocks)."""
        free, ref_count, fill = self.free, self.ref_count, self.fill
        if len(free) < count:
            return [self.take() for _ in range(count)]
        # a loop, not a comprehension: Python 3.11 makes a function and a frame for each
        # comprehension it runs, and this one ran 88,642 times in a 10,000-request run (most
        # for one to three blocks: 0.15-0.35 us more a call than this loop, timed alone)
        blocks = []
        for _ in range(count):
            block = free.popleft()
            ref_count[block] = 1
            fill[block] = 0
            blocks.append(block)
        return blocks

    def drop_blocks(self, blocks: list[int] | tuple[int, ...]) -> tuple[int, int]:
        """One holder fewer for each of `blocks`, in order: a block nobody holds goes to the free
        queue, or, when the cache knows its content, to the evictable ones (least recently freed
        first). Returns how many became free and their fill."""
        ref_count, fill, block_hash = self.ref_count, self.fill, self.block_hash
        count = len(blocks)
        # the common case, a finished sequence's own unnamed blocks, read in C (a sequence gives
        # its blocks back tail first: a named head, the prefix cache's, goes to the loop at once)
        if count > 1 and block_hash[blocks[-1]] is None:
            of = itemgetter(*blocks)
            if of(block_hash).count(None) == count and of(ref_count).count(1) == count:
                for block in blocks:
                    ref_count[block] = 0
                self.free.extend(blocks)
                return count, sum(of(fill))
        freed = freed_fill = 0
        for block in blocks:
            count = ref_count[block] - 1
            ref_count[block] = count
            if count:
                continue
            freed += 1
            freed_fill += fill[block]
            if block_hash[block] is None:
                self.free.append(block)
            else:
                self.evictable[block] = None
        return freed, freed_fill

    def hold(self, block: int) -> bool:
        """One holder more; True when the block was free (a prefix-cache hit revived it)."""
        revived = self.ref_count[block] == 0
        if revived:
            del self.evictable[block]
        self.ref_count[block] += 1
        return revived

    def drop(self, block: int) -> bool:
        """One holder fewer; True when the block became free."""
        return self.drop_blocks((block,))[0] == 1

    def copy_on_write(self, block: int) -> int:
        """A private copy of shared block `block` for the holder about to write it: a new block
        with the same fill; the shared one loses that holder."""
        copy = self.take()
        self.fill[copy] = self.fill[block]
        self.drop(block)
        return copy

    # --- the prefix cache ----------------------------------------------------------------
    def name(self, block: int, block_hash: int) -> None:
        """Register full block `block` as holding the content `block_hash` names."""
        if self.block_hash[block] is not None:
            return
        self.block_hash[block] = block_hash
        if block_hash in self.cached:
            self.copies.setdefault(block_hash, []).append(block)
        else:
            self.cached[block_hash] = block

    def unname(self, block: int) -> None:
        """Take `block`'s content out of the cache: it was named when scheduled, and the step
        that would have written it never ran. A block nobody holds moves to the free queue; a
        held one goes there when its holders let it go."""
        if self.block_hash[block] is None:
            return
        self._forget(block)
        if not self.ref_count[block]:
            del self.evictable[block]
            self.free.append(block)

    def unname_unrun(self, table: list[int], hashes: list, computed: int) -> None:
        """A sequence's blocks named past its `computed` full blocks (`table`'s entries up to
        its `hashes`; -1, a window's released block, skipped) taken out of the cache, and its
        hashes of them dropped, which a swap-in would name again."""
        for block in table[computed : len(hashes)]:
            if block >= 0:
                self.unname(block)
        del hashes[computed:]

    def lookup(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def _forget(self, block: int) -> None:
        """An evicted block's content leaves the cache; its oldest copy, if any, takes its hash."""
        block_hash = self.block_hash[block]
        self.block_hash[block] = None
        copies = self.copies.get(block_hash)
        if self.cached[block_hash] == block:
            if copies:  # the oldest copy, as vLLM's hash map gives its first surviving entry
                self.cached[block_hash] = copies.pop(0)
            else:
                del self.cached[block_hash]
        else:
            copies.remove(block)
        if copies is not None and not copies:
            del self.copies[block_hash]
