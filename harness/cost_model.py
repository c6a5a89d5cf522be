"""CostModelExecutor: a step's time from the roofline of the model on the hardware.

time = max(bytes moved / achievable bandwidth, FLOPs / achievable compute) + per-step overhead
where bytes = weights + the KV the step's attention reads and writes, and FLOPs = 2 x params per
token + the attention score and value products. Achievable = datasheet peak x efficiency; every
constant is in the hardware YAML and recorded with the results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kvbench.scheduler import Batch
from kvbench.spec import Hardware, ModelSpec


@dataclass
class StepResult:
    duration_s: float
    tokens: Optional[list] = None  # sampled token id per scheduled sequence (serve only)


class CostModelExecutor:
    simulated = True

    def __init__(self, model: ModelSpec, hardware: Hardware):
        g = hardware.num_gpus
        self.weight_bytes = model.weight_bytes
        self.kv_bytes_per_token = model.kv_bytes_per_token
        self.bytes_per_s = hardware.hbm_bytes_per_s * hardware.hbm_efficiency * g
        self.flops_per_s = hardware.peak_flops * hardware.flops_efficiency * g
        self.flops_per_token = 2.0 * model.num_params
        attention_layers = model.num_layers - model.num_layers_of("linear")
        self.flops_per_attention_pair = 4.0 * attention_layers * model.num_heads * model.head_dim
        self.step_overhead_s = hardware.step_overhead_s

    def step_time(self, num_tokens: int, context_tokens: int, attention_pairs: int) -> float:
        memory_s = (self.weight_bytes + self.kv_bytes_per_token * (context_tokens + num_tokens)) / self.bytes_per_s
        compute_s = (self.flops_per_token * num_tokens
                     + self.flops_per_attention_pair * attention_pairs) / self.flops_per_s
        return max(memory_s, compute_s) + self.step_overhead_s

    def execute(self, batch: Batch) -> StepResult:
        return StepResult(self.step_time(batch.num_tokens, batch.context_tokens, batch.attention_pairs))
