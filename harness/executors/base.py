"""The executor contract: run one scheduled batch and say how long it took.

The engine is the same for every scenario; only its executor differs. A simulated executor
(`simulated = True`) returns the step's modelled duration and the engine advances its clock by
it; a real one runs the model, returns the sampled tokens, and the engine times the step itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvbench.core.scheduler import Batch


@dataclass
class StepResult:
    duration_s: float
    # serve only, per scheduled sequence: its sampled token id; for a request that forks or
    # steps its beams, at the root's row, the list the engine applies; None for a prefill chunk
    tokens: list | None = None


class Executor(Protocol):
    simulated: bool
    # False: execute() reads only the batch's totals (num_tokens, num_seqs, context_tokens,
    # attention_pairs, swapped_*), never batch.seqs, and returns no tokens. The scheduler then
    # leaves steadily decoding sequences out of `batch.seqs` (core/scheduler.py, lazy decode).
    # An executor without the attribute gets every scheduled sequence.
    needs_sequences: bool

    def execute(self, batch: Batch) -> StepResult: ...

    # Optional, for an executor that reads only totals: `quiet_step_s(num_tokens, context_tokens,
    # attention_pairs)`, the duration execute() would return for a batch of `num_tokens` steady
    # decodes and nothing else (no swap). With it the engine runs a stretch of such steps
    # without building their batches (Engine._run_quiet_steps); without it, it executes every
    # step.
