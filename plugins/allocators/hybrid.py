"""The hybrid allocator: full-attention, sliding-window and linear-state layers in one KV pool.

One pool of equal-byte pages (hybrid_pages.unify_pages), one manager per layer group of a
kind, as vLLM groups layers: full attention keeps every block; a window layer gives back the
blocks that fall out of its window; a linear-state layer holds one fixed-size state per
sequence. `policy` picks how the pool is shared, so the two naive choices are measured by the
same code:

    shared   one pool, any kind takes any free page (as vLLM's hybrid allocator does, its
             layers grouped as vLLM groups them: hybrid_pages.py)
    static   the pool split by layer kind in proportion to layer counts
    as_full  one pool, every layer kept as full attention (window layers keep every block,
             linear layers store K/V per token): PagedAttention unaware of layer kinds

Accounting is in bytes, per kind and in total. A kind's token state is what its layers will
read again (full: every token; window: the W - 1 before the next query; linear: the state), so
the tokens a window layer keeps beyond its window (an `as_full` one: all of them) count as
internal fragmentation, and a block's tail no token will fill, with a page's padding, as
rounding, as the paged allocator counts its own. A kind's view of the pool is the pages it
holds plus the free pages it could take; the five parts of each view, and of the whole pool,
add up to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvbench.arith import cdiv
from kvbench.core.sequence import Sequence
from kvbench.core.spec import LAYER_KINDS
from kvbench.errors import UserError
from kvbench.plugins.allocators.base import KVAccounting, KVAllocator
from kvbench.plugins.allocators.block_pool import BlockPool
from kvbench.plugins.allocators.hybrid_attention import AttentionManager
from kvbench.plugins.allocators.hybrid_pages import LinearStateManager, unify_pages

POLICIES = ("shared", "static", "as_full")


@dataclass(slots=True)
class HybridAccounting(KVAccounting):
    """The pool's accounting in bytes, with each layer kind's view of it."""

    by_kind: dict = field(default_factory=dict)


class HybridAllocator(KVAllocator):
    """Hybrid models: one pool of equal-byte pages, a KV manager per layer kind."""

    name = "hybrid"
    layout = "paged"
    layer_kinds = LAYER_KINDS
    per_layer_kind_layout = True

    def __init__(
        self,
        num_slots: int,
        max_model_len: int,
        block_size: int = 16,
        model=None,
        policy: str = "shared",
        watermark: float = 0.01,
        prefix_caching: bool = False,
        **options,
    ):
        super().__init__(num_slots, max_model_len, block_size, model=model, **options)
        if model is None:
            raise ValueError("the hybrid allocator needs the model's layer kinds (model=ModelSpec)")
        if policy not in POLICIES:
            raise UserError(f"allocator.policy={policy!r} is not one of {', '.join(POLICIES)}")
        if not 0.0 <= watermark < 1.0:
            raise UserError(f"allocator.watermark={watermark} must be in [0, 1)")
        self.policy = policy
        self.pages = unify_pages(model, block_size, linear_as_full=policy == "as_full")
        self.slot_bytes = model.kv_bytes_per_token  # `num_slots` counts tokens of these bytes
        num_pages = num_slots * self.slot_bytes // self.pages.page_bytes
        # what whole pages hold: a partial page at the end is unusable (as paged's partial block)
        self.num_slots = num_pages * self.pages.page_bytes // self.slot_bytes
        kinds = [k for k in LAYER_KINDS if model.num_layers_of(k)]
        if policy == "static":  # partitions in proportion to layer counts, disjoint page ids
            sizes = [num_pages * model.num_layers_of(k) // model.num_layers for k in kinds]
            for i in range(num_pages - sum(sizes)):  # what the floors left, a page each to the first kinds
                sizes[i] += 1
            firsts = [sum(sizes[:i]) for i in range(len(kinds))]
            pools = {k: BlockPool(n, first, watermark) for k, n, first in zip(kinds, sizes, firsts)}
        else:
            pools = dict.fromkeys(kinds, BlockPool(num_pages, watermark=watermark))
        self.pools = list({id(p): p for p in pools.values()}.values())
        self.one_pool = len(self.pools) == 1  # a decode step's short way (_grow_one) needs one
        # (seq_id, each group's hashes of its prompt) of the last sequence refused, as paged keeps it
        self._waiting_chains: tuple[int, dict] = (-1, {})
        self.num_pages = num_pages
        self.groups: dict = {}  # kind -> its managers: one a layer group (hybrid_pages), one for linear states
        for kind in kinds:
            if kind == "linear" and policy != "as_full":
                self.groups[kind] = [
                    LinearStateManager(
                        pools[kind], self.pages.pages_per_state, self.pages.state_bytes, self._log_page_copy
                    )
                ]
                continue
            keep = model.window if kind == "window" else 0
            if kind == "linear":  # sized as attention, it still reads only its state's worth
                state_bytes = model.num_layers_of("linear") * model.linear_state_bytes_per_layer
                keep = cdiv(state_bytes, self.pages.token_bytes[kind])
            self.groups[kind] = [
                AttentionManager(
                    kind,
                    pools[kind],
                    self.pages.block_sizes[kind],
                    self.pages.group_token_bytes(kind, group),
                    keep=keep,
                    release=kind == "window" and policy != "as_full",
                    log_copy=self._log_page_copy,
                    group=group,
                )
                for group in range(len(self.pages.groups[kind]))
            ]
        self.managers = {kind: managers[0] for kind, managers in self.groups.items()}  # a kind's first group
        self.attention = [m for managers in self.groups.values() for m in managers if isinstance(m, AttentionManager)]
        self.linear = self.managers.get("linear") if policy != "as_full" else None
        # A linear layer's state after a prefix is not kept, so models with linear layers get no
        # prefix hits, whatever the policy (as_full included, for a fair comparison).
        self.prefix_caching = bool(prefix_caching) and not model.num_layers_of("linear")
        self.hit_step = math.lcm(*(m.block_size for m in self.attention)) if self.attention else 1
        self.prefix_hit_tokens = self.prefix_query_tokens = 0
        self.preempted_hit_tokens = 0  # what re-admitted victims found cached (vLLM's preempted_hits)

    # --- the contract --------------------------------------------------------------------
    def _fits(self, need: dict, reserve: bool) -> bool:
        reserve = reserve and not self.watermark_exempt
        return all(pool.fits(need.get(id(pool), 0), reserve) for pool in self.pools)

    def _num_states(self, seq: Sequence) -> int:
        """States a sequence takes at admission: its own and those of the samples or beams it will fork."""
        return seq.request.width if seq.parent is None and seq.first_token_s is None else 1

    def admit(self, seq: Sequence) -> bool:
        # As paged: admit while the whole prompt's blocks fit, less the cached blocks it starts
        # with that a live sequence already holds. A window layer holds, while a step runs, its
        # window plus every token the step writes; counting only its steady state admits
        # sequences whose later prefill chunks preempt (and recompute) one another.
        step = min(seq.num_tokens, self.max_step_tokens or seq.num_tokens)
        cached = self.prefix_caching and (self.stand_in_tokens or bool(seq.token_ids))
        hit, hashes = self._prefix_hit(seq) if cached else (0, {})
        need: dict = {}
        for m in self.attention:
            blocks = m.blocks_for(seq.num_tokens, step)
            if hit:
                blocks = m.pool.admission_need(blocks, m.hit_pages(hashes[m], hit))
            need[id(m.pool)] = need.get(id(m.pool), 0) + blocks
        states = self._num_states(seq)
        if self.linear:
            pool = id(self.linear.pool)
            need[pool] = need.get(pool, 0) + states * self.pages.pages_per_state
        if not self._fits(need, reserve=True):
            return False
        if cached:
            self._waiting_chains = (-1, {})
            self._adopt(seq, hit, hashes)
        else:
            for m in self.attention:
                m.add(seq.seq_id)
        if self.linear:
            self.linear.add(seq.seq_id, states)
        return True

    def _prefix_hit(self, seq: Sequence) -> tuple[int, dict]:
        """The longest cached prefix every kind agrees on, never the last prompt token; and
        each kind's block hashes of the prompt."""
        tokens, limit = self.token_ids(seq, seq.num_tokens - 1), seq.num_tokens - 1
        sid, hashes = self._waiting_chains
        if sid != seq.seq_id:  # kept until it is admitted: a head refused step after step hashes once
            hashes = {m: m.chain(tokens, limit // m.block_size) for m in self.attention}
            self._waiting_chains = (seq.seq_id, hashes)
        hit = min([m.cached_prefix_blocks(hashes[m]) * m.block_size for m in self.attention if not m.release] + [limit])
        hit -= hit % self.hit_step
        while hit and not all(m.window_cached(hashes[m], hit) for m in self.attention if m.release):
            hit -= self.hit_step
        return hit, hashes

    def _adopt(self, seq: Sequence, hit: int, hashes: dict) -> None:
        for m in self.attention:
            m.adopt(seq.seq_id, hashes[m], hit)
        seq.num_computed = hit
        if not seq.num_preemptions:  # a preempted request's lookup counts apart (docs/metrics.md)
            seq.num_cached = hit
            self.prefix_hit_tokens += hit
            self.prefix_query_tokens += seq.num_tokens
        else:
            self.preempted_hit_tokens += hit

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        if num_tokens == 1 and self.one_pool:  # a decode step in one pool
            return self._grow_one(seq)
        return self._grow(seq, num_tokens)

    def _grow_one(self, seq: Sequence) -> bool:
        """_grow(seq, 1) the short way, with the same result: a decode step calls each group
        twice (its release and need, its write), where _grow calls it five to seven times."""
        sid, before = seq.seq_id, seq.num_computed
        need = 0
        for m in self.attention:
            need += m.decode_need(sid, before)
        if need and not self.pools[0].fits(need, False):
            return False
        tokens = self.token_ids(seq, before + 1) if self.prefix_caching else None
        final_len = seq.final_len
        for m in self.attention:
            m.append_one(sid, before, final_len, tokens)
        if self.linear:
            self.linear.start(sid)
        return True

    def _grow(self, seq: Sequence, num_tokens: int) -> bool:
        sid, before = seq.seq_id, seq.num_computed
        after = before + num_tokens
        need: dict = {}
        for m in self.attention:
            if m.release:
                m.release_before(sid, m.first_needed(before))
            need[id(m.pool)] = need.get(id(m.pool), 0) + m.pages_needed(sid, before, after)
        if not self._fits(need, reserve=False):
            return False
        tokens = self.token_ids(seq, after) if self.prefix_caching else None
        for m in self.attention:
            m.append(sid, before, after, seq.final_len, tokens)
        if self.linear:
            self.linear.start(sid)
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        for m in self.attention:
            m.fork(parent.seq_id, child.seq_id, parent.num_computed, parent.final_len)
        if self.linear:  # a child whose first token is its last runs no step: its state is not copied
            self.linear.fork(parent.seq_id, child.seq_id, copy=parent.num_computed < child.final_len)
        child.num_computed = parent.num_computed

    def free(self, seq: Sequence) -> None:
        for managers in self.groups.values():
            for m in managers:
                m.free(seq.seq_id)

    def forget_unrun(self, seqs) -> None:
        for seq in seqs:  # each kind's pages named past the sequence's computed tokens
            for m in self.attention:
                hashes = m.hashes.get(seq.seq_id)
                if hashes is not None:
                    m.pool.unname_unrun(m.tables[seq.seq_id], hashes, seq.num_computed // m.block_size)

    def capacity(self, seq: Sequence) -> int:
        pages = sum(m.held_blocks(seq.seq_id) for m in self.attention)
        if self.linear:
            pages += self.pages.pages_per_state * (1 + len(self.linear.spares[seq.seq_id]))
        return pages * self.pages.page_bytes // self.slot_bytes

    def _pages_at_end(self, request_len: int, width: int = 1, whole: bool = False) -> dict:
        """Pages `width` sequences of `request_len` tokens may need at once, each admitted with a
        prefill of all its tokens (a window layer holds every token that step writes): in one
        step where `whole` (a preempted group comes back so: Scheduler._admit_group does not
        chunk it), else in steps of the budget."""
        step = request_len if whole else min(request_len, self.max_step_tokens or request_len)
        need: dict = {}
        for m in self.attention:
            need[id(m.pool)] = need.get(id(m.pool), 0) + width * m.blocks_for(request_len, step)
        if self.linear:
            pool = id(self.linear.pool)
            need[pool] = need.get(pool, 0) + width * self.pages.pages_per_state
        return need

    def footprint(self, request_len: int) -> int:
        return cdiv(sum(self._pages_at_end(request_len).values()) * self.pages.page_bytes, self.slot_bytes)

    def group_footprint(self, request_len: int) -> int:
        return cdiv(sum(self._pages_at_end(request_len, whole=True).values()) * self.pages.page_bytes, self.slot_bytes)

    def can_ever_admit(self, final_len: int, width: int = 1) -> bool:
        need = self._pages_at_end(final_len, width, whole=width > 1)
        kept = (lambda p: 0) if self.watermark_exempt else (lambda p: p.watermark_blocks)  # as paged's
        return all(need.get(id(p), 0) <= p.num_blocks - kept(p) for p in self.pools)

    # --- accounting ----------------------------------------------------------------------
    def accounting(self) -> HybridAccounting:
        # as the paged allocator counts them: a block's tail no token will fill (and a page's
        # padding) is rounding; a window layer's tokens that left the window, on a page still
        # held, are internal fragmentation (held inside a sequence's blocks for nothing)
        page_bytes = self.pages.page_bytes
        by_kind, token, reserved, internal, held, named = {}, 0, 0, 0, 0, 0
        for kind, managers in self.groups.items():  # a kind: the sum of its groups
            pages, kind_token, kind_reserved, kind_internal = (sum(u) for u in zip(*(m.usage() for m in managers)))
            kind_named = sum(m.num_named for m in managers)
            by_kind[kind] = KVAccounting(
                (pages + managers[0].pool.num_free) * page_bytes,
                kind_token,
                kind_reserved,
                kind_internal,
                rounding=pages * page_bytes - kind_token - kind_reserved - kind_internal,
                named=kind_named * page_bytes,
            )
            token, reserved, internal = token + kind_token, reserved + kind_reserved, internal + kind_internal
            held += pages
            named += kind_named
        total = sum(p.num_blocks for p in self.pools) * page_bytes
        rounding = held * page_bytes - token - reserved - internal
        return HybridAccounting(
            total, token, reserved, internal, rounding=rounding, by_kind=by_kind, named=named * page_bytes
        )

    def kv_slots(self) -> tuple[int, int, int, int, int]:
        return self.accounting().slots()

    @property
    def num_free_slots(self) -> int:
        free = sum(p.num_free for p in self.pools)
        return free * self.pages.page_bytes // self.slot_bytes

    def stats(self) -> dict:
        row = {
            **super().stats(),
            "copies": sum(m.num_copies for managers in self.groups.values() for m in managers),
            "prefix_hit_rate": self.prefix_hit_tokens / max(1, self.prefix_query_tokens),
            "policy": self.policy,
            "page_bytes": self.pages.page_bytes,
            "num_pages": self.num_pages,
            "pages_per_state": self.pages.pages_per_state,
        }
        row.update({f"block_size_{k}": b for k, b in self.pages.block_sizes.items()})
        row.update({f"groups_{k}": len(g) for k, g in self.pages.groups.items()})  # of group_size layers each
        if self.pages.groups:
            row["group_size"] = self.pages.group_size
        return row

    # --- what the executor needs ---------------------------------------------------------
    def block_size_of(self, kind: str) -> int:
        return self.managers[kind].block_size

    def block_table(self, seq: Sequence, kind: str | None = None, group: int = 0) -> list[int]:
        """Pages of `seq`'s blocks for the layers of group `group` of `kind` (default: the first
        attention kind's first group); -1 marks a block a window layer has released."""
        manager = self.groups[kind][group] if kind else self.attention[0]
        return manager.tables[seq.seq_id]

    def layer_places(self, layer_kinds: list[str]) -> list[tuple[str, int, int]]:
        """(kind, group, place) of each attention layer, in order: the i-th layer of a kind is in
        group i mod its number of groups, as vLLM strides them, at place i // its groups there
        (its cache: PageLayout.cache_places)."""
        seen: dict = {}
        places = []
        for kind in layer_kinds:
            index = seen[kind] = seen.get(kind, -1) + 1
            count = len(self.groups[kind])
            places.append((kind, index % count, index // count))
        return places

    def state_slot(self, seq: Sequence) -> int:
        """The linear layers' state of `seq` lives at this page (the first of its state's pages)."""
        return self.linear.states[seq.seq_id][0]

    def _log_page_copy(self, src: int, dst: int) -> None:
        """Log ("page", src, dst, 1): attention copy-on-write and forked linear states, in order.
        A page id names one page whatever its kind, so copying a pair in every layer's cache
        changes only the pages that kind owns."""
        self.copied_slots += self.pages.page_bytes / self.slot_bytes  # a page's bytes, in slots
        self._log_copy("page", src, dst, 1)
