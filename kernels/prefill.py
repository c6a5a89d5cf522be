"""Prefill and chunked-prefill attention: packed variable-length queries over the KV cache.

Sequence b's queries are rows `query_start_loc[b]:query_start_loc[b+1]` and are the last q_len
tokens of its `seq_lens[b]`-token context, so a chunk of a long prompt attends to the chunks
already cached and a decode row (q_len 1) is just a short sequence. One program owns
(sequence, kv head, block of BLOCK_Q query tokens); its tile rows are those tokens times the
query heads sharing the kv head (GQA), so each K/V tile is loaded once for all of them. Keys are
walked BLOCK_N at a time up to the block's last query position, with causal and sliding-window
masks and an online softmax in base 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvbench.kernels.kv_layout import LOG2E, check_query, dot_precision, kv_token_offsets, layout_args, pow2_at_least_16

TILE_ROWS = 64


# Triton would otherwise specialise window == 1 into a constant and compile a kernel for it.
@triton.jit(do_not_specialize=["window"])
def _prefill_kernel(
    query_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_starts_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    scale,
    window,
    stride_qt,
    stride_qh,
    stride_table,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_ot,
    stride_oh,
    QUERIES_PER_KV: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_block = tl.program_id(2)

    q_begin = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_begin
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_before = seq_len - q_len

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    token = q_block * BLOCK_Q + rows // GROUP_PAD
    group = rows % GROUP_PAD
    head = kv_head * QUERIES_PER_KV + group
    row_mask = (token < q_len) & (group < QUERIES_PER_KV)
    dims = tl.arange(0, DIM_PAD)
    dim_mask = dims < HEAD_DIM
    q_pos = context_before + token

    q = tl.load(
        query_ptr + (q_begin + token)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=row_mask[:, None] & dim_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    q = q * (scale * LOG2E)

    first_pos = context_before + q_block * BLOCK_Q
    kv_start = tl.where(window > 0, tl.maximum(first_pos - window + 1, 0), 0)
    kv_end = tl.minimum(first_pos + BLOCK_Q, seq_len)

    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, DIM_PAD], tl.float32)

    for tile_start in range(kv_start, kv_end, BLOCK_N):
        pos = tile_start + tl.arange(0, BLOCK_N)
        key_mask = pos < kv_end
        token_offsets = kv_token_offsets(
            block_tables_ptr, seq_starts_ptr, seq, stride_table, pos, key_mask, stride_cb, stride_ct, BLOCK_SIZE, PAGED
        )
        kv_offsets = token_offsets[:, None] + kv_head * stride_ch + dims[None, :]
        kv_mask = key_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)

        visible = key_mask[None, :] & (pos[None, :] <= q_pos[:, None])
        visible = visible & ((window == 0) | (pos[None, :] > q_pos[:, None] - window))
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        # A row that has seen no visible key yet keeps max -inf; shift by 0 so exp2 gives 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_shift[:, None])
        alpha = tl.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + (q_begin + token)[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & dim_mask[None, :],
    )


def paged_prefill(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_query_len: int,
    block_tables: torch.Tensor | None = None,
    seq_starts: torch.Tensor | None = None,
    window: int = 0,
    block_n: int = 64,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of packed queries [T, num_heads, head_dim] over each sequence's context.

    Rows past `query_start_loc[-1]` (padding) are left as they are in `out` (zero if not given).
    """
    num_heads, head_dim, block_size, num_kv_heads = check_query(query, k_cache, v_cache, "T")
    table, starts, stride_table, paged = layout_args(block_tables, seq_starts)
    if out is None:
        out = torch.zeros_like(query)
    num_seqs = seq_lens.shape[0]
    queries_per_kv = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(queries_per_kv)
    block_q = max(1, TILE_ROWS // group_pad)
    if num_seqs == 0 or max_query_len == 0:
        return out
    grid = (num_seqs, num_kv_heads, triton.cdiv(max_query_len, block_q))
    _prefill_kernel[grid](
        query,
        k_cache,
        v_cache,
        table,
        starts,
        query_start_loc,
        seq_lens,
        out,
        scale,
        window,
        query.stride(0),
        query.stride(1),
        stride_table,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        out.stride(0),
        out.stride(1),
        QUERIES_PER_KV=queries_per_kv,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        HEAD_DIM=head_dim,
        DIM_PAD=pow2_at_least_16(head_dim),
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        PAGED=paged,
        DOT_PRECISION=dot_precision(query.dtype),
    )
    return out
