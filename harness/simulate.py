"""scenario=simulate: memory-constrained serving of a workload on a modelled GPU."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from kvbench import workload
from kvbench.cost_model import CostModelExecutor
from kvbench.engine import Engine
from kvbench.metrics import Recorder
from kvbench.run import build_allocator, kv_slots, load_specs
from kvbench.scheduler import Scheduler


def build_engine(cfg: DictConfig, executor, model, num_slots: int) -> Engine:
    allocator = build_allocator(cfg, model, num_slots)
    sched = cfg.scheduler
    scheduler = Scheduler(allocator, int(sched.max_num_seqs), int(sched.max_num_batched_tokens),
                          bool(sched.chunked_prefill))
    return Engine(scheduler, executor, Recorder(float(cfg.measure.warmup_frac)), bool(cfg.progress))


def run(cfg: DictConfig) -> list[dict]:
    model, hardware = load_specs(cfg)
    requests = workload.generate(OmegaConf.to_container(cfg.workload, resolve=True), int(cfg.seed),
                                 model.max_model_len, vocab_size=model.vocab_size)
    engine = build_engine(cfg, CostModelExecutor(model, hardware), model, kv_slots(cfg, model, hardware))
    row = engine.run(requests)
    row["device"] = "simulated"
    return [row]
