"""The one place a composed config becomes plugins and an engine, for every scenario.

Each builder checks what the plugin itself declares before constructing it: an allocator must
hold every layer kind of the model, a backend must support the device / dtype / layout / window.
A graph mode wraps the model's forward, so it is constructed (and checked against the backend)
where the executor wraps the model, by kvbench.plugins.graphs.base.build. The scenarios
(simulate, serve, kernel) call these; nothing else looks plugins up in the registry.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kvbench.arith import tensor_parallel_degrees
from kvbench.core import request_log
from kvbench.core.engine import Engine
from kvbench.core.recorder import Recorder
from kvbench.core.scheduler import Scheduler
from kvbench.core.serving_metrics import goodput_slos
from kvbench.core.spec import Hardware, ModelSpec, kv_capacity_bytes
from kvbench.errors import UserError
from kvbench.registry import default_registry
from kvbench.scenarios import repeats

# A run that names no plugin uses these; the row records what was used.
DEFAULT_PLUGINS = {
    "allocator": {"name": "paged", "block_size": 16},
    "backend": {"name": "eager"},
    "graph": {"name": "eager"},
}


def plugin_cfg(cfg: DictConfig, kind: str) -> dict:
    chosen = cfg.get(kind)
    if chosen is None:
        return dict(DEFAULT_PLUGINS[kind])
    return OmegaConf.to_container(chosen, resolve=True)


def load_specs(cfg: DictConfig) -> tuple[ModelSpec, Hardware]:
    return (
        ModelSpec.from_cfg(OmegaConf.to_container(cfg.model, resolve=True)),
        Hardware.from_cfg(OmegaConf.to_container(cfg.hardware, resolve=True)),
    )


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


def allocator_class(cfg: DictConfig, model: ModelSpec) -> tuple[type, dict]:
    """The configured allocator class and its options; it must hold every layer kind of `model`."""
    options = plugin_cfg(cfg, "allocator")
    cls = default_registry().get("allocator", options.pop("name"))
    unserved = [k for k in dict.fromkeys(model.layer_kinds) if k not in cls.layer_kinds]
    if unserved:
        raise UserError(
            f"allocator {cls.name} cannot hold the {' and '.join(unserved)} layers of model "
            f"{model.name} (it holds: {', '.join(cls.layer_kinds)}); {_other_layers_hint(cfg, unserved)}"
        )
    return cls, options


def _other_layers_hint(cfg: DictConfig, unserved: list[str]) -> str:
    """What runs a model with layers other than full attention, in this scenario: the kernel
    scenario times one full-attention layer and takes no hybrid pool; as_full (every layer sized
    as full attention) is a memory baseline that serves no linear layer."""
    scenario = cfg.scenario.name
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized() and HydraConfig.get().runtime.choices.get("preset") == "vllm":
        return (  # the preset's allocator is paged, and it refuses +allocator=hybrid beside it
            "+preset=vllm configures vLLM's paged allocator, which holds full-attention layers only: run this "
            "model without the preset, with +allocator=hybrid"
        )
    if scenario == "kernel":
        return (
            "scenario=kernel times one full-attention layer on one block table: choose a model whose "
            "layers are all full attention (e.g. model=tiny), or run this one whole with "
            "scenario=serve +allocator=hybrid"
        )
    if scenario == "simulate" or "linear" not in unserved:
        return "use +allocator=hybrid (allocator.policy=as_full sizes every layer as full attention)"
    return "use +allocator=hybrid (policy shared or static: as_full has no state slots for linear layers)"


def build_allocator(cfg: DictConfig, model: ModelSpec, num_slots: int, max_model_len: int | None = None):
    cls, options = allocator_class(cfg, model)
    allocator = cls(num_slots=num_slots, max_model_len=max_model_len or model.max_model_len, model=model, **options)
    if allocator.num_slots > num_slots:  # its rows would report memory the point never had
        raise UserError(
            f"allocator {cls.name} made a pool of {allocator.num_slots} token slots from the {num_slots} it was "
            f"given (KVAllocator.num_slots: at most what the constructor gets)"
        )
    return allocator


def backend_class(cfg: DictConfig, device, dtype, layout: str, windows, where: str = "here") -> type:
    """The configured attention backend class; it must support every window the run needs."""
    name = plugin_cfg(cfg, "backend")["name"]
    cls = default_registry().get("backend", name)
    for window in dict.fromkeys(windows):
        reason = cls.unsupported_reason(device, dtype, layout, window)
        if reason:
            raise UserError(f"backend {name} cannot run {where}: {reason}")
    return cls


def backend_options(cfg: DictConfig) -> dict:
    """The configured backend's options, as its constructor takes them (a plugin's own: the
    built-in backends take none)."""
    options = plugin_cfg(cfg, "backend")
    options.pop("name")
    return options


def graph_mode(cfg: DictConfig) -> tuple[type, dict]:
    """The configured graph mode class and its options (checked against the backend when built)."""
    options = plugin_cfg(cfg, "graph")
    return default_registry().get("graph", options.pop("name")), options


def full_graph_over_layer_kinds(allocator: str) -> UserError:
    """graph=full beside an allocator that lays out each layer kind apart: every step would run
    eager (FullGraph's PER_LAYER), recorded as graph=full."""
    return UserError(
        f"graph=full captures one attention metadata for every layer; allocator={allocator} gives each "
        f"layer kind its own, so no step could replay: choose +graph=piecewise (not for a model with linear "
        f"layers) or +graph=eager"
    )


def refuse_plugins_that_cannot_meet(cfg: DictConfig, model: ModelSpec) -> None:
    """What a real run (serve, profile, validate) would refuse only as its plugins meet, decided
    from the config before anything runs: a graph mode that cannot run the backend, graph=full
    over a layout per layer kind, what the hybrid layout cannot serve, and async scheduling
    beside prefix caching; and, in every scenario, prefix caching of a model with linear layers."""
    if cfg.scenario.name in ("kernel",):
        return
    allocator_cls, options = allocator_class(cfg, model)
    if allocator_cls.per_layer_kind_layout and options.get("prefix_caching") and model.num_layers_of("linear"):
        raise UserError(  # the allocator turned it off, and the row said prefix_caching=true, hit rate 0
            f"allocator.prefix_caching=true cannot apply to {model.name}: its linear layers keep one state a "
            f"sequence, which no prefix can be found in; set allocator.prefix_caching=false"
        )
    if cfg.scenario.name not in ("serve", "profile", "validate"):
        return
    graph_cls, _ = graph_mode(cfg)
    if graph_cls.name != "eager":  # the mode's own rule, on the device the run would take (torch: a real run's)
        from kvbench.plugins.graphs.base import refuse_unsupported

        backend_cls = default_registry().get("backend", plugin_cfg(cfg, "backend")["name"])
        device = OmegaConf.select(cfg, "scenario.device") or OmegaConf.select(cfg, "scenario.serve.device") or "auto"
        refuse_unsupported(graph_cls, backend_cls, resolve_device(str(device)))
    if allocator_cls.per_layer_kind_layout and graph_cls.name == "full":
        raise full_graph_over_layer_kinds(allocator_cls.name)
    if allocator_cls.per_layer_kind_layout:
        from kvbench.executors.hybrid_executor import refuse_unservable

        linear, async_scheduling = model.num_layers_of("linear"), bool(cfg.engine.get("async_scheduling"))
        refuse_unservable(options.get("policy", "shared"), linear, async_scheduling, graph_cls.name)
    if cfg.engine.get("async_scheduling") and options.get("prefix_caching"):
        from kvbench.executors.async_scheduling import refuse_prefix_caching

        refuse_prefix_caching(True)


def kv_slots(cfg: DictConfig, model: ModelSpec, hardware: Hardware) -> int:
    kv_bytes = kv_capacity_bytes(model, hardware, cfg.engine.get("kv_cache_bytes"))
    if kv_bytes <= 0:
        # the degrees that divide the heads and the K/V heads (schema.refuse_uneven_tensor_parallelism)
        # and would leave KV memory: "raise num_gpus" was advice a degree could then refuse
        fits = [
            g
            for g in tensor_parallel_degrees(model.num_heads, model.num_kv_heads)
            if g > hardware.num_gpus and kv_capacity_bytes(model, replace(hardware, num_gpus=g), None) > 0
        ]
        more = f"hardware.num_gpus={fits[0]}" if fits else "a GPU with more memory (hardware=...)"
        raise UserError(
            f"{model.name} weights ({model.weight_bytes / 1e9:.1f} GB) leave no KV memory on "
            f"{hardware.num_gpus} x {hardware.name} at utilization {hardware.gpu_memory_utilization}; "
            f"choose {more}, or set engine.kv_cache_bytes"
        )
    return int(kv_bytes // model.kv_bytes_per_token)


def build_engine(cfg: DictConfig, model, num_slots: int, make_executor, swap_slots: int | None = None) -> Engine:
    """The engine of one point; `make_executor(allocator)` builds its executor. The swap pool
    holds `swap_slots` tokens (default: engine.swap_space_bytes of the model's KV)."""
    allocator = build_allocator(cfg, model, num_slots)
    preemption = str(cfg.engine.preemption)
    if preemption == "swap" and not allocator.supports_swap:  # it would recompute, under swap's name
        swapping = sorted(n for n, c in default_registry().classes("allocator").items() if c.supports_swap)
        raise UserError(
            f"engine.preemption=swap: {allocator.name} cannot swap a request out, so its preemptions "
            f"would recompute; allocators that swap: {', '.join(swapping)} (or engine.preemption=recompute)"
        )
    if preemption == "swap":
        if swap_slots is None:
            swap_slots = int(float(cfg.engine.swap_space_bytes) // model.kv_bytes_per_token)
        allocator.enable_swap(swap_slots)
    sched = cfg.scheduler
    scheduler = Scheduler(
        allocator,
        int(sched.max_num_seqs),
        int(sched.max_num_batched_tokens),
        bool(sched.chunked_prefill),
        preemption,
        bool(sched.get("watermark_when_idle", True)),
    )
    return Engine(scheduler, make_executor(allocator), build_recorder(cfg), bool(cfg.progress), int(cfg.seed))


def build_recorder(cfg: DictConfig) -> Recorder:
    """The point's recorder; a `bench` run's streams requests.jsonl into its run directory (a
    single run's through `bench`'s helper, which writes the lines on the other core, where the
    command set `request_log.follower`). Each repeat of a repeated point writes its own,
    requests.K.jsonl: its row holds the repeats' medians, and each file recomputes its repeat's
    entries of the `samples` column."""
    report = cfg.get("report") or {}
    slos = goodput_slos(OmegaConf.to_container(report["goodput"], resolve=True) if report.get("goodput") else None)
    log = None
    if cfg.measure.get("save_requests", True) and HydraConfig.initialized():
        index = repeats.repeat.get()
        name = "requests.jsonl" if index is None else f"requests.{index}.jsonl"
        log = request_log.open_request_log(
            Path(HydraConfig.get().runtime.output_dir) / name, request_log.follower.get()
        )
    return Recorder(float(cfg.measure.warmup_frac), log, slos)
