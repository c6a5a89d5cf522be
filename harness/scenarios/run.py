"""One measured point: turn a composed config into plugins, run its scenario, return result rows."""

from __future__ import annotations

import importlib
import math

from omegaconf import DictConfig

from kvbench.errors import UserError
from kvbench.scenarios.build import plugin_cfg
from kvbench.scenarios.repeats import run_repeated

SCENARIOS = {
    "simulate": "kvbench.scenarios.simulate",
    "serve": "kvbench.scenarios.serve",
    "kernel": "kvbench.scenarios.kernel",
    "profile": "kvbench.scenarios.profile",
    "validate": "kvbench.scenarios.validate_simulator",
}


def identity(cfg: DictConfig) -> dict:
    served = cfg.scenario.get("rate") if cfg.scenario.name == "serve" else None  # serve's replaces the workload's
    rate = float(cfg.workload.rate if served is None else served)
    seed = cfg.seed
    if isinstance(seed, float) and seed.is_integer():  # seed=1e3 is seed 1000 (the schema took it so)
        seed = int(seed)
    # a kernel times one batch and a profile fixed shapes: neither reads a workload, and a
    # profile times the device it runs on (a kernel's roofline names its own, roofline_hardware).
    # A served run's `hardware` is the profile its modelled preemption costs read; the `device`
    # column names what it ran on, and its titles say that (figures.context_title)
    shapes = cfg.scenario.name in ("kernel", "profile")
    return {
        "scenario": cfg.scenario.name,
        "allocator": plugin_cfg(cfg, "allocator")["name"],
        "backend": plugin_cfg(cfg, "backend")["name"],
        "graph": plugin_cfg(cfg, "graph")["name"],
        "model": cfg.model.name,
        "hardware": "" if shapes else cfg.hardware.name,
        "workload": "" if shapes else cfg.workload.kind,
        "seed": seed,
        "block_size": plugin_cfg(cfg, "allocator").get("block_size", ""),
        # a trace's own arrival times leave workload.rate unread: no rate is recorded
        "rate": "" if shapes or timed_trace(cfg) else "inf" if math.isinf(rate) else rate,
    }


def timed_trace(cfg: DictConfig) -> bool:
    if cfg.workload.kind != "trace":
        return False
    from kvbench.core.workload import trace_has_arrival_times

    return trace_has_arrival_times(str(cfg.workload.get("path") or ""))


# scenarios whose run checks its config first with a `preflight(cfg)` of its own, which --cfg job
# and a sweep's check before its first point run too (a module is imported only to ask it)
PREFLIGHT = ("simulate", "validate", "profile", "serve")


def preflight(cfg: DictConfig) -> None:
    """What the point's scenario checks before it runs anything (its files, its combinations),
    asked without running it: a config --cfg job printed, or a sweep checked, must not pass it."""
    name = cfg.scenario.name
    if name in PREFLIGHT:
        importlib.import_module(SCENARIOS[name]).preflight(cfg)


def run_point(cfg: DictConfig) -> list[dict]:
    name = cfg.scenario.name
    if name not in SCENARIOS:
        raise UserError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    scenario = importlib.import_module(SCENARIOS[name])
    rows = run_repeated(name, cfg.get("repeats", 1), lambda: scenario.run(cfg))
    head = identity(cfg)
    return [{**head, **row} for row in rows]
