"""The flashinfer backend: FlashInfer's paged decode and prefill kernels over kvbench's cache.

FlashInfer addresses KV in CSR form: request b owns pages `kv_indices[kv_indptr[b]:kv_indptr[b+1]]`
and fills `kv_last_page_len[b]` slots of its last one. A paged block table becomes that CSR with
page size = block size. A contiguous slot range becomes pages of size 1 (one page per token) over
the flat `[num_blocks * block_size, 1, kv_heads, head_dim]` view of the same cache.

FlashInfer plans on the host (`plan` copies the page table to the CPU and picks a work split), then
runs on the GPU. Every layer of a step shares one `AttentionMetadata` object, so a plan is made once
per (step, sliding window) and reused by all layers; the executor must build a new metadata object
for each step rather than mutate one in place.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.errors import UserError
from kvbench.plugins.backends.base import AttentionBackend, AttentionMetadata
from kvbench.plugins.backends.eager import EagerBackend

INSTALL_HINT = "flashinfer is not installed (pip install 'kvbench[flashinfer]')"
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)  # FlashInfer has no fp32 attention kernels
WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended split-KV scratch size

WrapperFactory = Callable[[bool, torch.device], Any]  # (decode?, device) -> plan()/run() wrapper


@dataclass(frozen=True)
class PagedKV:
    """One step's KV page table in FlashInfer's CSR layout (all int32, on the metadata's device)."""

    indptr: torch.Tensor  # [B + 1]
    indices: torch.Tensor  # [indptr[-1]] physical page ids
    last_page_len: torch.Tensor  # [B], 1..page_size (0 only for an empty context)
    page_size: int


def paged_kv_from_block_tables(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> PagedKV:
    """The CSR page table holding the first `seq_lens[b]` tokens of each block-table row."""
    seq_lens = seq_lens.to(torch.int32)
    pages = (seq_lens + block_size - 1) // block_size
    if pages.numel() and int(pages.max()) > block_tables.shape[1]:
        raise ValueError(
            f"a sequence needs {int(pages.max())} blocks but the block table has {block_tables.shape[1]} columns"
        )
    indptr = torch.zeros(len(seq_lens) + 1, dtype=torch.int32, device=seq_lens.device)
    indptr[1:] = pages.cumsum(0)
    held = torch.arange(block_tables.shape[1], device=seq_lens.device)[None, :] < pages[:, None]
    last_page_len = seq_lens - (pages - 1).clamp(min=0) * block_size
    return PagedKV(indptr, block_tables[held].to(torch.int32), last_page_len, block_size)


def paged_kv_from_seq_starts(seq_starts: torch.Tensor, seq_lens: torch.Tensor) -> PagedKV:
    """The CSR page table of contiguous slot ranges, one token per page."""
    seq_lens = seq_lens.to(torch.int32)
    indptr = torch.zeros(len(seq_lens) + 1, dtype=torch.int32, device=seq_lens.device)
    indptr[1:] = seq_lens.cumsum(0)
    num_tokens = int(indptr[-1])
    offset_in_seq = torch.arange(num_tokens, device=seq_lens.device) - indptr[:-1].repeat_interleave(
        seq_lens, output_size=num_tokens
    )
    first_slot = seq_starts.to(torch.int64).repeat_interleave(seq_lens, output_size=num_tokens)
    return PagedKV(indptr, (first_slot + offset_in_seq).to(torch.int32), (seq_lens > 0).to(torch.int32), 1)


def paged_kv(meta: AttentionMetadata) -> PagedKV:
    if meta.block_tables is not None:
        return paged_kv_from_block_tables(meta.block_tables, meta.seq_lens, meta.block_size)
    return paged_kv_from_seq_starts(meta.seq_starts, meta.seq_lens)


def window_left(window: int) -> int:
    """kvbench's window w (keys in (p - w, p]) as FlashInfer's inclusive left bound ([p - wl, p])."""
    return window - 1 if window > 0 else -1


def plan_step(
    wrapper: Any,
    meta: AttentionMetadata,
    kv: PagedKV,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    scale: float,
    window: int,
) -> None:
    """Plan one step on a decode wrapper (decode-only batch) or a prefill wrapper (any other)."""
    options = dict(window_left=window_left(window), sm_scale=scale, q_data_type=q_dtype, kv_data_type=kv_dtype)
    if meta.is_decode_only:
        wrapper.plan(
            kv.indptr, kv.indices, kv.last_page_len, num_heads, num_kv_heads, head_dim, kv.page_size, **options
        )
    else:
        # causal in FlashInfer aligns queries to the end of the context, as AttentionMetadata does.
        wrapper.plan(
            meta.query_start_loc.to(torch.int32),
            kv.indptr,
            kv.indices,
            kv.last_page_len,
            num_heads,
            num_kv_heads,
            head_dim,
            kv.page_size,
            causal=True,
            **options,
        )


@dataclass
class _PlannedStep:
    wrapper: Any
    num_query_rows: int  # rows of the packed query that are real tokens; the rest is padding


class FlashInferBackend(AttentionBackend):
    """FlashInfer batch decode / prefill kernels over the CSR page table (CUDA only)."""

    name = "flashinfer"

    def __init__(self, make_wrapper: WrapperFactory | None = None):
        self._make_wrapper = make_wrapper or self._flashinfer_wrapper
        self._workspaces: dict = {}  # device -> the split-KV scratch every wrapper shares
        self._wrappers: dict = {}  # (decode?, plan key) -> wrapper, re-planned every step
        self._step_meta: AttentionMetadata | None = None
        self._step_plans: dict = {}  # plan key -> _PlannedStep, valid for _step_meta only

    @classmethod
    def unsupported_reason(cls, device: torch.device, dtype: torch.dtype, layout: str, window: int) -> str | None:
        if torch.device(device).type != "cuda":  # first: installing it would not help on a CPU
            return "needs a CUDA GPU (flashinfer kernels are CUDA-only); on a CPU use eager or triton_paged"
        if importlib.util.find_spec("flashinfer") is None:
            return INSTALL_HINT
        if dtype not in SUPPORTED_DTYPES:
            return f"dtype {dtype} not supported by flashinfer; use float16 or bfloat16"
        layout_reason = cls.layout_reason(layout, window)
        if layout_reason:
            return layout_reason
        try:
            import flashinfer  # noqa: F401
        except Exception as exc:  # a broken install raises more than ImportError
            return f"flashinfer is installed but fails to import: {exc}"
        return None

    # One scatter through slot_mapping, as vLLM's reshape_and_cache does before FlashInfer runs.
    write_kv = EagerBackend.write_kv

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int = 0,
    ) -> torch.Tensor:
        if query.is_cuda and torch.cuda.is_current_stream_capturing():
            # A captured run would replay the plan of the capture step for every later batch.
            raise UserError(
                "flashinfer plans each step on the host, so it cannot be captured "
                "in a full CUDA graph; use +graph=eager or +graph=piecewise"
            )
        step = self._plan(query, k_cache, meta, scale, window)
        if meta.block_tables is None:
            k_cache = k_cache.view(-1, 1, *k_cache.shape[2:])
            v_cache = v_cache.view(-1, 1, *v_cache.shape[2:])
        out = torch.zeros_like(query)
        rows = step.num_query_rows
        out[:rows] = step.wrapper.run(query[:rows], (k_cache, v_cache))
        return out

    def _plan(
        self, query: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata, scale: float, window: int
    ) -> _PlannedStep:
        if meta is not self._step_meta:
            self._step_meta, self._step_plans = meta, {}
        num_heads, head_dim = query.shape[1], query.shape[2]
        key = (query.device, window, num_heads, k_cache.shape[2], head_dim, query.dtype, k_cache.dtype, scale)
        step = self._step_plans.get(key)
        if step is None:
            wrapper_key = (meta.is_decode_only, key)
            wrapper = self._wrappers.get(wrapper_key)
            if wrapper is None:
                wrapper = self._wrappers[wrapper_key] = self._make_wrapper(meta.is_decode_only, query.device)
            kv = paged_kv(meta)
            plan_step(
                wrapper, meta, kv, num_heads, k_cache.shape[2], head_dim, query.dtype, k_cache.dtype, scale, window
            )
            rows = meta.num_seqs if meta.is_decode_only else int(meta.query_start_loc[-1])
            step = self._step_plans[key] = _PlannedStep(wrapper, rows)
        return step

    def _flashinfer_wrapper(self, decode: bool, device: torch.device) -> Any:
        import flashinfer

        workspace = self._workspaces.get(device)
        if workspace is None:
            workspace = self._workspaces[device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        if decode:
            return flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
        return flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
