"""Settings a run would not read, refused before it runs: a key given on the command line that
this scenario, executor, model or preemption mode ignores would be recorded in the run's row as
if it had shaped the numbers."""

from __future__ import annotations

import math

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from kvbench.errors import UserError
from kvbench.schema.overrides import override_values, split_override

# Config a scenario reads only if it is one of these: given on the command line to another, it
# would be recorded as a column of a run it never shaped, so it is refused instead.
READ_ONLY_BY = {
    "batch": ("kernel",),
    "executor": ("simulate",),
    "workload": ("simulate", "serve", "validate"),
    # the roofline's GPU, serve's modelled preemption cost, a kernel's reference peak; a profile
    # times the real device alone
    "hardware": ("simulate", "serve", "kernel", "validate"),
    # a kernel times one batch of the backend: no scheduler, engine or recorder runs
    "scheduler": ("simulate", "serve", "profile", "validate"),  # a profile's grid stays within its limits
    # admission headroom and the prefix cache act when a scheduler admits requests; a kernel places
    # one batch with the allocator's layout (a watermark crashed its placement)
    "allocator.watermark": ("simulate", "serve", "profile", "validate"),
    "allocator.prefix_caching": ("simulate", "serve", "profile", "validate"),
    "engine": ("simulate", "serve", "validate"),  # a profile times fixed shapes: no pool, preemption or async
    "engine.kv_cache_bytes": ("simulate", "serve"),  # validate sizes both sides by scenario.kv_cache_tokens
    "model.dtype": ("simulate", "kernel"),  # the real model runs in scenario.dtype
    "measure": ("simulate", "serve", "validate"),
    "report.goodput": ("simulate", "serve", "validate"),  # the recorder's SLOs; report.* else is a sweep's
    "repeats": ("serve", "kernel"),  # a simulated point is exact for its seed: it runs once (scenarios/repeats)
    # vLLM's scheduler and allocator settings (conf/preset/vllm.yaml): a kernel runs neither
    "preset": ("simulate", "serve", "profile", "validate"),
}
# what the generic line adds for a key: where the setting it meant lives
UNREAD_HINTS = {
    ("model.dtype", "serve"): "its real model runs in scenario.dtype: set that",
    ("model.dtype", "profile"): "its real model runs in scenario.dtype: set that",
    ("model.dtype", "validate"): "its real model runs in scenario.serve.dtype and scenario.profiling.dtype: set those",
    ("engine.kv_cache_bytes", "validate"): "it sizes both sides' pool by scenario.kv_cache_tokens: set that",
}
# the roofline's step-time knobs (cost_model); a calibrated executor times steps from its profile
# (the peak FLOP/s still models what recomputing the preempted tokens would cost)
ROOFLINE_STEP_KEYS = ("hardware.hbm_bytes_per_s", "hardware.hbm_efficiency", "hardware.step_overhead_s")
# what times the roofline's tensor-parallel all-reduces, read only with hardware.num_gpus > 1
ALLREDUCE_KEYS = ("hardware.allreduce_latency_s", "hardware.allreduce_bytes_per_s")
ROOFLINE_STEP_KEYS += ALLREDUCE_KEYS
# what times a swap, read (as the swap pool's size) only with engine.preemption=swap
SWAP_KEYS = ("hardware.pcie_bytes_per_s", "hardware.copy_latency_s")
# scenario=kernel's timing knobs by device: do_bench on cuda, torch's Timer on cpu
KERNEL_CUDA_KEYS = ("scenario.warmup_ms", "scenario.rep_ms", "scenario.cuda_graph")
# what validate's host-speed probe reads of scenario.profiling where a profile is given
PROBE_KEYS = ("clock", "cpu_threads", "device")
# the real model's shape beyond what the roofline reads (cost_model: num_params, layers, heads,
# head_dim, window, state; the hidden size under tensor parallelism, as the all-reduces' message):
# a simulated run with executor=roofline would record them unread
ROOFLINE_UNREAD = ("model.hidden_size", "model.intermediate_size", "model.rope_theta", "model.vocab_size")


