"""CostModelExecutor: a step's time from the roofline of the model on the hardware.

time = max(bytes moved / achievable bandwidth, FLOPs / achievable compute) + per-step overhead
where bytes = weights + the KV the step's attention reads and writes, and FLOPs = 2 x active
params per token + the attention score and value products. Hybrid models: window layers read at
most their window of KV, linear layers their fixed-size state. Achievable = datasheet peak x
efficiency; every constant is in the hardware YAML and recorded with the results.

Under tensor parallelism (hardware.num_gpus = g > 1) each GPU holds 1/g of the weights and the
KV, and a step adds its all-reduces, which do not overlap compute: two a layer (after the
attention's output projection and after the MLP), each a fixed latency plus 2(g-1)/g of its
message (the step's tokens x hidden size x dtype bytes) at the all-reduce's bus bandwidth.

Preemption by swapping adds its copies to the step (a fixed latency per copy plus the bytes
over PCIe); recomputation costs the re-prefill's FLOPs, which the steps already contain. KV
copied within the device (a shared block copied on write, a reservation copied for a fork) is
read and written once at the achievable HBM bandwidth, before the step that follows the copy.
"""

from __future__ import annotations

from kvbench.arith import causal_pairs
from kvbench.core.scheduler import Batch
from kvbench.core.spec import Hardware, ModelSpec
from kvbench.executors.base import StepResult


def allreduce_time(model: ModelSpec, hardware: Hardware) -> tuple[float, float]:
    """A step's tensor-parallel all-reduces as (fixed seconds, seconds a token): zeros on one GPU."""
    g = hardware.num_gpus
    if g == 1:
        return 0.0, 0.0
    per_step = 2 * model.num_layers
    ring = 2.0 * (g - 1) / g  # a ring all-reduce sends and receives this share of the message
    per_token = ring * model.hidden_size * model.dtype_bytes / hardware.allreduce_bytes_per_s
    return per_step * hardware.allreduce_latency_s, per_step * per_token


def swap_time_s(hardware: Hardware, num_copies: int, num_bytes: float) -> float:
    """Host <-> device copies: a fixed latency per copy plus the bytes over PCIe."""
    return num_copies * hardware.copy_latency_s + num_bytes / hardware.pcie_bytes_per_s


def copies_per_block(model: ModelSpec) -> int:
    """Copies that move one block: its K and V sit in separate tensors per attention layer (as in vLLM)."""
    return 2 * (model.num_layers - model.num_layers_of("linear"))


class CopyTime:
    """What a step's copies add to its time on `hardware` (the roofline and the calibrated
    executor both charge them this way): every swapped block's copies and bytes over PCIe, and
    the KV copied within the device (copy-on-write, forks) read and written once at the
    achievable HBM bandwidth."""

    def __init__(self, model: ModelSpec, hardware: Hardware) -> None:
        self.hardware = hardware
        self.copies_per_block = copies_per_block(model)
        self.bytes_per_slot = model.kv_bytes_per_token
        self.device_s_per_slot = 2.0 * self.bytes_per_slot / hardware.achievable_hbm_bytes_per_s

    def __call__(self, batch: Batch) -> float:
        step_s = batch.copied_slots * self.device_s_per_slot
        if batch.swapped_blocks:
            step_s += swap_time_s(
                self.hardware, batch.swapped_blocks * self.copies_per_block, batch.swapped_slots * self.bytes_per_slot
            )
        return step_s


def preemption_costs(
    model: ModelSpec,
    hardware: Hardware,
    block_size: int,
    swapped_blocks: int,
    recomputed_tokens: int,
    recomputed_pairs: int,
) -> dict:
    """What a run's preemptions cost on `hardware`: its swap traffic, and the modelled time of
    the swaps and of the recomputation (re-prefill FLOPs at achievable compute)."""
    swapped_bytes = swapped_blocks * block_size * model.kv_bytes_per_token
    copies = swapped_blocks * copies_per_block(model)
    attention_layers = model.num_layers - model.num_layers_of("linear")
    flops = (
        2.0 * model.active_params * recomputed_tokens
        + 4.0 * attention_layers * model.num_heads * model.head_dim * recomputed_pairs
    )
    flops_per_s = hardware.peak_flops * hardware.flops_efficiency * hardware.num_gpus
    return {
        "swapped_bytes": swapped_bytes,
        "swap_copies": copies,
        "swap_time_model_s": swap_time_s(hardware, copies, swapped_bytes),
        "recompute_time_model_s": flops / flops_per_s,
    }


