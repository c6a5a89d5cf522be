"""What a point would allocate, estimated from its config and refused before it starts when it cannot fit.

The estimates count the big things only: the serve model's weights, KV cache and largest step's
activations (real tensors),
the kernel scenario's KV cache, the simulator's per-block lists, the request objects. They are
within a small factor, which is all a refusal needs: a point that would take more than the
memory available would swap or be killed part-way instead of reporting.
"""

from __future__ import annotations

import math
import os

from kvbench.errors import UserError
from kvbench.schema import groups as sections

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
REQUEST_BYTES = 2048  # a Request, its Sequence(s) and the recorder's per-request entries
BLOCK_BYTES = 64  # a paged pool's per-block entries (free list, ref count, fill, table slot)
SEQUENCE_BYTES = 1024  # the kernel scenario's per-sequence Python objects and metadata rows


def available_bytes() -> int:
    """Memory this host can still give a new point (MemAvailable, else all physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def _kv_bytes_per_token(model, dtype_bytes: int) -> int:
    attention = sum(
        1
        for i in range(model.num_layers)
        if (model.layer_pattern or ["full"])[i % len(model.layer_pattern or ["full"])] != "linear"
    )
    return 2 * attention * model.num_kv_heads * model.head_dim * dtype_bytes


def _serve_weights(model, dtype_bytes: int) -> float:
    """The tiny decoder's real parameter count for this shape (embedding, layers, head)."""
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    inner = model.intermediate_size or 4 * model.hidden_size
    per_layer = model.hidden_size * (q + 2 * kv) + q * model.hidden_size + 3 * model.hidden_size * inner
    params = 2 * model.vocab_size * model.hidden_size + model.num_layers * per_layer
    return params * dtype_bytes + model.max_model_len * model.head_dim * 4  # + the RoPE tables


def _activations(model, dtype: str, step_tokens: int) -> float:
    """The largest step's transient tensors in the real decoder: per token the MLP's three
    intermediate rows, the q/k/v projections and a few hidden-size rows, the eager attention's
    scores (fp32, heads x tokens x context) and fp32 logits. The step is one full-length prompt at
    most (a prompt's prefill is what a serve run meets first), within the step budget."""
    tokens = min(step_tokens, model.max_model_len)
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    inner = model.intermediate_size or 4 * model.hidden_size
    per_token = (3 * inner + q + 2 * kv + 4 * model.hidden_size) * DTYPE_BYTES[{"auto": "fp32"}.get(dtype, dtype)]
    return tokens * per_token + model.num_heads * tokens * tokens * 4 + tokens * model.vocab_size * 4


def _real_model(model, dtype: str) -> tuple[tuple[str, float], int]:
    """(the weights' part name and bytes, KV bytes per token) of the real model a scenario builds
    in `dtype`: on the host first, in fp32 (torch's default) unless a dtype is set."""
    dtype = {"auto": "fp32"}.get(dtype, dtype)
    return (f"weights ({dtype})", _serve_weights(model, DTYPE_BYTES[dtype])), _kv_bytes_per_token(
        model, DTYPE_BYTES[dtype]
    )


def _hybrid_caches(model, dtype: str, num_slots: int, block_size: int, as_full: bool = False) -> float:
    """The bytes allocator=hybrid's serve executor allocates for a pool of `num_slots` tokens:
    its pages as the allocator unifies them (plugins/allocators/hybrid_pages.py), one cache of
    every page for each place of a group (one a layer under as_full), and every linear layer a
    state for every page (HybridModelExecutor), which is more than the pool's budget counts."""
    from kvbench.core.spec import ModelSpec
    from kvbench.plugins.allocators.hybrid_pages import unify_pages

    spec = ModelSpec.from_cfg({**model.model_dump(), "dtype": {"auto": "fp32"}.get(dtype, dtype)})
    layout = unify_pages(spec, block_size, linear_as_full=as_full)
    pages = num_slots * spec.kv_bytes_per_token // layout.page_bytes
    caches = sum(pages * size * spec.kv_bytes_per_token_per_layer for size, _ in layout.cache_places())
    return caches + spec.num_layers_of("linear") * pages * spec.linear_state_bytes_per_layer


def _given(changes, key: str, section):
    """validate's change to `key`, else the scenario's own default (its schema's, as its YAML's)."""
    value = getattr(changes, key)
    return section.model_fields[key].default if value is None else value


def _num_requests(workload, scenario) -> float:
    if workload.num_requests is not None:
        count = workload.num_requests
    elif workload.duration_s is not None and math.isfinite(workload.rate):
        count = workload.rate * workload.duration_s
    else:
        count = 0
    if workload.kind == "trace":  # a trace gives at most its rows, whatever the rate
        count = min(count, _lines(workload.path)) if count else _lines(workload.path)
    cap = getattr(scenario, "num_requests", None)
    if cap and workload.num_requests is None and workload.kind != "trace":
        return cap  # serve draws that many, whatever the duration (scenarios/serve.serve_workload)
    return min(count, cap) if cap else count


def _lines(path) -> int:
    """The lines of a file, a bound on a trace's rows (0 for one that cannot be read: its reader
    then says why)."""
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")) + 1
    except (OSError, TypeError):
        return 0


