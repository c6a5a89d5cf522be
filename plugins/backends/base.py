"""The attention-backend contract: queries + KV cache + per-batch metadata -> attention output.

Cache layout, shared by every backend: per layer, `k_cache` and `v_cache` are tensors of shape
`[num_blocks, block_size, num_kv_heads, head_dim]`. A paged allocator's sequence reaches its
tokens through `block_tables` (token i of sequence b lives in block `block_tables[b, i // bs]`
at offset `i % bs`). A contiguous allocator's sequence owns one slot range: token i of
sequence b lives at flat slot `seq_starts[b] + i` of the view `[num_blocks * block_size, ...]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.errors import UserError


@dataclass
class AttentionMetadata:
    """What one step's attention needs to know about the batch.

    Queries are packed: sequence b's new tokens are rows `query_start_loc[b]:query_start_loc[b+1]`
    of the query tensor, and they are the last tokens of its context of `seq_lens[b]` tokens
    (their K/V are written to the cache before attention runs). A decode has one query row.
    """

    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32, context length including this step's tokens
    slot_mapping: torch.Tensor  # [T] int64, flat slot of each new token; -1 = padding, not written
    block_size: int
    max_query_len: int
    max_seq_len: int
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32 (paged layout)
    seq_starts: torch.Tensor | None = None  # [B] int64 (contiguous layout)

    @property
    def layout(self) -> str:
        return "paged" if self.block_tables is not None else "contiguous"

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def refuse_misshapen(name: str, result: torch.Tensor, query: torch.Tensor) -> None:
    """A backend's forward returns one row per query token: any other shape (a [1, h, d] row
    that copy_ would broadcast over every token) is refused, naming the backend, not timed or served."""
    if not isinstance(result, torch.Tensor):  # None, a list: forward forgot its return
        raise UserError(
            f"backend {name} returned {type(result).__name__} from forward, not a tensor; "
            f"AttentionBackend.forward returns the attention, one row per query token"
        )
    if result.shape != query.shape:
        raise UserError(
            f"backend {name} returned attention of shape {tuple(result.shape)} for a query of "
            f"{tuple(query.shape)}; AttentionBackend.forward returns one row per query token"
        )


class AttentionBackend:
    """Base of every attention-backend plugin. Subclasses set `name` and implement the methods.

    `window` is the sliding-window size in tokens (a query at position p sees keys in
    (p - window, p]); 0 means full causal attention.
    """

    name: ClassVar[str]
    # True when a decode step's forward can be captured in a CUDA graph and replayed: no host
    # reads of the metadata, launch shapes fixed by the metadata's sizes and `max_seq_len`.
    cuda_graph_capturable: ClassVar[bool] = False
    # True when its kernels are Triton's: under TRITON_INTERPRET=1 on a CPU the interpreter runs
    # them, and a served row says its times are not performance (`interpreted`)
    triton_kernels: ClassVar[bool] = False

    @classmethod
    def unsupported_reason(cls, device: torch.device, dtype: torch.dtype, layout: str, window: int) -> str | None:
        """None when the backend can run this combination, else why not (one line)."""
        return None

    @staticmethod
    def layout_reason(layout: str, window: int) -> str | None:
        """The checks every backend shares: a known cache layout, a window that is not negative."""
        if layout not in ("paged", "contiguous"):
            return f"unknown cache layout {layout!r}; expected 'paged' or 'contiguous'"
        if window < 0:
            return f"window must be >= 0 (0 = full attention), got {window}"
        return None

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store the new tokens' K/V ([T, kv_heads, head_dim]) at their slots; skip slot -1."""
        raise NotImplementedError

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int = 0,
    ) -> torch.Tensor:
        """Causal attention of packed queries [T, num_heads, head_dim] over the cache."""
        raise NotImplementedError