class CostModelExecutor:
    simulated = True

    def __init__(self, model: ModelSpec, hardware: Hardware):
        self.copy_time = CopyTime(model, hardware)
        g = hardware.num_gpus
        self.weight_bytes = model.weight_bytes
        self.bytes_per_s = hardware.achievable_hbm_bytes_per_s
        self.flops_per_s = hardware.peak_flops * hardware.flops_efficiency * g
        self.flops_per_token = 2.0 * model.active_params
        per_layer, pair_flops = model.kv_bytes_per_token_per_layer, 4.0 * model.num_heads * model.head_dim
        full, window, linear = (model.num_layers_of(k) for k in ("full", "window", "linear"))
        self.kv_bytes_per_token = full * per_layer  # full attention reads the whole context
        self.flops_per_attention_pair = pair_flops * full
        # Window layers read at most the last `window` tokens; a linear layer reads and writes its
        # state once per sequence and updates it per token (a rank-1 delta rule: ~6 flops a value).
        self.window = model.window
        self.window_kv_bytes_per_token = window * per_layer
        self.window_flops_per_pair = pair_flops * window
        state_values = linear * model.num_heads * model.head_dim * model.linear_state_dim
        self.state_bytes_per_seq = 2 * linear * model.linear_state_bytes_per_layer
        self.state_flops_per_token = 6.0 * state_values
        self.hybrid = bool(window or linear)
        self.needs_sequences = self.hybrid  # window layers read each sequence's context (executors/base.py)
        self.step_overhead_s = hardware.step_overhead_s
        self.allreduce_s, self.allreduce_s_per_token = allreduce_time(model, hardware)
        self.fixed_step_s = self.step_overhead_s + self.allreduce_s  # every step's, whatever it runs
        if not self.hybrid:  # execute()'s duration for steady decodes alone (executors/base.py):
            # only a full-attention model's executor reads totals alone, so only it has one
            self.quiet_step_s = self._full_attention_step_s()

    def _full_attention_step_s(self):
        """quiet_step_s for a full-attention model, asked once per simulated step: step_time's
        arithmetic without its window and state terms, which are zeros there. Adding a zero
        changes no float, so every step time is the bit-identical value step_time returns
        (tests/test_quiet_steps.py); a call takes about 0.3 us against step_time's 0.74."""
        weights, per_token, bytes_per_s = self.weight_bytes, self.kv_bytes_per_token, self.bytes_per_s
        flops_per_token, per_pair, flops_per_s = self.flops_per_token, self.flops_per_attention_pair, self.flops_per_s
        overhead = self.step_overhead_s
        allreduce_s, allreduce_s_per_token = self.allreduce_s, self.allreduce_s_per_token

        def quiet_step_s(num_tokens: int, context_tokens: int, attention_pairs: int) -> float:
            memory_s = (weights + per_token * (context_tokens + num_tokens)) / bytes_per_s
            compute_s = (flops_per_token * num_tokens + per_pair * attention_pairs) / flops_per_s
            return (compute_s if compute_s > memory_s else memory_s) + overhead  # max(), inlined

        if not (allreduce_s or allreduce_s_per_token):  # one GPU: no all-reduce term, not even a zero added
            return quiet_step_s
        fixed_s = self.fixed_step_s

        def parallel_step_s(num_tokens: int, context_tokens: int, attention_pairs: int) -> float:
            memory_s = (weights + per_token * (context_tokens + num_tokens)) / bytes_per_s
            compute_s = (flops_per_token * num_tokens + per_pair * attention_pairs) / flops_per_s
            return (compute_s if compute_s > memory_s else memory_s) + fixed_s + allreduce_s_per_token * num_tokens

        return parallel_step_s

    def step_time(
        self,
        num_tokens: int,
        context_tokens: int,
        attention_pairs: int,
        window_context_tokens: int = 0,
        window_pairs: int = 0,
        num_seqs: int = 0,
    ) -> float:
        kv_bytes = (
            self.kv_bytes_per_token * (context_tokens + num_tokens)
            + self.window_kv_bytes_per_token * (window_context_tokens + num_tokens)
            + self.state_bytes_per_seq * num_seqs
        )
        memory_s = (self.weight_bytes + kv_bytes) / self.bytes_per_s
        compute_s = (
            self.flops_per_token * num_tokens
            + self.state_flops_per_token * num_tokens
            + self.flops_per_attention_pair * attention_pairs
            + self.window_flops_per_pair * window_pairs
        ) / self.flops_per_s
        # on one GPU the all-reduces' terms are zeros, which change no float
        return max(memory_s, compute_s) + self.fixed_step_s + self.allreduce_s_per_token * num_tokens

    def execute(self, batch: Batch) -> StepResult:
        if self.hybrid:  # O(scheduled sequences), only for models with window or linear layers
            step_s = self._hybrid_step_time(batch)
        else:  # O(1): the batch's totals
            step_s = self.step_time(batch.num_tokens, batch.context_tokens, batch.attention_pairs)
        if batch.swapped_blocks or batch.copied_slots:
            step_s += self.copy_time(batch)
        return StepResult(step_s)

    def _hybrid_step_time(self, batch: Batch) -> float:
        w = self.window
        window_context = window_pairs = 0
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            window_context += min(seq.num_computed, w)
            window_pairs += causal_pairs(n, seq.num_computed, w)
        return self.step_time(
            batch.num_tokens, batch.context_tokens, batch.attention_pairs, window_context, window_pairs, batch.num_seqs
        )
