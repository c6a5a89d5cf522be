"""Logits -> tokens: greedy, temperature / top-p with per-request seeded noise, beam selection.

A sampled token never depends on what else is in the batch: its noise comes from a
torch.Generator seeded by (run seed, request, sample index, position), so a request draws the
same tokens alone, in any batch, after a fork and after preemption. Sampling uses the
exponential-race form of a categorical draw (argmax of p / E with E ~ Exp(1)), which needs one
noise vector per token and no cumulative search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvbench.errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens whose probability reaches top_p
    seed: int = 0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise UserError(f"sampling temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise UserError(f"sampling top_p={self.top_p} must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def token_generator(
    seed: int, request_id: int, sample_index: int, position: int, device: torch.device
) -> torch.Generator:
    """The generator of one sampled token: a pure function of who samples and where."""
    state = np.random.SeedSequence([seed, request_id, sample_index, position]).generate_state(1, np.uint64)
    return torch.Generator(device=device).manual_seed(int(state[0] >> np.uint64(1)))


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero every token outside each row's nucleus (the first token is always kept)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def sample(logits: torch.Tensor, params: SamplingParams, keys: list[tuple[int, int, int]]) -> list[int]:
    """One token per row of `logits` [N, vocab]; `keys[i]` = (request_id, sample_index, position)."""
    if params.greedy:
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1:
        probs = top_p_filter(probs, params.top_p)
    vocab = logits.shape[-1]
    noise = torch.stack(
        [
            torch.empty(vocab, device=logits.device).exponential_(
                generator=token_generator(params.seed, *key, device=logits.device)
            )
            for key in keys
        ]
    )
    return (probs / noise).argmax(dim=-1).tolist()


def beam_select(logits: torch.Tensor, cumulative_logprobs: list[float], width: int) -> list[tuple[int, int, float]]:
    """The `width` best continuations (beam row, token, cumulative logprob) of beams [W, vocab].

    Scores are summed in float64 and sorted stably, so equal scores keep (beam, token) order and
    the choice is the same however the beams were batched.
    """
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    scores = (
        torch.tensor(cumulative_logprobs, dtype=torch.float64, device=logits.device)[:, None] + logprobs
    ).flatten()
    best = torch.sort(scores, descending=True, stable=True).indices[:width].tolist()
    vocab = logits.shape[-1]
    values = scores[best].tolist()
    return [(index // vocab, index % vocab, value) for index, value in zip(best, values)]
