"""The triton_paged backend: kvbench's own Triton kernels over the paged or contiguous cache.

Decode-only batches go to the split-KV decode kernel; any batch with a prefill or a prefill
chunk goes to the varlen prefill kernel, which treats decode rows as one-token queries.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from kvbench.plugins.backends.base import AttentionBackend, AttentionMetadata

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on")


def _kernels_compiled_for_gpu() -> bool:
    # Triton picks interpreter or compiler when a kernel is defined, i.e. at module import.
    decode = sys.modules.get("kvbench.kernels.decode")
    if decode is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return not isinstance(decode._decode_kernel, InterpretedFunction)


class TritonPagedBackend(AttentionBackend):
    """Triton split-KV decode and varlen prefill kernels over the block table."""

    name = "triton_paged"
    cuda_graph_capturable = True
    triton_kernels = True

    @classmethod
    def unsupported_reason(cls, device: torch.device, dtype: torch.dtype, layout: str, window: int) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (pip install triton)"
        device = torch.device(device)
        if device.type == "cpu":
            if not _interpreting():
                return "Triton on CPU needs TRITON_INTERPRET=1 (the interpreter; correctness only, slow)"
            if _kernels_compiled_for_gpu():
                return "kvbench.kernels was imported before TRITON_INTERPRET=1 was set; set it before the first import"
        elif device.type != "cuda":
            return f"Triton runs on cuda, or on cpu under TRITON_INTERPRET=1; not on {device.type}"
        if dtype not in SUPPORTED_DTYPES:
            return f"dtype {dtype} not supported; use float16, bfloat16 or float32"
        layout_reason = cls.layout_reason(layout, window)
        if layout_reason:
            return layout_reason
        return None

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        # Imported here, not at the top: the import fixes interpreter vs GPU for the process.
        from kvbench.kernels.cache_write import write_kv_cache

        if key.stride() != value.stride() or key.stride(-1) != 1:  # the kernel walks both with one set of strides
            key, value = key.contiguous(), value.contiguous()
        write_kv_cache(key, value, k_cache, v_cache, slot_mapping)

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int = 0,
    ) -> torch.Tensor:
        from kvbench.kernels.decode import paged_decode
        from kvbench.kernels.prefill import paged_prefill

        out = torch.zeros_like(query)
        if meta.is_decode_only:
            num_seqs = meta.num_seqs
            paged_decode(
                query[:num_seqs],
                k_cache,
                v_cache,
                meta.seq_lens,
                scale,
                block_tables=meta.block_tables,
                seq_starts=meta.seq_starts,
                window=window,
                max_seq_len=meta.max_seq_len,
                out=out[:num_seqs],
            )
        else:
            paged_prefill(
                query,
                k_cache,
                v_cache,
                meta.query_start_loc,
                meta.seq_lens,
                scale,
                max_query_len=meta.max_query_len,
                block_tables=meta.block_tables,
                seq_starts=meta.seq_starts,
                window=window,
                out=out,
            )
        return out
