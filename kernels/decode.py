"""Decode attention: one query token per sequence over its cached context, with split-KV.

One program owns (sequence, kv head, split): it loads the query heads that share the kv head
(GQA) as the rows of one tile, walks its slice of the context `BLOCK_N` tokens at a time through
the block table (or the slot range), and keeps an online softmax in base 2. With more than one
split, each program writes its partial max, sum and normalised output, and a reduce kernel
rescales and combines them; this is what keeps the GPU busy when batch x kv heads is small and
the context is long.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvbench.kernels.kv_layout import LOG2E, check_query, dot_precision, kv_token_offsets, layout_args, pow2_at_least_16

# A split shorter than this spends more on its partial results than it saves.
MIN_PARTITION = 256
MAX_SPLITS = 64


# Triton would otherwise specialise window == 1 into a constant and compile a kernel for it.
@triton.jit(do_not_specialize=["window"])
def _decode_kernel(
    query_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_starts_ptr,
    seq_lens_ptr,
    out_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_out_ptr,
    scale,
    window,
    partition_size,
    num_heads,
    num_splits,
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
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    # The query sits at position seq_len - 1 and sees keys in (seq_len - 1 - window, seq_len - 1].
    kv_start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    split_start = kv_start + split * partition_size
    split_end = tl.minimum(split_start + partition_size, seq_len)

    group = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, DIM_PAD)
    head = kv_head * QUERIES_PER_KV + group
    head_mask = group < QUERIES_PER_KV
    dim_mask = dims < HEAD_DIM

    q = tl.load(
        query_ptr + seq * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=head_mask[:, None] & dim_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    q = q * (scale * LOG2E)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)

    # Every tile starts at a valid key, so the running max is finite after the first one.
    for tile_start in range(split_start, split_end, BLOCK_N):
        pos = tile_start + tl.arange(0, BLOCK_N)
        key_mask = pos < split_end
        token = kv_token_offsets(
            block_tables_ptr, seq_starts_ptr, seq, stride_table, pos, key_mask, stride_cb, stride_ct, BLOCK_SIZE, PAGED
        )
        kv_offsets = token[:, None] + kv_head * stride_ch + dims[None, :]
        kv_mask = key_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)

        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        scores = tl.where(key_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new

    # An empty split (or an empty sequence) has l_i == 0 and contributes nothing.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if SPLIT_KV:
        part = (seq * num_heads + head) * num_splits + split
        tl.store(part_max_ptr + part, m_i, mask=head_mask)
        tl.store(part_sum_ptr + part, l_i, mask=head_mask)
        tl.store(
            part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], out, mask=head_mask[:, None] & dim_mask[None, :]
        )
    else:
        tl.store(
            out_ptr + seq * stride_ot + head[:, None] * stride_oh + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=head_mask[:, None] & dim_mask[None, :],
        )


@triton.jit
def _combine_splits_kernel(
    part_max_ptr,
    part_sum_ptr,
    part_out_ptr,
    out_ptr,
    num_heads,
    num_splits,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, DIM_PAD)
    split_mask = splits < num_splits
    dim_mask = dims < HEAD_DIM
    part = (seq * num_heads + head) * num_splits + splits

    part_max = tl.load(part_max_ptr + part, mask=split_mask, other=float("-inf"))
    part_sum = tl.load(part_sum_ptr + part, mask=split_mask, other=0.0)
    part_out = tl.load(
        part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=split_mask[:, None] & dim_mask[None, :], other=0.0
    )
    global_max = tl.max(part_max, 0)
    global_max = tl.where(global_max == float("-inf"), 0.0, global_max)
    weight = tl.exp2(part_max - global_max) * part_sum
    total = tl.sum(weight, 0)
    out = tl.sum(weight[:, None] * part_out, 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty), mask=dim_mask)


def default_num_splits(device: torch.device, num_seqs: int, num_kv_heads: int, span: int) -> int:
    """Enough splits to give every SM about two programs, never splits under MIN_PARTITION."""
    if device.type != "cuda":
        return 1
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = triton.cdiv(2 * sm_count, max(1, num_seqs * num_kv_heads))
    return max(1, min(wanted, triton.cdiv(span, MIN_PARTITION), MAX_SPLITS))


def split_plan(span: int, num_splits: int, block_n: int) -> tuple[int, int]:
    """(partition_size, num_splits) that cover `span` keys, leaving no split of the longest
    context empty. A partition longer than a tile is rounded up to whole tiles, so only the
    context's last tile runs partly masked.
    """
    partition_size = triton.cdiv(span, num_splits)
    if partition_size > block_n:
        partition_size = triton.cdiv(partition_size, block_n) * block_n
    return partition_size, triton.cdiv(span, partition_size)


def paged_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    block_tables: torch.Tensor | None = None,
    seq_starts: torch.Tensor | None = None,
    window: int = 0,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    block_n: int = 64,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query per sequence (`query[b]`, [B, num_heads, head_dim]) over its context.

    Sequence b's context is its first `seq_lens[b]` tokens, the last being the query's own.
    `num_splits` None picks one from the device and the context length; the split count used may
    be lower than asked when the context is too short to give every split a token.
    """
    num_heads, head_dim, block_size, num_kv_heads = check_query(query, k_cache, v_cache, "B")
    num_seqs = query.shape[0]
    table, starts, stride_table, paged = layout_args(block_tables, seq_starts)
    if out is None:
        out = torch.empty_like(query)
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if num_seqs else 0
    span = max(1, min(max_seq_len, window) if window > 0 else max_seq_len)
    if num_splits is None:
        num_splits = default_num_splits(query.device, num_seqs, num_kv_heads, span)
    partition_size, num_splits = split_plan(span, num_splits, block_n)

    split_kv = num_splits > 1
    if split_kv:
        part_max = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=query.device)
        part_sum = torch.empty_like(part_max)
        part_out = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=query.device)
    else:
        part_max = part_sum = part_out = out

    queries_per_kv = num_heads // num_kv_heads
    dim_pad = pow2_at_least_16(head_dim)
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query,
        k_cache,
        v_cache,
        table,
        starts,
        seq_lens,
        out,
        part_max,
        part_sum,
        part_out,
        scale,
        window,
        partition_size,
        num_heads,
        num_splits,
        query.stride(0),
        query.stride(1),
        stride_table,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        out.stride(0),
        out.stride(1),
        QUERIES_PER_KV=queries_per_kv,
        GROUP_PAD=pow2_at_least_16(queries_per_kv),
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        PAGED=paged,
        SPLIT_KV=split_kv,
        DOT_PRECISION=dot_precision(query.dtype),
    )
    if split_kv:
        _combine_splits_kernel[(num_seqs, num_heads)](
            part_max,
            part_sum,
            part_out,
            out,
            num_heads,
            num_splits,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            DIM_PAD=dim_pad,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
        )
    return out
