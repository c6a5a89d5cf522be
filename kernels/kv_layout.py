"""Where a sequence's token lives in the KV cache, for the paged and the contiguous layout.

Both layouts share the cache shape `[num_blocks, block_size, num_kv_heads, head_dim]` (see
`kvbench.plugins.backends.base`). Paged: token `pos` of sequence `seq` is in block
`block_tables[seq, pos // block_size]` at offset `pos % block_size`. Contiguous: it is at flat
slot `seq_starts[seq] + pos`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def kv_token_offsets(
    block_tables_ptr,
    seq_starts_ptr,
    seq,
    stride_table,
    pos,
    mask,
    stride_block,
    stride_token,
    BLOCK_SIZE: tl.constexpr,
    PAGED: tl.constexpr,
):
    """Element offsets (int64) of the first K/V element of each token `pos` of sequence `seq`."""
    if PAGED:
        block = tl.load(block_tables_ptr + seq * stride_table + pos // BLOCK_SIZE, mask=mask, other=0).to(tl.int64)
        offset = pos % BLOCK_SIZE
    else:
        slot = tl.load(seq_starts_ptr + seq).to(tl.int64) + pos
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
    return block * stride_block + offset * stride_token


def layout_args(block_tables: torch.Tensor | None, seq_starts: torch.Tensor | None):
    """(block_tables, seq_starts, stride_table, paged) for a kernel launch; exactly one is given.

    The unused pointer argument receives the other tensor: the kernel never reads it.
    """
    if (block_tables is None) == (seq_starts is None):
        raise ValueError("pass exactly one of block_tables (paged layout) or seq_starts (contiguous layout)")
    if block_tables is not None:
        if block_tables.stride(1) != 1:
            raise ValueError("block_tables must be contiguous along its block dimension")
        return block_tables, block_tables, block_tables.stride(0), True
    return seq_starts, seq_starts, 0, False


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, "
            f"head_dim]; got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError("k_cache and v_cache must share strides and be contiguous along head_dim")


def check_query(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: str) -> tuple[int, ...]:
    """A query [`rows`, num_heads, head_dim] against the cache (checked too): its heads a multiple
    of the cache's kv heads, its head_dim the cache's, contiguous along it. Returns
    (num_heads, head_dim, block_size, num_kv_heads)."""
    check_cache(k_cache, v_cache)
    _, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if num_heads % num_kv_heads or head_dim != cache_head_dim or query.stride(2) != 1:
        raise ValueError(
            f"query [{rows}, {num_heads}, {head_dim}] (contiguous last dim) does not fit "
            f"a cache of {num_kv_heads} kv heads x {cache_head_dim} dims"
        )
    return num_heads, head_dim, block_size, num_kv_heads


def dot_precision(dtype: torch.dtype) -> str:
    # fp16/bf16 runs take TF32's speed: it holds their K and V exactly, but not the scaled queries or
    # the fp32 probabilities it multiplies them by (10 mantissa bits), so their outputs may differ
    # from eager's by about an fp16 ulp on a GPU. fp32 runs take the IEEE path, to match eager.
    # (Triton's CPU interpreter ignores input_precision: no CPU test sees the difference.)
    return "ieee" if dtype == torch.float32 else "tf32"


def pow2_at_least_16(n: int) -> int:
    # tl.dot needs every dimension to be at least 16.
    return max(16, triton.next_power_of_2(n))
