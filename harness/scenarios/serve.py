"""scenario=serve: a workload through the real engine: the tiny model on the local device.

The scheduler and allocators are the simulator's; the executor runs the model with a real KV
cache the allocator lays out and the chosen attention backend. Times are wall times on this
host. The row adds the per-step host time split and, beside the measured swap time, what the
hardware profile's swap / recompute model says the run's preemptions would cost.

So that two identical runs agree, the measurement fixes torch's thread counts (and, when asked,
the cores it may run on), warms the model up on synthetic steps before the first measured one,
and keeps Python's garbage collector out of the measured steps.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import time
from dataclasses import dataclass, field, replace

import torch
from omegaconf import DictConfig, OmegaConf

from kvbench.core import workload
from kvbench.core.engine import Engine
from kvbench.core.radix import radix_hit_rate
from kvbench.core.spec import ModelSpec
from kvbench.errors import UserError
from kvbench.executors.async_scheduling import AsyncScheduling, check_async_supported
from kvbench.executors.hybrid_executor import HybridModelExecutor
from kvbench.executors.model_executor import ModelExecutor
from kvbench.model.decoder import TinyDecoder
from kvbench.model.sampling import SamplingParams
from kvbench.scenarios.build import (
    allocator_class,
    backend_class,
    backend_options,
    build_allocator,
    build_engine,
    full_graph_over_layer_kinds,
    graph_mode,
    load_specs,
    resolve_device,
)
from kvbench.scenarios.kernel_case import TORCH_DTYPES
from kvbench.scenarios.run import timed_trace
from kvbench.scenarios.simulate import preemption_report
from kvbench.scenarios.synthetic_steps import Shape, StepTimer

log = logging.getLogger("kvbench")


def resolve_dtype(name: str, device: torch.device) -> str:
    if name == "auto":
        return "fp32" if device.type == "cpu" else "bf16"
    if name not in TORCH_DTYPES:
        raise UserError(f"scenario.dtype={name!r} is not one of auto, {', '.join(TORCH_DTYPES)}")
    return name


def serve_workload(cfg: DictConfig) -> tuple[dict, int | None]:
    """The workload config with serve's caps applied (scenario.num_requests, scenario.rate), and
    the most requests a trace that sets no count of its own may give (the cap, which a shorter
    trace is not held to: it serves every row)."""
    cap, rate = cfg.scenario.get("num_requests"), cfg.scenario.get("rate")
    if cap is not None and int(cap) < 1:
        raise UserError(f"scenario.num_requests={cap} must be >= 1 (or null for the whole workload)")
    return workload.served(OmegaConf.to_container(cfg.workload, resolve=True), rate, cap)


# the cores this process could run on when it started: a run pinned earlier in a sweep narrows
# what sched_getaffinity reports, not what a later run may ask for
START_CORES = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()


def check_cores(cores: list[int]) -> None:
    """Refuse cores this process could not be pinned to exactly: the kernel would silently drop
    the cores it cannot use ([0, 99] runs on core 0 alone) and refuse a set of none with a bare
    errno."""
    setting = f"scenario.cpu_affinity={cores}"
    if not hasattr(os, "sched_setaffinity"):
        raise UserError(f"{setting}: this platform cannot pin a process to cores; set it to null")
    allowed = ", ".join(_ranges(sorted(START_CORES)))
    if not cores:
        raise UserError(f"{setting} names no core: list some of {allowed}, or null to keep every core")
    unknown = sorted(set(cores) - START_CORES)
    if unknown:
        raise UserError(f"{setting}: this process may run on cores {allowed} only, not {unknown}")


def pin_cores(cores: list[int]) -> None:
    """Run this process on exactly `cores`, or refuse (check_cores)."""
    check_cores(cores)
    _set_affinity(cores)


def _set_affinity(cores: list[int]) -> None:
    try:
        os.sched_setaffinity(0, set(cores))
    except OSError as err:
        raise UserError(f"scenario.cpu_affinity={cores} cannot be applied: {err}") from None


def _ranges(cores: list[int]) -> list[str]:
    """[0, 1, 2, 5] -> ['0-2', '5']."""
    spans: list[list[int]] = []
    for core in cores:
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return [f"{a}-{b}" if b > a else str(a) for a, b in spans]


def check_threads(scenario: DictConfig, device_type: str) -> None:
    """Refuse the cores (scenario.cpu_affinity) and the torch thread count (scenario.cpu_threads)
    a run on `device_type` could not have: asked before the run, and again as it pins them."""
    cores = scenario.get("cpu_affinity")
    if cores is not None:
        check_cores([int(c) for c in cores])
    threads = scenario.get("cpu_threads")
    if device_type != "cpu" or threads is None:
        return
    if int(threads) < 1:
        raise UserError(f"scenario.cpu_threads={threads} must be >= 1 (or null for torch's default)")
    if cores is not None:
        usable = len({int(c) for c in cores})
    else:
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if int(threads) > usable:  # oversubscribed threads wait on each other (a 4-request run on 2 cores:
        # 7.7 s with 16 threads, 27 s with 256; 4096 ran past a minute)
        raise UserError(
            f"scenario.cpu_threads={threads} is more than the {usable} core(s) this process may use: "
            f"at most {usable} (or null for torch's default)"
        )


def preflight(cfg: DictConfig) -> None:
    """What a served run refuses before it builds its model (scenarios.run.preflight): the
    cores and threads it would pin."""
    check_threads(cfg.scenario, resolve_device(str(cfg.scenario.device)).type)


def pin_threads(scenario: DictConfig, device: torch.device) -> None:
    """Fix torch's intra- and inter-op thread counts and, if set, the cores this process runs on."""
    check_threads(scenario, device.type)  # the cores too
    cores = scenario.get("cpu_affinity")
    if cores is not None:
        _set_affinity([int(c) for c in cores])
    threads = scenario.get("cpu_threads")
    if device.type != "cpu" or threads is None:
        return
    torch.set_num_threads(int(threads))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # settable once per process, before any parallel work: already fixed
        pass


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def step_clock(scenario: DictConfig, device: torch.device, async_scheduling: bool = False):
    """How a step is timed: wall time, or (cpu, one thread) this process's CPU time, which a
    shared host's other processes do not inflate while they hold the core."""
    name = str(scenario.get("clock", "wall"))
    if name not in CLOCKS:
        raise UserError(f"scenario.clock={name!r} is not one of {', '.join(CLOCKS)}")
    if name == "cpu" and (device.type != "cpu" or scenario.get("cpu_threads") != 1 or async_scheduling):
        raise UserError(
            "scenario.clock=cpu needs device cpu, scenario.cpu_threads=1 and no async "
            "scheduling: only then is the process's CPU time the step's duration"
        )
    return CLOCKS[name]


