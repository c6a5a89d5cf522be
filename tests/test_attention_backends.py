"""Attention backends: eager against plain contiguous attention, triton_paged against eager.

Batches are ragged and their caches non-contiguous on purpose: paged sequences get physical
blocks from a random permutation, contiguous sequences sit in a shuffled order with gaps, and
every slot no sequence owns holds NaN, so a kernel reading a wrong slot cannot pass. Without a
GPU the Triton kernels run under the interpreter, so shapes stay tiny.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.plugins.backends.eager import EagerBackend
from kvbench.plugins.backends.triton_paged import TritonPagedBackend

from helpers import batches
from helpers.batches import Batch

# without a GPU, conftest has put the Triton kernels under the interpreter
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

NUM_HEADS, HEAD_DIM = 4, 16
SCALE = HEAD_DIM**-0.5

# name -> (context length of each sequence, how many of its last tokens are this step's queries)
SCENARIOS = {
    "prefill": ([13, 1, 30], [13, 1, 30]),
    "decode": ([37, 5, 20], [1, 1, 1]),
    # a prompt chunk over 33 cached tokens, a decode row and a fresh prompt in one step
    "chunked_mixed": ([40, 9, 23], [7, 1, 23]),
}


def make_batch(scenario: str, block_size: int, layout: str, **options) -> Batch:
    seq_lens, query_lens = SCENARIOS[scenario]
    return batches.make_batch(
        seq_lens, query_lens, block_size, layout, num_heads=NUM_HEADS, head_dim=HEAD_DIM, device=DEVICE, **options
    )


def contiguous_attention(batch: Batch, window: int) -> torch.Tensor:
    """softmax(Q K^T * scale + mask) V per sequence from its plain K/V tensors: no cache at all."""
    outputs = []
    starts = batch.meta.query_start_loc.tolist()
    for seq, (k, v) in enumerate(zip(batch.context_keys, batch.context_values)):
        q = batch.query[starts[seq] : starts[seq + 1]].float()
        q_len, seq_len = q.shape[0], k.shape[0]
        group = NUM_HEADS // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        ones = torch.ones(q_len, seq_len, dtype=torch.bool, device=DEVICE)
        visible = ones.tril(seq_len - q_len)
        if window:
            visible &= ~ones.tril(seq_len - q_len - window)
        bias = torch.zeros(q_len, seq_len, device=DEVICE).masked_fill(~visible, float("-inf"))
        heads = [torch.softmax(q[:, h] @ k[:, h].T * SCALE + bias, dim=-1) @ v[:, h] for h in range(NUM_HEADS)]
        outputs.append(torch.stack(heads, dim=1))
    padding = batch.query.shape[0] - starts[-1]
    outputs.append(torch.zeros(padding, NUM_HEADS, HEAD_DIM, device=DEVICE))
    return torch.cat(outputs)


def run_backend(backend, batch: Batch, window: int):
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    backend.write_kv(batch.key, batch.value, k_cache, v_cache, batch.meta.slot_mapping)
    return backend.forward(batch.query, k_cache, v_cache, batch.meta, SCALE, window)


def require_triton():
    reason = TritonPagedBackend.unsupported_reason(DEVICE, torch.float32, "paged", 0)
    if reason:
        pytest.skip(reason)


# ---- eager is the reference: check it against attention that never touches a cache ----


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("window", [0, 5])
def test_eager_equals_contiguous_attention(scenario, block_size, layout, window):
    batch = make_batch(scenario, block_size, layout)
    out = run_backend(EagerBackend(), batch, window)
    torch.testing.assert_close(out, contiguous_attention(batch, window), rtol=0, atol=1e-5)


@pytest.mark.parametrize("num_kv_heads", [1, 4])  # MQA and MHA next to the GQA default of 2
def test_eager_handles_every_head_grouping(num_kv_heads):
    batch = make_batch("chunked_mixed", 4, "paged", num_kv_heads=num_kv_heads)
    out = run_backend(EagerBackend(), batch, 0)
    torch.testing.assert_close(out, contiguous_attention(batch, 0), rtol=0, atol=1e-5)


def test_sliding_window_changes_long_context_output_only():
    batch = make_batch("decode", 4, "paged")
    full, windowed = (run_backend(EagerBackend(), batch, w) for w in (0, 5))
    # seq 1 has 5 tokens, so a window of 5 sees all of them; the 37- and 20-token ones lose keys.
    assert torch.equal(full[1], windowed[1])
    assert (full[0] - windowed[0]).abs().max() > 1e-2
    assert (full[2] - windowed[2]).abs().max() > 1e-2


def test_eager_write_kv_skips_padding_slot():
    batch = make_batch("chunked_mixed", 4, "paged", pad_tokens=2)
    batch.key[-2:] = 7.0  # a padding row that leaked would leave 7s in the cache
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    EagerBackend().write_kv(batch.key, batch.value, k_cache, v_cache, batch.meta.slot_mapping)
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    assert torch.equal(flat_k[batch.meta.slot_mapping[:-2]], batch.key[:-2])
    assert not (k_cache == 7.0).any()
    # Exactly the 31 new tokens' slots stopped being NaN.
    slots_filled = batch.k_cache.isnan().sum() - k_cache.isnan().sum()
    assert slots_filled == 31 * k_cache.shape[2] * HEAD_DIM


# ---- triton_paged against eager (interpreter on CPU) ----


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("window", [0, 5])
def test_triton_paged_matches_eager(scenario, layout, window):
    require_triton()
    batch = make_batch(scenario, 4, layout, pad_tokens=1)
    expected = run_backend(EagerBackend(), batch, window)
    out = run_backend(TritonPagedBackend(), batch, window)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_triton_paged_across_block_sizes(block_size, layout):
    require_triton()
    batch = make_batch("chunked_mixed", block_size, layout, seed=block_size)
    expected = run_backend(EagerBackend(), batch, 0)
    out = run_backend(TritonPagedBackend(), batch, 0)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-4)


def test_split_plan_gives_every_split_tokens():
    from kvbench.kernels.decode import split_plan

    assert split_plan(37, 3, block_n=16) == (13, 3)
    assert split_plan(200, 3, block_n=16) == (80, 3)  # partitions rounded up to whole tiles
    assert split_plan(5, 8, block_n=16) == (1, 5)  # never more splits than tokens


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("window", [0, 12])
def test_split_kv_decode_matches_eager(layout, window):
    require_triton()
    from kvbench.kernels.decode import paged_decode

    batch = make_batch("decode", 4, layout)
    expected = run_backend(EagerBackend(), batch, window)
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    EagerBackend().write_kv(batch.key, batch.value, k_cache, v_cache, batch.meta.slot_mapping)
    meta = batch.meta
    for num_splits in (2, 3):
        # block_n 8: splits of 13-19 tokens take several tiles each, so both merges are exercised.
        out = paged_decode(
            batch.query,
            k_cache,
            v_cache,
            meta.seq_lens,
            SCALE,
            block_tables=meta.block_tables,
            seq_starts=meta.seq_starts,
            window=window,
            num_splits=num_splits,
            block_n=8,
        )
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("window", [0, 5])
def test_prefill_over_several_key_tiles_matches_eager(layout, window):
    require_triton()
    from kvbench.kernels.prefill import paged_prefill

    batch = make_batch("chunked_mixed", 4, layout)
    expected = run_backend(EagerBackend(), batch, window)
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    EagerBackend().write_kv(batch.key, batch.value, k_cache, v_cache, batch.meta.slot_mapping)
    meta = batch.meta
    out = paged_prefill(
        batch.query,
        k_cache,
        v_cache,
        meta.query_start_loc,
        meta.seq_lens,
        SCALE,
        max_query_len=meta.max_query_len,
        block_tables=meta.block_tables,
        seq_starts=meta.seq_starts,
        window=window,
        block_n=16,
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-4)


def test_cache_write_kernel_matches_eager_and_skips_padding():
    require_triton()
    batch = make_batch("chunked_mixed", 4, "paged", pad_tokens=2)
    batch.key[-2:] = 7.0  # a padding row that leaked would leave 7s in the cache
    caches = {}
    for backend in (EagerBackend(), TritonPagedBackend()):
        k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
        backend.write_kv(batch.key, batch.value, k_cache, v_cache, batch.meta.slot_mapping)
        caches[backend.name] = (k_cache, v_cache)
    for eager_cache, triton_cache in zip(caches["eager"], caches["triton_paged"]):
        torch.testing.assert_close(triton_cache, eager_cache, rtol=0, atol=0, equal_nan=True)
    k_cache = caches["triton_paged"][0]
    assert not (k_cache == 7.0).any()
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    assert torch.equal(flat_k[batch.meta.slot_mapping[:-2]], batch.key[:-2])


def test_triton_paged_bf16_decode_within_bf16_rounding():
    require_triton()
    batch = make_batch("decode", 4, "paged", dtype=torch.bfloat16)
    expected = run_backend(EagerBackend(), batch, 0)
    out = run_backend(TritonPagedBackend(), batch, 0)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), rtol=0, atol=2e-2)


def test_triton_paged_says_why_cpu_needs_the_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = TritonPagedBackend.unsupported_reason(torch.device("cpu"), torch.float32, "paged", 0)
    assert "TRITON_INTERPRET=1" in reason
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if DEVICE.type == "cpu":  # on a GPU machine the kernels here were compiled, not interpreted
        assert TritonPagedBackend.unsupported_reason(torch.device("cpu"), torch.float32, "contiguous", 8) is None
    assert "int8" in TritonPagedBackend.unsupported_reason(torch.device("cpu"), torch.int8, "paged", 0)
    assert EagerBackend.unsupported_reason(torch.device("cpu"), torch.float64, "contiguous", 3) is None


def test_a_backend_whose_output_is_not_one_row_per_query_token_is_refused_naming_it():
    """copy_ broadcast a [1, h, d] result over every token: the run served garbage with status ok."""
    from types import SimpleNamespace

    from kvbench.errors import UserError
    from kvbench.model.attention_op import ForwardContext, attention, forward_context

    backend = SimpleNamespace(
        name="one_row", write_kv=lambda *args: None, forward=lambda query, *args: query[:1].clone()
    )
    meta = SimpleNamespace(slot_mapping=None)
    query, key = torch.zeros(5, 2, 4), torch.zeros(5, 2, 4)
    ctx = ForwardContext(backend, meta, [(None, None)], 1.0, [0])
    with (
        forward_context(ctx),
        pytest.raises(UserError, match=r"backend one_row returned attention of shape \(1, 2, 4\)"),
    ):
        attention(query, key, key, torch.empty_like(query), 0)


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_the_kernels_refuse_a_query_that_does_not_fit_the_cache(kernel):
    """Checked before any launch: 4 query heads of 8 dims against 2 kv heads of 16 dims."""
    from kvbench.kernels.decode import paged_decode
    from kvbench.kernels.prefill import paged_prefill

    k_cache = v_cache = torch.zeros(4, 16, 2, 16)
    query, lens, table = torch.zeros(2, 4, 8), torch.tensor([3, 5]), torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(
        ValueError, match=r"query \[., 4, 8\] \(contiguous last dim\) does not fit a cache of 2 kv heads x 16"
    ):
        if kernel == "decode":
            paged_decode(query, k_cache, v_cache, lens, 1.0, block_tables=table)
        else:
            paged_prefill(
                query, k_cache, v_cache, torch.tensor([0, 1, 2]), lens, 1.0, max_query_len=1, block_tables=table
            )
    with pytest.raises(ValueError, match="k_cache and v_cache must both be"):
        paged_decode(query, k_cache, torch.zeros(4, 16, 2, 8), lens, 1.0, block_tables=table)
