"""The linear-state layer of the tiny model: a gated delta rule over a fixed-size state per sequence.

Per head, the state S is a [head_dim, state_dim] matrix (Gated DeltaNet, as in Qwen3-Next):

    S_t = a_t S_{t-1} + b_t k_t (v_t - a_t S_{t-1}^T k_t)^T        o_t = S_t^T q_t

with k_t, q_t L2-normalised, decay a_t in (0, 1) and write strength b_t in (0, 1). Unlike
attention, a layer keeps no K/V per token: a sequence's whole history is its state, so its
memory is constant in sequence length. Decode is one recurrent step per sequence; prefill runs
the same recurrence over the chunk's tokens, all sequences of the batch in step.

States live in per-layer tensors `[num_slots, heads, head_dim, state_dim]`, addressed by the
state slot the allocator gives each sequence; the executor says, per step, which slot each
sequence uses and which sequences start from an empty state (`StateContext`). The layer calls
the custom op `kvbench::linear_state`, so graph modes see it as an opaque op like attention.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kvbench.core.spec import ModelSpec
from kvbench.model.attention_op import scoped
from kvbench.model.layers import MLP, RMSNorm, seeded_linear


@dataclass
class StateContext:
    """One step's linear-state inputs: where each sequence's state lives and how its tokens pack."""

    states: list  # per linear layer: [num_slots, heads, head_dim, state_dim]
    slots: torch.Tensor  # [B] int64, the state slot of each sequence in the batch
    query_start_loc: torch.Tensor  # [B + 1] int32, as in AttentionMetadata
    fresh: torch.Tensor  # [B] bool, True where the sequence starts from an empty state


_current: ContextVar[StateContext | None] = ContextVar("kvbench_state_context", default=None)


def state_context(ctx: StateContext):
    return scoped(_current, ctx)


def new_states(spec: ModelSpec, num_slots: int, device=None, dtype=torch.float32) -> list:
    """Zeroed state tensors for every linear layer of `spec`."""
    shape = (num_slots, spec.num_heads, spec.head_dim, spec.linear_state_dim)
    return [torch.zeros(shape, device=device, dtype=dtype) for _ in range(spec.num_layers_of("linear"))]


def from_scratch(spec: ModelSpec, query_start_loc: torch.Tensor, dtype=torch.float32):
    """A state context in which every packed sequence starts empty and nothing is kept: the
    from-scratch forward the independent reference runs (a no-op without linear layers)."""
    if not spec.num_layers_of("linear"):
        return contextlib.nullcontext()
    num_seqs, device = query_start_loc.shape[0] - 1, query_start_loc.device
    return state_context(
        StateContext(
            new_states(spec, num_seqs, device, dtype),
            torch.arange(num_seqs, device=device),
            query_start_loc,
            torch.ones(num_seqs, dtype=torch.bool, device=device),
        )
    )


def delta_rule_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, write: torch.Tensor, decay: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: state [B, H, dk, dv], q/k [B, H, dk], v [B, H, dv], write/decay
    [B, H] -> (new state, output [B, H, dv])."""
    state = decay[..., None, None] * state
    recalled = torch.einsum("bhkv,bhk->bhv", state, k)
    state = state + torch.einsum("bhk,bhv->bhkv", k, write[..., None] * (v - recalled))
    return state, torch.einsum("bhkv,bhk->bhv", state, q)


def delta_rule(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    write: torch.Tensor,
    decay: torch.Tensor,
    lengths: torch.Tensor,
):
    """Ragged chunks padded to [B, T, ...]: sequence b runs its first lengths[b] tokens from
    `state[b]`. Returns (final states, outputs [B, T, H, dv]); padded steps leave the state alone."""
    outputs = []
    for t in range(q.shape[1]):
        new, out = delta_rule_step(state, q[:, t], k[:, t], v[:, t], write[:, t], decay[:, t])
        live = (lengths > t)[:, None, None, None]
        state = torch.where(live, new, state)
        outputs.append(out)
    return state, torch.stack(outputs, dim=1)


@torch.library.custom_op("kvbench::linear_state", mutates_args=("output",))
def linear_state(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    write: torch.Tensor,
    decay: torch.Tensor,
    output: torch.Tensor,
    layer: int,
) -> None:
    """Run linear layer `layer` on the packed tokens ([T, H, ...]) and update the states in place."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("kvbench::linear_state called outside state_context()")
    storage = ctx.states[layer]
    starts = ctx.query_start_loc.to(torch.int64)
    lengths = starts[1:] - starts[:-1]
    num_seqs, longest = lengths.shape[0], int(lengths.max())
    # Scatter the packed tokens into [B, longest, ...] (row b, step t) and back.
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=q.device), lengths)
    step_of_token = torch.arange(q.shape[0], device=q.device) - starts[seq_of_token]

    def padded(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(num_seqs, longest, *x.shape[1:])
        out[seq_of_token, step_of_token] = x
        return out

    state = storage[ctx.slots].float()
    state = torch.where(ctx.fresh[:, None, None, None], torch.zeros_like(state), state)
    state, out = delta_rule(state, *(padded(x.float()) for x in (q, k, v, write, decay)), lengths)
    storage[ctx.slots] = state.to(storage.dtype)
    output.copy_(out[seq_of_token, step_of_token].to(output.dtype))


@linear_state.register_fake
def _(q, k, v, write, decay, output, layer) -> None:
    return None


class LinearStateLayer(nn.Module):
    """Pre-norm decoder layer whose token mixer is the gated delta rule; `state_index` is its
    position among the linear layers (which state tensor it owns)."""

    def __init__(self, spec: ModelSpec, state_index: int, generator: torch.Generator):
        super().__init__()
        self.state_index = state_index
        self.num_heads, self.head_dim, self.state_dim = spec.num_heads, spec.head_dim, spec.linear_state_dim
        qk, v, h = spec.num_heads * spec.head_dim, spec.num_heads * spec.linear_state_dim, spec.num_heads
        self.split = (qk, qk, v, h, h)
        self.input_norm = RMSNorm(spec.hidden_size)
        self.proj = seeded_linear(spec.hidden_size, 2 * qk + v + 2 * h, generator)
        self.o_proj = seeded_linear(v, spec.hidden_size, generator)
        self.post_norm = RMSNorm(spec.hidden_size)
        self.mlp = MLP(spec, generator)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        tokens, heads = hidden.shape[0], self.num_heads
        q, k, v, write, decay = self.proj(self.input_norm(hidden)).split(self.split, dim=-1)
        q = F.normalize(q.view(tokens, heads, self.head_dim), dim=-1)
        k = F.normalize(k.view(tokens, heads, self.head_dim), dim=-1)
        v = v.reshape(tokens, heads, self.state_dim)
        out = torch.empty_like(v)
        # The +2 bias starts the decay near 0.9, so the random model's states remember some history.
        torch.ops.kvbench.linear_state(q, k, v, torch.sigmoid(write), torch.sigmoid(decay + 2.0), out, self.state_index)
        hidden = hidden + self.o_proj(out.view(tokens, -1))
        return hidden + self.mlp(self.post_norm(hidden))
