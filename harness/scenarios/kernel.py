"""scenario=kernel: one attention backend on one batch shape, timed against the memory roofline.

No scheduler and no model weights: the batch spec (`batch=32d1k`) gives the shape, `model` the
heads, head dim and dtype, `allocator` the block size and the KV layout. A decode's floor is
its bytes / HBM bandwidth (docs/facts.md), so every latency is reported next to the bandwidth it
achieved and its fraction of the hardware profile's peak; on a GPU the profile is the detected
device's. Timings taken under the Triton interpreter are flagged `interpreted` and are not
performance.
"""

from __future__ import annotations

import math
import os
import time
from importlib import resources

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from kvbench.arith import cdiv
from kvbench.core.spec import Hardware, ModelSpec
from kvbench.errors import UserError
from kvbench.plugins.backends.base import refuse_misshapen
from kvbench.plugins.backends.eager import EagerBackend
from kvbench.scenarios import batch_spec, kernel_case
from kvbench.scenarios.build import allocator_class, backend_class, backend_options, load_specs, resolve_device

QUANTILES = (0.1, 0.5, 0.9)
# torch.cuda.get_device_name() fragment -> hardware profile (first match wins); None: a card no
# profile describes (an H100 PCIe reads 2.0 TB/s, not the SXM's 3.35), which takes `hardware=`
GPU_PROFILES = (
    ("GH200", None),
    ("H100 PCIe", None),
    ("H100 NVL", None),
    ("A100 80GB PCIe", None),
    ("H200", "h200"),
    ("H100", "h100-sxm"),
    ("A100-SXM4-80GB", "a100-80gb"),
    ("A100 80GB", "a100-80gb"),
    ("A100", "a100-40gb"),
)


def interpreting(device: torch.device, backend_cls: type) -> bool:
    """True where Triton's interpreter runs this backend's kernels (TRITON_INTERPRET=1 on a CPU):
    its times are the interpreter's. A backend without Triton kernels (eager) is never interpreted."""
    return (
        device.type == "cpu"
        and bool(getattr(backend_cls, "triton_kernels", False))
        and os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on")
    )


