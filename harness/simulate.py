"""scenario=simulate: memory-constrained serving of a workload on a modelled GPU."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from kvbench import workload
from kvbench.cost_model import CostModelExecutor, preemption_costs
from kvbench.engine import Engine
from kvbench.metrics import Recorder
from kvbench.radix import radix_hit_rate
from kvbench.run import build_allocator, kv_slots, load_specs
from kvbench.scheduler import Scheduler


def build_engine(cfg: DictConfig, model, num_slots: int, make_executor, swap_slots: int | None = None) -> Engine:
    """The engine of one point; `make_executor(allocator)` builds its executor. The swap pool
    holds `swap_slots` tokens (default: engine.swap_space_bytes of the model's KV)."""
    allocator = build_allocator(cfg, model, num_slots)
    preemption = str(cfg.engine.preemption)
    if preemption == "swap" and allocator.supports_swap:
        if swap_slots is None:
            swap_slots = int(float(cfg.engine.swap_space_bytes) // model.kv_bytes_per_token)
        allocator.enable_swap(swap_slots)
    sched = cfg.scheduler
    scheduler = Scheduler(allocator, int(sched.max_num_seqs), int(sched.max_num_batched_tokens),
                          bool(sched.chunked_prefill), preemption)
    return Engine(scheduler, make_executor(allocator), Recorder(float(cfg.measure.warmup_frac)),
                  bool(cfg.progress), int(cfg.seed))


def preemption_report(engine: Engine, model, hardware, row: dict) -> dict:
    return preemption_costs(model, hardware, engine.allocator.block_size, row["swapped_blocks"],
                            row["recomputed_tokens"], engine.scheduler.recomputed_pairs)


def run(cfg: DictConfig) -> list[dict]:
    model, hardware = load_specs(cfg)
    requests = workload.generate(OmegaConf.to_container(cfg.workload, resolve=True), int(cfg.seed),
                                 model.max_model_len, vocab_size=model.vocab_size)
    engine = build_engine(cfg, model, kv_slots(cfg, model, hardware),
                          lambda allocator: CostModelExecutor(model, hardware))
    row = engine.run(requests)
    row.update(preemption_report(engine, model, hardware, row), device="simulated")
    if any(r.prefix_id >= 0 for r in requests):
        row["prefix_hit_rate_radix"] = radix_hit_rate(r.prompt_tokens for r in requests)
    return [row]
