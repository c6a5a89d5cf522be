"""The `bench` command: a Hydra app that runs one point (or, with -m, a sweep) and writes its rows.

Hydra parses the command line and composes the config; kvbench.schema checks the result before
anything runs. Bad input ends a run with one line on stderr and exit code 2 (kvbench.errors).
Inside a sweep a failing point is recorded (status=failed, with the reason) and the sweep goes
on; the sweep then exits 2 naming the first failure. Re-running a sweep into its directory
(hydra.sweep.dir=...) skips the points an earlier run completed with the same config and code
(kvbench.sweep).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import math
import os
import re
import sys
from functools import partial
from importlib import resources
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError, InterpolationResolutionError, OmegaConfBaseException

import kvbench
from kvbench import launch, schema, sweep
from kvbench.core import recorder, request_log
from kvbench.errors import (
    UserError,
    exit_interrupted,
    exit_with,
    guarded_stdout,
    one_line,
    reportable,
)
from kvbench.profiling import profiled
from kvbench.reporting.results import IDENTITY, environment, write_csv

log = logging.getLogger("kvbench")
single_run_done = False  # a single run ended well: `bench` may leave at once (kvbench.launch.leave)
sweep_dir: str | None = None  # the sweep being run, for the line an interrupted sweep ends with

# ${kvbench.pid:} in a run directory's name keeps runs started in the same second apart
OmegaConf.register_new_resolver("kvbench.pid", os.getpid, use_cache=True, replace=True)


def _field_docs(*, _root_) -> str:
    from kvbench.schema import groups
    from kvbench.schema.docs import help_text

    names = {}
    for group in groups.PLUGINS:
        try:  # a name that does not resolve (${oc.env:UNSET}): the run says so, the help still shows
            names[group] = OmegaConf.select(_root_, f"{group}.name", default=None)
        except Exception:  # noqa: BLE001 (OmegaConf's errors, and a resolver's own)
            names[group] = None
    plugins = {g: name for g, name in names.items() if isinstance(name, str) and name not in groups.PLUGINS[g]}
    searchpath = OmegaConf.select(_root_, "hydra.searchpath", default=None) or []
    return help_text(OmegaConf.select(_root_, "hydra.runtime.choices", default=None), plugins, list(searchpath))


def _config_groups(*, _root_) -> str:
    from kvbench.schema.docs import groups_text

    return groups_text(list(OmegaConf.select(_root_, "hydra.searchpath", default=None) or []))


OmegaConf.register_new_resolver("kvbench.field_docs", _field_docs, replace=True)
OmegaConf.register_new_resolver("kvbench.config_groups", _config_groups, replace=True)


def point_dirname(overrides: str) -> str:
    """A sweep point's directory name: its overrides, with every character a file name cannot
    safely hold (a path's slashes) replaced, and a short hash of the original when anything was
    replaced or cut, so two points never share a directory."""
    safe = re.sub(r"[^A-Za-z0-9._=,+-]", "_", overrides)[:150]
    if safe == overrides:
        return safe
    return f"{safe}-{hashlib.sha1(overrides.encode()).hexdigest()[:8]}"


# hydra.sweep.subdir (conf/bench.yaml) names each point's directory through this resolver; a
# joblib worker registers it too, when it imports this module to run the task function.
OmegaConf.register_new_resolver("point_dirname", point_dirname, replace=True)


def not_measured() -> list[str]:
    """The keys in no point's name or column: conf/bench.yaml's override_dirname.exclude_keys,
    which a command line may extend."""
    return list(HydraConfig.get().job.config.override_dirname.exclude_keys)


@functools.lru_cache(maxsize=1)
def run_mode_keys() -> tuple[str, ...]:
    """The keys that change how a point runs or is reported, not what it measures: the packaged
    conf/bench.yaml's override_dirname.exclude_keys, before a command line extends them."""
    packaged = OmegaConf.load(str(resources.files("kvbench.conf") / "bench.yaml"))
    return tuple(packaged.hydra.job.config.override_dirname.exclude_keys)


def unfingerprinted() -> list[str]:
    """The keys a point's fingerprint leaves out: those of not_measured() that only change how it
    runs (run_mode_keys). A key a command line adds to exclude_keys (workload.num_requests) still
    shapes what the point measures, so a rerun that changes it runs the point again."""
    return [key for key in not_measured() if key in run_mode_keys()]


def split_override(item: str) -> tuple[str, str]:
    """`+key=value`, `~key` or `key=value` as (key, value)."""
    key, _, value = item.lstrip("+~").partition("=")
    return key, value


def point_overrides() -> dict:
    """The swept / overridden parameters of this point, as identity columns (the groups in
    IDENTITY have their own; another group chosen, such as +preset=vllm, is a column of its own)."""
    hydra_cfg = HydraConfig.get()
    skipped = set(not_measured()) | (set(hydra_cfg.runtime.choices) & set(IDENTITY))
    return {key: value for key, value in map(split_override, hydra_cfg.overrides.task) if key not in skipped}


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
# read at a sweep's end (summary, report, paper comparison): a single run would ignore them
SWEEP_END_KEYS = ("report.paper", "report.baseline", "report.slo_s_per_token")


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
            overridden += [f"{key}.{sub}" for v in _values(item) if isinstance(v, dict) for sub in v]
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


def failed_rows(cfg: DictConfig) -> list[dict]:
    from kvbench.scenarios.run import identity

    try:
        return [identity(cfg)]
    except Exception:  # the identity itself may be what is invalid
        return [{}]


def preset_allocator_clash(preset: str | None, allocator: str | None) -> None:
    if preset == "vllm" and allocator not in (None, "paged"):
        raise UserError(
            f"+preset=vllm configures vLLM's paged allocator (conf/preset/vllm.yaml), not allocator={allocator}: "
            f"drop +allocator={allocator}, or the preset"
        )


def refuse_preset_clash() -> None:
    """+preset=vllm sets the paged allocator's knobs: another allocator would be refused for a
    key it lacks, with no word of the preset that set it."""
    choices = HydraConfig.get().runtime.choices
    preset, allocator = choices.get("preset"), choices.get("allocator")
    preset_allocator_clash(preset, allocator)
    chosen = [split_override(o)[0] for o in HydraConfig.get().overrides.task]
    if (
        preset == "vllm"
        and {"allocator", "preset"} <= set(chosen)
        and chosen.index("allocator") > chosen.index("preset")
    ):
        raise UserError(  # composed after the preset, the allocator's own YAML replaced its settings
            "+allocator=... after +preset=vllm replaces the settings the preset gives the paged allocator "
            "(watermark, prefix caching): drop it (the preset chooses paged), or put it before +preset=vllm"
        )


def task_config(config: DictConfig) -> DictConfig:
    """A composed config without its `hydra` node: the config a point's run is handed."""
    return OmegaConf.masked_copy(config, [key for key in config if key != "hydra"])


# files a run reads, given relative to where `bench` was launched
INPUT_PATHS = ("workload.path", "executor.profile", "scenario.profile")


def from_the_launch_folder(cfg: DictConfig) -> None:
    """A relative input path read where `bench` was launched, not in the run's folder, which
    hydra.job.chdir=true makes the working directory."""
    from hydra.utils import to_absolute_path

    if Path.cwd() == Path(HydraConfig.get().runtime.cwd):
        return
    for key in INPUT_PATHS:
        path = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        if isinstance(path, str) and path.strip() and not Path(path).is_absolute():
            OmegaConf.update(cfg, key, to_absolute_path(path))


def check_run_config(cfg: DictConfig) -> None:
    """What a run checks of its config before it runs anything (HydraConfig set)."""
    from_the_launch_folder(cfg)
    refuse_preset_clash()
    schema.settle_whole_numbers(cfg, schema.validate(cfg))
    refuse_unread_overrides(cfg)
    from kvbench.scenarios.build import load_specs, refuse_plugins_that_cannot_meet
    from kvbench.scenarios.run import preflight

    refuse_plugins_that_cannot_meet(cfg, load_specs(cfg)[0])
    preflight(cfg)


def run_checked(cfg: DictConfig, out_dir: Path) -> list[dict]:
    from kvbench.scenarios.run import run_point

    check_run_config(cfg)
    with sweep.deadline(float(cfg.sweep.point_timeout_s)), profiled(cfg, out_dir):
        return run_point(cfg)


def refuse_deleted_keys(overrides: list[str]) -> None:
    """`~key` deletes a key or section that every run reads (a group's choice may go: `~allocator`).
    Checked before Hydra composes: a key whose value is null it would call missing."""
    deleted = [item for item in overrides if item.startswith("~")]
    if not deleted:
        return
    from kvbench.schema.docs import schema_fields

    read = schema_fields()
    for item in deleted:
        key = split_override(item)[0]
        setting = (o for o in overrides if not o.startswith("~") and split_override(o)[0].startswith(f"{key}."))
        inside = next(setting, None)
        if inside is not None:  # `~workload workload.num_requests=20`: Hydra's line would say to add it with +
            raise UserError(f"{inside} sets a key of {key}, which {item} deletes: drop one of them")
        if "/" in key or _is_group(key):  # a group's choice (hydra/launcher, allocator) may go
            continue
        if key in read:
            raise UserError(f"{item} deletes a key every run reads: set it instead ({key}=VALUE)")
        if any(field.startswith(f"{key}.") for field in read):
            raise UserError(f"{item} deletes a section every run reads: set its keys instead ({key}.KEY=VALUE)")


def _draw_early(cfg: DictConfig, out_dir: Path, helper, sent: list, shares: dict) -> None:
    """Hand the helper a single run's figure job from its KV shares and identity, all the figure
    shows (run_figure.draw_run): the figure is drawn while the summary's latencies, the row and
    the console table are made, not after (0.11 s off a 10,000-request run's end)."""
    from kvbench.scenarios.run import identity

    if not sent:
        helper.send({"job": "run", "rows": [{**identity(cfg), **shares, "status": "ok"}], "out": str(out_dir)})
        sent.append(helper)


def run_point_and_record(cfg: DictConfig, out_dir: Path, multirun: bool) -> None:
    drawing_early: list = []  # the helper that had the figure's job from the summary
    if not multirun:
        paper = OmegaConf.select(cfg, "report.paper")
        known = bool(paper) and (resources.files("kvbench.conf") / "experiment" / f"{paper}.yaml").is_file()
        if (
            known
        ):  # written by SweepSummary, at a sweep's end: a single run would end without it (another: the schema's)
            forced = bool(HydraConfig.get().sweeper.get("params"))  # an experiment's sweep, run as one
            fix = "drop hydra.mode=RUN" if forced else f"run +experiment={paper} (the paper's sweep), or add -m"
            raise UserError(
                f"report.paper={paper} compares a sweep with the paper when the sweep ends, and this is one run: {fix}"
            )
        for key, value in map(split_override, HydraConfig.get().overrides.task):
            if key in SWEEP_END_KEYS:
                raise UserError(
                    f"{key}={value} is read when a sweep ends (its report); a single run would ignore it: "
                    f"add -m, or drop it"
                )
        # the helper of this single run of `bench` writes its requests.jsonl (core/request_log),
        # and draws a simulated run's figure as soon as its KV shares are known (recorder.shares_ready)
        helper = launch.run_helper()
        token = request_log.follower.set(helper)
        early = helper is not None and cfg.plots is True and cfg.scenario.name == "simulate"
        hook = recorder.shares_ready.set(partial(_draw_early, cfg, out_dir, helper, drawing_early) if early else None)
        try:
            rows, status, reason = run_checked(cfg, out_dir), "ok", ""
        finally:
            request_log.follower.reset(token)
            recorder.shares_ready.reset(hook)
    else:
        # a subdir that resolved only now (../p${hydra.job.num}): the check before the sweep could not see it
        try:
            refuse_nested_folders([str(HydraConfig.get().sweep.subdir)])
        except UserError:
            sweep.remove_if_bare(out_dir, (".hydra", "cli.log"))  # what Hydra made there for the point
            if Path(sweep_dir).resolve() not in folders_before:  # and the sweep's folder, if it made it
                sweep.remove_if_bare(Path(sweep_dir), ("multirun.yaml", sweep.LOCK))
            raise
        try:
            current = sweep.fingerprint(cfg, unfingerprinted())
        except Exception:  # a config that does not resolve: the schema check below says why
            current = {}
        skip, why = sweep.resume(out_dir, current) if current else (False, "")
        if skip:
            log.info("skipped %s: %s", out_dir.name, why)
            return
        if why:
            log.info("re-running %s: %s", out_dir.name, why)
        try:
            rows, status, reason = run_checked(cfg, out_dir), "ok", ""
        except Exception as err:  # bad input, out of memory, a crashed kernel: recorded, the sweep goes on
            if not reportable(err):
                log.exception("point %s crashed", out_dir.name)
            reason = one_line(err) if reportable(err) else f"{type(err).__name__}: {one_line(err)}"
            log.warning("point %s failed: %s", out_dir.name, reason)
            rows, status = failed_rows(cfg), "failed"
    env = environment()
    overridden = point_overrides()
    options = {key: value for key, value in sweep.plugin_options(cfg).items() if key not in overridden}
    for row in rows:
        # an identity column the row has is the value the run read (seed=1e3 ran, and is, seed 1000)
        row.update({key: value for key, value in overridden.items() if key not in IDENTITY or key not in row})
        row.update({key: value for key, value in options.items() if key not in row})
        row.setdefault("device", "simulated" if cfg.scenario.name == "simulate" else "cpu")  # a failed point's
        row.update(status=status, reason=reason, **env)
    drawing = not multirun and cfg.plots is True
    helper = launch.current() if drawing else None
    if helper is not None:  # `bench`'s helper draws the figure while the row is written and printed here
        helper.send({"job": "run", "rows": rows, "out": str(out_dir)})
    elif drawing and drawing_early:  # it has had the job since the summary had the shares
        helper = drawing_early[0]
    write_csv(out_dir / "metrics.csv", rows)
    if multirun and current:
        sweep.write_fingerprint(out_dir, current)
    if status == "ok":
        log.info("wrote %s", out_dir / "metrics.csv")
    if not multirun:  # a sweep prints its table and draws its comparison plots once, at its end
        from kvbench.reporting.console import run_table, validation_table

        if status == "ok" and rows[0].get("scenario") == "validate":  # a row a metric
            print(validation_table(rows))
        else:
            for row in rows:
                print(run_table(row))
        if drawing:
            done = helper.result() if helper is not None else None
            if done is None:
                from kvbench.reporting.run_figure import draw_run

                done = {"written": draw_run(rows, out_dir)}
            for path in done["written"]:
                log.info("wrote %s", path)
        global single_run_done
        single_run_done = status == "ok"


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="bench")
def _main(cfg: DictConfig) -> None:
    global sweep_dir
    # a log line to a console closed early is dropped, not a traceback: a joblib worker's console
    # is not the guarded one (GuardedStdout), and its Hydra-made handlers write to the closed pipe
    logging.raiseExceptions = False
    out_dir, multirun = Path(HydraConfig.get().runtime.output_dir), HydraConfig.get().mode == RunMode.MULTIRUN
    sweep_dir = str(HydraConfig.get().sweep.dir) if multirun else None
    try:
        run_point_and_record(cfg, out_dir, multirun)
    except Exception as err:  # here, not in main(): Hydra would print a line of its own first
        if isinstance(err, OmegaConfBaseException):  # seed=${seed}, seed=${nope}: resolved as the run reads it
            from kvbench.schema.hydra_errors import hydra_line

            line = hydra_line(err)
            given = [o for o in sys.argv[1:] if "${" in o and "=" in o]  # the values that did not resolve
            key = getattr(err, "full_key", None) or ", ".join(given)
            if line is not None:
                exit_with(UserError(f"{key}: {line}" if key and not line.startswith(str(key)) else line))
        if not reportable(err):
            raise
        exit_with(err)


