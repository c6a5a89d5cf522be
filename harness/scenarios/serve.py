"""scenario=serve: a workload through the real engine: the tiny model on the local device.

The scheduler and allocators are the simulator's; the executor runs the model with a real KV
cache the allocator lays out and the chosen attention backend. Times are wall times on this
host. The row adds the per-step host time split and, beside the measured swap time, what the
hardware profile's swap / recompute model says the run's preemptions would cost.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from omegaconf import DictConfig, OmegaConf

from kvbench.core import workload
from kvbench.core.radix import radix_hit_rate
from kvbench.errors import UserError
from kvbench.executors.async_scheduling import AsyncScheduling, check_async_supported
from kvbench.executors.hybrid_executor import HybridModelExecutor
from kvbench.executors.model_executor import ModelExecutor
from kvbench.model.decoder import TinyDecoder
from kvbench.model.sampling import SamplingParams
from kvbench.scenarios.build import allocator_class, backend_class, build_engine, graph_mode, load_specs, resolve_device
from kvbench.scenarios.kernel_case import TORCH_DTYPES
from kvbench.scenarios.simulate import preemption_report


def resolve_dtype(name: str, device: torch.device) -> str:
    if name == "auto":
        return "fp32" if device.type == "cpu" else "bf16"
    if name not in TORCH_DTYPES:
        raise UserError(f"scenario.dtype={name!r} is not one of auto, {', '.join(TORCH_DTYPES)}")
    return name


def serve_workload(cfg: DictConfig) -> dict:
    """The workload config with serve's caps applied (scenario.num_requests, scenario.rate)."""
    spec = OmegaConf.to_container(cfg.workload, resolve=True)
    cap, rate = cfg.scenario.get("num_requests"), cfg.scenario.get("rate")
    if rate is not None:
        spec["rate"] = float(rate)
    if cap is not None:
        if int(cap) < 1:
            raise UserError(f"scenario.num_requests={cap} must be >= 1 (or null for the whole workload)")
        count = spec.get("num_requests")
        spec["num_requests"] = int(cap) if count is None else min(int(cap), int(count))
    return spec


def run(cfg: DictConfig) -> list[dict]:
    model_spec, hardware = load_specs(cfg)
    scenario = cfg.scenario
    device = resolve_device(str(scenario.device))
    model_spec = replace(model_spec, dtype=resolve_dtype(str(scenario.dtype), device))
    dtype = TORCH_DTYPES[model_spec.dtype]
    sampling = SamplingParams(float(scenario.sampling.temperature), float(scenario.sampling.top_p), int(cfg.seed))
    async_scheduling = bool(cfg.engine.get("async_scheduling", False))

    allocator_cls, _ = allocator_class(cfg, model_spec)
    windows = [model_spec.window if k == "window" else 0 for k in model_spec.layer_kinds]
    backend_cls = backend_class(cfg, device, dtype, allocator_cls.layout, windows)
    graph_cls, graph_options = graph_mode(cfg)

    served = serve_workload(cfg)
    requests = workload.generate(served, int(cfg.seed), model_spec.max_model_len,
                                 with_tokens=True, vocab_size=model_spec.vocab_size)
    kv_bytes = cfg.engine.get("kv_cache_bytes")
    num_slots = (int(float(kv_bytes) // model_spec.kv_bytes_per_token) if kv_bytes is not None
                 else int(scenario.kv_cache_tokens))
    if num_slots < 1:
        raise UserError(f"the serve KV pool must hold at least one token (scenario.kv_cache_tokens={num_slots})")

    threads = scenario.get("cpu_threads")
    if device.type == "cpu" and threads is not None:
        torch.set_num_threads(int(threads))
    model = TinyDecoder(model_spec, seed=int(cfg.seed)).to(device=device, dtype=dtype).eval()
    swap_slots = int(scenario.swap_space_tokens)

    def make_executor(allocator):
        swap = allocator.num_cpu_blocks * allocator.block_size if allocator.supports_swap else 0
        allocator.record_copies = True
        # an allocator that lays out each layer kind apart needs the executor that reads that layout
        executor_cls = HybridModelExecutor if allocator.per_layer_kind_layout else ModelExecutor
        return executor_cls(model, allocator, backend_cls(), sampling, swap_slots=swap,
                            graph=(graph_cls, graph_options), async_scheduling=async_scheduling)

    engine = build_engine(cfg, model_spec, num_slots, make_executor, swap_slots=swap_slots)
    if device.type == "cuda":  # capture before the first step, so no step's time includes it
        engine.executor.capture_graphs(int(cfg.scheduler.max_num_seqs), int(cfg.scheduler.max_num_batched_tokens))
    if async_scheduling:
        check_async_supported(requests, engine.allocator)
        engine.executor = AsyncScheduling(engine.executor, engine.recorder, len(requests))
    row = engine.run(requests)
    executor = engine.executor
    if async_scheduling:
        executor.drain()
    row.update(executor.time_split(engine.recorder.schedule_s, engine.recorder.step_dt),
               async_scheduling=async_scheduling)
    row.update(preemption_report(engine, model_spec, hardware, row), swap_time_s=executor.swap_s)
    if any(r.prefix_id >= 0 for r in requests):
        row["prefix_hit_rate_radix"] = radix_hit_rate(r.prompt_tokens for r in requests)
    rate = float(served["rate"])
    row.update(device=str(device), dtype=model_spec.dtype, rate="inf" if math.isinf(rate) else rate,
               sampling="greedy" if sampling.greedy else f"t={sampling.temperature},top_p={sampling.top_p}")
    return [row]
