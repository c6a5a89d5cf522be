"""What is served and on what: the model's shape (ModelSpec) and the hardware's limits (Hardware)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from kvbench.errors import UserError

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
LAYER_KINDS = ("full", "window", "linear")


def _from_cfg(cls, cfg: dict, what: str):
    allowed = {f.name for f in fields(cls)}
    unknown = set(cfg) - allowed
    if unknown:
        raise UserError(f"{what} has unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    return cls(**cfg)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. `layer_pattern` repeats over the layers ("full" if empty)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: float
    max_model_len: int
    dtype: str = "fp16"
    vocab_size: int = 50272
    intermediate_size: int = 0
    layer_pattern: tuple = ()
    window: int = 0
    linear_state_dim: int = 0  # per-head state is head_dim x linear_state_dim for linear layers
    rope_theta: float = 10000.0
    num_active_params: float = 0.0  # parameters one token uses (mixture of experts); 0 = all

    @classmethod
    def from_cfg(cls, cfg: dict) -> ModelSpec:
        cfg = dict(cfg)
        cfg["layer_pattern"] = tuple(cfg.get("layer_pattern") or ())
        spec = _from_cfg(cls, cfg, f"model {cfg.get('name', '?')}")
        spec.validate()
        return spec

    def validate(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise UserError(f"model.dtype={self.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        for kind in self.layer_pattern:
            if kind not in LAYER_KINDS:
                raise UserError(
                    f"model.layer_pattern names unknown layer kind {kind!r}; known: {', '.join(LAYER_KINDS)}"
                )
        if "window" in self.layer_pattern and self.window <= 0:
            raise UserError(f"model.window={self.window} must be > 0 for window layers")
        if "linear" in self.layer_pattern and self.linear_state_dim <= 0:
            raise UserError(f"model.linear_state_dim={self.linear_state_dim} must be > 0 for linear layers")
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"model.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def layer_kinds(self) -> tuple:
        pattern = self.layer_pattern or ("full",)
        return tuple(pattern[i % len(pattern)] for i in range(self.num_layers))

    def num_layers_of(self, kind: str) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across the attention layers: 2 x layers x kv_heads x head_dim x bytes."""
        attention_layers = self.num_layers - self.num_layers_of("linear")
        return attention_layers * self.kv_bytes_per_token_per_layer

    @property
    def linear_state_bytes_per_layer(self) -> int:
        """One sequence's recurrent state in one linear layer: heads x head_dim x linear_state_dim."""
        return self.num_heads * self.head_dim * self.linear_state_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes

    @property
    def active_params(self) -> float:
        return self.num_active_params or self.num_params


@dataclass(frozen=True)
class Hardware:
    """One accelerator (times `num_gpus` under tensor parallelism). Rates in bytes/s and FLOP/s."""

    name: str
    hbm_bytes_per_s: float
    peak_flops: float
    memory_bytes: float
    pcie_bytes_per_s: float = 25e9
    copy_latency_s: float = 10e-6
    hbm_efficiency: float = 1.0
    flops_efficiency: float = 1.0
    step_overhead_s: float = 0.0
    gpu_memory_utilization: float = 0.9
    num_gpus: int = 1
    allreduce_latency_s: float = 9e-6
    allreduce_bytes_per_s: float = 200e9

    @property
    def achievable_hbm_bytes_per_s(self) -> float:
        """HBM bandwidth a step reaches: the datasheet's x hbm_efficiency x num_gpus."""
        return self.hbm_bytes_per_s * self.hbm_efficiency * self.num_gpus

    @classmethod
    def from_cfg(cls, cfg: dict) -> Hardware:
        hw = _from_cfg(cls, dict(cfg), f"hardware {cfg.get('name', '?')}")
        for name in ("hbm_bytes_per_s", "peak_flops", "memory_bytes", "pcie_bytes_per_s", "allreduce_bytes_per_s"):
            if getattr(hw, name) <= 0:
                raise UserError(f"hardware.{name}={getattr(hw, name)} must be > 0")
        if not 0 < hw.gpu_memory_utilization <= 1:
            raise UserError(f"hardware.gpu_memory_utilization={hw.gpu_memory_utilization} must be in (0, 1]")
        return hw

    @property
    def total_memory_bytes(self) -> float:
        return self.memory_bytes * self.num_gpus


def kv_capacity_bytes(model: ModelSpec, hw: Hardware, kv_cache_bytes: float | None) -> float:
    """KV pool = memory x utilization - weights, unless set explicitly."""
    if kv_cache_bytes is not None:
        return float(kv_cache_bytes)
    return hw.total_memory_bytes * hw.gpu_memory_utilization - model.weight_bytes