@dataclass
class RealModel:
    """What a real run serves: the model on its device, and the plugins that run it."""

    spec: ModelSpec
    device: torch.device
    model: TinyDecoder
    backend_cls: type
    graph: tuple
    sampling: SamplingParams
    backend_options: dict = field(default_factory=dict)

    def executor(self, allocator, swap_slots: int = 0, async_scheduling: bool = False):
        # an allocator that lays out each layer kind apart needs the executor that reads that layout
        executor_cls = HybridModelExecutor if allocator.per_layer_kind_layout else ModelExecutor
        mode = self.graph[0]
        if allocator.per_layer_kind_layout and getattr(mode, "name", "") == "full":
            raise full_graph_over_layer_kinds(allocator.name)
        return executor_cls(
            self.model,
            allocator,
            self.backend_cls(**self.backend_options),
            self.sampling,
            swap_slots=swap_slots,
            graph=self.graph,
            async_scheduling=async_scheduling,
        )


def real_model(cfg: DictConfig) -> RealModel:
    """The model of `cfg` built on scenario.device in scenario.dtype, threads pinned."""
    model_spec, _ = load_specs(cfg)
    scenario = cfg.scenario
    device = resolve_device(str(scenario.device))
    model_spec = replace(model_spec, dtype=resolve_dtype(str(scenario.dtype), device))
    dtype = TORCH_DTYPES[model_spec.dtype]
    sampling = (
        SamplingParams(float(scenario.sampling.temperature), float(scenario.sampling.top_p), int(cfg.seed))
        if "sampling" in scenario
        else SamplingParams(seed=int(cfg.seed))
    )
    allocator_cls, _ = allocator_class(cfg, model_spec)
    windows = [model_spec.window if k == "window" else 0 for k in model_spec.layer_kinds]
    backend_cls = backend_class(cfg, device, dtype, allocator_cls.layout, windows)
    pin_threads(scenario, device)
    model = TinyDecoder(model_spec, seed=int(cfg.seed)).to(device=device, dtype=dtype).eval()
    return RealModel(model_spec, device, model, backend_cls, graph_mode(cfg), sampling, backend_options(cfg))


