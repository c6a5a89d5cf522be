"""The hybrid allocator's parts: one pool of equal-byte pages and a KV manager per layer group.

Page-size unification, as vLLM's hybrid KV cache manager does it for attention kinds (v1
kv_cache_planning, `_get_kv_cache_groups_uniform_page_size`): each kind's layers are split into
groups of one size, `group_size` layers (the fewest layers of any kind, or the most where no kind
has 1.5 times the layers of another), the i-th layer of a kind going to group i mod its number of
groups; a kind whose layers do not fill its last groups gets padding layers there, bytes every
page of those groups holds for nothing (rounding). Every group keeps its own block table of
`block_size` tokens, and a page holds one block of one group: `block_size * group_size` tokens'
K/V of one layer. gemma-3's 10 full and 52 sliding-window layers: groups of 10, one full group
and six window groups of 9, 9, 9, 9, 8 and 8 layers (8 padding layers, 13 % of the window
layers' pages). So a prefix hit comes in steps of `block_size`, whatever the kinds. A linear-state
kind's fixed-size state per sequence takes a whole number of pages. Every page has `page_bytes`,
so any group can take any free page.

The pages themselves (ref counts, free queues, eviction order, the prefix cache) are a
block_pool.BlockPool, the same pool the paged allocator uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.arith import cdiv
from kvbench.core.spec import LAYER_KINDS, ModelSpec
from kvbench.errors import UserError
from kvbench.plugins.allocators.block_pool import BlockPool


@dataclass(frozen=True)
class PageLayout:
    """How each layer kind fills a page of `page_bytes`."""

    page_bytes: int
    block_sizes: dict  # kind whose KV grows per token -> tokens per block (every group's)
    token_bytes: dict  # same kinds -> bytes of one token across the kind's layers
    state_bytes: int  # one sequence's recurrent state across all linear layers (0: none, or as full)
    pages_per_state: int
    groups: dict  # same kinds -> layers of each of its groups (gemma-3's window: [9, 9, 9, 9, 8, 8])
    group_size: int  # layers a page holds a block of (a group's layers and its padding)

    def group_token_bytes(self, kind: str, group: int) -> int:
        """Bytes of one token across the real layers of group `group` of `kind`."""
        return self.groups[kind][group] * self.token_bytes[kind] // sum(self.groups[kind])

    def cache_places(self) -> dict:
        """(block size, place) -> the attention kinds whose layers at that place of their groups
        share one K/V cache of every page (HybridModelExecutor): their groups' pages are disjoint,
        as vLLM lays one tensor a place. Grouped, a place per layer of a group; as_full, a kind a
        group, so a place per layer, shared only by kinds of one scaled block size."""
        places: dict = {}
        for kind, size in self.block_sizes.items():
            for place in range(max(self.groups[kind])):
                places.setdefault((size, place), []).append(kind)
        return places

    def page_padding(self, kind: str, group: int = 0) -> int:
        """Bytes of a page that a group of `kind` never fills (its padding layers, or as_full's
        block rounding), or of a linear state's pages (their rounding)."""
        if kind in self.block_sizes:
            return self.page_bytes - self.block_sizes[kind] * self.group_token_bytes(kind, group)
        return self.pages_per_state * self.page_bytes - self.state_bytes


def group_layers(counts: list[int]) -> int:
    """Layers a group holds, given each attention kind's layer count (vLLM's rule)."""
    fewest, most = min(counts), max(counts)
    return most if most < 1.5 * fewest else fewest


