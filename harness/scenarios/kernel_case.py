"""The kernel scenario's input: a batch spec's queries over a KV cache laid out by an allocator.

The chosen allocator places every sequence exactly as it would in the engine (block tables, or
slot ranges); a paged layout's physical blocks are then renumbered by a random permutation, so
consecutive logical blocks are scattered over the cache and non-contiguity is real. The same
cache also carries a contiguous reference layout (sequences back to back), which is what the
paging overhead is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.arith import cdiv
from kvbench.core.sequence import Request, Sequence
from kvbench.core.spec import ModelSpec
from kvbench.plugins.allocators.base import KVAllocator
from kvbench.plugins.backends.base import AttentionMetadata
from kvbench.scenarios.batch_spec import BatchSpec

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class KernelCase:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    meta: AttentionMetadata  # the allocator's layout
    contiguous_meta: AttentionMetadata | None  # reference layout; None when meta is contiguous
    scale: float


def place(spec: BatchSpec, allocator: KVAllocator) -> list[Sequence]:
    """Admit and grow one sequence per spec entry, as the scheduler would for a whole prompt."""
    seqs = []
    for seq_id, seq_len in enumerate(spec.seq_lens):
        seq = Sequence(seq_id, Request(seq_id, 0.0, prompt_len=seq_len, output_len=1), seq_len)
        if not (allocator.admit(seq) and allocator.grow(seq, seq_len)):
            raise RuntimeError(
                f"{allocator.name} could not place sequence {seq_id} ({seq_len} tokens) in {allocator.num_slots} slots"
            )
        seq.num_computed = seq_len
        seqs.append(seq)
    return seqs


def _paged_tables(allocator: KVAllocator, seqs: list[Sequence], gen: torch.Generator):
    tables = [allocator.block_table(s) for s in seqs]
    num_blocks = 1 + max(b for table in tables for b in table)
    physical = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.zeros(len(seqs), max(len(t) for t in tables), dtype=torch.int32)
    for row, table in enumerate(tables):
        block_tables[row, : len(table)] = physical[table].to(torch.int32)
    return block_tables, num_blocks


def _metadata(spec: BatchSpec, block_size: int, device, *, block_tables=None, seq_starts=None) -> AttentionMetadata:
    seq_lens = torch.tensor(spec.seq_lens, dtype=torch.int32)
    query_lens = torch.tensor(spec.query_lens)
    query_start_loc = torch.zeros(spec.num_seqs + 1, dtype=torch.int32)
    query_start_loc[1:] = query_lens.cumsum(0)
    # Each sequence's query tokens are the last ones of its context.
    slot_mapping = []
    for seq, (seq_len, query_len) in enumerate(zip(spec.seq_lens, spec.query_lens)):
        positions = torch.arange(seq_len - query_len, seq_len)
        if block_tables is not None:
            slots = block_tables[seq, positions // block_size].long() * block_size + positions % block_size
        else:
            slots = seq_starts[seq] + positions
        slot_mapping.append(slots)
    return AttentionMetadata(
        query_start_loc=query_start_loc.to(device),
        seq_lens=seq_lens.to(device),
        slot_mapping=torch.cat(slot_mapping).to(device),
        block_size=block_size,
        max_query_len=max(spec.query_lens),
        max_seq_len=max(spec.seq_lens),
        block_tables=None if block_tables is None else block_tables.to(device),
        seq_starts=None if seq_starts is None else seq_starts.to(device),
    )


def build(
    spec: BatchSpec, model: ModelSpec, allocator: KVAllocator, dtype: torch.dtype, device: torch.device, seed: int
) -> KernelCase:
    gen = torch.Generator().manual_seed(seed)
    block_size = allocator.block_size
    seqs = place(spec, allocator)
    back_to_back = torch.zeros(spec.num_seqs, dtype=torch.int64)
    back_to_back[1:] = torch.tensor(spec.seq_lens[:-1]).cumsum(0)
    if allocator.layout == "paged":
        block_tables, num_blocks = _paged_tables(allocator, seqs, gen)
        meta = _metadata(spec, block_size, device, block_tables=block_tables)
        contiguous = _metadata(spec, block_size, device, seq_starts=back_to_back)
    else:
        seq_starts = torch.tensor([allocator.slot_start(s) for s in seqs], dtype=torch.int64)
        end = max(int(start) + n for start, n in zip(seq_starts, spec.seq_lens))
        num_blocks = cdiv(end, block_size)
        meta, contiguous = _metadata(spec, block_size, device, seq_starts=seq_starts), None
    num_blocks = max(num_blocks, cdiv(spec.kv_tokens, block_size))  # room for the reference too

    values = torch.Generator(device=device).manual_seed(seed)

    def random(*shape):
        return torch.randn(shape, generator=values, device=device, dtype=dtype)

    cache_shape = (num_blocks, block_size, model.num_kv_heads, model.head_dim)
    return KernelCase(
        query=random(spec.num_tokens, model.num_heads, model.head_dim),
        k_cache=random(*cache_shape),
        v_cache=random(*cache_shape),
        meta=meta,
        contiguous_meta=contiguous,
        scale=model.head_dim**-0.5,
    )
