"""The piecewise graph mode: torch.compile splits the model at attention; the pieces are captured.

A custom torch.compile backend receives the model's FX graph and cuts it at every
`kvbench::attention` call: N attention calls leave N + 1 pieces (vLLM's split). Each piece is
captured once per capture size; attention runs eagerly between them, so it may read the
step's metadata on the host and serve prefills, decodes and mixed batches alike. A step pads
its tokens up to the next capture size (padded tokens: id 0, position 0, slot -1, outside
every sequence); a step above the largest size runs the pieces uncaptured and is counted.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import fx
from torch.fx.passes.split_module import split_module

import kvbench.model.attention_op  # noqa: F401  (registers torch.ops.kvbench.attention)
from kvbench.model.attention_op import ForwardContext, forward_context
from kvbench.plugins.graphs.base import Capture, GraphMode, padding_metadata

ATTENTION_OPS = (torch.ops.kvbench.attention, torch.ops.kvbench.attention.default)


def split_at_attention(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[str]]:
    """The graph cut into submodules, each attention call alone in its own; and the pieces' names."""
    part, assignment, attention_parts = 0, {}, set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and node.target in ATTENTION_OPS:
            part += 1
            attention_parts.add(part)
            assignment[node] = part
            part += 1
        else:
            assignment[node] = part
    split = split_module(gm, None, lambda node: assignment[node], keep_original_order=True)
    pieces = [name for name, _ in split.named_children() if int(name.rsplit("_", 1)[1]) not in attention_parts]
    return split, pieces


class Piece(torch.nn.Module):
    """One piece between attention calls: captured per padded size, run as is when uncaptured."""

    def __init__(self, submodule: torch.nn.Module, mode: PiecewiseGraph):
        super().__init__()
        self.submodule = submodule
        self.mode = mode
        self.captures: dict[int, Capture] = {}

    def forward(self, *args):
        size = self.mode.current_size
        if size is None:
            return self.submodule(*args)
        capture = self.captures.get(size)
        if capture is None:
            capture = self.captures[size] = Capture(self.submodule, args, self.mode.pool)
        return capture.replay(*args)


class PiecewiseGraph(GraphMode):
    """Torch.compile split at attention; pieces captured per size, attention eager."""

    name = "piecewise"

    def __init__(self, forward, device, max_seq_len: int, capture_sizes=None, **options):
        super().__init__(forward, device, max_seq_len, capture_sizes, **options)
        # Dynamo counts recompilations per code object across compiled callables; a fresh
        # model in the same process (a sweep's next point) must not inherit the earlier ones.
        torch.compiler.reset()
        self.pieces: list[int] = []  # pieces of each graph torch.compile handed to the backend
        self.piece_modules: list[Piece] = []
        self.current_size: int | None = None
        self.pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self.static_ids = torch.zeros(self.capture_sizes[-1], dtype=torch.long, device=self.device)
        self.static_positions = torch.zeros_like(self.static_ids)
        self.compiled = torch.compile(forward, backend=self._split, dynamic=True, fullgraph=True)

    def _split(self, gm: fx.GraphModule, example_inputs) -> fx.GraphModule:
        split, names = split_at_attention(gm)
        for name in names:
            setattr(split, name, Piece(getattr(split, name), self))
        self.pieces.append(len(names))
        self.piece_modules += [getattr(split, name) for name in names]
        return split

    def _run(self, input_ids, positions, ctx: ForwardContext, size: int | None) -> torch.Tensor:
        self.current_size = size
        try:
            with forward_context(ctx):
                return self.compiled(input_ids, positions)
        finally:
            self.current_size = None

    def prepare(self, max_num_seqs: int, max_num_tokens: int, ctx: ForwardContext) -> None:
        """Compile, then capture the pieces of every size up to the one `max_num_tokens` pads to."""
        largest = self.padded_size(max_num_tokens) or self.capture_sizes[-1]
        for size in reversed([s for s in self.capture_sizes if s <= largest]):
            self.static_ids[:size].zero_()
            self.static_positions[:size].zero_()
            self._run(
                self.static_ids[:size],
                self.static_positions[:size],
                replace(ctx, meta=padding_metadata(ctx.meta, size), layer_meta=None),
                size,
            )

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        num_tokens = input_ids.shape[0]
        size = self.padded_size(num_tokens)
        if size is None:
            self.eager_steps[f"{self.too_large(num_tokens)}: pieces ran uncaptured"] += 1
            return self._run(input_ids, positions, ctx, None)
        self.replays += 1
        for static, new in ((self.static_ids, input_ids), (self.static_positions, positions)):
            static[:num_tokens].copy_(new)
            static[num_tokens:size].zero_()
        padding = torch.full((size - num_tokens,), -1, dtype=torch.int64, device=self.device)

        def pad(meta):
            return replace(meta, slot_mapping=torch.cat([meta.slot_mapping, padding]))

        layer_meta = None if ctx.layer_meta is None else [pad(m) for m in ctx.layer_meta]
        hidden = self._run(
            self.static_ids[:size],
            self.static_positions[:size],
            replace(ctx, meta=pad(ctx.meta), layer_meta=layer_meta),
            size,
        )
        return hidden[:num_tokens]

    def stats(self) -> dict:
        return {
            **super().stats(),
            "graph_pieces": max(self.pieces, default=0),
            "graph_compiles": len(self.pieces),
            "graph_captured_sizes": len({size for piece in self.piece_modules for size in piece.captures}),
        }
