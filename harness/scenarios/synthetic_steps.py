"""Synthetic batches for timing the real executor: a shape's sequences placed into a scheduler.

A shape is some prompts run whole (prefill) beside some sequences decoding one token each at a
given context. Its decodes are placed as if their context had been computed already (admitted
and grown by the allocator, no forward run), its prompts wait; then one step is timed exactly as
the engine times a served one: the scheduler's `schedule()` and the executor's `execute()`.
Every placement draws fresh token ids, so a prefix cache never turns a repeat into a hit.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from kvbench.core.scheduler import Scheduler
from kvbench.core.sequence import Request, SeqStatus, Sequence


@dataclass(frozen=True)
class Shape:
    prefill_seqs: int = 0
    prefill_len: int = 0
    decode_seqs: int = 0
    decode_context: int = 0  # context of each decode after its step (the tokens its attention reads)

    @property
    def phase(self) -> str:
        if not self.decode_seqs:
            return "prefill"
        return "decode" if not self.prefill_seqs else "mixed"

    @property
    def kv_tokens(self) -> int:
        return self.prefill_seqs * self.prefill_len + self.decode_seqs * self.decode_context

    @property
    def num_tokens(self) -> int:
        return self.prefill_seqs * self.prefill_len + self.decode_seqs


@dataclass(frozen=True)
class TimedStep:
    seconds: float
    num_tokens: int
    num_seqs: int
    context_tokens: int
    attention_pairs: int


class StepTimer:
    """Times one step of a shape at a time on `executor`, whose KV pool `allocator` manages."""

    def __init__(
        self,
        allocator,
        executor,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        vocab_size: int,
        seed: int = 0,
        clock=time.perf_counter,
    ):
        self.allocator, self.executor, self.clock = allocator, executor, clock
        self.scheduler = Scheduler(allocator, max_num_seqs, max_num_batched_tokens)
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(seed)
        self._ids = itertools.count()

    def _sequence(self, num_tokens: int, prompt_len: int, output_len: int) -> Sequence:
        tokens = self.rng.integers(0, self.vocab_size, num_tokens).tolist()
        request = Request(next(self._ids), 0.0, prompt_len, output_len)
        return Sequence(next(self._ids), request, num_tokens, token_ids=tokens)

    def _place(self, shape: Shape) -> list[Sequence] | None:
        allocator, scheduler = self.allocator, self.scheduler
        placed = []
        context = shape.decode_context
        for _ in range(shape.decode_seqs):
            seq = self._sequence(context, context - 1, 2)
            admitted = allocator.admit(seq)
            if admitted:
                seq.status = SeqStatus.RUNNING  # so that _clear frees it
            if not admitted or not allocator.grow(seq, context - 1):
                self._clear(placed + [seq] if admitted else placed)
                return None
            seq.num_computed = context - 1
            scheduler.running.append(seq)
            scheduler.num_running_seqs += 1
            placed.append(seq)
        for _ in range(shape.prefill_seqs):
            seq = self._sequence(shape.prefill_len, shape.prefill_len, 2)
            scheduler.waiting.append(seq)
            placed.append(seq)
        return placed

    def _clear(self, placed: list[Sequence]) -> None:
        scheduler = self.scheduler
        for seq in placed:
            if seq.status == SeqStatus.RUNNING:
                self.allocator.free(seq)
        scheduler.running.clear()
        scheduler.waiting.clear()
        scheduler.num_running_seqs = 0
        self.allocator.take_copies()

    def time(self, shape: Shape) -> TimedStep | None:
        """One timed step of `shape`; None when the pool or the scheduler's limits cannot hold it."""
        placed = self._place(shape)
        if placed is None:
            return None
        start = self.clock()
        batch = self.scheduler.schedule()
        if len(batch.seqs) != len(placed) or batch.num_tokens != shape.num_tokens:
            self._clear(placed)
            return None
        self.executor.execute(batch)
        seconds = self.clock() - start
        self._clear(placed)
        return TimedStep(seconds, batch.num_tokens, len(batch.seqs), batch.context_tokens, batch.attention_pairs)
