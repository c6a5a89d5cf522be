"""The building blocks of kvbench's decoders: seeded linear layers, RMSNorm, RoPE, the MLP and
the attention layer (which calls `torch.ops.kvbench.attention`, the op graph modes split at)."""

from __future__ import annotations

import torch
import torch._dynamo  # noqa: F401  (a custom op's first call imports it: seconds inside a measured step)
import torch.nn.functional as F
from torch import nn

import kvbench.model.attention_op  # noqa: F401  (registers torch.ops.kvbench.attention)
from kvbench.core.spec import ModelSpec

ATTENTION_KINDS = ("full", "window")


def seeded_linear(in_features: int, out_features: int, generator: torch.Generator) -> nn.Linear:
    layer = nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=generator) * in_features**-0.5)
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
        self.gate_up = seeded_linear(spec.hidden_size, 2 * inner, generator)
        self.down = seeded_linear(inner, spec.hidden_size, generator)

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
        self.qkv = seeded_linear(spec.hidden_size, q_size + 2 * kv_size, generator)
        self.o_proj = seeded_linear(q_size, spec.hidden_size, generator)
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