def warm_up(cfg: DictConfig, real: RealModel, steps: int, num_slots: int) -> None:
    """Run `steps` synthetic prefill and decode steps on a throwaway pool, so that first-call
    costs (allocations, dispatch caches, lazy initialisation) land before the measured steps.
    The pool is small (8 sequences of 64 tokens), or the run's own size where an allocator
    cannot work in that (a plugin that keeps blocks in reserve); freed before the run's is made."""
    if steps < 1:
        return
    length = min(64, real.spec.max_model_len)
    pools = [8 * length, *([num_slots] if num_slots > 8 * length else [])]
    for pool in pools:
        try:
            allocator = build_allocator(cfg, real.spec, pool)
            timer = StepTimer(allocator, real.executor(allocator), 4, 4 * length, real.spec.vocab_size, int(cfg.seed))
            for _ in range(steps):
                timer.time(Shape(prefill_seqs=1, prefill_len=length))
                timer.time(Shape(decode_seqs=4, decode_context=length))
            return
        except (RuntimeError, ValueError, UserError):  # too small a pool for this allocator: the run's own next
            if pool == pools[-1]:
                raise


def pool_hint(kv_bytes, num_slots: int, allocator) -> str:
    """How a served run's KV pool gets more room: the setting that sized it, and the whole
    blocks it came to where the allocator rounded it down."""
    pages = getattr(allocator, "num_pages", None)  # the hybrid pool's: pages of a block of a layer group
    if pages is not None:
        unit = f"{pages} whole page{'' if pages == 1 else 's'} ({allocator.num_slots} token slots)"
    else:
        blocks = allocator.num_slots // allocator.block_size
        unit = f"{blocks} whole {allocator.block_size}-token block{'' if blocks == 1 else 's'}"
    rounded = f"rounds down to {unit}"
    if kv_bytes is not None:
        slots = f"{num_slots} token slot{'' if num_slots == 1 else 's'}"
        return f"raise engine.kv_cache_bytes (now {kv_bytes}: {slots}, which {rounded})"
    return (
        f"raise scenario.kv_cache_tokens (now {num_slots}"
        f"{', which ' + rounded if allocator.num_slots != num_slots else ''})"
    )


