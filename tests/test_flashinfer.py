"""The flashinfer backend: its CSR page tables and plans on CPU, its kernels against eager on a GPU.

Without a GPU the kernels cannot run, so a reference wrapper (tests/helpers) plays FlashInfer's documented
plan()/run() contract in plain torch (its causal and window_left masks as in FlashInfer's
attention variants); everything kvbench does around the kernel is then checked against eager.
Slots no sequence owns hold a large finite sentinel: a wrong-slot read dominates the softmax and
the output, while FlashInfer's masked reads of a last page's unused tail stay harmless.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from kvbench.arith import cdiv
from kvbench.errors import UserError
from kvbench.plugins.backends.flashinfer import (
    INSTALL_HINT,
    FlashInferBackend,
    paged_kv,
    paged_kv_from_block_tables,
    paged_kv_from_seq_starts,
    window_left,
)

from helpers.batches import make_batch
from helpers.flashinfer_reference import ReferenceFactory

SENTINEL = 1e4
# name -> (context length of each sequence, how many of its last tokens are this step's queries)
SCENARIOS = {
    "prefill": ([13, 1, 32], [13, 1, 32]),
    "decode": ([37, 5, 16], [1, 1, 1]),
    "chunked_mixed": ([40, 9, 23], [7, 1, 23]),  # a prompt chunk, a decode row, a fresh prompt
}


def make_step(scenario, block_size, layout, **options):
    """(query, key, value, k_cache, v_cache, meta) of a step whose cached prefixes are written."""
    batch = make_batch(*SCENARIOS[scenario], block_size, layout, fill=SENTINEL, **options)
    return batch.query, batch.key, batch.value, batch.k_cache, batch.v_cache, batch.meta


def token_slots(kv, seq):
    """Flat slots of a sequence's tokens, read back from the CSR page table."""
    pages = kv.indices[kv.indptr[seq] : kv.indptr[seq + 1]].tolist()
    length = (len(pages) - 1) * kv.page_size + int(kv.last_page_len[seq]) if pages else 0
    return [pages[i // kv.page_size] * kv.page_size + i % kv.page_size for i in range(length)]


# ---- CSR page tables ----


def test_block_table_to_csr_worked_example():
    block_tables = torch.tensor([[7, 2, 5], [3, 0, 5], [9, 5, 5]], dtype=torch.int32)
    kv = paged_kv_from_block_tables(block_tables, torch.tensor([5, 8, 1]), block_size=4)
    assert kv.indptr.tolist() == [0, 2, 4, 5]
    assert kv.indices.tolist() == [7, 2, 3, 0, 9]
    assert kv.last_page_len.tolist() == [1, 4, 1]  # 8 = 2 full blocks: last page full, not 0
    assert kv.page_size == 4
    assert {t.dtype for t in (kv.indptr, kv.indices, kv.last_page_len)} == {torch.int32}


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_csr_reaches_exactly_the_block_table_slots(block_size, scenario):
    *_, meta = make_step(scenario, block_size, "paged", seed=block_size)
    kv = paged_kv(meta)
    for seq, seq_len in enumerate(meta.seq_lens.tolist()):
        blocks = meta.block_tables[seq]
        expected = [int(blocks[i // block_size]) * block_size + i % block_size for i in range(seq_len)]
        assert token_slots(kv, seq) == expected
        assert 1 <= int(kv.last_page_len[seq]) <= block_size
    assert int(kv.indptr[-1]) == sum(cdiv(n, block_size) for n in meta.seq_lens.tolist())


def test_exact_multiple_of_block_size_fills_the_last_page():
    block_tables = torch.tensor([[4, 1], [2, 3]], dtype=torch.int32)
    kv = paged_kv_from_block_tables(block_tables, torch.tensor([32, 16]), block_size=16)
    assert kv.indptr.tolist() == [0, 2, 3]
    assert kv.last_page_len.tolist() == [16, 16]


def test_block_table_too_narrow_for_seq_len_is_an_error():
    with pytest.raises(ValueError, match="needs 3 blocks"):
        paged_kv_from_block_tables(torch.zeros(1, 2, dtype=torch.int32), torch.tensor([9]), 4)


def test_contiguous_ranges_become_pages_of_one_token():
    kv = paged_kv_from_seq_starts(torch.tensor([10, 0, 4]), torch.tensor([3, 2, 1]))
    assert kv.page_size == 1
    assert kv.indptr.tolist() == [0, 3, 5, 6]
    assert kv.indices.tolist() == [10, 11, 12, 0, 1, 4]
    assert kv.last_page_len.tolist() == [1, 1, 1]


def test_window_maps_to_inclusive_left_bound():
    assert window_left(0) == -1  # full attention
    assert window_left(1) == 0  # only the query's own key
    assert window_left(5) == 4


# ---- plans and forward, with the reference wrapper standing in for the kernels ----


def test_decode_plan_arguments():
    query, _, _, k_cache, _, meta = make_step("decode", 16, "paged")
    factory = ReferenceFactory()
    FlashInferBackend(factory).forward(query, k_cache, k_cache, meta, scale=0.25, window=8)
    (wrapper,) = factory.wrappers
    ((args, options),) = wrapper.plans
    assert wrapper.decode
    indptr, indices, last, num_heads, num_kv_heads, head_dim, page_size = args
    assert indptr.tolist() == [0, 3, 4, 5] and last.tolist() == [5, 5, 16]
    assert (num_heads, num_kv_heads, head_dim, page_size) == (4, 2, 16, 16)
    assert options == dict(window_left=7, sm_scale=0.25, q_data_type=torch.float32, kv_data_type=torch.float32)


def test_chunked_prefill_plan_arguments():
    query, _, _, k_cache, _, meta = make_step("chunked_mixed", 4, "paged")
    factory = ReferenceFactory()
    FlashInferBackend(factory).forward(query, k_cache, k_cache, meta, scale=0.25)
    (wrapper,) = factory.wrappers
    ((args, options),) = wrapper.plans
    assert not wrapper.decode
    qo_indptr, indptr, _, last, *_ = args
    assert qo_indptr.tolist() == [0, 7, 8, 31] and qo_indptr.dtype == torch.int32
    assert indptr.tolist() == [0, 10, 13, 19] and last.tolist() == [4, 1, 3]
    assert options["causal"] and options["window_left"] == -1


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("layout,block_size", [("paged", 1), ("paged", 4), ("paged", 16), ("contiguous", 4)])
@pytest.mark.parametrize("window", [0, 5])
def test_forward_through_reference_wrapper_equals_eager(scenario, layout, block_size, window):
    from kvbench.plugins.backends.eager import EagerBackend

    query, key, value, k_cache, v_cache, meta = make_step(scenario, block_size, layout, pad_tokens=2)
    backend = FlashInferBackend(ReferenceFactory())
    backend.write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
    got = backend.forward(query, k_cache, v_cache, meta, scale=0.25, window=window)
    want = EagerBackend().forward(query, k_cache, v_cache, meta, scale=0.25, window=window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got[-2:].abs().max() == 0  # padding rows


def test_one_plan_per_step_and_window_shared_by_all_layers():
    query, _, _, k_cache, v_cache, meta = make_step("chunked_mixed", 4, "paged")
    factory = ReferenceFactory()
    backend = FlashInferBackend(factory)
    for _ in range(3):  # three full-attention layers
        backend.forward(query, k_cache, v_cache, meta, scale=0.25)
    backend.forward(query, k_cache, v_cache, meta, scale=0.25, window=4)  # a sliding layer
    assert factory.plan_count == 2 and len(factory.wrappers) == 2

    next_query, *_, next_meta = make_step("decode", 4, "paged")
    backend.forward(next_query, k_cache, v_cache, next_meta, scale=0.25)
    backend.forward(next_query, k_cache, v_cache, next_meta, scale=0.25)
    assert factory.plan_count == 3  # the new step planned once, on a new decode wrapper

    backend.forward(query, k_cache, v_cache, make_step("chunked_mixed", 4, "paged")[-1], 0.25)
    assert factory.plan_count == 4 and len(factory.wrappers) == 3  # prefill wrapper re-planned


# ---- what the backend says it cannot run ----


def test_unsupported_reasons(monkeypatch):
    # As if flashinfer were installed (it is an optional extra): the checks after that one.
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "flashinfer" else real_find_spec(name, *a)
    )
    reason = FlashInferBackend.unsupported_reason
    cpu = "needs a CUDA GPU (flashinfer kernels are CUDA-only); on a CPU use eager or triton_paged"
    assert reason(torch.device("cpu"), torch.float16, "paged", 0) == cpu
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flashinfer" else object())
    assert reason(torch.device("cpu"), torch.float16, "paged", 0) == cpu  # not "pip install": no help on a CPU
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "flashinfer" else real_find_spec(name, *a)
    )
    assert "float32" in reason(torch.device("cuda"), torch.float32, "paged", 0)
    assert "layout" in reason("cuda", torch.float16, "ring", 0)
    assert "window" in reason("cuda", torch.bfloat16, "paged", -1)


def test_module_imports_and_explains_without_flashinfer():
    probe = (
        "import sys; sys.modules['flashinfer'] = None\n"
        "import torch\n"
        "from kvbench.plugins.backends.flashinfer import FlashInferBackend\n"
        "print(FlashInferBackend.unsupported_reason(torch.device('cuda'), torch.float16, "
        "'paged', 0))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == INSTALL_HINT


# ---- the real kernels (marked gpu: skipped without a CUDA device) ----


def gpu_skip_reason(dtype):
    """Why FlashInfer cannot run on this GPU (not installed, dtype), or None."""
    return FlashInferBackend.unsupported_reason(torch.device("cuda"), dtype, "paged", 0)


GPU_CASES = [
    (scenario, layout, block_size, window, torch.float16)
    for scenario in SCENARIOS
    for layout, block_size in [("paged", 1), ("paged", 16), ("contiguous", 16)]
    for window in (0, 5)
]
GPU_CASES.append(("chunked_mixed", "paged", 16, 0, torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("scenario,layout,block_size,window,dtype", GPU_CASES)
def test_flashinfer_kernels_equal_eager(scenario, layout, block_size, window, dtype):
    reason = gpu_skip_reason(dtype)
    if reason:
        pytest.skip(reason)
    from kvbench.plugins.backends.eager import EagerBackend

    query, key, value, k_cache, v_cache, meta = make_step(
        scenario,
        block_size,
        layout,
        num_heads=8,
        num_kv_heads=2,
        head_dim=128,
        dtype=dtype,
        device="cuda",
        pad_tokens=3,
    )
    scale = 128**-0.5
    backend, eager = FlashInferBackend(), EagerBackend()
    backend.write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
    got = backend.forward(query, k_cache, v_cache, meta, scale, window)
    want = eager.forward(query, k_cache, v_cache, meta, scale, window)
    tolerance = 5e-3 if dtype == torch.float16 else 3e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)
    # a second layer of the same step reuses the plan and sees its own cache
    got_again = backend.forward(query, k_cache * 2, v_cache, meta, scale, window)
    want_again = eager.forward(query, k_cache * 2, v_cache, meta, scale, window)
    torch.testing.assert_close(got_again.float(), want_again.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.gpu
def test_full_cuda_graph_capture_is_refused():
    reason = gpu_skip_reason(torch.float16)
    if reason:
        pytest.skip(reason)
    query, _, _, k_cache, v_cache, meta = make_step(
        "decode", 16, "paged", head_dim=128, dtype=torch.float16, device="cuda"
    )
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(UserError, match="full CUDA graph"), torch.cuda.graph(graph):
        FlashInferBackend().forward(query, k_cache, v_cache, meta, scale=0.1)
