"""scenario=simulate: memory-constrained serving of a workload on a modelled GPU.

The executor group chooses where step times come from: `roofline` (the default) models them
from the hardware's peaks, `calibrated` predicts them from a profile measured on a real device.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

from kvbench.core import workload
from kvbench.core.engine import Engine
from kvbench.core.radix import radix_hit_rate
from kvbench.errors import UserError
from kvbench.executors.cost_model import CostModelExecutor, preemption_costs
from kvbench.scenarios.build import build_engine, kv_slots, load_specs, plugin_cfg

log = logging.getLogger("kvbench")

EXECUTORS = ("roofline", "calibrated")


def preemption_report(engine: Engine, model, hardware, row: dict) -> dict:
    return preemption_costs(
        model,
        hardware,
        engine.allocator.block_size,
        row["swapped_blocks"],
        row["recomputed_tokens"],
        engine.scheduler.recomputed_pairs,
    )


def make_executor(cfg: DictConfig, model, hardware) -> tuple:
    """The configured executor and the columns that name it in the result row."""
    chosen = cfg.get("executor") or {"name": "roofline"}
    name = str(chosen.get("name"))
    if name not in EXECUTORS:
        raise UserError(f"executor={name!r} is not one of {', '.join(EXECUTORS)}")
    if name == "roofline":
        # The roofline times a step from its totals and the hardware alone: no backend or graph
        # mode enters it, so a row that named one would label numbers it never had.
        unmodelled = [f"{kind}={n}" for kind in ("backend", "graph") if (n := plugin_cfg(cfg, kind)["name"]) != "eager"]
        if unmodelled:
            raise UserError(
                f"executor=roofline does not model {' or '.join(unmodelled)}: its step times are the same "
                f"for every backend and graph mode; time a backend with scenario=kernel, both with scenario=serve, or "
                f"simulate with executor=calibrated executor.profile=PATH (a profile measured with them)"
            )
        return CostModelExecutor(model, hardware), {"executor": "roofline"}
    from kvbench.executors.calibrated import (
        CalibratedExecutor,
        check_profile,
        load_profile,
        local_device_name,
        model_shape,
    )

    path = chosen.get("profile")
    if not path:
        raise UserError("executor=calibrated needs executor.profile=PATH (a profile.csv from bench scenario=profile)")
    profile = load_profile(str(path))
    expected = {
        "model": model.name,
        "model_shape": model_shape(model),
        "dtype": model.dtype,
        "backend": plugin_cfg(cfg, "backend")["name"],
        "graph": plugin_cfg(cfg, "graph")["name"],
    }
    device = str(chosen.get("device", "local"))
    if device != "any":
        expected["device"] = local_device_name() if device == "local" else device
    check_profile(profile, expected)
    profiled = str(profile.identity["device"])
    chip = hardware.name.split("-")[0].lower()  # a100 of a100-40gb: the GPU the pool is sized for
    if cfg.engine.get("kv_cache_bytes") is None and chip not in profiled.lower():
        # the pool would be the modelled GPU's memory less the weights: 75 million slots for tiny
        raise UserError(
            f"executor=calibrated with a profile measured on {profiled}: the KV pool would be hardware="
            f"{hardware.name}'s, not that device's; set engine.kv_cache_bytes to the KV memory of the device "
            f"you model (docs/simulator.md runs small with engine.kv_cache_bytes=16777216), or hardware= that GPU"
        )
    report = profile.report
    time_scale = float(chosen.get("time_scale", 1.0))
    return CalibratedExecutor(profile, model, hardware, time_scale), {
        "executor": "calibrated",
        "executor_time_scale": time_scale,
        "executor_profile": profile.path,
        "executor_profile_sha256": profile.sha256,
        "executor_fit_form": report.model.form,
        "executor_fit_heldout_median_err": report.heldout_median,
        "executor_fit_heldout_max_err": report.heldout_max,
        "executor_device": profile.identity["device"],
        # the KV layout its steps were timed with, beside this run's (a paged gather is not a
        # contiguous read: the eager backend on a CPU timed the contiguous layout's steps 17 %
        # shorter, docs/simulator.md); a profile from another layout is used, and the console says so
        "executor_profile_layout": _layout(profile.rows[0].get("allocator")),
        "kv_layout": _layout(plugin_cfg(cfg, "allocator")["name"]),
    }


def _layout(allocator: str | None) -> str:
    """The KV layout allocator `allocator` keeps (its class's `layout`); "" where unknown."""
    from kvbench.registry import default_registry

    cls = default_registry().classes("allocator").get(allocator or "")
    return getattr(cls, "layout", "") or ""


def simulate(cfg: DictConfig, prepare=None) -> tuple[dict, Engine]:
    """One simulated run: its result row and the engine (whose recorder holds the steps);
    `prepare(engine)` is called before the run starts."""
    model, hardware = load_specs(cfg)
    requests = workload.generate(
        OmegaConf.to_container(cfg.workload, resolve=True),
        int(cfg.seed),
        model.max_model_len,
        vocab_size=model.vocab_size,
    )
    executor, columns = make_executor(cfg, model, hardware)
    engine = build_engine(cfg, model, kv_slots(cfg, model, hardware), lambda allocator: executor)
    if prepare is not None:
        prepare(engine)
    row = engine.run(requests)
    row.update(preemption_report(engine, model, hardware, row), device="simulated", dropped_requests=requests.dropped)
    row.update(columns)
    if any(r.prefix_id >= 0 for r in requests):
        row["prefix_hit_rate_radix"] = radix_hit_rate(r.prompt_tokens for r in requests)
    return row, engine


def refuse_async(cfg: DictConfig) -> None:
    if cfg.engine.get("async_scheduling"):
        raise UserError(
            "engine.async_scheduling=true is measured by scenario=serve: the simulator's step times do "
            "not model scheduling overlapping the step before; drop it here"
        )


def preflight(cfg: DictConfig) -> None:
    """What a run refuses before it simulates (scenarios.run.preflight): async scheduling, and an
    executor that cannot be built (executor=calibrated without a readable profile of this model
    and device)."""
    refuse_async(cfg)
    make_executor(cfg, *load_specs(cfg))


def run(cfg: DictConfig) -> list[dict]:
    refuse_async(cfg)
    return [simulate(cfg)[0]]
