"""Attention batches: ragged sequences whose K/V sit at scattered slots of the cache.

Paged sequences get physical blocks from a random permutation (a spare block, never owned,
fills the unused block-table entries); contiguous sequences sit in shuffled order with gaps.
Every slot no sequence owns holds `fill`, so a backend that reads a wrong slot shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.arith import cdiv
from kvbench.plugins.backends.base import AttentionMetadata


@dataclass
class Batch:
    query: torch.Tensor  # [T, num_heads, head_dim], the last rows padding when pad_tokens
    key: torch.Tensor  # [T, kv_heads, head_dim], this step's tokens
    value: torch.Tensor
    k_cache: torch.Tensor  # cached prefixes written, this step's tokens not yet
    v_cache: torch.Tensor
    meta: AttentionMetadata
    context_keys: list  # per sequence [seq_len, kv_heads, head_dim], the whole context
    context_values: list


def scattered_slots(seq_lens: list, block_size: int, layout: str, gen: torch.Generator):
    """(slots of each sequence's tokens, num_blocks, block_tables, seq_starts) for one layout."""
    block_tables = seq_starts = None
    if layout == "paged":
        needed = [cdiv(n, block_size) for n in seq_lens]
        physical = torch.randperm(sum(needed) + 2, generator=gen).tolist()
        num_blocks = len(physical)
        spare = physical.pop()
        block_tables = torch.full((len(seq_lens), max(needed) + 1), spare, dtype=torch.int32)
        slots = []
        for seq, (n, count) in enumerate(zip(seq_lens, needed)):
            ids, physical = physical[:count], physical[count:]
            block_tables[seq, :count] = torch.tensor(ids)
            slots.append([ids[i // block_size] * block_size + i % block_size for i in range(n)])
    else:
        starts, end = [0] * len(seq_lens), 0
        for seq in torch.randperm(len(seq_lens), generator=gen).tolist():
            starts[seq] = end + int(torch.randint(0, 4, (1,), generator=gen))
            end = starts[seq] + seq_lens[seq]
        num_blocks = cdiv((end + 3), block_size)
        seq_starts = torch.tensor(starts, dtype=torch.int64)
        slots = [list(range(start, start + n)) for start, n in zip(starts, seq_lens)]
    return slots, num_blocks, block_tables, seq_starts


def make_batch(
    seq_lens: list,
    query_lens: list,
    block_size: int,
    layout: str,
    *,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    fill: float = float("nan"),
    pad_tokens: int = 0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device="cpu",
) -> Batch:
    """Sequence b has `seq_lens[b]` tokens of context, its last `query_lens[b]` this step's."""
    gen = torch.Generator().manual_seed(seed)
    slots, num_blocks, block_tables, seq_starts = scattered_slots(seq_lens, block_size, layout, gen)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.full(shape, fill), torch.full(shape, fill)
    flat_k, flat_v = k_cache.view(-1, num_kv_heads, head_dim), v_cache.view(-1, num_kv_heads, head_dim)
    context_keys = [torch.randn(n, num_kv_heads, head_dim, generator=gen) for n in seq_lens]
    context_values = [torch.randn(n, num_kv_heads, head_dim, generator=gen) for n in seq_lens]
    slot_mapping, new_keys, new_values = [], [], []
    for seq_slots, k, v, n, q_len in zip(slots, context_keys, context_values, seq_lens, query_lens):
        flat_k[seq_slots[: n - q_len]], flat_v[seq_slots[: n - q_len]] = k[: n - q_len], v[: n - q_len]
        slot_mapping += seq_slots[n - q_len :]
        new_keys.append(k[n - q_len :])
        new_values.append(v[n - q_len :])
    padding = torch.zeros(pad_tokens, num_kv_heads, head_dim)
    num_tokens = sum(query_lens) + pad_tokens
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0] + query_lens).cumsum(0).to(device, torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slot_mapping + [-1] * pad_tokens, dtype=torch.int64, device=device),
        block_size=block_size,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_tables=None if block_tables is None else block_tables.to(device),
        seq_starts=None if seq_starts is None else seq_starts.to(device),
    )
    return Batch(
        query=torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(device, dtype),
        key=torch.cat(new_keys + [padding]).to(device, dtype),
        value=torch.cat(new_values + [padding]).to(device, dtype),
        k_cache=k_cache.to(device, dtype),
        v_cache=v_cache.to(device, dtype),
        meta=meta,
        context_keys=[k.to(device) for k in context_keys],
        context_values=[v.to(device) for v in context_values],
    )
