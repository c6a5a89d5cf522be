"""The schema of every config group: one pydantic model per group (or per option), types and ranges side by side.

A field is one line: `name: Type = Field(default, range...)`. Ranges are the physical ones
(> 0, in [0, 1), whole numbers) plus an upper bound past which a value is a typo on any machine
this harness runs on. Floats are finite unless a field says `allow_inf_nan=True` (workload.rate:
inf = every request at t=0); booleans accept only true / false; integers accept whole numbers
(`1e3` is 1000) and refuse `1.5` and booleans.
"""

from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from kvbench.schema.messages import show


def _not_bool(value):
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")
    return value


Int = Annotated[int, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]


def _finite_or_inf(rate: float) -> float:
    if math.isfinite(rate) and rate > 1e9:
        raise ValueError("must be <= 1e9 requests/s, or inf (every request at t=0)")
    return rate


Rate = Annotated[float, Field(gt=0, allow_inf_nan=True), BeforeValidator(_not_bool), AfterValidator(_finite_or_inf)]
Bool = StrictBool
DType = Literal["fp32", "fp16", "bf16", "fp8"]
Device = Literal["auto", "cpu", "cuda"]
TB = 2**40  # bytes: no memory, pool or link in this harness's range reaches 2**50


class Section(BaseModel):
    """A config group's node: unknown keys and NaN / inf are errors. A model's validator is
    built when it first validates (`defer_build`): a run checks only its own groups' models, and
    importing this module took 0.13-0.18 s with every validator built, 0.10-0.14 s deferred."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True, defer_build=True)


# --- top-level sections -------------------------------------------------------------------------


class Engine(Section):
    kv_cache_bytes: Float | None = Field(None, gt=0, le=1024 * TB)
    preemption: Literal["recompute", "swap"] = "recompute"
    swap_space_bytes: Float = Field(4.0e9, ge=0, le=1024 * TB)
    async_scheduling: Bool = False


class Scheduler(Section):
    max_num_seqs: Int = Field(256, ge=1, le=1_000_000)
    max_num_batched_tokens: Int = Field(2560, ge=1, le=100_000_000)
    chunked_prefill: Bool = False
    watermark_when_idle: Bool = True


class Measure(Section):
    warmup_frac: Float = Field(0.333, ge=0, lt=1)
    save_requests: Bool = True


def _milliseconds(value):
    """A goodput SLO: null (no limit) or a finite number of milliseconds in (0, 1e12]."""
    if value is None:
        return None
    try:
        number = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not math.isfinite(number) or not number > 0:
        raise ValueError("must be a number of milliseconds > 0, or null for no limit")
    if number > 1e12:
        raise ValueError("must be a number of milliseconds > 0 and <= 1e12")
    return number


SLO = Annotated[float | None, BeforeValidator(_milliseconds)]


class Goodput(Section):
    """vLLM's --goodput ttft:MS tpot:MS e2el:MS; an unknown key lists these three."""

    ttft_ms: SLO = Field(None, gt=0, le=1e12, description="time to first token limit, ms; null = no limit")
    tpot_ms: SLO = Field(None, gt=0, le=1e12, description="time per output token limit, ms; null = no limit")
    e2el_ms: SLO = Field(None, gt=0, le=1e12, description="end-to-end latency limit, ms; null = no limit")


SLO_MAX_S = 1e6  # the largest latency target, s/token: report.slo_s_per_token and bench-report --slo


class Report(Section):
    paper: Literal["fig2", "fig12", "fig13", "fig14_15", "fig18", "fig19"] | None = None
    slo_s_per_token: Float = Field(0.5, gt=0, le=SLO_MAX_S)
    baseline: str | None = "contiguous"

    @field_validator("baseline")
    @classmethod
    def _registered_allocator(cls, name):
        from kvbench.registry import default_registry

        known = default_registry().classes("allocator")
        if name is not None and name not in known:
            raise ValueError(f"must be a registered allocator: {', '.join(known)}")
        return name

    goodput: Goodput = Goodput()


class Sweep(Section):
    point_timeout_s: Float = Field(24 * 3600.0, gt=0, le=30 * 24 * 3600.0)


# --- model / hardware ---------------------------------------------------------------------------