def mode_is_the_command_lines(args) -> bool:
    """Whether the run mode follows from the command line alone: -m or not (composing_once then
    skips get_mode's composition). In kvbench's configs only the experiment group sets the mode,
    so this holds unless the command line chooses an experiment, sets hydra.mode or a search
    path, names another primary config, or chooses a group option that is not one of kvbench's
    own (a plugin's YAML might set the mode)."""
    if args.multirun:  # a config's mode can only be MULTIRUN too (or RUN, which -m overrides)
        return True
    if args.config_path or args.config_name or args.config_dir:
        return False
    conf = resources.files("kvbench.conf")
    for key, value in map(split_override, args.overrides):
        if key.startswith(("hydra.mode", "hydra.searchpath")) or key == "experiment":
            return False
        group = conf / key
        if "." not in key and "/" not in key and value and group.is_dir() and not (group / f"{value}.yaml").is_file():
            return False
    return True


def refuse_unreadable_rerun(path: str) -> None:
    """--experimental-rerun FILE: Hydra unpickles a run's .hydra/config.pickle; a file that is not
    one, or none at all, is refused in one line."""
    import pickle

    if not Path(path).is_file():  # Hydra's own line spoke of overrides
        raise UserError(
            f"--experimental-rerun {path}: {'is a directory' if Path(path).is_dir() else 'no such file'}; give a "
            f"run's .hydra/config.pickle (written with +hydra.callbacks.save_job_info._target_="
            f"hydra.experimental.callbacks.PickleJobInfoCallback)"
        )
    try:
        with open(path, "rb") as file:
            config = pickle.load(file)
    except Exception as err:  # noqa: BLE001 (whatever unpickling raises: the file is not a pickled config)
        config = err
    if not isinstance(config, DictConfig):
        raise UserError(
            f"--experimental-rerun {path}: not a config Hydra pickled ({type(config).__name__}); give a run's "
            f".hydra/config.pickle"
        )


