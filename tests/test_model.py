"""The tiny model over a paged cache, and the sampling that turns its logits into tokens.

A ragged batch run step by step (prefill, prefill chunks and decodes mixed) through a cache
whose blocks come from a random permutation must give each token the hidden state that a
from-scratch forward of that sequence alone gives it; sampling must depend only on the
sampled request's own seed and logits.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.arith import cdiv
from kvbench.errors import UserError
from kvbench.model.attention_op import ForwardContext, forward_context
from kvbench.model.decoder import TinyDecoder, layer_class
from kvbench.model.sampling import SamplingParams, beam_select, sample, top_p_filter
from kvbench.plugins.backends.base import AttentionMetadata
from kvbench.plugins.backends.eager import EagerBackend

from helpers.engine import SPEC, tiny_model

# per step: tokens of sequence A and of sequence B fed (their contexts are 16 and 12 tokens)
STEPS = [(7, 3), (1, 5), (6, 1), (1, 3), (1, 0)]


def full_forward(model: TinyDecoder, tokens: torch.Tensor) -> torch.Tensor:
    """Hidden states of one sequence computed alone in a private contiguous cache."""
    n = len(tokens)
    caches = [
        (torch.zeros(1, n, SPEC.num_kv_heads, SPEC.head_dim), torch.zeros(1, n, SPEC.num_kv_heads, SPEC.head_dim))
        for _ in model.attention_windows
    ]
    meta = AttentionMetadata(
        torch.tensor([0, n], dtype=torch.int32),
        torch.tensor([n], dtype=torch.int32),
        torch.arange(n),
        n,
        n,
        n,
        seq_starts=torch.zeros(1, dtype=torch.int64),
    )
    with (
        torch.inference_mode(),
        forward_context(ForwardContext(EagerBackend(), meta, caches, model.scale, model.attention_windows)),
    ):
        return model(tokens, torch.arange(n))


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_stepwise_batched_forward_over_the_cache_equals_forward_alone(block_size, layout):
    model = tiny_model()
    gen = torch.Generator().manual_seed(block_size)
    lengths = [sum(step[b] for step in STEPS) for b in range(2)]
    sequences = [torch.randint(0, SPEC.vocab_size, (n,), generator=gen) for n in lengths]
    num_blocks = sum(cdiv(n, block_size) for n in lengths) + 2
    physical = torch.randperm(num_blocks, generator=gen)
    tables = [physical[: cdiv(lengths[0], block_size)], physical[cdiv(lengths[0], block_size) :]]
    starts = torch.tensor([lengths[1] + 3, 1])  # contiguous: B before A, gaps around both
    shape = (num_blocks + (lengths[0] + lengths[1] + 4) // block_size + 1, block_size, SPEC.num_kv_heads, SPEC.head_dim)
    caches = [(torch.full(shape, float("nan")), torch.full(shape, float("nan"))) for _ in model.attention_windows]
    done, outputs = [0, 0], [[], []]
    for step in STEPS:
        ids, positions, slots, query_start = [], [], [], [0]
        for b, n in enumerate(step):
            pos = torch.arange(done[b], done[b] + n)
            ids.append(sequences[b][pos])
            positions.append(pos)
            slots.append(
                tables[b][pos // block_size] * block_size + pos % block_size if layout == "paged" else starts[b] + pos
            )
            query_start.append(query_start[-1] + n)
            done[b] += n
        width = max(len(t) for t in tables)
        meta = AttentionMetadata(
            torch.tensor(query_start, dtype=torch.int32),
            torch.tensor(done, dtype=torch.int32),
            torch.cat(slots),
            block_size,
            max(step),
            max(done),
            block_tables=torch.stack([torch.nn.functional.pad(t, (0, width - len(t))) for t in tables]).int()
            if layout == "paged"
            else None,
            seq_starts=starts if layout == "contiguous" else None,
        )
        context = ForwardContext(EagerBackend(), meta, caches, model.scale, model.attention_windows)
        with torch.inference_mode(), forward_context(context):
            hidden = model(torch.cat(ids), torch.cat(positions))
        for b in range(2):
            outputs[b].append(hidden[query_start[b] : query_start[b + 1]])
    for b in range(2):
        torch.testing.assert_close(torch.cat(outputs[b]), full_forward(model, sequences[b]), rtol=0, atol=1e-5)


def test_window_layers_get_the_models_window_and_weights_follow_the_seed():
    assert tiny_model().attention_windows == [SPEC.window, 0]
    same, other = TinyDecoder(SPEC, seed=0), TinyDecoder(SPEC, seed=1)
    assert torch.equal(same.lm_head.weight, tiny_model().lm_head.weight)
    assert not torch.equal(other.lm_head.weight, same.lm_head.weight)
    torch.testing.assert_close(full_forward(same, torch.arange(5)), full_forward(tiny_model(), torch.arange(5)))


def test_an_unknown_layer_kind_is_a_user_error():
    with pytest.raises(UserError, match="no layer class for layer kind 'mamba'"):
        layer_class("mamba")


def test_a_token_depends_only_on_its_requests_seed_and_logits():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, seed=7)
    keys = [(0, 0, 10), (1, 0, 10), (2, 1, 4)]
    batched = sample(logits, params, keys)
    alone = [sample(logits[i : i + 1], params, [keys[i]])[0] for i in range(3)]
    assert batched == alone
    assert sample(logits, SamplingParams(), keys) == logits.argmax(-1).tolist()


def test_sampling_follows_the_distribution_and_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    draws = [sample(logits, SamplingParams(temperature=1.0), [(i, 0, 0)])[0] for i in range(2000)]
    freq = torch.bincount(torch.tensor(draws), minlength=4) / 2000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.04, rtol=0)
    kept = top_p_filter(logits.softmax(-1), 0.75)
    assert (kept[0] > 0).tolist() == [True, True, False, False]
    nucleus = {sample(logits, SamplingParams(temperature=1.0, top_p=0.75), [(i, 0, 0)])[0] for i in range(300)}
    assert nucleus == {0, 1}


def test_beam_select_keeps_the_best_cumulative_continuations_in_order():
    logits = torch.log(torch.tensor([[0.6, 0.4, 1e-9], [0.1, 0.1, 0.8]]))
    picks = beam_select(logits, [-0.1, -2.0], 3)
    assert [(row, token) for row, token, _ in picks] == [(0, 0), (0, 1), (1, 2)]
    assert picks[0][2] == pytest.approx(-0.1 + torch.log(torch.tensor(0.6)).item())
