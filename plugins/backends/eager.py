"""The eager backend: attention in plain PyTorch, one sequence at a time; THE reference.

Every other backend is tested against this one, so it favours being obviously right over being
fast: it gathers each sequence's K/V token by token through its block table (or slot range) and
computes masked softmax attention in fp32.
"""

from __future__ import annotations

import torch

from kvbench.plugins.backends.base import AttentionBackend, AttentionMetadata


def context_slots(meta: AttentionMetadata, seq: int, seq_len: int) -> torch.Tensor:
    """Flat cache slots of tokens 0..seq_len-1 of sequence `seq`, in either layout."""
    positions = torch.arange(seq_len, device=meta.seq_lens.device)
    if meta.block_tables is not None:
        blocks = meta.block_tables[seq, positions // meta.block_size].to(torch.int64)
        return blocks * meta.block_size + positions % meta.block_size
    return meta.seq_starts[seq].to(torch.int64) + positions


class EagerBackend(AttentionBackend):
    """PyTorch reference: per-sequence gather and fp32 softmax attention."""

    name = "eager"

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        written = slot_mapping >= 0
        slots = slot_mapping[written]
        # view (not reshape) so a non-contiguous cache fails loudly instead of writing a copy.
        k_cache.view(-1, *k_cache.shape[2:])[slots] = key[written].to(k_cache.dtype)
        v_cache.view(-1, *v_cache.shape[2:])[slots] = value[written].to(v_cache.dtype)

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int = 0,
    ) -> torch.Tensor:
        num_heads = query.shape[1]
        num_kv_heads = k_cache.shape[2]
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads cannot share {num_kv_heads} kv heads evenly")
        queries_per_kv = num_heads // num_kv_heads
        flat_k = k_cache.view(-1, *k_cache.shape[2:])
        flat_v = v_cache.view(-1, *v_cache.shape[2:])
        out = torch.zeros_like(query)
        starts = meta.query_start_loc.tolist()
        for seq, seq_len in enumerate(meta.seq_lens.tolist()):
            q_begin, q_end = starts[seq], starts[seq + 1]
            if q_end == q_begin:
                continue
            slots = context_slots(meta, seq, seq_len)
            k = flat_k[slots].float().repeat_interleave(queries_per_kv, dim=1)
            v = flat_v[slots].float().repeat_interleave(queries_per_kv, dim=1)
            q = query[q_begin:q_end].float()

            q_pos = torch.arange(seq_len - (q_end - q_begin), seq_len, device=query.device)
            k_pos = torch.arange(seq_len, device=query.device)
            visible = k_pos[None, :] <= q_pos[:, None]
            if window > 0:
                visible &= k_pos[None, :] > q_pos[:, None] - window

            scores = torch.einsum("qhd,khd->hqk", q, k) * scale
            scores = scores.masked_fill(~visible, float("-inf"))
            out[q_begin:q_end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(query.dtype)
        return out