def refuse_unread_overrides(cfg: DictConfig, task: list[str] | None = None) -> None:
    """Refuse a key the command line gives (`task`: its overrides, by default the running
    point's) that this run would not read."""
    from kvbench.scenarios.build import plugin_cfg  # loaded by the point's run next anyway

    scenario = str(cfg.scenario.name)
    task = list(HydraConfig.get().overrides.task if task is None else task)
    overridden = [key for key, _ in map(split_override, task)]
    # a section set through a dict (scenario.serve={rate:2}) sets each of its keys
    for item in task:
        key, value = split_override(item)
        if "{" in value:
            overridden += [f"{key}.{sub}" for v in override_values(item) if isinstance(v, dict) for sub in v]
    for key in overridden:
        readers = READ_ONLY_BY.get(".".join(key.split(".")[:2])) or READ_ONLY_BY.get(key.split(".")[0])
        if readers and scenario not in readers:
            hint = UNREAD_HINTS.get((key, scenario), "drop it")
            raise UserError(
                f"{key} is read by scenario={' or '.join(readers)} only; scenario={scenario} would ignore it: {hint}"
            )
    refuse_unread_settings(cfg, scenario, overridden)
    kinds = set(cfg.model.get("layer_pattern") or ["full"])
    for key, kind in (("model.window", "window"), ("model.linear_state_dim", "linear")):
        if key in overridden and kind not in kinds and cfg.model.get(key.split(".")[1]):  # 0: none, as said
            raise UserError(
                f"{key} is read by {kind} layers only, and model={cfg.model.name} has none (model.layer_pattern="
                f"[{','.join(cfg.model.get('layer_pattern') or [])}]): drop it, or give the model {kind} layers"
            )
    if scenario == "serve" and "scenario.kv_cache_tokens" in overridden and cfg.engine.get("kv_cache_bytes"):
        raise UserError(
            f"scenario.kv_cache_tokens is not read: engine.kv_cache_bytes={cfg.engine.kv_cache_bytes:g} sizes the "
            f"pool, and wins: give one of the two"
        )
    served = scenario == "serve" and cfg.scenario.get("rate") is not None  # null keeps the workload's
    pool = "scenario.swap_space_tokens" if scenario == "serve" else "engine.swap_space_bytes"  # the swap pool's size
    if scenario == "serve" and "engine.swap_space_bytes" in overridden:
        raise UserError(
            f"engine.swap_space_bytes is not read by scenario=serve, whose swap pool is {pool}: set that instead"
        )
    # the swap pools (validate's serve runs have their own) and what times a swap
    pools = (pool, "scenario.serve.swap_space_tokens") if scenario == "validate" else (pool,)
    unread = next((k for k in (*pools, *SWAP_KEYS) if k in overridden), None)
    if unread and str(cfg.engine.get("preemption")) != "swap":
        raise UserError(
            f"{unread} {'is' if unread in pools else 'times swaps,'} read only with engine.preemption=swap; "
            f"engine.preemption={cfg.engine.get('preemption')} recomputes what it preempts: drop it, or set "
            f"engine.preemption=swap"
        )
    parallel = int(cfg.hardware.get("num_gpus") or 1) > 1
    roofline_unread = [k for k in ROOFLINE_UNREAD if k in overridden and not (parallel and k == "model.hidden_size")]
    roofline = scenario == "simulate" and cfg.get("executor", {}).get("name") == "roofline"
    unread = next((k for k in ALLREDUCE_KEYS if k in overridden), None)
    if roofline and unread and not parallel:
        raise UserError(
            f"{unread} times the tensor-parallel all-reduces, read only with hardware.num_gpus > 1; "
            f"hardware.num_gpus=1 has none: drop it, or set hardware.num_gpus"
        )
    if roofline and roofline_unread:
        raise UserError(
            f"{roofline_unread[0]} is not read by the roofline (executor=roofline), which times a step from "
            f"model.num_params, the layers, heads and head_dim (and the hidden size on several GPUs): it shapes "
            f"the real model (scenario=serve, profile, kernel) and executor=calibrated's profile; drop it"
        )
    if "workload.num_prefixes" in overridden and not cfg.workload.get("prefix_len"):
        raise UserError(
            "workload.num_prefixes is not read: workload.prefix_len=0 puts no shared system prompt before the "
            "prompts; set workload.prefix_len=TOKENS too, or drop it"
        )
    shaping = {"workload.rate", "workload.burstiness"} | ({"scenario.rate"} if served else set())
    arrivals = sorted(shaping.intersection(overridden))
    if (arrivals or cfg.workload.get("shuffle") is True) and cfg.workload.kind == "trace":
        from kvbench.core.workload import refuse_shuffled_arrivals, trace_has_arrival_times

        timed = trace_has_arrival_times(str(cfg.workload.path))
        if arrivals and timed:
            raise UserError(
                f"{arrivals[0]} is not read: the trace {cfg.workload.path} gives every request its arrival "
                f"time (a rate and burstiness shape arrivals only for a trace without them): drop it"
            )
        refuse_shuffled_arrivals(cfg.workload, timed)
    counted = [("workload.num_requests", cfg.workload.get("num_requests"))]
    if scenario == "serve":  # serve's cap, which a workload without a count of its own takes
        counted.append(("scenario.num_requests", cfg.scenario.get("num_requests")))
    count = next(((key, value) for key, value in counted if value is not None), None)
    given = "workload.duration_s" in overridden and cfg.workload.get("duration_s") is not None
    if given and count and cfg.workload.kind != "trace":  # a trace's rows stop at whichever comes first
        way = ", or scenario.num_requests=null and a finite scenario.rate" if count[0].startswith("s") else ""
        raise UserError(
            f"workload.duration_s is not read: {count[0]}={count[1]} bounds the run, and takes precedence; "
            f"drop one of them{way}"
        )
    served_rate = cfg.scenario.get("rate") if scenario == "serve" else None
    if served_rate is not None and "workload.rate" in overridden:
        raise UserError(
            f"workload.rate is not read: scenario=serve replaces it with scenario.rate={served_rate} "
            f"(inf: every request at t=0); set scenario.rate=VALUE, or scenario.rate=null to keep workload.rate"
        )
    rate_key, rate = ("scenario.rate", served_rate) if served_rate is not None else ("rate", cfg.workload.rate)
    if "workload.burstiness" in overridden and math.isinf(float(rate)):  # a timed trace was refused above
        raise UserError(
            f"workload.burstiness is not read: {rate_key}=inf sends every request at t=0, with no gaps to shape"
        )
    graph = plugin_cfg(cfg, "graph")["name"]
    if scenario == "kernel" and graph != "eager":  # a graph mode wraps the model's forward, which a kernel has not
        raise UserError(
            f"graph={graph} wraps the model's forward (scenario=serve, profile or validate); scenario=kernel "
            f"times the attention backend alone and would ignore it: drop it (on a GPU, "
            f"scenario.cuda_graph=true also times the kernel replayed from a CUDA graph)"
        )