def unify_pages(model: ModelSpec, block_size: int, linear_as_full: bool = False) -> PageLayout:
    """Pages of one `block_size`-token block of `group_size` layers; each kind's layers in groups.

    `linear_as_full` is the naive baseline (allocator.policy=as_full): PagedAttention unaware of
    layer kinds, as vLLM runs with its hybrid manager disabled, keeps one block table for every
    layer, so it pays no padding layers. Here each kind keeps its own manager (its accounting:
    a window layer's tokens past its window are internal fragmentation), so a page is a block of
    the heaviest kind's layers and the other kinds' blocks are scaled to fill it (a rounding of
    under a token a block); linear layers are sized as full attention.
    """
    per_layer = model.kv_bytes_per_token_per_layer
    token_kinds = [k for k in LAYER_KINDS if model.num_layers_of(k) and (k != "linear" or linear_as_full)]
    token_bytes = {k: model.num_layers_of(k) * per_layer for k in token_kinds}
    num_linear = 0 if linear_as_full else model.num_layers_of("linear")
    state_bytes = num_linear * model.linear_state_bytes_per_layer
    if linear_as_full:  # one group a kind, its block size scaled
        size = max((model.num_layers_of(k) for k in token_kinds), default=0)
        groups = {k: [model.num_layers_of(k)] for k in token_kinds}
        block_sizes = {k: block_size * size // model.num_layers_of(k) for k in token_kinds}
    else:
        size = group_layers([model.num_layers_of(k) for k in token_kinds]) if token_kinds else 0
        groups = {}
        for kind in token_kinds:
            layers, count = model.num_layers_of(kind), cdiv(model.num_layers_of(kind), size)
            groups[kind] = [len(range(i, layers, count)) for i in range(count)]  # layers i, i + count, ...
        block_sizes = dict.fromkeys(token_kinds, block_size)
    page_bytes = block_size * size * per_layer if token_kinds else state_bytes
    if page_bytes <= 0:
        raise UserError(f"model {model.name} stores no KV and no state: nothing to allocate")
    pages_per_state = cdiv(state_bytes, page_bytes)
    return PageLayout(page_bytes, block_sizes, token_bytes, state_bytes, pages_per_state, groups, size)


class LinearStateManager:
    """One fixed-size recurrent state per sequence, `pages_per_state` pages each.

    A request of n parallel samples (or beams) reserves its n - 1 children's states when it is admitted,
    so forking (which copies the parent's state) never waits for memory.
    """

    kind = "linear"

    def __init__(self, pool: BlockPool, pages_per_state: int, state_bytes: int, log_copy=lambda src, dst: None):
        self.pool, self.pages_per_state, self.state_bytes = pool, pages_per_state, state_bytes
        self.log_copy = log_copy
        self.states: dict[int, list[int]] = {}
        self.spares: dict[int, list[list[int]]] = {}
        self.started: set[int] = set()  # sequences whose state holds computed tokens
        self.num_pages = self.num_states = self.num_copies = 0

    def _take_state(self) -> list[int]:
        self.num_pages += self.pages_per_state
        self.num_states += 1
        return self.pool.take_blocks(self.pages_per_state)

    def _drop_state(self, pages: list[int]) -> None:
        self.pool.drop_blocks(pages)
        self.num_pages -= self.pages_per_state
        self.num_states -= 1

    def add(self, seq_id: int, num_states: int) -> None:
        self.states[seq_id] = self._take_state()
        self.spares[seq_id] = [self._take_state() for _ in range(num_states - 1)]

    def start(self, seq_id: int) -> None:
        self.started.add(seq_id)

    def fork(self, parent: int, child: int, copy: bool = True) -> None:
        spares = self.spares[parent]
        pages = spares.pop() if spares else self._take_state()
        if copy:
            for src, dst in zip(self.states[parent], pages):
                self.log_copy(src, dst)
            self.num_copies += 1
        self.states[child] = pages
        self.spares[child] = []
        self.started.add(child)

    def free(self, seq_id: int) -> None:
        self._drop_state(self.states.pop(seq_id))
        for pages in self.spares.pop(seq_id):
            self._drop_state(pages)
        self.started.discard(seq_id)

    @property
    def num_named(self) -> int:
        """A state is never shared: the sequences name exactly the pages held."""
        return self.num_pages

    def usage(self) -> tuple[int, int, int, int]:
        """(pages held, bytes of started states, bytes of states set aside, 0: nothing goes stale);
        the rest of the pages, their padding, is rounding."""
        started = len(self.started)
        return (self.num_pages, started * self.state_bytes, (self.num_states - started) * self.state_bytes, 0)
