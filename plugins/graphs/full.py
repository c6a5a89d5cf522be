"""The full graph mode: the whole decode step, attention included, captured once per capture size.

A step copies its token ids, positions and attention metadata into static buffers sized for
the largest capture size and replays the capture of the next size up; the rows past the batch
are padding: token 0 at position 0, context length 0, slot -1 (its K/V are written nowhere),
so they never change a real row. The captured metadata says `max_seq_len` is the mode's bound,
so a kernel sized from it covers any context the capture will later see. Steps a capture
cannot serve (a prefill, a batch above the largest size) run eagerly and are counted.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kvbench.arith import cdiv
from kvbench.model.attention_op import ForwardContext, forward_context
from kvbench.plugins.backends.base import AttentionMetadata
from kvbench.plugins.graphs.base import Capture, GraphMode, padding_metadata

PREFILL = "prefill step (full graphs capture decode steps only)"
PER_LAYER = "per-layer attention metadata (hybrid allocator), which the capture does not hold"


class StaticInputs:
    """The buffers a captured step reads: token ids, positions and the attention metadata."""

    def __init__(self, num_rows: int, like: AttentionMetadata, max_seq_len: int, device):
        to = dict(device=device)
        self.block_size = like.block_size
        self.max_seq_len = max_seq_len
        self.input_ids = torch.zeros(num_rows, dtype=torch.long, **to)
        self.positions = torch.zeros(num_rows, dtype=torch.long, **to)
        self.seq_lens = torch.zeros(num_rows, dtype=torch.int32, **to)
        self.slot_mapping = torch.full((num_rows,), -1, dtype=torch.int64, **to)
        self.query_start_loc = torch.arange(num_rows + 1, dtype=torch.int32, **to)  # one token each
        self.block_tables = self.seq_starts = None
        if like.layout == "paged":
            max_blocks = cdiv(max_seq_len, like.block_size)
            self.block_tables = torch.zeros(num_rows, max_blocks, dtype=torch.int32, **to)
        else:
            self.seq_starts = torch.zeros(num_rows, dtype=torch.int64, **to)

    def load(self, input_ids, positions, meta: AttentionMetadata, size: int) -> None:
        """Rows [0, n) from the step, rows [n, size) padding."""
        n = input_ids.shape[0]
        for static, new, pad in (
            (self.input_ids, input_ids, 0),
            (self.positions, positions, 0),
            (self.seq_lens, meta.seq_lens, 0),
            (self.slot_mapping, meta.slot_mapping, -1),
            (self.seq_starts, meta.seq_starts, 0),
        ):
            if static is not None:
                static[:n].copy_(new)
                static[n:size].fill_(pad)
        if self.block_tables is not None:
            width = meta.block_tables.shape[1]
            if width > self.block_tables.shape[1]:
                raise ValueError(
                    f"block table of {width} blocks exceeds the captured bound of "
                    f"{self.block_tables.shape[1]} (max_seq_len={self.max_seq_len})"
                )
            self.block_tables[:n, :width].copy_(meta.block_tables)
            self.block_tables[n:size].zero_()

    def meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            slot_mapping=self.slot_mapping[:size],
            block_size=self.block_size,
            max_query_len=1,
            max_seq_len=self.max_seq_len,
            block_tables=None if self.block_tables is None else self.block_tables[:size],
            seq_starts=None if self.seq_starts is None else self.seq_starts[:size],
        )


class FullGraph(GraphMode):
    """Whole decode step captured per capture size; batches padded up; prefills eager."""

    name = "full"

    def __init__(self, forward, device, max_seq_len: int, capture_sizes=None, **options):
        super().__init__(forward, device, max_seq_len, capture_sizes, **options)
        self.static: StaticInputs | None = None
        self.captures: dict[int, Capture] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None

    @classmethod
    def unsupported_reason(cls, backend_cls: type, device: torch.device) -> str | None:
        if getattr(backend_cls, "cuda_graph_capturable", False):
            return None
        return (
            "its forward is not declared cuda_graph_capturable (a replayed graph never "
            "re-runs host code, so a backend that reads batch metadata on the host would "
            "attend over the capture's batch); use +graph=piecewise, which keeps attention "
            "out of the graph (not for a model with linear layers), or +graph=eager"
        )

    def _capture(self, size: int, ctx: ForwardContext) -> Capture:
        static_ctx = replace(ctx, meta=self.static.meta(size))

        def step(input_ids, positions):
            with forward_context(static_ctx):
                return self.forward(input_ids, positions)

        capture = Capture(step, (self.static.input_ids[:size], self.static.positions[:size]), self.pool)
        self.captures[size] = capture
        return capture

    def _replay(self, input_ids, positions, ctx: ForwardContext, size: int) -> torch.Tensor:
        if self.static is None:
            self.static = StaticInputs(self.capture_sizes[-1], ctx.meta, self.max_seq_len, self.device)
        self.static.load(input_ids, positions, ctx.meta, size)
        capture = self.captures.get(size) or self._capture(size, ctx)
        return capture.replay()

    def prepare(self, max_num_seqs: int, max_num_tokens: int, ctx: ForwardContext) -> None:
        """Capture every size up to the one `max_num_seqs` pads to, from all-padding batches."""
        largest = self.padded_size(max_num_seqs) or self.capture_sizes[-1]
        no_rows = replace(ctx, meta=padding_metadata(ctx.meta, 0))
        empty = no_rows.meta.slot_mapping
        for size in reversed([s for s in self.capture_sizes if s <= largest]):  # vLLM: largest first
            if size not in self.captures:
                self._replay(empty, empty, no_rows, size)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        num_tokens = input_ids.shape[0]
        size = self.padded_size(num_tokens)
        if ctx.layer_meta is not None:
            reason = PER_LAYER
        elif not ctx.meta.is_decode_only or num_tokens != ctx.meta.num_seqs:
            reason = PREFILL
        elif size is None:
            reason = self.too_large(num_tokens)
        else:
            self.replays += 1
            return self._replay(input_ids, positions, ctx, size)[:num_tokens]
        self.eager_steps[f"{reason}: ran eager"] += 1
        with forward_context(ctx):
            return self.forward(input_ids, positions)

    def stats(self) -> dict:
        return {**super().stats(), "graph_captured_sizes": len(self.captures)}
