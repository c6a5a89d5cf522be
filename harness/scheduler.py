"""Iteration-level continuous batching: who runs this step, and who is preempted to make room.

Each step, running sequences are served first, oldest first, each with its remaining tokens (one
for a decode, the rest of the prompt for a prefill, at most the step's token budget with chunked
prefill). When the allocator cannot grow a sequence, whole sequences are preempted, newest
first, until it can (FCFS order protected). Then waiting sequences are admitted in arrival
order while the allocator admits them and the budgets (`max_num_seqs`, `max_num_batched_tokens`)
allow. Per step the work is O(scheduled sequences); nothing scans the KV pool.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvbench.errors import UserError
from kvbench.plugins.allocators.base import KVAllocator
from kvbench.sequence import Sequence, SeqStatus


@dataclass
class Batch:
    """One step's work: `num_new_tokens[i]` tokens of `seqs[i]`, the last ones of its context."""

    seqs: list = field(default_factory=list)
    num_new_tokens: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    num_tokens: int = 0  # tokens fed to the model
    num_prefill_seqs: int = 0
    context_tokens: int = 0  # sum of context lengths after the step (KV read by attention)
    attention_pairs: int = 0  # sum of new tokens x context length (attention FLOPs / 4 / dims)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, allocator: KVAllocator, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2560, chunked_prefill: bool = False):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise UserError(f"scheduler.max_num_seqs={max_num_seqs} and max_num_batched_tokens="
                            f"{max_num_batched_tokens} must be >= 1")
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.recomputed_tokens = 0
        self.last_admit_s = 0.0

    def add(self, seq: Sequence) -> None:
        if not self.chunked_prefill and seq.num_tokens > self.max_num_batched_tokens:
            raise UserError(f"a prompt of {seq.num_tokens} tokens exceeds scheduler.max_num_batched_tokens="
                            f"{self.max_num_batched_tokens}; raise it or set scheduler.chunked_prefill=true")
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: drop the KV, re-prefill prompt + generated tokens later."""
        self.running.remove(seq) if seq is not self.running[-1] else self.running.pop()
        self.allocator.free(seq)
        self.recomputed_tokens += seq.num_computed
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self, now: float = 0.0) -> Batch:
        batch = Batch()
        budget = self.max_num_batched_tokens
        allocator, running = self.allocator, self.running
        seqs, counts = batch.seqs, batch.num_new_tokens
        num_tokens = context_tokens = attention_pairs = prefills = 0
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = seq.num_tokens - seq.num_computed
            if n > budget:
                n = budget
            while not allocator.grow(seq, n):
                victim = running[-1]  # newest first
                self.preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                # inlined _add_to_batch: this loop runs for every running sequence every step
                seq.num_computed = context = seq.num_computed + n
                seqs.append(seq)
                counts.append(n)
                num_tokens += n
                context_tokens += context
                attention_pairs += n * context
                if n > 1 or seq.num_tokens == seq.request.prompt_len:
                    prefills += 1
                budget -= n
                i += 1
                continue
            break
        batch.num_tokens, batch.context_tokens = num_tokens, context_tokens
        batch.attention_pairs, batch.num_prefill_seqs = attention_pairs, prefills
        waiting = self.waiting
        while waiting and budget > 0 and len(running) < self.max_num_seqs and not batch.preempted:
            seq = waiting[0]
            n = seq.num_tokens - seq.num_computed
            if n > budget:
                if not self.chunked_prefill:
                    break
                n = budget
            if not allocator.admit(seq):
                break
            n = min(n, seq.num_tokens - seq.num_computed)  # a prefix-cache hit may cover some
            if not allocator.grow(seq, n):
                allocator.free(seq)
                break
            waiting.popleft()
            seq.status = SeqStatus.RUNNING
            running.append(seq)
            self.last_admit_s = now
            self._add_to_batch(batch, seq, n)
            budget -= n
        return batch

    @staticmethod
    def _add_to_batch(batch: Batch, seq: Sequence, n: int) -> None:
        seq.num_computed += n
        context = seq.num_computed
        batch.seqs.append(seq)
        batch.num_new_tokens.append(n)
        batch.num_tokens += n
        batch.context_tokens += context
        batch.attention_pairs += n * context
        if n > 1 or seq.num_generated == 0:
            batch.num_prefill_seqs += 1

    def finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.allocator.free(seq)
        seq.status = SeqStatus.FINISHED