def refuse_replacing_a_run(cfg: DictConfig) -> None:
    """A single run into a folder that holds an earlier run's metrics.csv would replace its
    results (Hydra writes its .hydra/ there before the run starts): refused while composing. So
    is a run into a sweep's folder (and a sweep into a run's: refuse_a_sweep_into_a_run):
    bench-report reads a sweep's points from its subfolders, so the run's row would go unread."""
    try:
        if OmegaConf.select(cfg, "hydra.mode") == RunMode.MULTIRUN:
            return
        folder = OmegaConf.select(cfg, "hydra.run.dir")
    except OmegaConfBaseException:  # a folder named by what only the job knows (${hydra.job.id})
        return
    if not folder:
        return
    folder = Path(folder)
    if (folder / "metrics.csv").is_file():
        raise UserError(
            f"hydra.run.dir={folder} holds an earlier run's metrics.csv, which this run would replace: give "
            f"a new folder (or move that one away)"
        )
    if (folder / "multirun.yaml").is_file() or any(folder.glob("*/metrics.csv")):
        raise UserError(
            f"hydra.run.dir={folder} holds a sweep's points: a run's result would go unread beside them; give "
            f"a new folder"
        )


def refuse_a_sweep_into_a_run(cfg: DictConfig) -> None:
    """A sweep into a single run's folder: the sweep's summary reads its points' subfolders, not
    the run's metrics.csv beside them."""
    try:
        folder = OmegaConf.select(cfg, "hydra.sweep.dir")
    except OmegaConfBaseException:  # a folder named by what only the job knows
        return
    if folder and (Path(folder) / "metrics.csv").is_file():
        raise UserError(
            f"hydra.sweep.dir={folder} holds a single run's metrics.csv, which the sweep's summary would not "
            f"read; give a new folder"
        )


