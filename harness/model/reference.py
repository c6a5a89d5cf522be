"""Independent one-request generation: the reference the engine's tokens are checked against.

Every token comes from running the model over the request's whole sequence so far, in a private
one-sequence contiguous cache with the eager backend: no allocator, no batch, no reuse of K/V.
Sampling uses the same per-token seeds as the engine, so a request's samples must agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvbench.model.attention_op import ForwardContext, forward_context
from kvbench.model.decoder import TinyDecoder
from kvbench.model.linear_state import from_scratch
from kvbench.model.sampling import SamplingParams, beam_select, sample
from kvbench.plugins.backends.base import AttentionMetadata
from kvbench.plugins.backends.eager import EagerBackend


@torch.inference_mode()
def next_token_logits(model: TinyDecoder, tokens: Sequence[int]) -> torch.Tensor:
    """Logits [vocab] after `tokens`, computed from scratch."""
    device, dtype = model.embed.weight.device, model.embed.weight.dtype
    spec, length = model.spec, len(tokens)
    shape = (1, length, spec.num_kv_heads, spec.head_dim)
    caches = [
        (torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
        for _ in model.attention_windows
    ]
    ints = dict(device=device, dtype=torch.int32)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, length], **ints),
        seq_lens=torch.tensor([length], **ints),
        slot_mapping=torch.arange(length, device=device),
        block_size=length,
        max_query_len=length,
        max_seq_len=length,
        seq_starts=torch.zeros(1, dtype=torch.int64, device=device),
    )
    context = ForwardContext(EagerBackend(), meta, caches, model.scale, model.attention_windows)
    with forward_context(context), from_scratch(spec, meta.query_start_loc, dtype):
        hidden = model(torch.tensor(list(tokens), device=device), torch.arange(length, device=device))
    return model.compute_logits(hidden[-1:])[0]


def generate_alone(
    model: TinyDecoder,
    prompt: Sequence[int],
    output_len: int,
    params: SamplingParams,
    request_id: int,
    sample_index: int = 0,
) -> list[int]:
    """The `output_len` tokens sample `sample_index` of request `request_id` draws on its own."""
    tokens = [int(t) for t in prompt]
    for _ in range(output_len):
        logits = next_token_logits(model, tokens)
        tokens += sample(logits[None], params, [(request_id, sample_index, len(tokens))])
    return tokens[len(prompt) :]


def beam_search_alone(
    model: TinyDecoder, prompt: Sequence[int], output_len: int, width: int
) -> list[tuple[list[int], float]]:
    """The final beams (generated tokens, cumulative logprob), best first."""
    beams = [([int(t) for t in prompt], 0.0)]
    for _ in range(output_len):
        logits = torch.stack([next_token_logits(model, tokens) for tokens, _ in beams])
        chosen = beam_select(logits, [score for _, score in beams], width)
        beams = [(beams[row][0] + [token], score) for row, token, score in chosen]
    return [(tokens[len(prompt) :], score) for tokens, score in beams]
