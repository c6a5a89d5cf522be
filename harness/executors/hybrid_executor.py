"""HybridModelExecutor: the tiny model served from the hybrid allocator's per-layer-group layout.

Every page id names one page of the pool, whatever layer group holds it. The attention layers at
one place of their groups (hybrid_pages) share a K and a V tensor `[num_pages, block_size,
kv_heads, head_dim]`, since their groups hold disjoint pages, so the caches take what the pool
does, as vLLM lays one tensor a place (as_full: one a place and block size, its kinds' blocks
scaled, so kinds of one block size share and others do not). Each linear layer has a state
tensor `[num_pages, heads, head_dim, state_dim]` whose row `state_slot(seq)` is the sequence's
state. Per step each layer group (the i-th layer of a kind in group i mod its groups) gets its
own block tables and slot mapping, since each group holds its own pages and window layers drop
the blocks that fell out of their window; linear layers get the batch's state slots, and which
sequences start from an empty state.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kvbench.core.scheduler import Batch
from kvbench.errors import UserError
from kvbench.executors.model_executor import ModelExecutor
from kvbench.model.attention_op import current_context, forward_context
from kvbench.model.linear_state import StateContext, new_states, state_context


def refuse_unservable(policy: str, linear_layers: int, async_scheduling: bool, graph: str) -> None:
    """What the hybrid layout cannot serve (kvbench.scenarios.build checks it before a run, too)."""
    if policy == "as_full" and linear_layers:
        raise UserError(
            "allocator.policy=as_full sizes linear layers as attention (a memory "
            "baseline for scenario=simulate) and has no state slots to serve them; "
            "use policy shared or static"
        )
    # A step's per-kind metadata and state slots are held from prepare to forward: one step
    # at a time. Graph modes take per-layer metadata, but not the linear layers' state slots.
    if async_scheduling:
        raise UserError("allocator hybrid serves with engine.async_scheduling=false")
    if graph != "eager" and linear_layers:
        raise UserError(
            "a model with linear layers serves with graph=eager: captured graphs "
            "do not carry the layers' per-step state slots"
        )


class HybridModelExecutor(ModelExecutor):
    def __init__(
        self,
        model,
        allocator,
        backend,
        sampling,
        swap_slots: int = 0,
        graph: tuple[type, dict] | None = None,
        async_scheduling: bool = False,
    ):
        graph_name = graph[0].name if graph is not None else "eager"
        refuse_unservable(allocator.policy, model.spec.num_layers_of("linear"), async_scheduling, graph_name)
        super().__init__(model, allocator, backend, sampling, swap_slots, graph, async_scheduling)
        spec, pages = model.spec, allocator.num_pages
        self.kinds = [k for k in spec.layer_kinds if k != "linear"]  # attention layers, cache order
        places = allocator.layer_places(self.kinds)  # each attention layer's (kind, group, place)
        self.layer_groups = [(kind, group) for kind, group, _ in places]
        self.block_size = allocator.attention[0].block_size  # the kind block_table(seq) answers for
        shape = (spec.num_kv_heads, spec.head_dim)
        on_device = dict(device=self.device, dtype=self.dtype)
        shared = {  # (block size, place) -> its K and V (PageLayout.cache_places)
            (size, place): tuple(torch.zeros(pages, size, *shape, **on_device) for _ in "kv")
            for size, place in allocator.pages.cache_places()
        }
        self.kv_caches = [shared[allocator.block_size_of(kind), place] for kind, _, place in places]
        self._caches = list(shared.values())  # each once, for page copies
        self.states = new_states(spec, pages, self.device, self.dtype)
        self._flat = []  # the base's slot-addressed views of the caches replaced above
        self._step_meta, self._step_states = None, None

    def _copy(self, copies: list) -> None:
        """Copy whole pages, in the order logged, in every layer's cache and state tensor."""
        for _, src, dst, _ in copies:
            for cache in (c for pair in self._caches for c in pair):
                cache[dst] = cache[src]
            for states in self.states:
                states[dst] = states[src]

    def _prepare(self, batch: Batch):
        ids, positions, meta, last_rows, sampled = super()._prepare(batch)
        to = dict(device=self.device)
        counts = torch.tensor(batch.num_new_tokens, **to)
        seq_of_token = torch.repeat_interleave(torch.arange(len(batch.seqs), **to), counts)
        by_group = {}
        for kind, group in dict.fromkeys(self.layer_groups):
            bs = self.allocator.block_size_of(kind)
            tables = [self.allocator.block_table(seq, kind, group) for seq in batch.seqs]
            width = max(len(t) for t in tables)
            # A released window block (-1) is never read (masked out), but must index a real page.
            block_tables = torch.tensor(
                [[max(p, 0) for p in t] + [0] * (width - len(t)) for t in tables], dtype=torch.int32, **to
            )
            slot_mapping = block_tables[seq_of_token, positions // bs].to(torch.int64) * bs + positions % bs
            by_group[kind, group] = replace(meta, block_tables=block_tables, slot_mapping=slot_mapping, block_size=bs)
        self._step_meta = [by_group[key] for key in self.layer_groups]
        if self.states:
            slots = torch.tensor([self.allocator.state_slot(seq) for seq in batch.seqs], dtype=torch.int64, **to)
            fresh = torch.tensor(
                [seq.num_computed == n for seq, n in zip(batch.seqs, batch.num_new_tokens)], dtype=torch.bool, **to
            )
            self._step_states = StateContext(self.states, slots, meta.query_start_loc, fresh)
        return ids, positions, meta, last_rows, sampled

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        context = replace(current_context(), layer_meta=self._step_meta)
        with forward_context(context):
            if self._step_states is None:
                return super()._forward(input_ids, positions)
            with state_context(self._step_states):
                return super()._forward(input_ids, positions)
