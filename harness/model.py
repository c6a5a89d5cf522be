"""A tiny decoder-only transformer with seeded random weights, for scenario=serve.

Every attention layer calls `torch.ops.kvbench.attention` (kvbench.attention_op): that op writes
the step's K/V into the cache the allocator laid out and runs the configured backend, with the
batch's metadata taken from the forward context. The op is the seam graph modes split at, so
`forward(input_ids, positions)` takes only the packed token ids and their positions.

Layers are built from `ModelSpec.layer_kinds` through `LAYER_CLASSES` (kind -> class, each
constructed as `cls(spec, cache_index, generator)`): "full" and "window" are attention layers;
"linear" layers register themselves from `kvbench.linear_state` when that module exists.
"""

from __future__ import annotations

import importlib

import torch
import torch._dynamo  # noqa: F401  (a custom op's first call imports it: seconds inside a measured step)
import torch.nn.functional as F
from torch import nn

import kvbench.attention_op  # noqa: F401  (registers torch.ops.kvbench.attention)
from kvbench.errors import UserError
from kvbench.spec import ModelSpec

ATTENTION_KINDS = ("full", "window")


def _linear(in_features: int, out_features: int, generator: torch.Generator) -> nn.Linear:
    layer = nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=generator) * in_features ** -0.5)
    return layer


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * scale).to(x.dtype) * self.weight


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half convention: x [T, heads, head_dim], cos/sin [T, head_dim / 2]."""
    first, second = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, spec: ModelSpec, generator: torch.Generator):
        super().__init__()
        inner = spec.intermediate_size or 4 * spec.hidden_size
        self.gate_up = _linear(spec.hidden_size, 2 * inner, generator)
        self.down = _linear(inner, spec.hidden_size, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class AttentionLayer(nn.Module):
    """Pre-norm decoder layer whose token mixer is attention over the paged / contiguous KV cache.

    `cache_index` is this layer's position among the attention layers: it selects the layer's
    K/V cache and sliding window in the forward context.
    """

    def __init__(self, spec: ModelSpec, cache_index: int, generator: torch.Generator):
        super().__init__()
        self.cache_index = cache_index
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        q_size, kv_size = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.input_norm = RMSNorm(spec.hidden_size)
        self.qkv = _linear(spec.hidden_size, q_size + 2 * kv_size, generator)
        self.o_proj = _linear(q_size, spec.hidden_size, generator)
        self.post_norm = RMSNorm(spec.hidden_size)
        self.mlp = MLP(spec, generator)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self.qkv(self.input_norm(hidden)).split(self.split, dim=-1)
        q = apply_rope(q.view(tokens, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(tokens, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        out = torch.empty_like(q)
        torch.ops.kvbench.attention(q, k, v, out, self.cache_index)
        hidden = hidden + self.o_proj(out.view(tokens, -1))
        return hidden + self.mlp(self.post_norm(hidden))


LAYER_CLASSES: dict[str, type] = {"full": AttentionLayer, "window": AttentionLayer}


def layer_class(kind: str) -> type:
    if kind == "linear" and kind not in LAYER_CLASSES:
        try:
            importlib.import_module("kvbench.linear_state")  # registers LAYER_CLASSES["linear"]
        except ModuleNotFoundError:
            raise UserError("model has 'linear' layers, but kvbench.linear_state (the linear-state "
                            "layer) is not available; use a model of 'full' / 'window' layers") from None
    if kind not in LAYER_CLASSES:
        raise UserError(f"no layer class for layer kind {kind!r}; known: {', '.join(LAYER_CLASSES)}")
    return LAYER_CLASSES[kind]


class TinyDecoder(nn.Module):
    def __init__(self, spec: ModelSpec, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.spec = spec
        self.scale = spec.head_dim ** -0.5
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(spec.vocab_size, spec.hidden_size, generator=generator))
        counts: dict[str, int] = {}
        layers = []
        for kind in spec.layer_kinds:
            family = "attention" if kind in ATTENTION_KINDS else kind
            layers.append(layer_class(kind)(spec, counts.get(family, 0), generator))
            counts[family] = counts.get(family, 0) + 1
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(spec.hidden_size)
        self.lm_head = _linear(spec.hidden_size, spec.vocab_size, generator)
        half = spec.head_dim // 2
        inv_freq = spec.rope_theta ** (-torch.arange(half, dtype=torch.float64) / half)
        angles = torch.outer(torch.arange(spec.max_model_len, dtype=torch.float64), inv_freq)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    @property
    def attention_windows(self) -> list[int]:
        """Sliding window of each attention layer in cache order (0 = full attention)."""
        return [self.spec.window if kind == "window" else 0
                for kind in self.spec.layer_kinds if kind in ATTENTION_KINDS]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Final hidden states [T, hidden] of the packed tokens; K/V go to the context's caches."""
        hidden = self.embed(input_ids)
        cos, sin = self.cos[positions].to(hidden.dtype), self.sin[positions].to(hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
