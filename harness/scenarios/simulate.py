"""scenario=simulate: memory-constrained serving of a workload on a modelled GPU."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from kvbench.core import workload
from kvbench.core.engine import Engine
from kvbench.core.radix import radix_hit_rate
from kvbench.executors.cost_model import CostModelExecutor, preemption_costs
from kvbench.scenarios.build import build_engine, kv_slots, load_specs


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
    row.update(preemption_report(engine, model, hardware, row), device="simulated",
               dropped_requests=requests.dropped)
    if any(r.prefix_id >= 0 for r in requests):
        row["prefix_hit_rate_radix"] = radix_hit_rate(r.prompt_tokens for r in requests)
    return [row]