@contextlib.contextmanager
def composing_once(args):
    """Hydra, for the length of one `main`, composing each config it runs once.

    - Hydra's `get_mode` composes the whole config once more, only to read `hydra.mode`; that is
      skipped where `mode_is_the_command_lines(args)` (about 0.1 s of a short run).
    - Hydra's sweeper composes every point's config to check a batch before it launches any
      point, and its launcher composed each again to run it (about 0.15 s a point: the README's
      sweep took 6.9 s so, 6.3 s without). The check keeps what it composed and the launcher
      takes each checked config once, so a bad point still stops a sweep before its first point
      runs. A launcher that composes in another process (joblib, submitit) composes there.

    docs/design.md has the measurements."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra
    from hydra.plugins.sweeper import Sweeper

    compose = ConfigLoaderImpl.load_sweep_config
    checked: dict[tuple, object] = {}
    # a run, not a look at its config (--cfg, --info, --help); Hydra's rerun of a pickled config
    # composes nothing, so the run-folder check never meets it
    looks = (args.cfg, args.info)
    running = all(look is None for look in looks) and not (args.help or args.hydra_help or args.shell_completion)
    swept_folders: set[str] = set()  # the point folders of this sweep's batches so far

    def validate_batch_is_legal(self, batch) -> None:
        global sweep_dir  # an interrupt before the first point ends names the sweep's folder too
        sweep_dir = str(OmegaConf.select(self.config, "hydra.sweep.dir", default=None) or "") or None
        loader = getattr(self, "hydra_context", None)
        loader = loader.config_loader if loader is not None else self.config_loader
        for overrides in batch:
            checked[tuple(overrides)] = compose(loader, master_config=self.config, sweep_overrides=list(overrides))
        configs = [checked[tuple(overrides)] for overrides in batch]
        refuse_swept_experiments(batch)
        for config in configs:  # before refuse_twice_swept: the preset makes the points one
            choices = OmegaConf.select(config, "hydra.runtime.choices", default=None) or {}
            preset_allocator_clash(choices.get("preset"), choices.get("allocator"))
        refuse_absent_baseline(batch, configs)
        refuse_unmeasured_sweeps(batch)
        refuse_twice_swept(batch, configs)
        folders = point_folders(configs)  # None: they resolve only as each point launches
        if folders is not None:
            subdir = OmegaConf.to_container(self.config.hydra.sweep, resolve=False).get("subdir")
            refuse_a_sweep_of_nothing(str(subdir), folders)
            refuse_nested_folders(folders)
            refuse_shared_folders(batch, folders)
            refuse_other_sweeps_points(sweep_dir, folders, swept_folders)
        refuse_bad_points(batch, configs)  # last: the sweep's own shape is checked first

    def load_sweep_config(self, master_config, sweep_overrides):
        config = checked.pop(tuple(sweep_overrides), None)
        return config if config is not None else compose(self, master_config, sweep_overrides)

    load, apply = ConfigLoaderImpl.load_configuration, ConfigLoaderImpl._apply_overrides_to_config
    getting_mode: list = []  # not empty while Hydra's get_mode composes, only to read hydra.mode
    swept: set[str] = set()  # while a sweep's master config composes: the groups its points choose
    master: list = []  # not empty while a sweep's master config composes

    def load_configuration(self, config_name, overrides, run_mode, *args, **kwargs):
        if run_mode != RunMode.MULTIRUN:
            cfg = load(self, config_name, overrides, run_mode, *args, **kwargs)
            if running:
                refuse_replacing_a_run(cfg)
            return cfg
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(list(overrides))
        swept.update(o.key_or_group for o in parsed if o.is_sweep_override() and "." not in o.key_or_group)
        master.append(True)
        try:
            cfg = load(self, config_name, overrides, run_mode, *args, **kwargs)
            if running and not getting_mode:  # before Hydra writes the sweep's multirun.yaml there
                refuse_a_sweep_into_a_run(cfg)
            return cfg
        finally:
            swept.clear()
            master.clear()

    def apply_overrides(overrides, cfg) -> None:
        # A key of a group the points choose (-m +allocator=paged,hybrid allocator.block_size=32)
        # has no node in the master config, which composes without the swept groups: each
        # point's config applies it. So has a group an experiment's own sweep chooses (its
        # hydra.sweeper.params sweep +allocator, and the command line gives allocator.watermark).
        params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None) if master else None
        chosen = {str(key).lstrip("+~") for key in params or {} if "." not in str(key)}
        apply([o for o in overrides if o.key_or_group.split(".")[0] not in (swept | chosen) - set(cfg)], cfg)

    show = Hydra.show_cfg

    def show_cfg(self, config_name, overrides, cfg_type, package, resolve=False) -> None:
        """`--cfg job|all` prints the config, then checks it as a run would: a config a run
        refuses is printed, then refused (one line, exit code 2), not shown as if it would run."""
        shown: list = []  # the config printed (job, or all: job and hydra)
        sanitize = self.get_sanitized_cfg

        def keep_printed(cfg, kind):
            shown.append(sanitize(cfg, kind))
            return shown[-1]

        self.get_sanitized_cfg = keep_printed  # show_cfg composes and prints without handing it back
        try:
            show(self, config_name, overrides, cfg_type, package, resolve)
        finally:
            del self.get_sanitized_cfg
        if cfg_type in ("job", "all") and shown:
            sys.stdout.flush()
            try:
                check_run_config(task_config(shown[0]))
                from hydra.types import RunMode

                from kvbench.reporting.paper import check_experiment, report_settings

                full = self.compose_config(config_name, overrides, run_mode=RunMode.MULTIRUN)  # with its hydra node
                check_experiment(full, report_settings(full.get("report"))["paper"])  # what the sweep's start refuses
            except UserError as err:
                raise UserError(f"{err} (the config printed above is one a run refuses)") from None

    patches = [
        (Hydra, "show_cfg", show_cfg),
        (Sweeper, "validate_batch_is_legal", validate_batch_is_legal),
        (ConfigLoaderImpl, "load_sweep_config", load_sweep_config),
        (ConfigLoaderImpl, "load_configuration", load_configuration),
        (ConfigLoaderImpl, "_apply_overrides_to_config", staticmethod(apply_overrides)),
    ]
    if mode_is_the_command_lines(args):  # None: RUN, or MULTIRUN with -m (Hydra's _run_app)
        patches.append((Hydra, "get_mode", lambda self, config_name, overrides: None))
    else:  # an experiment's mode: get_mode composes to read it, and takes any error for "not MULTIRUN"
        get_mode = Hydra.get_mode

        def reading_the_mode(self, *args, **kwargs):
            getting_mode.append(True)  # the checks wait for the composition that runs
            try:
                return get_mode(self, *args, **kwargs)
            finally:
                getting_mode.pop()

        patches.append((Hydra, "get_mode", reading_the_mode))
    originals = [(owner, name, vars(owner)[name]) for owner, name, _ in patches]  # a staticmethod as it is
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def refuse_swept_experiments(batch) -> None:
    """Before a sweep's first point: `-m +experiment=fig2,fig13` would run one default point of
    each, not their sweeps (an experiment's sweep is its own command's), and compare none."""
    chosen = {value for overrides in batch for key, value in map(split_override, overrides) if key == "experiment"}
    if len(chosen) > 1:
        names = sorted(chosen)
        raise UserError(
            f"+experiment is swept ({', '.join(names)}): each experiment is a sweep of its own, which a sweep "
            f"over experiments would not run; run them one at a time (bench +experiment={names[0]}, ...)"
        )


def _is_group(key: str) -> bool:
    return (
        "." not in key
        and "/" not in key
        and key != "hydra"
        and ((resources.files("kvbench.conf") / key).is_dir() or key in schema.PLUGIN_GROUPS)
    )


def _parsed(items) -> list:
    """`items` as Hydra's parser reads overrides; [] where one does not parse (Hydra says why
    in its own words when it composes)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(list(items))
    except Exception:  # noqa: BLE001
        return []


