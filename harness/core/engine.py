"""Engine = Scheduler + KV allocator + Executor, stepped until every request has finished.

The clock is the sum of step times: the cost model's in `simulate`, measured wall time in
`serve`. When nothing can run, the clock jumps to the next arrival (an idle server), so a run's
result does not depend on how fast the host is at being idle.

A request of n samples or beam width W forks when its prompt is done: every sequence takes its
first token from the prompt's logits. Beams then step together: each step keeps the W best
continuations, re-forking the beams nobody continued from the ones continued twice. The
simulator has no logits, so its beams pick their parents with a seeded RNG.
"""

from __future__ import annotations

import gc
import itertools
import math
import sys
import time
from collections import deque
from contextlib import contextmanager
from itertools import islice, repeat

import numpy as np

from kvbench.arith import cdiv
from kvbench.core.recorder import Recorder
from kvbench.core.scheduler import Batch, Scheduler
from kvbench.core.sequence import Request, SeqStatus, Sequence
from kvbench.errors import UserError


class Engine:
    # how a run gives its KV pool more room, for the errors that say it is too small; serve,
    # whose pool is scenario.kv_cache_tokens, names that instead
    more_memory = "give more memory (hardware.*, engine.kv_cache_bytes) or a smaller model"
    swap_pool_key = "engine.swap_space_bytes"  # the key that sizes the swap pool (serve: its own)

    def __init__(
        self, scheduler: Scheduler, executor, recorder: Recorder | None = None, progress: bool = True, seed: int = 0
    ):
        self.scheduler = scheduler
        self.rng = np.random.default_rng(seed)  # simulated beam search: which beams continue
        self.allocator = scheduler.allocator
        self.executor = executor
        # a simulated executor samples no token ids: a prefix cache names their blocks by stand-ins
        simulated = getattr(executor, "simulated", False)
        self.allocator.stand_in_tokens = bool(simulated and getattr(self.allocator, "prefix_caching", False))
        self.recorder = recorder or Recorder()
        self.progress = progress
        self._seq_ids = itertools.count()
        self.step_clock = time.perf_counter  # how a real step is timed (serve: or process CPU time)

    def check_fits(self, requests: list[Request]) -> None:
        # with watermark_when_idle=False an idle pool admits without the watermark: a request that
        # fits the whole pool runs (alone, at worst), so only the whole pool is asked of it
        self.allocator.watermark_exempt = not self.scheduler.watermark_when_idle
        try:
            self._check_fits(requests)
        finally:
            self.allocator.watermark_exempt = False

    def _check_fits(self, requests: list[Request]) -> None:
        # a sequence stores its prompt and every output token but the last (final_len): what a pool
        # must hold of it; `longest`, prompt + output, is how the messages name the request
        final = max(r.final_len for r in requests)
        longest = final + 1
        exact = getattr(self.allocator, "footprint_of", None)  # a reserving allocator's own reservations
        if exact is not None:
            self._check_reservations(requests, exact)
        elif not self.allocator.can_ever_admit(final):
            kept = getattr(self.allocator, "watermark_blocks", 0) * self.allocator.block_size
            if kept and self.allocator.footprint(final) <= self.allocator.num_slots:
                raise UserError(
                    f"the KV pool ({self.allocator.num_slots} token slots) keeps {kept} of them free "
                    f"(allocator.watermark), so a {longest}-token request ({self.allocator.footprint(final)} "
                    f"slots) can never be admitted; lower allocator.watermark or {self.more_memory}"
                )
            exempt, self.allocator.watermark_exempt = self.allocator.watermark_exempt, True
            try:  # without its headroom the pool would take it: the watermark keeps it out
                by_watermark = self.allocator.can_ever_admit(final)
            finally:
                self.allocator.watermark_exempt = exempt
            split = getattr(self.allocator, "policy", None) == "static"
            fits = self.allocator.footprint(final) <= self.allocator.num_slots
            if fits and (by_watermark or split):  # the pool holds it; a rule does not
                raise UserError(
                    f"allocator {self.allocator.name} can never admit a {longest}-token request "
                    f"({self.allocator.footprint(final)} slots), though the KV pool has {self.allocator.num_slots}: "
                    + (
                        "its headroom (allocator.watermark) keeps it out; lower the watermark, or "
                        if by_watermark
                        else "its split of the pool between layer kinds (allocator.policy=static) keeps it out; use "
                        "allocator.policy=shared, or "
                    )
                    + self.more_memory
                )
            raise UserError(
                f"the KV pool ({self.allocator.num_slots} token slots) is smaller than one request: "
                f"{self.allocator.name} needs {self.allocator.footprint(final)} slots for a "
                f"{longest}-token request{self._in_chunks(final)}; {self.more_memory}"
            )
        allocator, widest = self.allocator, max(r.width for r in requests)
        if widest > self.scheduler.max_num_seqs:
            raise UserError(
                f"a request of {widest} sequences (workload.n / workload.beam_width) can never run with "
                f"scheduler.max_num_seqs={self.scheduler.max_num_seqs}; raise it to at least {widest}"
            )
        if widest > self.scheduler.max_num_batched_tokens:  # its sequences decode in the same step
            raise UserError(
                f"a request of {widest} sequences (workload.n / workload.beam_width) decodes {widest} tokens "
                f"a step, which scheduler.max_num_batched_tokens={self.scheduler.max_num_batched_tokens} "
                f"never allows; raise it to at least {widest}"
            )
        if exact is None and not allocator.can_ever_admit(final, widest):  # a preempted request comes back whole
            each = allocator.group_footprint(final)
            raise UserError(
                f"the KV pool ({allocator.num_slots} token slots) cannot hold the {widest} "
                f"sequences of one request ({each} slots each with "
                f"{allocator.name}, and its admission watermark kept free); lower workload.n / "
                f"workload.beam_width or {self.more_memory}"
            )
        if self.scheduler.preemption == "swap" and allocator.supports_swap:
            blocks = cdiv(final, allocator.block_size)
            if blocks > allocator.num_cpu_blocks:
                raise UserError(
                    f"the swap pool ({allocator.num_cpu_blocks} block(s) of {allocator.block_size} "
                    f"tokens) cannot hold one {longest}-token request ({blocks} blocks); "
                    f"raise {self.swap_pool_key.format(longest=blocks * allocator.block_size)}"
                )

    def _check_reservations(self, requests: list[Request], footprint_of) -> None:
        """Each request's own reservation, all its sequences', within the pool (a reserving
        allocator reserves by the request's lengths, not by its total)."""
        sizes = {(r.prompt_len, r.output_len, r.width): r for r in requests}
        worst = max(sizes.values(), key=lambda r: footprint_of(r) * r.width)
        need = footprint_of(worst) * worst.width
        if need > self.allocator.num_slots:
            of = f" for its {worst.width} sequences" if worst.width > 1 else ""
            raise UserError(
                f"the KV pool ({self.allocator.num_slots} token slots) is smaller than one request: "
                f"{self.allocator.name} sets aside {need} slots{of} for a {worst.prompt_len} + "
                f"{worst.output_len}-token request; {self.more_memory}"
            )

    def _in_chunks(self, longest: int) -> str:
        """Where the longest sequence (`longest` tokens stored) fits if prefilled in smaller steps
        (a window layer holds every token a step writes), the largest step that fits, as advice;
        else nothing."""
        allocator, whole = self.allocator, self.allocator.max_step_tokens
        fits = []
        try:
            low, high = 1, min(whole or longest, longest) - 1
            while low <= high:  # the need grows with the step: the largest step that fits
                allocator.max_step_tokens = middle = (low + high) // 2
                if allocator.can_ever_admit(longest):
                    fits.append(middle)
                    low = middle + 1
                else:
                    high = middle - 1
        finally:
            allocator.max_step_tokens = whole
        if not fits:
            return ""
        return (
            f" in one {min(whole or longest, longest)}-token step; prefilled {fits[-1]} tokens a step it fits "
            f"(scheduler.chunked_prefill=true scheduler.max_num_batched_tokens={fits[-1]})"
        )

    def new_sequence(self, request: Request, parent: Sequence | None = None) -> Sequence:
        tokens = list(request.prompt_tokens) if request.prompt_tokens is not None else []
        seq = Sequence(next(self._seq_ids), request, request.prompt_len, token_ids=tokens)
        if parent is not None:
            seq.num_tokens = parent.num_tokens
            seq.token_ids = list(self._ids(parent))
            seq.first_token_s = parent.first_token_s
            seq.parent = parent
        return seq

    def _ids(self, seq: Sequence) -> list:
        """`seq`'s token ids, for a sequence forked from it to copy: all of them, stand-ins
        included where its allocator names blocks by them (so the fork's hashes of the blocks
        they share are the parent's)."""
        return self.allocator.token_ids(seq, seq.num_tokens)

    def run(self, requests: list[Request]) -> dict:
        with few_collections():
            return self._run(requests)

    def _run(self, requests: list[Request]) -> dict:
        self.check_fits(requests)
        pending = deque(requests)
        scheduler, recorder = self.scheduler, self.recorder
        clock = requests[0].arrival_s if requests else 0.0
        total = len(requests)
        bar = None
        # tqdm draws on a terminal only (its disable=None): where stderr is none, it is not
        # imported at all (with the multiprocessing lock it makes, 0.01 s of a short run)
        if self.progress and sys.stderr is not None and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=total, unit="req", desc=self.allocator.name, mininterval=1.0, leave=False)
        allocator, executor, simulated = self.allocator, self.executor, self.executor.simulated
        # an executor that reads only a batch's totals lets the scheduler advance steady decodes in bulk
        scheduler.lazy = simulated and not getattr(executor, "needs_sequences", True)
        step_clocks = scheduler.step_clocks
        quiet_step_s = getattr(executor, "quiet_step_s", None) if scheduler.lazy else None
        recorder.watch(allocator)
        while pending or scheduler.has_work():
            while pending and pending[0].arrival_s <= clock:
                scheduler.add(self.new_sequence(pending.popleft()))
            started = self.step_clock()
            batch = scheduler.schedule(clock)
            schedule_s = self.step_clock() - started
            num_seqs = batch.num_seqs
            if not num_seqs:
                step_clocks.append(clock)  # one entry per schedule() call
                if pending and not scheduler.running:
                    clock = max(clock, pending[0].arrival_s)
                    continue
                raise RuntimeError(
                    f"{self.allocator.name}: no sequence can run with "
                    f"{len(scheduler.waiting)} waiting and {len(scheduler.running)} running"
                )
            result = executor.execute(batch)
            dt = result.duration_s if simulated else self.step_clock() - started
            clock += dt
            step_clocks.append(clock)
            recorder.on_step(clock, dt, num_seqs, allocator, schedule_s)
            if batch.seqs:
                done = self._advance(batch, result.tokens, clock)
                if done and bar is not None:
                    bar.update(done)
            if quiet_step_s is not None:
                clock, done = self._run_quiet_steps(clock, pending, quiet_step_s)
                if done and bar is not None:
                    bar.update(done)
        if bar is not None:
            bar.close()
        scheduler.settle()
        first = requests[0].arrival_s if requests else 0.0
        row = recorder.summary(total, scheduler.last_admit_s, first)
        row.update(
            preemptions=scheduler.num_preemptions,
            recomputed_tokens=scheduler.recomputed_tokens,
            swap_fallbacks=scheduler.swap_fallbacks,
            swapped_blocks=self.allocator.swapped_blocks,
            kv_capacity_tokens=self.allocator.num_slots,
            **self.allocator.stats(),
        )
        row.setdefault("prefix_hit_rate", 0.0)
        return row

    def _run_quiet_steps(self, clock: float, pending: deque, quiet_step_s) -> tuple[float, int]:
        """After a step that left every running sequence steady, run the steps in which nothing
        but the steady decodes can happen (Scheduler.quiet_stretch) without building their
        batches; return the clock and how many requests finished. Each step is what schedule(),
        execute() and _advance would make of it, in their order: the arrivals queued, the
        decodes' room taken, the step's time from their totals, its clock and the recorder's
        row. An arrival that finds nobody waiting ends the stretch unless it stays refused (it
        may be admitted); behind a head that stays refused, arrivals only join the queue. A step
        that meets steady sequences runs on when all it does is give some of them new blocks and
        let others decode their last token (Scheduler.cross_quietly: those that cross take no
        room), preempting for those blocks where the free ones do not cover them (a step of
        striding crossings alone too); those that end are then brought up to date and retired,
        as _advance retires them, and after them or a preemption the stretch goes on only where
        quiet_stretch says so again. Any other meeting ends it."""
        stretch = self.scheduler.quiet_stretch()
        if stretch is None:
            return clock, 0
        step, met, steady, base, waiting = stretch
        scheduler, allocator, recorder = self.scheduler, self.allocator, self.recorder
        step_clocks, on_step, took_room = scheduler.step_clocks, recorder.on_step, allocator.took_room
        cross_quietly, next_meeting = scheduler.cross_quietly, scheduler.next_meeting
        striders, period = scheduler.striding()
        take_striding = allocator.take_striding
        perf_counter = time.perf_counter
        done = 0
        arrival = pending[0].arrival_s if pending else math.inf  # the next arrival's
        while True:
            if arrival <= clock:
                while pending and pending[0].arrival_s <= clock:
                    scheduler.add(self.new_sequence(pending.popleft()))
                arrival = pending[0].arrival_s if pending else math.inf
                if not waiting:  # the first to wait: the stretch goes on while it stays refused
                    if not scheduler.head_stays_refused(met - step):
                        break
                    waiting = True
            wall = perf_counter()
            took, met_here = steady, None
            striding = 0 if step == met else len(striders[step % period])
            if step == met or (striding and not take_striding(striding)):
                # steady sequences met, or striding crossings that the free blocks do not cover
                met_here = cross_quietly(step, waiting)  # (how many crossed, the ended, preempted)
                if met_here is None:
                    break
                crossed, ended, preempted = met_here
                if preempted:  # the victims decode no more
                    steady, base = scheduler.steady_totals()
                took = steady - crossed
            else:
                took -= striding  # striding sequences cross into new blocks (counted in bulk)
            if took:
                took_room(took)
            schedule_s = perf_counter() - wall
            step += 1
            context = base + steady * step
            dt = quiet_step_s(steady, context, context)
            clock += dt
            step_clocks.append(clock)
            on_step(clock, dt, steady, allocator, schedule_s)
            if met_here is not None:  # a step that met steady sequences, or preempted for blocks
                if crossed and not ended and not preempted:  # new blocks only: a head's refusal stands
                    met = next_meeting()
                    continue
                for seq in ended:  # retired as _advance retires them, then look again
                    scheduler.bring_up_to_date(seq)  # its last token's time is this step's clock
                    scheduler.finish(seq)
                    seq.finish_s = clock
                    recorder.on_finish(seq)
                done += len(ended)
                stretch = scheduler.quiet_stretch()
                if stretch is None:
                    break
                step, met, steady, base, waiting = stretch
        return clock, done

    def _advance(self, batch: Batch, tokens: list | None, clock: float) -> int:
        """Append each sampled token, fork requests whose prompt is done, step beams; retire
        the requests that are complete. Returns how many were retired."""
        finished = []
        seqs, plain = batch.seqs, batch.num_plain
        if plain and tokens is not None:  # serve's decode step: lone sequences that had their first token
            for seq, picked in zip(islice(seqs, plain), tokens):
                seq.num_tokens = num_tokens = seq.num_tokens + 1
                if picked is not None:
                    seq.token_ids.append(picked)
                seq.token_times.append(clock)
                if num_tokens >= seq.max_tokens:
                    finished.append(seq)
            seqs, tokens = seqs[plain:], tokens[plain:]  # admitted or swapped in after them
        for seq, picked in zip(seqs, repeat(None) if tokens is None else tokens):
            num_tokens = seq.num_tokens
            if seq.num_computed < num_tokens:
                continue  # a prefill chunk: no token yet
            if seq.width == 1:  # the common case, kept inline: one sequence per request
                seq.num_tokens = num_tokens = num_tokens + 1
                if picked is not None:
                    seq.token_ids.append(picked)
                seq.token_times.append(clock)
                if seq.first_token_s is None:
                    seq.first_token_s = clock
                if num_tokens >= seq.max_tokens:
                    finished.append(seq)
                continue
            request = seq.request
            if seq.group is None or seq is seq.group[0]:
                seq.token_times.append(clock)  # the root's times are the request's
            if seq.group is None:
                self._fork(seq, picked, clock)
            elif seq is not seq.group[0]:
                if request.beam_width == 1:
                    _append(seq, picked)  # a sample; the root's row retires the group
                continue
            elif request.beam_width > 1:
                self._step_beams(seq.group, picked)
            else:
                _append(seq, picked)
            if seq.num_tokens >= request.max_tokens:
                finished.append(seq)
        for root in finished:  # after the loop, when every member of a group has its token
            self.scheduler.finish(root)
            for seq in root.group or (root,):
                seq.finish_s = clock
                self.recorder.on_finish(seq)
        return len(finished)

    def _fork(self, root: Sequence, picked: list | None, clock: float) -> None:
        """The prompt is done: fork the other samples / beams; each takes its first token."""
        request = root.request
        root.group = [root]
        for index in range(1, request.width):
            child = self.new_sequence(request, parent=root)
            child.sample_index = index
            child.status = SeqStatus.RUNNING
            child.group = root.group
            self.allocator.fork(root, child)
            root.group.append(child)
        if request.beam_width > 1:
            for seq, (_, token, logprob) in zip(root.group, picked or [(0, None, 0.0)] * request.width):
                seq.cumulative_logprob = logprob
                _append(seq, token)
        else:
            for seq, token in zip(root.group, picked or [None] * request.width):
                _append(seq, token)
        for seq in root.group:
            seq.first_token_s = clock

    def _step_beams(self, beams: list, picked: list | None) -> None:
        """Continue with the `picked` (beam row, token, logprob) continuations. A picked beam keeps
        its sequence for its first continuation; further continuations of it take over the
        sequences of beams nobody picked, re-forked from it before any beam appends its token."""
        width = len(beams)
        if picked is None:
            picked = [(int(row), None, 0.0) for row in self.rng.integers(width, size=width)]
        slots: list = [None] * width
        again = []
        for pick in picked:
            if slots[pick[0]] is None:
                slots[pick[0]] = pick
            else:
                again.append(pick)
        unpicked = [slot for slot in range(width) if slots[slot] is None]
        last = beams[0].num_tokens + 1 >= beams[0].max_tokens  # this token ends the request
        for slot, pick in zip(unpicked, again):
            beam, parent = beams[slot], beams[pick[0]]
            if not last:  # a beam that decodes on reads its parent's KV; one that ends now reads none
                self.allocator.free(beam)
                self.allocator.fork(parent, beam)
            beam.num_tokens, beam.token_ids = parent.num_tokens, list(self._ids(parent))
            slots[slot] = pick
        for beam, (_, token, logprob) in zip(beams, slots):
            beam.cumulative_logprob = logprob
            _append(beam, token)


@contextmanager
def few_collections(young: int = 10_000):
    """Python's cyclic collector, tuned for a run's loop and restored after it. The loop allocates
    objects that live to its end (a tuple of KV accounting per step, sequences, block lists), and
    at the default thresholds (a young collection every 700 allocations) the collector rescans
    them, and everything the process held before the run, hundreds of times: 0.047 s of a
    10,000-request run here, a third of it in one full collection. Objects alive when the run
    starts (modules, the config, the workload) are frozen out of the scans, and young collections
    come every `young` allocations: 0.015 s. Where something else froze objects already, their
    freeze is left as it is."""
    threshold = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(young, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if freeze:
            gc.unfreeze()  # what the run left behind is collectable again


def _append(seq: Sequence, token: int | None) -> None:
    seq.num_tokens += 1
    if token is not None:
        seq.token_ids.append(token)