def refuse_unread_settings(cfg: DictConfig, scenario: str, overridden: list[str]) -> None:
    """Keys a scenario reads, but not with the other settings of this run: recorded in its row,
    they would describe a run that did not use them."""
    executor = (cfg.get("executor") or {}).get("name")
    unread = next((k for k in ROOFLINE_STEP_KEYS if k in overridden), None)
    if scenario == "simulate" and executor == "calibrated" and unread:
        raise UserError(
            f"{unread} is read by executor=roofline only; executor=calibrated times each step from its profile "
            f"(executor.profile): drop it"
        )
    if scenario == "simulate" and executor == "calibrated" and int(cfg.hardware.get("num_gpus") or 1) > 1:
        raise UserError(
            f"hardware.num_gpus={cfg.hardware.num_gpus}: executor=calibrated times each step as the one device "
            f"its profile measured, so its pool and its preemptions' cost are one device's too: drop it"
        )
    pattern = set(cfg.model.get("layer_pattern") or ["full"])
    if "allocator.policy" in overridden and pattern == {"full"}:  # the policies differ over layer kinds alone
        raise UserError(
            f"allocator.policy is not read: model={cfg.model.name} has full-attention layers only, which every "
            f"policy pools alike (it splits or shares the pool between window, linear and full layers): drop it"
        )
    unread = next((k for k in (*ROOFLINE_STEP_KEYS, "hardware.memory_bytes") if k in overridden), None)
    if scenario in ("serve", "validate") and unread:
        raise UserError(
            f"{unread} is read by the roofline (scenario=simulate) only; scenario={scenario} times its steps on this "
            f"machine, and its hardware profile models only what preemptions would cost (pcie_bytes_per_s, "
            f"copy_latency_s, peak_flops, flops_efficiency, num_gpus): drop it"
        )
    if "hardware.gpu_memory_utilization" in overridden:
        kv_bytes = cfg.engine.get("kv_cache_bytes") if "engine" in cfg else None
        if scenario != "simulate" or kv_bytes is not None:
            pool = f"engine.kv_cache_bytes={kv_bytes:g}" if kv_bytes is not None else "scenario.kv_cache_tokens"
            raise UserError(
                f"hardware.gpu_memory_utilization is not read: it sizes the simulated KV pool from the GPU's memory, "
                f"and this run's pool is {pool}: drop one"
            )
    if scenario == "kernel":
        from kvbench.scenarios.build import resolve_device

        device = resolve_device(str(cfg.scenario.device)).type
        cuda_only = [k for k in overridden if k in KERNEL_CUDA_KEYS or k.split(".")[0] == "hardware"]
        if device == "cpu" and cuda_only:
            raise UserError(
                f"{cuda_only[0]} is read on cuda only (do_bench, the GPU's roofline); this kernel runs on cpu "
                f"(scenario.device={cfg.scenario.device}), timed for scenario.min_run_time_s: drop it"
            )
        if device == "cuda" and "scenario.min_run_time_s" in overridden:
            raise UserError(
                "scenario.min_run_time_s is read on cpu only; on cuda do_bench times for scenario.warmup_ms and "
                "scenario.rep_ms: drop it"
            )
    sampling = cfg.scenario.get("sampling") if scenario == "serve" else None
    if sampling is not None:
        touched = [k for k in ("scenario.sampling.temperature", "scenario.sampling.top_p") if k in overridden]
        beams = int(cfg.workload.get("beam_width") or 1)
        if beams > 1 and touched:
            raise UserError(
                f"{touched[0]} is not read with workload.beam_width={beams}: beam search keeps the most likely "
                f"continuations, unsampled (vLLM refuses sampling settings with beams too): drop it"
            )
        if "scenario.sampling.top_p" in overridden and not float(sampling.get("temperature") or 0) > 0:
            raise UserError(
                "scenario.sampling.top_p is read only with scenario.sampling.temperature > 0; temperature 0 decodes "
                "greedily: set a temperature, or drop it"
            )
    if scenario == "validate":
        for key in ("scenario.serve.rate", "scenario.serve.num_requests"):
            if key in overridden:
                raise UserError(
                    f"{key} would serve another workload than the one simulated (validate compares the two on one "
                    f"workload): set workload.num_requests, or scenario.load (workload.rate with scenario.load=null)"
                )
        if "scenario.serve.kv_cache_tokens" in overridden:  # serve's pool is engine.kv_cache_bytes, which wins
            raise UserError(
                f"scenario.serve.kv_cache_tokens is not read: validate sizes both sides' pool by "
                f"scenario.kv_cache_tokens (now {cfg.scenario.kv_cache_tokens}): set that instead"
            )
        profiled = [k for k in overridden if k.startswith("scenario.profiling.") and k.split(".")[2] not in PROBE_KEYS]
        if cfg.scenario.get("profile") and profiled:
            raise UserError(
                f"{profiled[0]} is not read: scenario.profile={cfg.scenario.profile} is simulated with, and no "
                f"profile is taken: drop one"
            )
