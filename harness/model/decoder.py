"""A tiny decoder-only transformer with seeded random weights, for scenario=serve.

Every attention layer calls `torch.ops.kvbench.attention` (kvbench.model.attention_op): that op writes
the step's K/V into the cache the allocator laid out and runs the configured backend, with the
batch's metadata taken from the forward context. The op is the seam graph modes split at, so
`forward(input_ids, positions)` takes only the packed token ids and their positions.

Layers are built from `ModelSpec.layer_kinds` through `LAYER_CLASSES` (kind -> class, each
constructed as `cls(spec, cache_index, generator)`): "full" and "window" are attention layers;
"linear" layers are the delta-rule state layers of `kvbench.model.linear_state`.
"""

from __future__ import annotations

import torch
from torch import nn

from kvbench.core.spec import ModelSpec
from kvbench.errors import UserError
from kvbench.model.layers import ATTENTION_KINDS, AttentionLayer, RMSNorm, seeded_linear
from kvbench.model.linear_state import LinearStateLayer

LAYER_CLASSES: dict[str, type] = {"full": AttentionLayer, "window": AttentionLayer, "linear": LinearStateLayer}


def layer_class(kind: str) -> type:
    if kind not in LAYER_CLASSES:
        raise UserError(f"no layer class for layer kind {kind!r}; known: {', '.join(LAYER_CLASSES)}")
    return LAYER_CLASSES[kind]


class TinyDecoder(nn.Module):
    def __init__(self, spec: ModelSpec, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.spec = spec
        self.scale = spec.head_dim**-0.5
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
        self.lm_head = seeded_linear(spec.hidden_size, spec.vocab_size, generator)
        half = spec.head_dim // 2
        inv_freq = spec.rope_theta ** (-torch.arange(half, dtype=torch.float64) / half)
        angles = torch.outer(torch.arange(spec.max_model_len, dtype=torch.float64), inv_freq)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    @property
    def attention_windows(self) -> list[int]:
        """Sliding window of each attention layer in cache order (0 = full attention)."""
        return [
            self.spec.window if kind == "window" else 0 for kind in self.spec.layer_kinds if kind in ATTENTION_KINDS
        ]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Final hidden states [T, hidden] of the packed tokens; K/V go to the context's caches."""
        hidden = self.embed(input_ids)
        cos, sin = self.cos[positions].to(hidden.dtype), self.sin[positions].to(hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