class Model(Section):
    name: str = Field(pattern=r"\S", description="the model's name in result rows")
    num_layers: Int = Field(ge=1, le=10_000, description="decoder layers")
    hidden_size: Int = Field(ge=1, le=1_000_000, description="residual stream width")
    num_heads: Int = Field(ge=1, le=10_000, description="query heads per layer")
    num_kv_heads: Int = Field(ge=1, le=10_000, description="K/V heads per layer (< num_heads: GQA); divides num_heads")
    head_dim: Int = Field(ge=1, le=65_536, description="dimension of one head")
    num_params: Float = Field(gt=0, le=1e15, description="parameters, for the weights' bytes and the roofline's FLOPs")
    max_model_len: Int = Field(
        ge=1, le=100_000_000, description="longest prompt + output; Orca(Max) reserves this many slots"
    )
    dtype: DType = Field("fp16", description="weights and KV cache element type")
    vocab_size: Int = Field(50272, ge=1, le=100_000_000, description="token ids are drawn below this")
    intermediate_size: Int = Field(
        0, ge=0, le=10_000_000, description="MLP width of the serve model; 0 = 4 x hidden_size"
    )
    layer_pattern: list[Literal["full", "window", "linear"]] = Field(
        [], description="layer kinds repeated over the layers; empty = every layer full attention"
    )
    window: Int = Field(0, ge=0, le=100_000_000, description="sliding window of window layers, tokens")
    linear_state_dim: Int = Field(0, ge=0, le=65_536, description="per-head state width of linear layers")
    rope_theta: Float = Field(10000.0, gt=0, le=1e12, description="RoPE base of the serve model")
    num_active_params: Float = Field(
        0.0, ge=0, le=1e15, description="parameters one token uses (mixture of experts); 0 = all"
    )

    @model_validator(mode="after")
    def _shape(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        if "window" in self.layer_pattern and self.window < 1:
            raise ValueError(f"window={self.window} must be > 0 for window layers")
        if "window" in self.layer_pattern and self.window > self.max_model_len:
            raise ValueError(
                f"window={self.window} must be <= max_model_len={self.max_model_len}: no sequence is longer"
            )
        if "linear" in self.layer_pattern and self.linear_state_dim < 1:
            raise ValueError(f"linear_state_dim={self.linear_state_dim} must be > 0 for linear layers")
        if self.num_active_params > self.num_params:
            raise ValueError(f"num_active_params={self.num_active_params:g} must be <= num_params={self.num_params:g}")
        pattern = self.layer_pattern or ["full"]
        kinds = {pattern[i % len(pattern)] for i in range(min(self.num_layers, len(pattern)))}  # the layers it has
        if not {"full", "window"} & kinds:  # every pool is sized in K/V bytes a token: none would be no pool
            raise ValueError(
                f"layer_pattern=[{','.join(self.layer_pattern)}] gives the model's {self.num_layers} layer(s) no "
                f"attention layer, whose K/V the KV pool holds: give it a full or window layer among the linear ones"
            )
        if len(self.layer_pattern) > self.num_layers:  # its entries past the last layer would be dropped unread
            raise ValueError(
                f"layer_pattern has {len(self.layer_pattern)} entries for {self.num_layers} layer(s): it repeats over "
                f"the layers, so give at most num_layers={self.num_layers} entries"
            )
        return self


class Hardware(Section):
    name: str = Field(pattern=r"\S", description="the hardware's name in result rows")
    # Lower bounds in physical units: a value in GB/s or TFLOP/s where bytes/s or FLOP/s are
    # meant (peak_flops=312) would otherwise simulate steps of days and report them.
    hbm_bytes_per_s: Float = Field(ge=1e9, le=1024 * TB, description="device memory bandwidth in bytes/s, e.g. 1555e9")
    peak_flops: Float = Field(ge=1e9, le=1e20, description="dense peak at the model's dtype in FLOP/s, e.g. 312e12")
    memory_bytes: Float = Field(gt=0, le=1024 * TB, description="device memory per GPU, bytes")
    pcie_bytes_per_s: Float = Field(
        25e9, ge=1e6, le=1024 * TB, description="host-device copy rate for swapping in bytes/s, e.g. 25e9"
    )
    copy_latency_s: Float = Field(10e-6, ge=0, le=1.0)
    # below 1 % of its peak a device is not the one this profile names (1e-300 gave infinite step times)
    hbm_efficiency: Float = Field(1.0, ge=0.01, le=1, description="achievable / peak bandwidth, in [0.01, 1]")
    flops_efficiency: Float = Field(1.0, ge=0.01, le=1, description="achievable / peak compute, in [0.01, 1]")
    step_overhead_s: Float = Field(0.0, ge=0, le=60.0)
    gpu_memory_utilization: Float = Field(0.9, gt=0, le=1)
    num_gpus: Int = Field(1, ge=1, le=100_000, description="tensor-parallel degree: GPUs sharing each layer's heads")
    allreduce_latency_s: Float = Field(
        9e-6, ge=0, le=1.0, description="fixed cost of one tensor-parallel all-reduce in s (2 a layer a step)"
    )
    allreduce_bytes_per_s: Float = Field(
        200e9, ge=1e6, le=1024 * TB, description="an all-reduce's bus bandwidth in bytes/s, e.g. 200e9 (NVLink)"
    )


# --- workload: one model per kind ---------------------------------------------------------------


class Workload(Section):
    kind: str = Field(description="the length distribution (the workload config's name)")
    rate: Rate = 4.0
    duration_s: Float | None = Field(None, gt=0, le=1e9)
    num_requests: Int | None = Field(None, ge=1, le=100_000_000)
    burstiness: Float = Field(1.0, ge=1e-3, le=1e3)
    n: Int = Field(1, ge=1, le=1024)
    beam_width: Int = Field(1, ge=1, le=1024)
    prefix_len: Int = Field(0, ge=0, le=100_000_000)
    num_prefixes: Int = Field(1, ge=1, le=1_000_000)
    path: str | None = None
    shuffle: Bool = False
    strict: Bool = False
    # keys every workload config carries (path: null, for sweeps over traces) but one kind reads
    read_only_by: ClassVar[dict[str, str]] = {"path": "trace", "shuffle": "trace", "strict": "trace"}

    @model_validator(mode="after")
    def _arrivals(self):
        if self.n > 1 and self.beam_width > 1:
            raise ValueError("n and beam_width cannot both be > 1")
        if self.kind != "trace" and self.num_requests is None and math.isinf(self.rate):
            raise ValueError("rate=inf sends every request at t=0, so duration_s cannot bound them: set num_requests")
        if self.kind != "trace" and self.num_requests is None and self.duration_s is None:
            raise ValueError("set num_requests or duration_s: one of them must bound the run")
        unread = [(key, kind) for key, kind in self.read_only_by.items() if kind != self.kind and getattr(self, key)]
        if unread:
            (key, kind), *_ = unread
            setting = f"{key}={show(getattr(self, key))}"
            raise ValueError(f"{setting} is read by workload={kind} only; workload={self.kind} would ignore it")
        return self


class DatasetWorkload(Workload):
    kind: Literal["sharegpt", "alpaca"] = Field(description="the length distribution: choose it with workload=NAME")


class FixedWorkload(Workload):
    kind: Literal["fixed"]
    input_len: Int = Field(ge=1, le=100_000_000, description="prompt tokens (uniform: the range's centre)")
    output_len: Int = Field(ge=1, le=100_000_000, description="output tokens (uniform: the range's centre)")


class UniformWorkload(FixedWorkload):
    kind: Literal["uniform"]
    range_ratio: Float = Field(0.5, ge=0, lt=1, description="lengths uniform in [L(1-r), L(1+r)]")


class TraceWorkload(Workload):
    kind: Literal["trace"]
    path: str = Field(description="the trace CSV: input_len,output_len[,arrival_s]")

    @field_validator("path")
    @classmethod
    def _readable_csv(cls, path: str) -> str:
        if path in ("???", ""):  # `workload.path=` is the empty string, which names the working directory
            raise ValueError("is required: workload.path=FILE.csv (columns input_len,output_len[,arrival_s])")
        file = Path(path)  # which drops a trailing /, where the system refuses one after a file
        if path.endswith("/") and file.is_file():
            raise ValueError(f"{path} names a file as a folder: drop the trailing /")
        if not file.exists():
            raise ValueError(f"file {path} does not exist")
        if file.is_dir():
            raise ValueError(f"{path} is a directory, not a CSV file")
        if not file.is_file():
            raise ValueError(f"{path} is not a regular file (a device or a pipe), not a CSV file")
        try:
            file.read_bytes().decode("utf-8")
        except PermissionError:
            raise ValueError(f"{path} cannot be read (permission denied)") from None
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text (byte {err.start}): not a CSV file") from None
        return path


WORKLOADS = {
    "sharegpt": DatasetWorkload,
    "alpaca": DatasetWorkload,
    "fixed": FixedWorkload,
    "uniform": UniformWorkload,
    "trace": TraceWorkload,
}


# --- scenario: one model per name ---------------------------------------------------------------


class Simulate(Section):
    name: Literal["simulate"] = Field(description="the scenario: choose it with scenario=NAME")


class Sampling(Section):
    temperature: Float = Field(0.0, ge=0, le=100)
    top_p: Float = Field(1.0, gt=0, le=1)


class Serve(Section):
    name: Literal["serve"]
    device: Device = "auto"
    dtype: Literal["auto", "fp32", "fp16", "bf16"] = "auto"
    cpu_threads: Int | None = Field(1, ge=1, le=4096)
    kv_cache_tokens: Int = Field(4096, ge=1, le=10**10)
    swap_space_tokens: Int = Field(8192, ge=0, le=10**10)
    num_requests: Int | None = Field(64, ge=1, le=100_000_000)
    rate: Rate | None = float("inf")
    sampling: Sampling = Sampling()
    clock: Literal["wall", "cpu"] = "wall"
    cpu_affinity: list[Annotated[Int, Field(ge=0, le=65535)]] | None = None
    warmup_steps: Int = Field(3, ge=0, le=10_000)
    check_tokens: Bool = Field(False, description="check every sequence's tokens against one-request generation")


Length = Annotated[Int, Field(ge=1, le=100_000_000)] | Literal["max"]


class Profile(Section):
    name: Literal["profile"]
    device: Device = "auto"
    dtype: Literal["auto", "fp32", "fp16", "bf16"] = "auto"
    cpu_threads: Int | None = Field(1, ge=1, le=4096)
    clock: Literal["wall", "cpu"] = "wall"
    cpu_affinity: list[Annotated[Int, Field(ge=0, le=65535)]] | None = None
    warmup: Int = Field(2, ge=0, le=10_000)
    repeats: Int = Field(5, ge=1, le=10_000)
    burst: Int = Field(3, ge=1, le=1_000)
    fit_to: Literal["median", "mean"] = "mean"
    # the fit times prefill and decode steps apart: each phase needs a shape (mixed steps may go)
    prefill_len: list[Length] = Field([16, 64, 256, "max"], min_length=1)
    prefill_seqs: list[Annotated[Int, Field(ge=1, le=1_000_000)]] = Field([1, 4], min_length=1)
    decode_batch: list[Annotated[Int, Field(ge=1, le=1_000_000)]] = Field([1, 4, 16, 64, 256], min_length=1)
    decode_context: list[Length] = Field([16, 64, 256, "max"], min_length=1)
    mixed_batch: list[Annotated[Int, Field(ge=1, le=1_000_000)]] = [4, 32]
    mixed_prefill_len: list[Length] = [32, 256]
    kv_cache_tokens: Int = Field(65536, ge=1, le=10**10)
    heldout_frac: Float = Field(0.25, ge=0, lt=1)
    out_dir: str | None = None


def changes_to(section: type[Section], name: str) -> type[Section]:
    """`section`'s keys, each unset unless given: the changes validate makes to the serve and
    profile scenarios it runs (`serve:`, `profiling:`), checked as those scenarios check them."""
    (scenario,) = typing.get_args(section.model_fields["name"].annotation)
    fields = {
        key: (
            info.annotation | None,
            FieldInfo.merge_field_infos(
                info, default=None, description=f"scenario={scenario}'s {key} (scenario.{key}), for validate's runs"
            ),
        )
        for key, info in section.model_fields.items()
        if key != "name"
    }
    return create_model(name, __base__=Section, **fields)


ServeChanges = changes_to(Serve, "ServeChanges")
ProfileChanges = changes_to(Profile, "ProfileChanges")


class Validate(Section):
    name: Literal["validate"]
    profile: str | None = None
    runs: Int = Field(2, ge=1, le=1000)
    load: Float | None = Field(0.8, gt=0, le=100)
    kv_cache_tokens: Int = Field(8192, ge=1, le=10**10)
    probe_every: Int = Field(200, ge=1, le=10**9)
    replay_window: Int = Field(101, ge=1, le=10**6)
    out_dir: str | None = None
    serve: ServeChanges = ServeChanges()
    profiling: ProfileChanges = ProfileChanges()


class Kernel(Section):
    name: Literal["kernel"]
    device: Device = "auto"
    min_run_time_s: Float = Field(0.2, gt=0, le=3600)
    warmup_ms: Float = Field(25, ge=0, le=3_600_000)
    rep_ms: Float = Field(100, gt=0, le=3_600_000)
    cuda_graph: Bool = True
    paging_overhead: Bool = True
    check_error: Bool = True


SCENARIOS = {"simulate": Simulate, "serve": Serve, "kernel": Kernel, "profile": Profile, "validate": Validate}


class RooflineExecutor(Section):
    name: Literal["roofline"] = Field(description="simulate's step times: choose with executor=NAME")


class CalibratedExecutor(Section):
    name: Literal["calibrated"]
    profile: str | None = None
    device: str = "local"
    time_scale: Float = Field(1.0, ge=0.01, le=100)


EXECUTORS = {"roofline": RooflineExecutor, "calibrated": CalibratedExecutor}


# --- plugins: built-in options; a third-party plugin's are checked against its constructor -----

BlockSize = Field(
    16,
    ge=1,
    le=256,
    description="tokens per block: paged's page; the unit the reserving allocators round and place ranges in",
)
Watermark = Field(0.01, ge=0, lt=1)


class Plugin(Section):
    name: str = Field(description="the plugin's registered name (a third-party one too)")


class ReservingAllocator(Plugin):
    name: Literal["contiguous", "oracle", "pow2"] = Field(description="the allocator: choose it with +allocator=NAME")
    block_size: Int = BlockSize
    placement: Literal["buddy", "first_fit"] = "buddy"


class PagedAllocator(Plugin):
    name: Literal["paged"]
    block_size: Int = BlockSize
    watermark: Float = Watermark
    prefix_caching: Bool = False


class HybridAllocator(PagedAllocator):
    name: Literal["hybrid"]
    policy: Literal["shared", "static", "as_full"] = "shared"


class Backend(Plugin):
    name: Literal["eager", "triton_paged", "flashinfer"] = Field(description="the attention backend: +backend=NAME")


class Graph(Plugin):
    name: Literal["eager", "full", "piecewise"] = Field(description="the graph mode: +graph=NAME")
    capture_sizes: list[Annotated[Int, Field(ge=1, le=1000000)]] | None = None

    @field_validator("capture_sizes")
    @classmethod
    def _increasing(cls, sizes):
        if sizes is not None and (not sizes or any(b <= a for a, b in zip(sizes, sizes[1:]))):
            raise ValueError("must be a non-empty list of sizes in increasing order, e.g. [1, 2, 4, 8]")
        return sizes


PLUGINS = {
    "allocator": {
        "contiguous": ReservingAllocator,
        "oracle": ReservingAllocator,
        "pow2": ReservingAllocator,
        "paged": PagedAllocator,
        "hybrid": HybridAllocator,
    },
    "backend": {name: Backend for name in ("eager", "triton_paged", "flashinfer")},
    "graph": {name: Graph for name in ("eager", "full", "piecewise")},
}


class Root(Section):
    """The keys of bench.yaml itself; each group node is checked by its own model."""

    seed: Int = Field(0, ge=0, le=2**32 - 2)
    batch: str = "32d1k"
    progress: Bool = True
    plots: Bool | Literal["auto"] = True
    profile: Bool = False
    repeats: Int = Field(1, ge=1, le=10_000)
    engine: Engine = Engine()
    scheduler: Scheduler = Scheduler()
    measure: Measure = Measure()
    sweep: Sweep = Sweep()
    report: Report = Report()
    # an experiment's own table (conf/experiment/NAME.yaml): per-workload rates and arrivals
    fig12: dict | None = Field(None, description="+experiment=fig12's point on each workload's rate curve")
    fig13: dict | None = Field(None, description="+experiment=fig13's rate and arrivals per workload")
    fig14_15: dict | None = Field(None, description="+experiment=fig14_15's sharing mode, width and arrivals")
    fig18: dict | None = Field(None, description="+experiment=fig18's rate and arrivals per workload")

    @field_validator("batch", mode="before")
    @classmethod
    def _batch_spec(cls, text):
        from kvbench.errors import UserError
        from kvbench.scenarios.batch_spec import parse

        try:
            parse(str(text))
        except UserError as err:
            raise ValueError(str(err).split(": ", 1)[-1]) from None
        return str(text)
