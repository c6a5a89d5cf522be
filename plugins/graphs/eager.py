"""The eager graph mode: every step calls the model's forward; nothing is captured."""

from __future__ import annotations

import torch

from kvbench.model.attention_op import ForwardContext, forward_context
from kvbench.plugins.graphs.base import GraphMode


class EagerGraph(GraphMode):
    """No capture: every operator is launched from Python each step."""

    name = "eager"

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        with forward_context(ctx):
            return self.forward(input_ids, positions)
