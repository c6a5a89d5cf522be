"""The attention call every model layer makes, registered as the custom op `kvbench::attention`.

Graph modes split a captured model at this op (piecewise) or capture through it (full). The op
takes only tensors and the layer index; the batch's metadata, the backend and the KV caches
come from the forward context the executor sets around each step.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from kvbench.plugins.backends.base import AttentionBackend, AttentionMetadata, refuse_misshapen


@dataclass
class ForwardContext:
    backend: AttentionBackend
    meta: AttentionMetadata
    kv_caches: list  # per attention layer: (k_cache, v_cache)
    scale: float
    windows: list  # per attention layer: sliding window in tokens, 0 = full
    layer_meta: list | None = None  # per attention layer, where layer kinds have their own
    # block tables (the hybrid allocator); None = `meta` for all


_current: ContextVar[ForwardContext | None] = ContextVar("kvbench_forward_context", default=None)


@contextlib.contextmanager
def scoped(var: ContextVar, value):
    """`var` holds `value` for the duration of the block; nesting restores the outer value."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def forward_context(ctx: ForwardContext):
    return scoped(_current, ctx)


def current_context() -> ForwardContext:
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("kvbench::attention called outside forward_context()")
    return ctx


@torch.library.custom_op("kvbench::attention", mutates_args=("output",))
def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, layer: int) -> None:
    """Write this step's K/V of `layer` into its cache, then attend; result into `output`.

    query / output: [T, num_heads, head_dim]; key / value: [T, num_kv_heads, head_dim].
    """
    ctx = current_context()
    k_cache, v_cache = ctx.kv_caches[layer]
    meta = ctx.meta if ctx.layer_meta is None else ctx.layer_meta[layer]
    ctx.backend.write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
    result = ctx.backend.forward(query, k_cache, v_cache, meta, ctx.scale, ctx.windows[layer])
    refuse_misshapen(ctx.backend.name, result, output)
    output.copy_(result)


@attention.register_fake
def _(query, key, value, output, layer) -> None:
    return None
