"""The hybrid allocator's parts: one pool of equal-byte pages and a KV manager per layer kind.

Page-size unification: a page of an attention kind holds one block of that kind's tokens across
all of its layers, so the kind that stores the most bytes per token gets `block_size` tokens per
block and the others proportionally more (the block size is scaled, the page is not); a
linear-state kind's fixed-size state per sequence takes a whole number of pages. Every page has
`page_bytes`, so any kind can take any free page.

vLLM's hybrid KV cache manager unifies pages otherwise for attention kinds: it splits each kind's
layers into groups of one size (gemma-3's 10 full and 52 sliding-window layers: groups of 10),
every group a block table of `block_size` tokens, and scales the block size only to fit a
Mamba state. So here a prefix-cache hit, which every kind must cover, comes in steps of the
least common multiple of the kinds' block sizes (gemma-3-like at block 16: 83 and 16 tokens, a
hit of 1,328), where vLLM's come in steps of 16: a 1,200-token shared prefix hits 0 tokens here
(a simulated run's prefix_hit_rate) where vLLM's 16-token blocks would give 1,184 (derived, not
run). A kind a table is the simpler model; the hit granularity is its cost.

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
    block_sizes: dict  # kind whose KV grows per token -> tokens per block
    token_bytes: dict  # same kinds -> bytes of one token across the kind's layers
    state_bytes: int  # one sequence's recurrent state across all linear layers (0: none, or as full)
    pages_per_state: int

    def page_padding(self, kind: str) -> int:
        """Bytes of a page that kind `kind` never fills (rounding of its scaled block size or state)."""
        if kind in self.block_sizes:
            return self.page_bytes - self.block_sizes[kind] * self.token_bytes[kind]
        return self.pages_per_state * self.page_bytes - self.state_bytes


def unify_pages(model: ModelSpec, block_size: int, linear_as_full: bool = False) -> PageLayout:
    """Pages of `block_size` tokens of the heaviest attention kind; block sizes of the rest scaled up.

    `linear_as_full` sizes linear layers as if they were full attention (the naive baseline).
    """
    per_layer = model.kv_bytes_per_token_per_layer
    token_kinds = [k for k in LAYER_KINDS if model.num_layers_of(k) and (k != "linear" or linear_as_full)]
    token_bytes = {k: model.num_layers_of(k) * per_layer for k in token_kinds}
    num_linear = 0 if linear_as_full else model.num_layers_of("linear")
    state_bytes = num_linear * model.linear_state_bytes_per_layer
    page_bytes = block_size * max(token_bytes.values()) if token_bytes else state_bytes
    if page_bytes <= 0:
        raise UserError(f"model {model.name} stores no KV and no state: nothing to allocate")
    block_sizes = {k: page_bytes // b for k, b in token_bytes.items()}
    pages_per_state = cdiv(state_bytes, page_bytes)
    return PageLayout(page_bytes, block_sizes, token_bytes, state_bytes, pages_per_state)


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

    def fork(self, parent: int, child: int) -> None:
        spares = self.spares[parent]
        pages = spares.pop() if spares else self._take_state()
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
