"""The graph-mode contract: how a model's forward runs each step, and the capture it shares.

A graph mode wraps `forward(input_ids, positions) -> hidden` (the model's packed-token
forward; attention reaches its batch metadata and KV caches through the forward context) and
is called once per step with the step's inputs and context. It returns the hidden states of
the step's real tokens, valid until its next call.

Captured modes pad a batch up to the next capture size (vLLM's sizes by default) so one
capture serves every batch up to that size; padded tokens write their K/V nowhere (slot -1).
A capture is a CUDA graph on cuda; on other devices the same static buffers, padding and
capture bookkeeping run, replaying by calling the captured function on its static inputs, so
the logic is testable on a laptop.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar

import torch

from kvbench.errors import UserError
from kvbench.model.attention_op import ForwardContext
from kvbench.plugins.backends.base import AttentionMetadata

# vLLM's default CUDA-graph capture sizes: 1, 2, 4, then every multiple of 8 up to 256.
DEFAULT_CAPTURE_SIZES = (1, 2, 4) + tuple(range(8, 257, 8))


def check_capture_sizes(sizes) -> tuple[int, ...]:
    if sizes is None:
        return DEFAULT_CAPTURE_SIZES
    sizes = tuple(sizes)
    valid = bool(sizes) and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes)
    if not valid or any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise UserError(
            f"graph.capture_sizes={list(sizes)} must be positive integers in increasing "
            f"order, e.g. [1, 2, 4, 8, 16]; null = vLLM's [1, 2, 4, 8, ..., 256]"
        )
    return sizes


def padding_metadata(like: AttentionMetadata, num_seqs: int) -> AttentionMetadata:
    """A decode batch of `num_seqs` empty sequences writing nowhere: what capture-time rows are."""
    device = like.seq_lens.device
    return replace(
        like,
        query_start_loc=torch.arange(num_seqs + 1, dtype=torch.int32, device=device),
        seq_lens=torch.zeros(num_seqs, dtype=torch.int32, device=device),
        slot_mapping=torch.full((num_seqs,), -1, dtype=torch.int64, device=device),
        max_query_len=1,
        max_seq_len=1,
        block_tables=None if like.block_tables is None else like.block_tables.new_zeros(num_seqs, 1),
        seq_starts=None if like.seq_starts is None else like.seq_starts.new_zeros(num_seqs),
    )


class Capture:
    """`fn(*static_args)` captured once; `replay(*args)` runs it on new inputs of the same shapes.

    New tensor inputs are copied into the captured ones unless they already are them (the
    outputs of a previous capture, the model's weights), so a replay never depends on where a
    caller's tensors live. Non-tensor inputs (sizes) must equal the captured ones.
    """

    def __init__(self, fn: Callable, static_args: tuple, pool=None):
        self.fn = fn
        self.static_args = static_args
        self.graph = None
        self.output = None
        first = next((a for a in static_args if isinstance(a, torch.Tensor)), None)
        if first is not None and first.is_cuda:
            fn(*static_args)  # warm-up: Triton compiles and allocator growth stay out of the graph
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                self.output = fn(*static_args)

    def replay(self, *args):
        for new, static in zip(args, self.static_args):
            if isinstance(static, torch.Tensor) and new.data_ptr() != static.data_ptr():
                static.copy_(new)
        if self.graph is None:
            return self.fn(*self.static_args)
        self.graph.replay()
        return self.output


class GraphMode:
    """Base of every graph-mode plugin. Subclasses set `name` and implement `__call__`.

    `max_seq_len` bounds the context of any sequence the mode will see (captured attention
    metadata is sized for it); `capture_sizes` None means DEFAULT_CAPTURE_SIZES.
    """

    name: ClassVar[str]

    def __init__(self, forward: Callable, device: torch.device, max_seq_len: int, capture_sizes=None, **options):
        if options:
            raise UserError(f"graph mode {self.name} has no option(s) {sorted(options)}")
        self.forward = forward
        self.device = torch.device(device)
        self.max_seq_len = max_seq_len
        self.capture_sizes = check_capture_sizes(capture_sizes)
        self.replays = 0
        self.eager_steps: Counter = Counter()  # why a step ran uncaptured -> how many did

    @classmethod
    def unsupported_reason(cls, backend_cls: type, device: torch.device) -> str | None:
        """None when this mode can run the attention backend on the device, else why not."""
        return None

    def padded_size(self, num_tokens: int) -> int | None:
        """The capture size a batch of `num_tokens` runs at; None when it exceeds the largest."""
        i = bisect.bisect_left(self.capture_sizes, num_tokens)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    def too_large(self, num_tokens: int) -> str:
        return f"step's tokens > largest capture size {self.capture_sizes[-1]}"  # sizes count tokens

    def prepare(self, max_num_seqs: int, max_num_tokens: int, ctx: ForwardContext) -> None:
        """Capture ahead of the first step what the scheduler's largest batches will need."""

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        raise NotImplementedError

    def stats(self) -> dict:
        """Result columns: captures replayed, steps run uncaptured and why (the results say so)."""
        return {
            "graph_replays": self.replays,
            "graph_eager_steps": sum(self.eager_steps.values()),
            "graph_eager_reason": "; ".join(f"{n} x {why}" for why, n in sorted(self.eager_steps.items())),
        }


def build(
    cls: type, options: dict, forward: Callable, backend_cls: type, device: torch.device, max_seq_len: int
) -> GraphMode:
    """Graph mode `cls` with `options` around `forward`; a mode that cannot run the attention
    backend is a UserError naming the reason."""
    refuse_unsupported(cls, backend_cls, device)
    return cls(forward, device, max_seq_len, **options)


def refuse_unsupported(cls: type, backend_cls: type, device) -> None:
    """Graph mode `cls` cannot run `backend_cls` on `device`: a UserError naming the reason (also
    checked from the config before a run: kvbench.scenarios.build)."""
    reason = cls.unsupported_reason(backend_cls, torch.device(device))
    if reason:
        raise UserError(f"graph={cls.name} cannot run backend {backend_cls.name}: {reason}")