def serve(cfg: DictConfig, prepare=None) -> tuple[dict, Engine]:
    """One served run: its result row and the engine (whose recorder holds the steps);
    `prepare(engine)`, when given, sees the engine before the first step."""
    scenario = cfg.scenario
    real = real_model(cfg)
    model_spec, device = real.spec, real.device
    _, hardware = load_specs(cfg)
    async_scheduling = bool(cfg.engine.get("async_scheduling", False))
    served, at_most = serve_workload(cfg)
    requests = workload.generate(
        served,
        int(cfg.seed),
        model_spec.max_model_len,
        with_tokens=True,
        vocab_size=model_spec.vocab_size,
        at_most=at_most,
    )
    kv_bytes = cfg.engine.get("kv_cache_bytes")
    num_slots = (
        int(float(kv_bytes) // model_spec.kv_bytes_per_token) if kv_bytes is not None else int(scenario.kv_cache_tokens)
    )
    if num_slots < 1:
        given = (
            f"engine.kv_cache_bytes={kv_bytes} holds none of {model_spec.kv_bytes_per_token} bytes"
            if kv_bytes is not None
            else f"scenario.kv_cache_tokens={num_slots}"
        )
        raise UserError(f"the serve KV pool must hold at least one token ({given})")
    checking = bool(scenario.get("check_tokens", False))
    # Triton kernels run by its interpreter on a CPU (a triton backend under TRITON_INTERPRET=1):
    # the step times are the interpreter's, not performance (as a kernel row says the same)
    from kvbench.scenarios.kernel import interpreting

    interpreted = interpreting(device, real.backend_cls)
    if checking and model_spec.dtype == "bf16" and interpreted:
        raise UserError(
            "scenario.check_tokens=true compares tokens bit for bit, and Triton's interpreter (TRITON_INTERPRET=1) "
            "rounds a bf16 store toward zero where torch rounds to nearest: this backend's bf16 tokens are not the "
            "reference's on a CPU; check them with scenario.dtype=fp32 or fp16"
        )
    if checking and device.type != "cpu":
        raise UserError(
            "scenario.check_tokens=true compares tokens bit for bit with one-request generation, which a batch "
            "gives on a CPU only (a GPU kernel's rounding depends on the batch): run it with scenario.device=cpu"
        )
    swap_slots = int(scenario.swap_space_tokens)

    def make_executor(allocator):
        swap = allocator.num_cpu_blocks * allocator.block_size if allocator.supports_swap else 0
        allocator.record_copies = True
        return real.executor(allocator, swap, async_scheduling)

    # first: its throwaway executor's graph mode resets torch.compile (plugins/graphs/piecewise.py),
    # which after the measured one's compile would discard it into the first measured step
    warm_up(cfg, real, int(scenario.get("warmup_steps", 0)), num_slots)
    engine = build_engine(cfg, model_spec, num_slots, make_executor, swap_slots=swap_slots)
    engine.step_clock = step_clock(scenario, device, async_scheduling)
    engine.executor.use_clock(engine.step_clock)  # its phases on the steps' clock, so they add up
    engine.more_memory = pool_hint(kv_bytes, num_slots, engine.allocator)
    engine.swap_pool_key = f"scenario.swap_space_tokens (now {scenario.swap_space_tokens}) to at least {{longest}}"
    # compile and capture before the first step, so no step's time includes it: on a CPU a graph
    # mode captures nothing, but piecewise compiles its split forward here (0.3 s on tiny)
    engine.executor.capture_graphs(int(cfg.scheduler.max_num_seqs), int(cfg.scheduler.max_num_batched_tokens))
    if prepare is not None:
        prepare(engine)
    if checking:
        engine.recorder.keep_sequences = True
    if async_scheduling:
        check_async_supported(requests, engine.allocator)
        engine.executor = AsyncScheduling(engine.executor, engine.recorder, len(requests))
    gc.collect()
    gc.disable()  # a collection would land in whichever step it happened to interrupt
    try:
        row = engine.run(requests)
    finally:
        gc.enable()
    executor = engine.executor
    if async_scheduling:
        executor.drain()
    row.update(
        executor.time_split(engine.recorder.schedule_s, engine.recorder.step_dt),
        async_scheduling=async_scheduling,
        dropped_requests=requests.dropped,
    )
    row.update(preemption_report(engine, model_spec, hardware, row), swap_time_s=executor.swap_s)
    if any(r.prefix_id >= 0 for r in requests):
        row["prefix_hit_rate_radix"] = radix_hit_rate(r.prompt_tokens for r in requests)
    rate = float(served["rate"])
    sampling = real.sampling
    if interpreted:
        log.warning(
            "the Triton kernels ran under its interpreter (TRITON_INTERPRET=1): these times are not performance"
        )
    row.update(
        interpreted=interpreted,
        device=str(device),
        dtype=model_spec.dtype,
        # a trace's own arrival times leave the rate unread: none is recorded (run.identity's rule)
        rate="" if timed_trace(cfg) else "inf" if math.isinf(rate) else rate,
        clock=str(scenario.get("clock", "wall")),
        sampling="greedy" if sampling.greedy else f"t={sampling.temperature},top_p={sampling.top_p}",
    )
    if checking:
        row["tokens_checked"] = check_tokens(real, engine.recorder.finished)
    return row, engine


def check_tokens(real: RealModel, finished) -> int:
    """Every finished sequence's tokens against one-request generation (kvbench.model.reference:
    the same model alone, each token recomputed from the whole sequence, no cache, no batch);
    the number of sequences checked. One that differs is an error: the allocator, backend or
    graph mode under test computed a wrong token, and the run's numbers are of a wrong engine."""
    from kvbench.model.reference import beam_search_alone, generate_alone

    requests: dict = {}
    for seq in finished:
        requests.setdefault(seq.request.request_id, (seq.request, []))[1].append(seq)
    log.info("checking %d sequences against one-request generation", len(finished))
    wrong, checked = [], 0
    with torch.inference_mode():
        for rid, (request, seqs) in sorted(requests.items()):
            prompt, start = request.prompt_tokens, request.prompt_len
            checked += len(seqs)
            if request.beam_width > 1:
                beams = beam_search_alone(real.model, prompt, request.output_len, request.beam_width)
                if sorted(s.token_ids[start:] for s in seqs) != sorted(tokens for tokens, _ in beams):
                    wrong.append(f"request {rid}'s beams")
                continue
            for s in seqs:
                alone = generate_alone(real.model, prompt, request.output_len, real.sampling, rid, s.sample_index)
                if list(s.token_ids[start:]) != alone:
                    at = next((i for i, (a, b) in enumerate(zip(s.token_ids[start:], alone)) if a != b), len(alone))
                    wrong.append(f"request {rid} sample {s.sample_index}, from its output token {at}")
    if wrong:
        raise UserError(
            f"{len(wrong)} of {checked} sequences' tokens differ from one-request generation (first: {wrong[0]}): "
            f"the engine computed a wrong token with these settings"
        )
    return checked


def run(cfg: DictConfig) -> list[dict]:
    return [serve(cfg)[0]]