def estimate(
    root, model, hardware, workload, scenario, allocator: dict, backend: str = "eager"
) -> tuple[float, list[str]]:
    """Bytes the point would allocate on this host, and the parts as `name size` strings for the
    message (`backend`: the kernel scenario's)."""
    parts: dict[str, float] = {}
    requests = _num_requests(workload, scenario)
    parts["requests"] = requests * REQUEST_BYTES + workload.num_prefixes * (workload.prefix_len * 8 + 128)
    block_size = int(allocator.get("block_size", 16) or 16)
    if scenario.name in ("serve", "profile"):
        weights, per_token = _real_model(model, scenario.dtype)
        parts[weights[0]] = weights[1]
        parts["a step's activations"] = _activations(model, scenario.dtype, root.scheduler.max_num_batched_tokens)
        if scenario.name == "serve":
            kv_bytes = root.engine.kv_cache_bytes
            slots = kv_bytes // per_token if kv_bytes is not None else scenario.kv_cache_tokens
            parts["KV cache"] = slots * per_token
            if allocator.get("name") == "hybrid":  # its pages' caches and states, allocated whole
                as_full = allocator.get("policy") == "as_full"
                parts["KV cache"] = _hybrid_caches(model, scenario.dtype, int(slots), block_size, as_full)
            if root.engine.preemption == "swap":  # recompute builds no swap pool
                parts["swap pool"] = scenario.swap_space_tokens * per_token
            parts["prompt tokens"] = requests * model.max_model_len * 8
        else:
            parts["KV cache"] = scenario.kv_cache_tokens * per_token
    elif scenario.name == "validate":
        # It keeps a probe model for the whole run and builds one more at a time: the profile's
        # (unless scenario.profile names a profile.csv), then the serve runs', each with its pool.
        serve, profiling = scenario.serve, scenario.profiling  # changes: None where unset
        weights, per_token = _real_model(model, serve.dtype or "auto")
        swapped = _given(serve, "swap_space_tokens", sections.Serve) if root.engine.preemption == "swap" else 0
        serve_kv = scenario.kv_cache_tokens + swapped
        profile_kv = 0 if scenario.profile else _given(profiling, "kv_cache_tokens", sections.Profile)
        parts[f"{weights[0]} x2"] = 2 * weights[1]
        parts["a step's activations"] = _activations(
            model, serve.dtype or "auto", root.scheduler.max_num_batched_tokens
        )
        parts["KV cache"] = max(serve_kv, profile_kv) * per_token
        parts["prompt tokens"] = requests * model.max_model_len * 8
    elif scenario.name == "kernel":
        from kvbench.scenarios.batch_spec import parse

        groups = parse(root.batch).groups  # counted per group: the spec's per-sequence lists may be huge
        num_seqs = sum(g.count for g in groups)
        kv_tokens = sum(g.count * g.length for g in groups)
        num_tokens = sum(g.count * g.query_len for g in groups)
        layer_token = 2 * model.num_kv_heads * model.head_dim * DTYPE_BYTES[model.dtype]
        parts["KV cache"] = (kv_tokens + num_seqs * block_size) * layer_token
        parts["queries"] = num_tokens * model.num_heads * model.head_dim * DTYPE_BYTES[model.dtype] * 2
        parts["sequences"] = num_seqs * SEQUENCE_BYTES
        # the eager backend, timed or as the reference a result is checked against, attends one
        # sequence at a time in fp32: its scores, their masked copy and their softmax, heads x
        # queries x context; on this host where the kernel runs on its CPU
        if (scenario.check_error or backend == "eager") and _kernel_on_cpu(scenario.device):
            longest = max((g.query_len * g.length for g in groups), default=0)
            parts["eager attention scores"] = 3 * model.num_heads * longest * 4
    else:
        kv_bytes = root.engine.kv_cache_bytes
        if kv_bytes is None:
            kv_bytes = (
                hardware.memory_bytes * hardware.num_gpus * hardware.gpu_memory_utilization
                - model.num_params * DTYPE_BYTES[model.dtype]
            )
        per_token = _kv_bytes_per_token(model, DTYPE_BYTES[model.dtype])
        parts["KV pool bookkeeping"] = max(kv_bytes, 0) / per_token / block_size * BLOCK_BYTES
        if root.engine.preemption == "swap":  # the CPU pool's free list, a block an entry
            parts["swap pool bookkeeping"] = root.engine.swap_space_bytes / per_token / block_size * BLOCK_BYTES
    total = sum(parts.values())
    return total, [f"{name} {_gb(size)}" for name, size in parts.items() if size >= 1e8]


def _kernel_on_cpu(device: str) -> bool:
    if device != "auto":
        return device == "cpu"
    import torch  # a kernel run imports it anyway

    return not torch.cuda.is_available()


def refuse_if_too_big(root, model, hardware, workload, scenario, allocator: dict, backend: str = "eager") -> None:
    total, parts = estimate(root, model, hardware, workload, scenario, allocator, backend)
    free = available_bytes()
    if total > free:
        shrink = {  # what each scenario's estimate is made of
            "serve": "the model, the KV pool (engine.kv_cache_bytes, scenario.kv_cache_tokens) or the workload",
            "profile": "the model or the KV pool (scenario.kv_cache_tokens)",
            "validate": "the model or the KV pools (scenario.kv_cache_tokens, scenario.profiling.kv_cache_tokens)",
            "kernel": "the model or the batch (batch=...)",
        }.get(
            scenario.name,
            "the KV pool (engine.kv_cache_bytes, hardware.*), the swap pool (swap_space_bytes) or the workload",
        )
        raise UserError(
            f"scenario={scenario.name} with model={model.name} would allocate about {_gb(total)} "
            f"({', '.join(parts)}) but this machine has {_gb(free)} available; shrink {shrink}"
        )