def _values(item: str) -> list:
    """The values an override gives, as Hydra parses them (each of a sweep's)."""
    parsed = _parsed([item])
    value = parsed[0].value() if parsed else []
    return list(getattr(value, "list", None) or [value]) if not isinstance(value, list) else [value]


def refuse_empty_ranges(overrides: list[str]) -> None:
    """`-m seed=range(0,0)`: a sweep of no points, refused before Hydra launches it (it would
    announce 0 jobs and leave a sweep folder behind)."""
    from hydra.core.override_parser.types import RangeSweep

    for override in _parsed(overrides):
        value = override.value()
        if not isinstance(value, RangeSweep) or value.step == 0:  # a step of 0: Hydra's own line says so
            continue
        if next(override.sweep_iterator(), None) is None:
            raise UserError(
                f"{override.input_line} gives no value (range(start, stop, step) stops before it starts): "
                f"the sweep would have no points"
            )


def refuse_unusable_hydra_paths(overrides: list[str]) -> None:
    """`hydra.run.dir=''` wrote a run's files into the current folder; a search path that names
    no folder or package was a multi-line warning, then "unknown allocator" for its plugin."""
    import importlib.util

    for item in overrides:
        key, value = split_override(item)
        if key in ("hydra.run.dir", "hydra.sweep.dir") and not any(str(v).strip() for v in _values(item)):
            raise UserError(f"{key} is empty: give a folder (left out, kvbench makes one under results/)")
        if key.endswith(".out_dir") and any(isinstance(v, str) and not v.strip() for v in _values(item)):
            raise UserError(f"{key} is empty: give a folder, or null for the run's own")
        if key != "hydra.searchpath":
            continue
        for entry in (e for v in _values(item) for e in (v if isinstance(v, list) else [v])):
            entry = str(entry)
            if entry.startswith("file://") and not Path(entry[len("file://") :]).is_dir():
                raise UserError(f"hydra.searchpath names {entry}, which is no folder: give file:///path/to/conf")
            if entry.startswith("pkg://"):
                module = entry[len("pkg://") :].replace("/", ".")
                try:
                    found = importlib.util.find_spec(module) is not None
                except (ImportError, ValueError):  # its parent package is not installed
                    found = False
                except Exception as err:  # noqa: BLE001 (the package raised as it was imported)
                    raise UserError(
                        f"a package of hydra.searchpath cannot be imported ({type(err).__name__}: {err}): fix or "
                        f"uninstall it"
                    ) from None
                if not found:
                    raise UserError(
                        f"hydra.searchpath names {entry}, but no installed package has {module}: install the "
                        f"package, or name its config folder with file://"
                    )


