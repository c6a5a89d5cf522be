"""Cache write: store new tokens' K/V at their flat slots of the KV cache, skipping padding.

Flat slot s is block `s // block_size`, offset `s % block_size` of the cache
`[num_blocks, block_size, num_kv_heads, head_dim]`, whichever layout chose s. One program
copies one token's [num_kv_heads, head_dim] key and value; slot -1 marks a padding token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvbench.kernels.kv_layout import check_cache


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_cb,
    stride_ct,
    stride_ch,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, DIM_PAD)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    src = token.to(tl.int64) * stride_kt + heads[:, None] * stride_kh + dims[None, :]
    dst = (
        (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_ct + heads[:, None] * stride_ch + dims[None, :]
    )
    key = tl.load(key_ptr + src, mask=mask)
    value = tl.load(value_ptr + src, mask=mask)
    tl.store(k_cache_ptr + dst, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write key/value [T, num_kv_heads, head_dim] to the caches at `slot_mapping` [T] (int64)."""
    check_cache(k_cache, v_cache)
    num_tokens, num_kv_heads, head_dim = key.shape
    if (
        key.shape != value.shape
        or key.stride() != value.stride()
        or key.stride(2) != 1
        or (num_kv_heads, head_dim) != tuple(k_cache.shape[2:])
    ):
        raise ValueError(
            f"key and value must both be [T, {k_cache.shape[2]}, {k_cache.shape[3]}] "
            f"with one stride layout; got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    if slot_mapping.shape != (num_tokens,) or slot_mapping.dtype != torch.int64:
        raise ValueError(
            f"slot_mapping must be int64 [{num_tokens}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[1],
    )
