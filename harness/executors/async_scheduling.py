"""engine.async_scheduling: the host schedules and prepares step t + 1 while the device runs step t.

Blocking, a step is schedule -> prepare -> launch -> wait -> sample and the device idles during
every host part. `AsyncScheduling` wraps the model executor so the engine's loop runs shifted
by one step, as vLLM's async scheduling does: `execute(batch)` launches the batch and returns
at once with a placeholder token for every sequence it will sample, so the engine advances
lengths, finishes and frees (all known before the token values are) and schedules the next
step while this one runs. The next `execute` prepares its batch, then collects the step in
flight, writes its tokens over the placeholders, refreshes its own input ids with them and
launches. The run's last step, which nothing can overlap, runs blocking.

Requests of one sequence only, and no prefix caching: forks, beams and block hashes depend
on the token values of the step still running.
"""

from __future__ import annotations

import time

from kvbench.errors import UserError
from kvbench.executors.base import StepResult

PLACEHOLDER = -1  # token id of a token the step in flight has not sampled yet


def check_async_supported(requests: list, allocator) -> None:
    if any(r.width > 1 for r in requests):
        raise UserError(
            "engine.async_scheduling=true serves requests of one sequence only (forks "
            "and beams depend on the tokens of the step still running); set workload.n=1 "
            "and workload.beam_width=1, or engine.async_scheduling=false"
        )
    refuse_prefix_caching(getattr(allocator, "prefix_caching", False))


def refuse_prefix_caching(prefix_caching: bool) -> None:
    if prefix_caching:
        raise UserError(
            "engine.async_scheduling=true cannot run with allocator.prefix_caching=true (+preset=vllm turns it "
            "on): block hashes need the token values of the step still running; set allocator.prefix_caching=false"
        )


class AsyncScheduling:
    """The executor the engine sees under async scheduling; `executor` does the work."""

    simulated = False

    def __init__(self, executor, recorder, num_requests: int):
        self.executor = executor
        self.recorder = recorder
        self.num_requests = num_requests
        self.inflight = None  # (launched step, its batch)
        self.returned_at = 0.0

    def __getattr__(self, name):  # time_split, swap_s, graph, ... of the wrapped executor
        return getattr(self.executor, name)

    def execute(self, batch) -> StepResult:
        start = time.perf_counter()
        step = self.executor.prepare(batch)  # overlaps the step in flight
        self.drain()
        self.executor.refresh_inputs(step)
        launched = self.executor.launch(step)
        if self._is_last(batch):
            result = self.executor.collect(launched)
            self.returned_at = time.perf_counter()
            return StepResult(self.returned_at - start, result.tokens)
        self.inflight = (launched, batch)
        self.returned_at = time.perf_counter()
        return StepResult(self.returned_at - start, [PLACEHOLDER] * len(batch.seqs))

    def drain(self) -> None:
        """Wait for the step in flight; its tokens replace their placeholders, its first-token
        and finish times become the time the tokens exist (not the time it was launched)."""
        if self.inflight is None:
            return
        launched, batch = self.inflight
        self.inflight = None
        waiting = [s for s in batch.seqs if s.token_ids and s.token_ids[-1] == PLACEHOLDER]
        # Sampling keys use each sequence's length at launch, before its placeholder was appended.
        for seq in waiting:
            seq.num_tokens -= 1
        try:
            tokens = self.executor.collect(launched).tokens
        finally:
            for seq in waiting:
                seq.num_tokens += 1
        launched_clock = self.recorder.step_end[-1]
        now = launched_clock + time.perf_counter() - self.returned_at
        for seq, token in zip(batch.seqs, tokens):
            if seq.token_ids and seq.token_ids[-1] == PLACEHOLDER and token is not None:
                seq.token_ids[-1] = token
            if seq.token_times and seq.token_times[-1] == launched_clock:
                seq.token_times[-1] = now
            if seq.first_token_s == launched_clock:
                seq.first_token_s = now
            if seq.finish_s == launched_clock:
                seq.finish_s = now

    def _is_last(self, batch) -> bool:
        """True when every request is complete once this step's tokens are in."""
        finishing = sum(
            1
            for seq, n in zip(batch.seqs, batch.num_new_tokens)
            if seq.num_computed == seq.num_tokens and seq.num_tokens + 1 >= seq.request.max_tokens
        )
        return self.recorder.num_finished + finishing >= self.num_requests
