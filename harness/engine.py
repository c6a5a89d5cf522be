"""Engine = Scheduler + KV allocator + Executor, stepped until every request has finished.

The clock is the sum of step times: the cost model's in `simulate`, measured wall time in
`serve`. When nothing can run, the clock jumps to the next arrival (an idle server), so a run's
result does not depend on how fast the host is at being idle.
"""

from __future__ import annotations

import itertools
import time
from collections import deque

from tqdm import tqdm

from kvbench.errors import UserError
from kvbench.metrics import Recorder
from kvbench.scheduler import Batch, Scheduler
from kvbench.sequence import Request, Sequence, SeqStatus


class Engine:
    def __init__(self, scheduler: Scheduler, executor, recorder: Recorder | None = None,
                 progress: bool = True):
        self.scheduler = scheduler
        self.allocator = scheduler.allocator
        self.executor = executor
        self.recorder = recorder or Recorder()
        self.progress = progress
        self._seq_ids = itertools.count()

    def check_fits(self, requests: list[Request]) -> None:
        longest = max(r.final_len for r in requests)
        if not self.allocator.can_ever_admit(longest):
            raise UserError(
                f"the KV pool ({self.allocator.num_slots} token slots) is smaller than one request: "
                f"{self.allocator.name} needs {self.allocator.footprint(longest)} slots for a "
                f"{longest}-token request; give more memory (hardware.*, engine.kv_cache_bytes) "
                f"or a smaller model")

    def new_sequence(self, request: Request, parent: Sequence | None = None) -> Sequence:
        tokens = list(request.prompt_tokens) if request.prompt_tokens is not None else []
        seq = Sequence(next(self._seq_ids), request, request.prompt_len, token_ids=tokens)
        if parent is not None:
            seq.num_tokens = parent.num_tokens
            seq.token_ids = list(parent.token_ids)
            seq.first_token_s = parent.first_token_s
            seq.parent = parent
        return seq

    def run(self, requests: list[Request]) -> dict:
        self.check_fits(requests)
        pending = deque(requests)
        scheduler, recorder = self.scheduler, self.recorder
        clock = requests[0].arrival_s if requests else 0.0
        total = len(requests)
        bar = tqdm(total=total, unit="req", desc=f"{self.allocator.name}", disable=not self.progress,
                   mininterval=1.0, leave=False)
        while pending or scheduler.has_work():
            while pending and pending[0].arrival_s <= clock:
                scheduler.add(self.new_sequence(pending.popleft()))
            wall = time.perf_counter()
            batch = scheduler.schedule(clock)
            schedule_s = time.perf_counter() - wall
            if not batch.seqs:
                if pending and not scheduler.running:
                    clock = max(clock, pending[0].arrival_s)
                    continue
                raise RuntimeError(f"{self.allocator.name}: no sequence can run with "
                                   f"{len(scheduler.waiting)} waiting and {len(scheduler.running)} running")
            result = self.executor.execute(batch)
            dt = result.duration_s if self.executor.simulated else time.perf_counter() - wall
            clock += dt
            recorder.on_step(clock, dt, len(batch), self.allocator.accounting(), schedule_s)
            done = self._advance(batch, result.tokens, clock)
            if done:
                bar.update(done)
        bar.close()
        first = requests[0].arrival_s if requests else 0.0
        row = recorder.summary(total, scheduler.last_admit_s, first)
        row.update(preemptions=scheduler.num_preemptions,
                   recomputed_tokens=scheduler.recomputed_tokens,
                   kv_capacity_tokens=self.allocator.num_slots, **self.allocator.stats())
        return row

    def _advance(self, batch: Batch, tokens: list | None, clock: float) -> int:
        """Append each sampled token; fork parallel samples after the prompt; finish sequences."""
        done = 0
        for i, seq in enumerate(batch.seqs):
            if seq.num_computed < seq.num_tokens:
                continue  # a prefill chunk: no token yet
            seq.num_tokens += 1
            if tokens is not None:
                seq.token_ids.append(tokens[i])
            if seq.first_token_s is None:
                seq.first_token_s = clock
                for _ in range(seq.request.n - 1):
                    child = self.new_sequence(seq.request, parent=seq)
                    self.allocator.fork(seq, child)
                    child.status = SeqStatus.RUNNING
                    self.scheduler.running.append(child)
            if seq.num_tokens >= seq.request.max_tokens:
                seq.finish_s = clock
                self.scheduler.finish(seq)
                self.recorder.on_finish(seq)
                if seq.parent is None:
                    done += 1
        return done