def roofline_hardware(cfg: DictConfig, device: torch.device) -> Hardware | None:
    """The detected GPU's profile on CUDA (when kvbench has one), else the configured one; None
    on a CPU, whose memory bandwidth no hardware profile describes (a GPU's would make any CPU
    kernel read as a fraction of a percent of its roofline)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, profile in GPU_PROFILES:
        if fragment in name and profile is None:
            break
        if fragment in name:
            path = resources.files("kvbench.conf") / "hardware" / f"{profile}.yaml"
            return Hardware.from_cfg(OmegaConf.to_container(OmegaConf.load(str(path))))
    return Hardware.from_cfg(OmegaConf.to_container(cfg.hardware, resolve=True))


def bytes_moved(spec: batch_spec.BatchSpec, model: ModelSpec, dtype_bytes: int, block_size: int, paged: bool) -> int:
    """Bytes one attention layer must move at least: each visible K/V once, q, o, the layout."""
    visible = sum(
        min(g.length, spec.window) if spec.window and g.kind == "d" else g.length
        for g in spec.groups
        for _ in range(g.count)
    )
    kv = visible * model.num_kv_heads * model.head_dim * 2 * dtype_bytes
    q_and_o = spec.num_tokens * model.num_heads * model.head_dim * 2 * dtype_bytes
    layout = sum(cdiv(n, block_size) for n in spec.seq_lens) * 4 if paged else spec.num_seqs * 8
    return kv + q_and_o + layout + spec.num_seqs * 4  # + seq_lens


def time_cpu(fn, min_run_time_s: float) -> list[float]:
    """p10, p50, p90 seconds from torch.utils.benchmark's blocked measurement: quantiles of its
    blocks, each the mean call of a block (docs/metrics.md), not of single calls."""
    from torch.utils.benchmark import Timer

    fn()  # warm-up: first-call costs (allocator, lazy imports, interpreter set-up) are not latency
    measurement = Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time_s)
    return [float(np.quantile(measurement.times, q)) for q in QUANTILES]


def time_cuda(fn, sc: DictConfig, graph: bool) -> list[float]:
    """p10, p50, p90 seconds: do_bench flushes L2 between calls; do_bench_cudagraph removes launches."""
    import triton.testing

    if graph:
        ms = triton.testing.do_bench_cudagraph(fn, rep=int(sc.rep_ms), quantiles=list(QUANTILES))
    else:
        ms = triton.testing.do_bench(fn, warmup=int(sc.warmup_ms), rep=int(sc.rep_ms), quantiles=list(QUANTILES))
    return [m * 1e-3 for m in ms]


def host_launch_s(fn, device: torch.device, calls: int = 5) -> float:
    """Host seconds per call, not waiting for the device (on CPU the call is the work)."""
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = (time.perf_counter() - start) / calls
    torch.cuda.synchronize(device)
    return elapsed


def run(cfg: DictConfig) -> list[dict]:
    sc = cfg.scenario
    model, _ = load_specs(cfg)
    spec = batch_spec.parse(cfg.batch)
    device = resolve_device(str(sc.device))
    dtype = kernel_case.TORCH_DTYPES.get(model.dtype)
    if dtype is None:
        raise UserError(f"model.dtype={model.dtype} has no kernel; use one of {', '.join(kernel_case.TORCH_DTYPES)}")
    allocator_cls, alloc_options = allocator_class(cfg, model)
    backend_cls = backend_class(
        cfg,
        device,
        dtype,
        allocator_cls.layout,
        [spec.window],
        f"batch={spec.text} on {device.type} {model.dtype} ({allocator_cls.layout} layout)",
    )

    longest = max(spec.seq_lens)
    max_model_len = max(model.max_model_len, longest)
    allocator = allocator_cls(
        num_slots=2 * spec.num_seqs * (max_model_len + 256), max_model_len=max_model_len, model=model, **alloc_options
    )
    case = kernel_case.build(spec, model, allocator, dtype, device, int(cfg.seed))
    backend = backend_cls(**backend_options(cfg))

    def attend(meta):
        return lambda: backend.forward(case.query, case.k_cache, case.v_cache, meta, case.scale, spec.window)

    on_cuda = device.type == "cuda"
    capturable = bool(getattr(backend_cls, "cuda_graph_capturable", False))
    refuse_misshapen(backend_cls.name, attend(case.meta)(), case.query)  # else the time is another computation's

    def latency(meta) -> list[float]:
        return time_cuda(attend(meta), sc, graph=False) if on_cuda else time_cpu(attend(meta), float(sc.min_run_time_s))

    p10, p50, p90 = latency(case.meta)
    row = {
        "batch_spec": spec.text,
        "num_seqs": spec.num_seqs,
        "num_tokens": spec.num_tokens,
        "context_len": spec.kv_tokens / spec.num_seqs,
        "kv_tokens": spec.kv_tokens,
        "window": spec.window,
        "layout": allocator.layout,
        "dtype": model.dtype,
        "device": torch.cuda.get_device_name(device) if on_cuda else "cpu",
        "timer": "do_bench" if on_cuda else "torch_timer",
        "latency_us_p50": p50 * 1e6,
        "latency_us_p10": p10 * 1e6,
        "latency_us_p90": p90 * 1e6,
    }
    device_s = p50
    if on_cuda and capturable and sc.cuda_graph:
        device_s = time_cuda(attend(case.meta), sc, graph=True)[1]
        row["latency_us_cudagraph_p50"] = device_s * 1e6
    hardware = roofline_hardware(cfg, device)
    moved = bytes_moved(spec, model, model.dtype_bytes, allocator.block_size, allocator.layout == "paged")
    row.update(
        bytes_moved=moved,
        achieved_gbps=moved / p50 / 1e9,
        roofline_frac=moved / p50 / hardware.hbm_bytes_per_s if hardware else float("nan"),
        roofline_hardware=hardware.name if hardware else "",
    )

    if sc.check_error:
        out = attend(case.meta)()
        reference = (
            out
            if backend_cls.name == "eager"
            else EagerBackend().forward(case.query, case.k_cache, case.v_cache, case.meta, case.scale, spec.window)
        )
        row["max_abs_err_vs_eager"] = float((out.float() - reference.float()).abs().max())
        if not math.isfinite(row["max_abs_err_vs_eager"]):
            raise UserError(f"backend {backend_cls.name}'s attention holds NaN or inf where eager's does not")
    if case.contiguous_meta is not None and sc.paging_overhead:
        contiguous_p50 = latency(case.contiguous_meta)[1]
        row.update(contiguous_latency_us_p50=contiguous_p50 * 1e6, paging_overhead=p50 / contiguous_p50)
    else:
        row["paging_overhead"] = float("nan")  # the layout is already contiguous

    launch_s = host_launch_s(attend(case.meta), device) if on_cuda else p50
    row.update(
        schedule_s=0.0,
        prepare_s=0.0,
        launch_s=launch_s,
        device_s=device_s,
        cpu_overhead_frac=max(0.0, launch_s - device_s) / max(launch_s, device_s),
        interpreted=interpreting(device, backend_cls),
    )
    return [row]