INF_SPELLED = re.compile(r"(?i)(?<![\w.])[-+]?inf(inity)?(?![\w.])")


def _infinities(value) -> int:
    """How many infinite floats a parsed override value holds (a list's or a dict's too)."""
    if isinstance(value, float):
        return int(math.isinf(value))
    if isinstance(value, dict):
        return sum(_infinities(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_infinities(v) for v in value)
    bounds = [getattr(value, name, None) for name in ("start", "stop", "step", "end")]  # range(), interval()
    return sum(isinstance(b, float) and math.isinf(b) for b in bounds)


def refuse_overflowing_numbers(overrides: list[str]) -> None:
    """`workload.rate=1e400`: Hydra reads a number beyond a float's range as inf, and the run
    would put every request at t=0 without a word. An infinity the command line does not spell
    `inf` is refused; a name such as `run-1e999` is Hydra's text, not a number."""
    for item in overrides:
        values = _values(item)
        if any(hasattr(v, "stop") and _infinities(v) for v in values):  # range(1,inf) would never end
            raise UserError(f"{item.lstrip('+~')}: a range() sweep needs finite start, stop and step")
        if _infinities(values) > len(INF_SPELLED.findall(split_override(item)[1])):
            raise UserError(
                f"{item.lstrip('+~')} holds a number beyond a float's range (about 1.8e308), which reads as "
                f"infinite: give a finite number, or inf where a key takes it (workload.rate=inf)"
            )


def refuse_null_groups(overrides: list[str]) -> None:
    """`hardware=null` (NULL, or null among a sweep's values): Hydra's words are "Config group
    override must be a string or a list"."""
    for item in overrides:
        key, value = split_override(item)
        if "null" in value.lower() and _is_group(key) and None in _values(item):
            plus = item[: len(item) - len(item.lstrip("+"))]  # a plugin group is added with +
            raise UserError(
                f"{item} chooses no option of the {key} group: choose one with {plus}{key}=NAME "
                f"(bench --help lists them)"
            )


def refuse_keys_given_twice(overrides: list[str]) -> None:
    """`seed=0,1 seed=2,3`: Hydra keeps the last list silently, and the sweep would be another
    than the one asked for (one value after another keeps the last, as a command line does).
    And `model={num_layers:20}` (alone or among a sweep's values): a group's keys set through a
    dict, which no column of the row records (its name stays the option's); `model=[a,b]`, two
    options merged into one config, the row naming the last."""
    seen: dict[str, str] = {}
    for item in overrides:
        key, value = split_override(item)
        if "{" in value and _is_group(key) and any(isinstance(v, dict) for v in _values(item)):
            raise UserError(
                f"{item} sets keys of the {key} group through a dict, which the result row would not record: set "
                f"each key instead ({key}.KEY=VALUE; {key}=NAME chooses one of its options)"
            )
        if "[" in value and _is_group(key) and any(isinstance(v, list) for v in _values(item)):
            raise UserError(
                f"{item} lists several options of the {key} group, which would be merged into one config while "
                f"the row names the last: choose one ({key}=NAME), or sweep them (-m {key}=A,B)"
            )
        if key in seen and _sweeps(seen[key], item):  # one value after another: the last wins, as usual
            raise UserError(
                f"{key} is given twice ({seen[key]} and {item}); the last would replace the first, and its points "
                f"would be another sweep's: give one list of every value to sweep"
            )
        seen[key] = item


def _sweeps(*overrides: str) -> bool:
    """Whether any of `overrides` sweeps a list of values (a,b / range() / glob() ...)."""
    return any(o.is_sweep_override() for o in _parsed(overrides))


def refuse_unmeasured_sweeps(batch) -> None:
    """`-m progress=true,false`: keys that change how a point runs, not what it measures
    (run_mode_keys), name no point folder, so two points would be one (it read "hydra.sweep.subdir
    gives a point the folder '.'", or "keep the default subdir", which was the one in use)."""
    if len(batch) < 2:
        return
    values: dict[str, set] = {}
    for overrides in batch:
        for key, value in map(split_override, overrides):
            values.setdefault(key, set()).add(value)
    unmeasured = sorted(key for key, seen in values.items() if len(seen) > 1 and key in run_mode_keys())
    if unmeasured:
        one = len(unmeasured) == 1
        raise UserError(
            f"the sweep varies {', '.join(unmeasured)}, which {'changes' if one else 'change'} how a point runs, "
            f"not what it measures: {'it names' if one else 'they name'} no point folder, so two points would "
            f"be one; give {'it' if one else 'each'} one value"
        )


def refuse_a_sweep_of_nothing(subdir: str, folders: list[str]) -> None:
    """`bench -m` with no values to sweep (or only settings that name no point): under the
    default subdir (`subdir`: its text, unresolved), which names a point by its overrides, its
    one point had no name, and was refused as a subdir of '.', which nobody gave."""
    if [os.path.normpath(f) for f in folders] == ["."] and "point_dirname" in subdir:
        raise UserError(
            "-m sweeps the values given as lists (-m +allocator=paged,contiguous workload.rate=1,2); with none to "
            "sweep, run once without -m"
        )


def refuse_nested_folders(folders: list[str]) -> None:
    """A point's folder must be a folder of the sweep's own: the sweep finds its points, and a
    rerun its finished ones, at SWEEP/*/metrics.csv."""
    for folder in map(os.path.normpath, folders):  # s0/ and ./s0 are s0
        if Path(folder).name != folder or folder in (".", ".."):
            raise UserError(
                f"hydra.sweep.subdir gives a point the folder {folder!r}, not a folder directly in the sweep's: the "
                f"sweep finds its points at hydra.sweep.dir/*/metrics.csv; give a subdir without / or .."
            )


def point_folders(configs) -> list[str] | None:
    """Each point's folder name, or None where one resolves only as its point launches (a
    subdir of ${hydra.job.num})."""
    try:
        return [str(OmegaConf.select(c, "hydra.sweep.subdir", throw_on_resolution_failure=True)) for c in configs]
    except Exception:  # noqa: BLE001 (any resolution failure: the checks below are skipped)
        return None


def refuse_other_sweeps_points(sweep_dir: str | None, folders: list[str], swept: set[str]) -> None:
    """Before a sweep's first point: a sweep folder that holds results of points this sweep does
    not run (a corrected sweep into the folder of the first, the same value spelled 1 and then
    1.0). Its summary, report, paper comparison and exit code cover every point in the folder:
    the earlier sweep's failed points would fail this one, its rows would be averaged in."""
    swept.update(folders)
    if not sweep_dir:
        return
    others = sorted(p.parent.name for p in Path(sweep_dir).glob("*/metrics.csv") if p.parent.name not in swept)
    if others:
        listed = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise UserError(
            f"{sweep_dir} holds points this sweep does not run ({listed}), which its summary and report "
            f"would count; give a new hydra.sweep.dir, or this folder's whole list of points again (its "
            f"finished points are skipped), or remove those folders"
        )


def refuse_shared_folders(batch, folders: list[str]) -> None:
    """Before a sweep's first point: points whose folders are one (hydra.sweep.subdir=same) would
    each overwrite the last one's result."""
    for first, (folder, overrides) in enumerate(zip(folders, batch)):
        if folder in folders[:first]:
            other = list(batch[folders.index(folder)])
            apart = [o for o in other if o not in overrides], [o for o in overrides if o not in other]
            raise UserError(
                f"hydra.sweep.subdir gives the points {' '.join(apart[0])} and {' '.join(apart[1])} one folder, "
                f"{folder!r}: each would overwrite the last; keep the default subdir, or one that names each point"
            )


def refuse_twice_swept(batch, configs) -> None:
    """Before a sweep's first point: two points that are one (seed=1000,1e3: Hydra keeps both
    spellings) would run twice and leave two rows of one identity, which no comparison can match."""

    def canonical(value):  # 1e3 is 1000
        if isinstance(value, dict):
            return {k: canonical(v) for k, v in value.items() if k != "hydra"}
        if isinstance(value, list):
            return [canonical(v) for v in value]
        return int(value) if isinstance(value, float) and value.is_integer() else value

    seen: dict[str, list[str]] = {}
    for overrides, config in zip(batch, configs):
        body = json.dumps(canonical(OmegaConf.to_container(config, resolve=False)), sort_keys=True, default=str)
        if body in seen:
            first, second = seen[body], list(overrides)
            apart = [o for o in first if o not in second], [o for o in second if o not in first]
            if not apart[0]:  # the same value listed twice (+allocator=paged,paged)
                raise UserError(
                    f"the sweep runs one point twice ({' '.join(first)}): a value is listed twice; give each once"
                )
            raise UserError(
                f"the sweep runs one point twice: {' '.join(apart[0])} and {' '.join(apart[1])} are the same "
                f"setting; give each value once"
            )
        seen[body] = list(overrides)


def refuse_bad_points(batch, configs) -> None:
    """Before a sweep's first point: a point whose config the schema refuses (`-m workload.rate=1,x`),
    or whose allocator cannot hold its model's layers (`-m model=glob(*)` with paged and a
    sliding-window model), would fail only when its turn came, after the points before it had
    run. What cannot be decided from the config alone (an interpolation that resolves only as
    its point launches) is left to the point, which fails with its own error."""
    from kvbench.scenarios.build import allocator_class, load_specs, refuse_plugins_that_cannot_meet
    from kvbench.scenarios.run import preflight

    traces_read: set[str] = set()  # each trace file's rows are checked once, whatever points share it
    for overrides, config in zip(batch, configs):
        try:
            try:  # resolved here, without the point's own Hydra settings (a ${hydra:...} value fails)
                data = OmegaConf.to_container(task_config(config), resolve=True)
            except (InterpolationKeyError, InterpolationResolutionError) as err:
                # ${nosuch.key}, fig14_15.sharing=foo, fig12.duration_s=5: no launch resolves it
                if isinstance(err, InterpolationKeyError) or "is not a container" in str(err):
                    schema.validate(task_config(config))  # which says so in kvbench's words
                continue
            except Exception:  # noqa: BLE001 (it resolves only as its point launches, or fails there)
                continue
            schema.validate(data)
            point = OmegaConf.create(data)
            model = load_specs(point)[0]
            allocator_class(point, model)
            refuse_plugins_that_cannot_meet(point, model)
            preflight(point)
            refuse_unread_overrides(point, OmegaConf.select(config, "hydra.overrides.task", default=None) or overrides)
            trace = point.workload.get("path") if point.workload.get("kind") == "trace" else None
            if trace and str(trace) not in traces_read:  # a malformed row fails its point only as it runs
                from kvbench.core.workload import load_trace

                load_trace(str(trace))
                traces_read.add(str(trace))
        except UserError as err:
            raise UserError(
                f"the sweep's point {','.join(overrides) or '(no overrides)'} would fail: {err}; "
                f"no point has run: fix or drop that value"
            ) from None
        except Exception:  # noqa: BLE001 (not decidable before the point launches)
            continue


def refuse_absent_baseline(batch, configs) -> None:
    """Before a sweep's first point: a report.baseline given that no point's allocator is (its
    report would end the sweep with this error, every point run)."""
    asked = {value for overrides in batch for key, value in map(split_override, overrides) if key == "report.baseline"}
    asked.discard("null")  # the default: the sweep's first system in the paper's order
    from kvbench.scenarios.build import plugin_cfg  # a point that names no allocator runs the default

    systems = [str(plugin_cfg(c, "allocator")["name"]) for c in configs]
    for name in asked - set(systems):
        raise UserError(
            f"report.baseline={name!r} is not in the sweep; its allocators: "
            f"{', '.join(dict.fromkeys(systems)) or 'none'}"
        )


@contextlib.contextmanager
def missing_package_is_bad_input(parsed):
    """`bench --cfg job -p nope`: Hydra prints that the package is not found and exits 1, the code
    of a crash; it is bad input, one line and exit 2."""
    if parsed.cfg is None or parsed.package is None:
        yield
        return
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            yield
    except SystemExit as err:
        if err.code == 1 and "not found in config" in said.getvalue():
            raise UserError(
                f"-p {parsed.package} names no part of the config: give a group or key that bench --cfg job "
                f"prints (e.g. -p workload, -p scheduler.max_num_seqs)"
            ) from None
        raise
    finally:
        sys.stderr.write(said.getvalue() if "not found in config" not in said.getvalue() else "")


folders_before: set[Path] = set()  # the sweep folders named on the command line that existed before it ran


@guarded_stdout()  # a console closed early costs the console only
def main(argv: list[str] | None = None) -> None:
    """`bench [OVERRIDES]`: every error kvbench can name is one line and exit code 2; a bug in
    kvbench keeps its traceback (HYDRA_FULL_ERROR=1 shows Hydra's own for every error)."""
    from hydra._internal.utils import get_args_parser

    from kvbench.schema.hydra_errors import hydra_line, sweeper_params_line

    global single_run_done, sweep_dir
    single_run_done, sweep_dir = False, None
    folders_before.clear()  # a hydra.sweep.dir that exists already is the user's: never removed
    folders_before.update(
        Path(value).resolve() for key, value in map(split_override, argv or sys.argv[1:]) if key == "hydra.sweep.dir"
    )
    folders_before.intersection_update(path for path in list(folders_before) if path.exists())
    args = sys.argv[1:] if argv is None else list(argv)
    if "--version" in args:  # kvbench's, where Hydra's flag would print only its own
        print(f"kvbench {kvbench.__version__} (Hydra {hydra.__version__})")
        return
    # argparse takes one run of overrides: `bench a=1 -m b=1,2` must reach Hydra as `-m a=1 b=1,2`.
    sys.argv[1:] = sorted(args, key=lambda arg: arg not in ("-m", "--multirun"))
    flags = get_args_parser()  # Hydra's own, parsed here first so a bad flag is one line too
    flags.error = lambda message: exit_with(UserError(f"bench: {message} (see bench --help)"))
    parsed = flags.parse_intermixed_args(sys.argv[1:])  # `a=1 --cfg job b=2`: both overrides
    others = list(sys.argv[1:])
    for override in reversed(parsed.overrides):  # Hydra's parser takes one run of them, after the flags
        del others[len(others) - 1 - others[::-1].index(override)]
    sys.argv[1:] = parsed.overrides + others  # before the flags: `--info` would take a later one for its value
    try:
        if parsed.hydra_help and parsed.overrides:  # Hydra composes its own help: every key read as unknown
            raise UserError(
                "--hydra-help shows Hydra's own flags and takes no overrides: drop them (bench --help shows "
                "kvbench's config with them)"
            )
        if (parsed.help or parsed.hydra_help) and parsed.multirun and _sweeps(*parsed.overrides):
            raise UserError(
                "--help shows one config and its fields: give it one value of each key (or none), without "
                "-m's lists; the sweep runs without --help"
            )
        refuse_null_groups(parsed.overrides)
        refuse_overflowing_numbers(parsed.overrides)
        refuse_unusable_hydra_paths(parsed.overrides)
        refuse_empty_ranges(parsed.overrides)
        refuse_deleted_keys(parsed.overrides)
        refuse_keys_given_twice(parsed.overrides)  # a sweep's, and a group set through a dict
        if parsed.experimental_rerun is not None:
            refuse_unreadable_rerun(parsed.experimental_rerun)
        if parsed.package is not None and parsed.cfg is None:  # Hydra would run the job, the flag unread
            raise UserError("bench: -p/--package selects the part of the config --cfg prints: give --cfg job with it")
    except UserError as err:
        exit_with(err)
    user_setting = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises, and the errors below become one line
    try:
        with composing_once(parsed), missing_package_is_bad_input(parsed):
            _main()
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM / SIGHUP (errors.Terminated)
        if user_setting == "1":
            raise
        if sweep_dir and Path(sweep_dir).resolve() not in folders_before:  # stopped before any point: no folder
            sweep.remove_if_bare(Path(sweep_dir), ("multirun.yaml", sweep.LOCK))
        exit_interrupted(
            f"the points that finished keep their rows in {sweep_dir}; the same command with "
            f"hydra.sweep.dir={sweep_dir} runs only the rest"
            if sweep_dir
            else "the run wrote no result",
            err,
        )
    except Exception as err:
        line = sweeper_params_line(err, [split_override(o)[0] for o in parsed.overrides]) or hydra_line(err)
        if type(err).__name__ == "TerminatedWorkerError" and sweep_dir:  # joblib's: a worker killed (OOM?)
            line = (
                f"a worker process of the joblib launcher died while it ran a point (killed, or out of memory: see "
                f"dmesg); the points that finished keep their rows in {sweep_dir}, and the same command with "
                f"hydra.sweep.dir={sweep_dir} runs only the rest"
            )
        if user_setting == "1" or (line is None and not reportable(err)):
            raise
        if sweep_dir and Path(sweep_dir).resolve() not in folders_before:  # a refused sweep's new folder goes
            sweep.remove_if_bare(Path(sweep_dir), ("multirun.yaml", sweep.LOCK))
        exit_with(UserError(line) if line is not None else err)
    finally:
        sweep.SweepLock.release_all()
        if user_setting is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = user_setting


if __name__ == "__main__":
    # `python -m kvbench.cli` (bench-compare --against runs bench so): run the module by its own
    # name, whose functions a joblib worker can unpickle; __main__'s it cannot
    from kvbench import cli
    from kvbench.errors import end_on_termination

    end_on_termination()
    cli.main()
