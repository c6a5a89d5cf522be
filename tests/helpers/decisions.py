"""What a simulated run decided, step by step, in a form two runs can be compared by.

`Totals` is a simulated executor whose step time depends only on a batch's totals and that logs
them; `decisions(scheduler, requests, lazy)` runs the requests with it and returns every step's
totals and preemptions (the scheduler's, by step), the recorder's clock, batch sizes and
accounting, each finished sequence's tokens, times and preemptions, and the result row (or the
refusal's text when a request cannot fit). `REQUESTS` draws small mixed workloads for it.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvbench.core.engine import Engine
from kvbench.core.recorder import Recorder
from kvbench.errors import UserError
from kvbench.executors.base import StepResult


class Totals:
    """A simulated executor whose step time depends on the batch's totals; it logs them."""

    simulated = True

    def __init__(self, needs_sequences: bool):
        self.needs_sequences = needs_sequences
        self.steps: list[tuple] = []

    def execute(self, batch) -> StepResult:
        totals = (batch.num_tokens, batch.num_seqs, batch.context_tokens, batch.attention_pairs, batch.swapped_blocks)
        self.steps.append(totals)
        return StepResult(self._step_s(batch.num_tokens, batch.context_tokens, batch.num_seqs))

    def quiet_step_s(self, num_tokens: int, context_tokens: int, attention_pairs: int) -> float:
        """A step the engine runs without a batch (steady decodes, and any preemption for their
        new blocks): logged as execute() logs it."""
        self.steps.append((num_tokens, num_tokens, context_tokens, attention_pairs, 0))
        return self._step_s(num_tokens, context_tokens, num_tokens)

    @staticmethod
    def _step_s(num_tokens: int, context_tokens: int, num_seqs: int) -> float:
        return 1e-3 + 1e-5 * num_tokens + 1e-7 * context_tokens + 1e-4 * num_seqs


REQUESTS = st.lists(
    st.tuples(
        st.floats(0.0, 0.05),  # arrival
        st.integers(1, 40),  # prompt
        st.integers(1, 70),  # output
        st.integers(-1, 2),  # shared prefix group, -1 = none
        st.sampled_from([(1, 1), (1, 1), (1, 1), (2, 1), (1, 2), (3, 1)]),  # (n, beam_width)
    ),
    min_size=1,
    max_size=40,
)


def decisions(scheduler, requests, lazy: bool):
    """Run `requests` through `scheduler` with lazy decode on or off; what it decided."""
    executor = Totals(needs_sequences=not lazy)
    recorder = Recorder(keep_sequences=True)
    # the preemptions, by the step they happen in: a step the engine runs without a batch
    # preempts too (lazy decode), so they are taken from the scheduler, not from the batch
    preempted: dict[int, list] = {}
    preempt = scheduler.preempt

    def logged_preempt(seq, batch, unrun=False):
        preempted.setdefault(len(executor.steps), []).append(seq.seq_id)
        preempt(seq, batch, unrun)

    scheduler.preempt = logged_preempt
    try:
        row = Engine(scheduler, executor, recorder=recorder, progress=False, seed=3).run(requests)
    except UserError as error:  # a request larger than the pool: every side refuses it
        return str(error)
    assert scheduler.lazy is lazy
    row.pop("schedule_us_per_step", None)  # measured, not decided
    finished = [
        (s.seq_id, s.num_tokens, s.first_token_s, s.finish_s, s.num_preemptions, tuple(s.token_times))
        for s in recorder.finished
    ]
    steps = [(*totals, preempted.get(step, [])) for step, totals in enumerate(executor.steps)]
    return steps, (recorder.step_end, recorder.batch_size, recorder.kv), finished, row
