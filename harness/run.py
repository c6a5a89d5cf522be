"""One measured point: turn a composed config into plugins, run its scenario, return result rows."""

from __future__ import annotations

import importlib
import math

from omegaconf import DictConfig, OmegaConf

from kvbench.errors import UserError
from kvbench.registry import default_registry
from kvbench.spec import Hardware, ModelSpec, kv_capacity_bytes

# A run that names no plugin uses these; the row records what was used.
DEFAULT_PLUGINS = {
    "allocator": {"name": "paged", "block_size": 16},
    "backend": {"name": "eager"},
    "graph": {"name": "eager"},
}
SCENARIOS = {
    "simulate": "kvbench.simulate",
    "serve": "kvbench.serve",
    "kernel": "kvbench.kernel_bench",
}


def plugin_cfg(cfg: DictConfig, kind: str) -> dict:
    chosen = cfg.get(kind)
    if chosen is None:
        return dict(DEFAULT_PLUGINS[kind])
    return OmegaConf.to_container(chosen, resolve=True)


def build_allocator(cfg: DictConfig, model: ModelSpec, num_slots: int):
    options = plugin_cfg(cfg, "allocator")
    cls = default_registry().get("allocator", options.pop("name"))
    unserved = [k for k in dict.fromkeys(model.layer_kinds) if k not in cls.layer_kinds]
    if unserved:
        raise UserError(f"allocator {cls.name} cannot hold the {' and '.join(unserved)} layers of model "
                        f"{model.name} (it holds: {', '.join(cls.layer_kinds)}); use +allocator=hybrid "
                        f"(allocator.policy=as_full keeps every layer as full attention)")
    return cls(num_slots=num_slots, max_model_len=model.max_model_len, model=model, **options)


def kv_slots(cfg: DictConfig, model: ModelSpec, hardware: Hardware) -> int:
    kv_bytes = kv_capacity_bytes(model, hardware, cfg.engine.get("kv_cache_bytes"))
    if kv_bytes <= 0:
        raise UserError(
            f"{model.name} weights ({model.weight_bytes / 1e9:.1f} GB) leave no KV memory on "
            f"{hardware.num_gpus} x {hardware.name} at utilization {hardware.gpu_memory_utilization}; "
            f"raise hardware.num_gpus or set engine.kv_cache_bytes")
    return int(kv_bytes // model.kv_bytes_per_token)


def resolve_device(choice: str):
    """The torch device a real run uses: `auto` is cuda when torch sees one, else cpu."""
    import torch  # here, not at the top: simulate never needs torch

    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice not in ("cpu", "cuda"):
        raise UserError(f"scenario.device={choice!r} is not one of auto, cpu, cuda")
    if choice == "cuda" and not torch.cuda.is_available():
        raise UserError("scenario.device=cuda but torch sees no CUDA device; use auto or cpu")
    return torch.device(choice)


def load_specs(cfg: DictConfig) -> tuple[ModelSpec, Hardware]:
    return (ModelSpec.from_cfg(OmegaConf.to_container(cfg.model, resolve=True)),
            Hardware.from_cfg(OmegaConf.to_container(cfg.hardware, resolve=True)))


def identity(cfg: DictConfig) -> dict:
    rate = float(cfg.workload.rate)
    return {
        "scenario": cfg.scenario.name,
        "allocator": plugin_cfg(cfg, "allocator")["name"],
        "backend": plugin_cfg(cfg, "backend")["name"],
        "graph": plugin_cfg(cfg, "graph")["name"],
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "workload": cfg.workload.kind,
        "seed": cfg.seed,
        "block_size": plugin_cfg(cfg, "allocator").get("block_size", ""),
        "rate": "inf" if math.isinf(rate) else rate,
    }


def run_point(cfg: DictConfig) -> list[dict]:
    name = cfg.scenario.name
    if name not in SCENARIOS:
        raise UserError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    rows = importlib.import_module(SCENARIOS[name]).run(cfg)
    head = identity(cfg)
    return [{**head, **row} for row in rows]
