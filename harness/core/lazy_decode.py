"""Lazy decode: the scheduler's running loop for executors that read only a batch's totals.

On with `Scheduler.lazy = True` (the engine sets it for the simulator's cost models). A
sequence that decodes into room is *steady*: until its room or its output runs out,
each step adds one token to it and nothing else happens to it, so the scheduler stops touching
it. It keeps its counters as of the step it became steady (`Sequence.steady_since`) and joins
the step its room or output ends (`_expiry`); per step the scheduler touches only the running
sequences that are not steady and the steady ones whose room ends, and counts the rest in bulk
(their number and the sum of their contexts grow by a known amount per step). A steady sequence
is brought up to date (`_unsteady`: counters, token times from `step_clocks`) whenever anything
else happens to it: its room ends, it is preempted, the budget could run out. Decisions are the
eager loop's exactly (tests/test_lazy_decode.py): the touched sequences are visited in running
order (`Sequence.run_order`), so every allocator call comes in the same order. A batch then
lists only the sequences whose state the engine must update (`Batch.seqs`); `Batch.num_seqs`
counts them all.

With a quiet allocator (`KVAllocator.quiet_room`: its `room_ran_out` does nothing; paged
without prefix caching, the Orca allocators) a steady sequence is not met at its last step of
room but at the next, where it asks for a new block; when it is granted room again it stays
steady, that step's token counted as one more step of room. Where the allocator has the short
path for it (`grow_steady`: paged takes the new block) the sequence is not even brought up to
date: its counters stay as of the step it became steady, its room grows by the steps it took
and the new block's. At block 16 a decoding sequence is then touched once per block, not three
times, and a block costs one allocator call. A step whose meetings are all such crossings
needs no schedule() at all: the engine's quiet stretch runs through it (`cross_quietly`, with
`grow_steady_all`: the allocator's blocks for all of them, or none).

Where the allocator strides (`KVAllocator.stride`: paged without prefix caching), a steady
sequence that crossed into a block it will fill is not met at its next crossings either, up to
the one into its last block: the sequences striding are kept by the phase of their crossings
(step mod block size), a step's crossings are taken in bulk (`take_striding`), and the blocks
are handed to the sequence when it is next met (`_end_stride`). A scheduled step gives them in
running order, one by one, so a refused block preempts as the eager loop does.

A step whose crossings the free blocks do not cover need not be scheduled either, where
preemption recomputes: the stretch makes `_meet`'s preemptions itself (`_preempt_for_crossings`:
the crossings in running order each take a block while there is one, and where there is none
the newest running request goes, until one is freed or the crossing sequence itself was the
newest), then gives the blocks of the crossings left running as above. Such a step admits
nobody (`_schedule_waiting` stops at a preemption), and its time is that of the steady decodes
left. In a 10,000-request ShareGPT run at 4 req/s (OPT-13B, A100-40GB) 8,551 of the 8,637 steps
that preempt run so; with swap the copies change the step's time, and it is scheduled.
"""

from __future__ import annotations

from array import array
from heapq import heappop, heappush
from operator import attrgetter
from typing import TYPE_CHECKING

from kvbench.core.sequence import SeqStatus, Sequence

if TYPE_CHECKING:
    from kvbench.core.scheduler import Batch

RUN_ORDER = attrgetter("run_order")  # the running list's order


class LazyDecode:
    """The scheduler's lazy decode, mixed into `Scheduler`: the steady sequences' bookkeeping
    and the running loop that leaves them out. It reads the scheduler's running list, budget
    and allocator, and falls back to the scheduler's eager loop."""

    def _init_lazy_decode(self) -> None:
        from kvbench.core.scheduler import Batch  # (the scheduler's module imports this one)

        self._stretch_batch = Batch()  # what `preempt` records of a quiet stretch's preemptions
        self.step_clocks = array("d")  # the engine's clock after each schedule() call (as token_times)
        self._active: set[Sequence] = set()  # running entries that are not steady
        self._runs = 0  # Sequence.run_order's counter
        self._num_steady = 0
        self._steady_base = 0  # sum over steady sequences of num_computed - steady_since
        self._expiry: dict[int, list] = {}  # step -> (steady_since, seq) whose room or output ends then
        self._expiry_steps: list[int] = []  # a heap of _expiry's keys (and of some it no longer has)
        # the striding sequences (Sequence.stride_start), by the phase of their crossings:
        # _striders[step % _period] cross into a new block at `step`
        self._period = self.allocator.stride or 1
        self._striders: list[set[Sequence]] = [set() for _ in range(self._period)]

    def _unsteady(self, seq: Sequence) -> None:
        """Bring steady `seq` up to the start of the current step and touch it one by one again."""
        since, now = seq.steady_since, len(self.step_clocks)
        if seq.stride_start >= 0:
            self._end_stride(seq, now)
        self._num_steady -= 1
        self._steady_base -= seq.num_computed - since
        steps = now - since
        if steps:
            seq.num_computed += steps
            seq.num_tokens += steps
            seq.room -= steps
            seq.token_times += self.step_clocks[since:now]
            if seq.first_token_s is None:  # a prefill chunk that left one token became steady
                seq.first_token_s = self.step_clocks[since]
        seq.steady_since = -1
        self._active.add(seq)

    def _start_stride(self, seq: Sequence, step: int, num_computed: int) -> None:
        """Steady `seq` just crossed into a new block at `step` (grow_steady, at `num_computed`
        tokens): where the allocator counts its next crossings in bulk, it strides through them,
        met next only after the last (its room grown by theirs)."""
        ahead = self.allocator.crossings_ahead(seq, num_computed)
        if ahead:
            seq.room += ahead * self._period
            seq.stride_start, seq.stride_len, seq.stride_done = step, ahead, 0
            self._striders[step % self._period].add(seq)

    def _end_stride(self, seq: Sequence, now: int) -> None:
        """Striding `seq` is met at step `now`: hand it the blocks of its crossings before `now`
        and give it the room it has, and it is an ordinary steady sequence again."""
        start, period = seq.stride_start, self._period
        done = max(seq.stride_done, min(seq.stride_len, (now - 1 - start) // period))
        if done > seq.stride_done:
            self.allocator.hand_striding(seq, done - seq.stride_done)
        seq.room -= (seq.stride_len - done) * period
        seq.stride_start = -1
        self._striders[start % period].discard(seq)

    def striding(self) -> tuple[list[set[Sequence]], int]:
        """The striding sequences by the phase of their crossings, and the period: those of
        `striding[step % period]` cross into a new block at `step`."""
        return self._striders, self._period

    def bring_up_to_date(self, seq: Sequence) -> None:
        """Steady `seq`'s counters and token times through the last step the engine ran (a quiet
        stretch's ended sequence, before the engine retires it)."""
        self._unsteady(seq)

    def settle(self) -> None:
        """Bring every steady sequence up to date (before anyone reads their counters)."""
        for seq in self.running:
            if seq.steady_since >= 0:
                self._unsteady(seq)
        self._expiry.clear()
        self._expiry_steps.clear()

    def _meet_at(self, step: int, since: int, seq: Sequence) -> None:
        """Meet steady `seq` (steady since step `since`) again at step `step`."""
        bucket = self._expiry.get(step)
        if bucket is None:
            self._expiry[step] = [(since, seq)]
            heappush(self._expiry_steps, step)
        else:
            bucket.append((since, seq))

    def next_meeting(self) -> int:
        """The first step at which a steady sequence is met (`_expiry` has one)."""
        steps, expiry = self._expiry_steps, self._expiry
        while steps[0] not in expiry:  # met already
            heappop(steps)
        return steps[0]

    def _schedule_running_lazy(self, batch: Batch, budget: int) -> int:
        """`_schedule_running`'s decisions, touching only the running sequences that change."""
        step, active, expiry = len(self.step_clocks), self._active, self._expiry
        quiet = self.allocator.quiet_room
        if active:
            self._become_steady(step)
        chunk_budget = budget  # what a prompt fed in chunks may take: all of it, unless counted below
        if self.chunked_prefill or self.num_running_seqs > budget:
            # Without chunked prefill every running sequence decodes one token: its request's
            # width bounds what they need. Otherwise count; where the budget runs out part-way,
            # the eager loop decides who runs, unless the sequences fed in chunks are the newest
            # running (as a prompt fed in chunks mostly is): every decode ahead of them runs,
            # and they take what it leaves, in running order (_meet), as the eager loop gives it.
            decodes, chunks, chunked = self._num_steady, 0, []  # tokens: decodes', chunks'
            for seq in active:
                if seq.group is not None:
                    decodes += len(seq.group)
                else:
                    n = seq.num_tokens - seq.num_computed
                    if n > 1:
                        chunks += n
                        chunked.append(seq)
                    else:
                        decodes += n
            if decodes + chunks > budget:
                if decodes > budget or not chunked or set(self.running[-len(chunked) :]) != set(chunked):
                    self.settle()
                    return self._schedule_running(batch, budget)
                chunk_budget = budget - decodes
        # Met this step: the sequences not steady, and the steady ones whose expiry is now. A
        # step that meets none (an Orca allocator's, mostly) is the bulk count below alone.
        due = expiry.pop(step, None)
        striders = self._striders[step % self._period]
        if due or active or striders:
            touched = []  # loops, not comprehensions (block_pool.take_blocks says why)
            if due:
                for since, seq in due:
                    if seq.steady_since == since:
                        touched.append(seq)
            if striders:  # their crossings now, but the last after their last (that one is due)
                period = self._period
                for seq in striders:
                    if seq.stride_start + seq.stride_len * period >= step:
                        touched.append(seq)
            touched += active
            num_tokens, context_tokens, attention_pairs, took, crossed = self._meet(
                batch, touched, step, quiet, chunk_budget
            )
        else:
            num_tokens = context_tokens = attention_pairs = took = crossed = 0
        steady = self._num_steady  # the steady sequences still running: one token each
        took += steady - crossed  # of room: those that crossed into a new block took it from grow
        decode_context = self._steady_base + steady * (step + 1)
        if took:
            self.allocator.took_room(took)
        num_tokens += took + crossed
        batch.num_tokens, batch.context_tokens = num_tokens, context_tokens + decode_context
        batch.attention_pairs = attention_pairs + decode_context
        batch.num_steady = steady
        return budget - num_tokens

    def _become_steady(self, step: int) -> None:
        """The running sequences that take a step of room from `step` on become steady: the
        first thing a step's schedule() does, done as soon as the step before has ended (the
        engine's quiet stretch may then start at `step`)."""
        active, expiry, quiet = self._active, self._expiry, self.allocator.quiet_room
        steady = [s for s in active if s.room and s.width == 1 and s.num_computed + 1 == s.num_tokens]
        if steady:
            # in running order, not the set's (which follows memory addresses): the expiry lists
            # then come out the same in every process, and so does cross_quietly's early exit
            steady.sort(key=RUN_ORDER)
            base = 0
            for seq in steady:
                seq.steady_since = step
                base += seq.num_computed
                at = _meets_at(step, seq, quiet)
                bucket = expiry.get(at)  # _meet_at, inlined: with prefix caching, once a block
                if bucket is None:
                    expiry[at] = [(step, seq)]
                    heappush(self._expiry_steps, at)
                else:
                    bucket.append((step, seq))
            active.difference_update(steady)
            self._num_steady += len(steady)
            self._steady_base += base - step * len(steady)

    def quiet_stretch(self) -> tuple[int, int, int, int, bool] | None:
        """After a step, where every running sequence is steady (those that the step made
        steady included: a prefilled sequence joins a stretch at once, not after one more
        scheduled step): the stretch of steps from the next one on in which only the steady
        decodes can run, as (its first step, the first step at which a steady sequence is met,
        the steady count and base: a step's decode context is base + steady * (step + 1), and
        whether the waiting queue has a head that stays refused until then, its refusals counted
        here as `_schedule_waiting` would count them; else an arrival ends the stretch). The
        engine runs the stretch on through the steps that meet steady sequences only to give them
        a new block (`cross_quietly`). None when the next step may do more."""
        step = len(self.step_clocks)
        if self._active:
            self._become_steady(step)  # as the step's schedule() would first
        if self._active or self.swapped or not self._expiry or self.allocator.copied_slots != self._copied_seen:
            return None  # copies made since the last scheduled step are charged to the next one
        if self._num_steady > self.max_num_batched_tokens:  # the budget runs out part-way: the
            return None  # eager loop decides who decodes (_schedule_running_lazy settles for it)
        met = self.next_meeting()
        waiting = bool(self.waiting)
        if waiting and not self.head_stays_refused(met - step):
            return None
        return step, met, self._num_steady, self._steady_base, waiting

    def cross_quietly(self, step: int, waiting: bool) -> tuple[int, list, bool] | None:
        """In a quiet stretch, `step`, at which steady sequences are met or striding ones cross
        into blocks that the free ones do not cover, run without scheduling it where each of the
        met either has used up its room and decodes on into a new block that the allocator gives
        them all (`grow_steady_all`), or decodes its last token into its room (a quiet
        allocator's room_ran_out does nothing). Where the free blocks do not cover the step's
        crossings, preempt for them first as `_meet` would (`_preempt_for_crossings`). Take the
        new blocks in running order as `_meet` would and return (how many crossed, the sequences
        whose output ends: still steady, so that the step's totals count them; the engine brings
        them up to date and retires them once the step's clock is known, and whether any request
        was preempted: the steady totals changed). None, changing nothing that scheduling the
        step would not, where the step must be scheduled.

        `waiting`: the stretch runs behind a waiting head, which must stay refused at this step
        too: tested here, or, where blocks are taken, by grow_steady_all's promise that the
        refusal tested when the stretch began stands; a step that preempts admits nobody
        (`_schedule_waiting`). The engine tests the steps after this one again (quiet_stretch)."""
        expiry, allocator = self._expiry, self.allocator
        touched, ending = [], []
        for since, seq in expiry.get(step, ()):  # _meet's tests, made before anything changes
            if seq.steady_since == since:
                if seq.stride_start >= 0:  # met after its last striding crossing: its blocks first
                    self._end_stride(seq, step)
                steps = step - since
                after = seq.max_tokens - seq.num_tokens - steps  # tokens to come from this one on
                if seq.room == steps and after > 1:
                    touched.append(seq)  # the short path to a new block
                elif seq.room > steps and after == 1:
                    ending.append(seq)  # its last token, into its room
                else:
                    return None
        if (touched or ending) and not allocator.quiet_room:
            return None
        striding = len(self._striders[step % self._period])  # those met above no longer stride
        preempted = False
        if touched or striding:  # the head's refusal stands: grow_steady_all's promise
            touched.sort(key=RUN_ORDER)
            computed = []  # a loop, not a comprehension (block_pool.take_blocks says why)
            for seq in touched:
                computed.append(seq.num_computed + step - seq.steady_since)
            granted = allocator.grow_steady_all(touched, computed, striding)
            if granted is None:
                if not self._preempt_for_crossings(step, touched, computed):
                    return None
                preempted, running_status = True, SeqStatus.RUNNING
                kept, kept_computed = [], []  # the crossings the preemptions left running
                for seq, before in zip(touched, computed):
                    if seq.status is running_status:
                        kept.append(seq)
                        kept_computed.append(before)
                touched, computed = kept, kept_computed
                ending = [seq for seq in ending if seq.status is running_status]
                striding = len(self._striders[step % self._period])  # the preempted no longer stride
                granted = allocator.grow_steady_all(touched, computed, striding)
                if granted is None:
                    raise RuntimeError(f"{allocator.name}: too few blocks after preempting for them at step {step}")
        elif waiting and not self.head_stays_refused(1):
            return None
        expiry.pop(step, None)
        if touched:
            meet_at, start_stride = self._meet_at, self._start_stride
            for seq, before, more in zip(touched, computed, granted):
                since = seq.steady_since
                seq.room = step - since + 1 + more  # this step's token, then the new block's room
                start_stride(seq, step, before)
                meet_at(_meets_at(since, seq, True), since, seq)
        if len(ending) > 1:
            ending.sort(key=RUN_ORDER)
        return len(touched) + striding, ending, preempted

    def _preempt_for_crossings(self, step: int, touched: list, computed: list) -> bool:
        """`step`'s crossings into new blocks, `touched` (in running order, `computed[i]` the
        i-th one's tokens) and the striding ones, where the free blocks do not cover them all:
        make the preemptions `_meet` makes for them. It gives the crossings their blocks in
        running order and, where none is left, preempts the newest running request (`preempt`)
        until one is, or until the crossing sequence itself was the newest. The blocks are
        taken afterwards (the caller): how many each victim freed is all the order depends on.
        False, changing nothing, where the step must be scheduled: preemption by swap (the
        step's time counts its copies), or a crossing the allocator's short path would refuse."""
        if self.preemption != "recompute":
            return False
        free = self.allocator.steady_blocks(touched, computed)
        if free is None:
            return False
        crossing = touched + list(self._striders[step % self._period])
        crossing.sort(key=RUN_ORDER)
        running, batch, taken, running_status = self.running, self._stretch_batch, 0, SeqStatus.RUNNING
        batch.preempted.clear()
        for seq in crossing:
            if seq.status is not running_status:
                continue  # preempted for a crossing ahead of it
            while taken == free:  # no block left for it (those ahead of it take theirs first)
                victim = running[-1]  # newest first
                self.preempt(victim, batch)
                free = self.allocator.steady_blocks()
                if victim is seq:
                    return True  # every crossing behind it was newer, so went before it
            taken += 1
        return True

    def steady_totals(self) -> tuple[int, int]:
        """The steady sequences' count and base: a step's decode context is base + count * (step + 1)."""
        return self._num_steady, self._steady_base

    def head_stays_refused(self, steps: int) -> bool:
        """Whether `_schedule_waiting` stops at the waiting head in each of the next `steps` steps
        in which only room is taken: its tests in its order, the allocator's last."""
        seq, budget = self.waiting[0], self.max_num_batched_tokens - self._num_steady
        if budget <= 0 or self.num_running_seqs + seq.request.width > self.max_num_seqs:
            return True
        if seq.group is not None:
            return False
        if seq.num_tokens - seq.num_computed > budget and not self.chunked_prefill:
            # a prompt over the budget left waits for a step of its own; with nothing steady that
            # step is the next (a recompute longer than the whole budget runs alone, as it does eager)
            return bool(self._num_steady)
        return self.allocator.refuses_again(seq, steps)

    def _meet(
        self, batch: Batch, touched: list, step: int, quiet: bool, chunk_budget: int
    ) -> tuple[int, int, int, int, int]:
        """Schedule the running sequences met this step, in running order, into `batch`: (their
        tokens fed, context tokens and attention pairs, except those of decodes into room; the
        decodes into room; the steady again after crossing into a new block). Those with more
        than one token to feed (a prompt in chunks: the newest running, behind every decode)
        share `chunk_budget` in running order."""
        touched.sort(key=RUN_ORDER)
        allocator, running, active, expiry = self.allocator, self.running, self._active, self._expiry
        seqs = batch.seqs
        append = seqs.append
        num_tokens = context_tokens = attention_pairs = took = crossed = 0
        others = []
        running_status = SeqStatus.RUNNING
        grow_steady = allocator.grow_steady if quiet else None
        period = self._period
        for seq in touched:
            if seq.status is not running_status:
                continue  # preempted earlier in this step, by a sequence ahead of it
            since = seq.steady_since
            if since >= 0:  # its room or its output ends this step, or it strides
                start = seq.stride_start
                if start >= 0:
                    crossing, off = divmod(step - start, period)
                    if not off and crossing <= seq.stride_len:
                        # a crossing that striding counts in bulk, at a step that is scheduled:
                        # its block now, in running order (its earlier ones first)
                        if crossing - 1 > seq.stride_done:
                            allocator.hand_striding(seq, crossing - 1 - seq.stride_done)
                            seq.stride_done = crossing - 1
                        if grow_steady(seq, seq.num_computed + step - since) is not None:
                            seq.stride_done = crossing
                            crossed += 1
                            continue
                    # Met where it ends or at its last block, or no block to be had: then the
                    # branch below asks grow_steady once more, which refuses again (rare, and
                    # cheaper than a test on every steady sequence met).
                    self._end_stride(seq, step)
                steps = step - since
                if grow_steady is not None and seq.room == steps and seq.max_tokens - seq.num_tokens - steps > 1:
                    # Its room is used up and its output goes on: with a new block it stays
                    # steady, its counters still as of `since` (the branch below, without
                    # bringing it up to date and back).
                    # (With two tokens or more still to come the new block has room after this
                    # step's token: the room granted is at least 1.)
                    granted = grow_steady(seq, seq.num_computed + steps)
                    if granted is not None:
                        seq.room = steps + 1 + granted  # this step's token, then the new block's room
                        self._start_stride(seq, step, seq.num_computed + steps)
                        at = _meets_at(since, seq, quiet)
                        bucket = expiry.get(at)  # _meet_at, inlined on every block's way
                        if bucket is None:
                            expiry[at] = [(since, seq)]
                            heappush(self._expiry_steps, at)
                        else:
                            bucket.append((since, seq))
                        crossed += 1
                        continue
                self._unsteady(seq)  # one by one again
            room = seq.room
            # room: a steady sequence whose room ends now, or one not made steady (width > 1)
            if room and seq.num_computed + 1 == seq.num_tokens:
                seq.room = room - 1
                seq.num_computed = context = seq.num_computed + 1
                if room == 1:
                    allocator.room_ran_out(seq)
                append(seq)
                context_tokens += context
                attention_pairs += context
                took += 1
                continue
            if seq.group is not None:
                group = seq.group
                if not self._grow_group(group, batch):
                    continue  # it was preempted, and everything behind it
                for member in group:
                    member.num_computed = context = member.num_computed + 1
                    append(member)
                    context_tokens += context
                    attention_pairs += context
                num_tokens += len(group)
                continue
            n = seq.num_tokens - seq.num_computed
            in_chunks = n > 1
            if in_chunks:  # what the decodes ahead of it and the chunks before it left
                if chunk_budget <= 0:
                    continue  # the eager loop stops at the spent budget; it and those behind wait
                n = min(n, chunk_budget)
            while not allocator.grow(seq, n):
                victim = running[-1]  # newest first
                self.preempt(victim, batch)
                if victim is seq:
                    break
            else:
                if in_chunks:
                    chunk_budget -= n
                elif quiet and seq.room and seq.width == 1 and seq.max_tokens - seq.num_tokens > 1:
                    # A quiet allocator gave it a new block with room: steady again from this
                    # step, whose token grow placed (room + 1 as of the step's start). Nothing
                    # processed after it in this step can preempt it: victims are newer. Not a
                    # request of several samples or beams: its last prompt token forks it.
                    seq.room += 1
                    seq.steady_since = step
                    active.discard(seq)
                    self._num_steady += 1
                    self._steady_base += seq.num_computed - step
                    self._start_stride(seq, step, seq.num_computed)
                    self._meet_at(_meets_at(step, seq, quiet), step, seq)
                    crossed += 1
                    continue
                seq.num_computed = context = seq.num_computed + n
                if n != 1:
                    others.append((len(seqs), n))
                append(seq)
                num_tokens += n
                context_tokens += context
                attention_pairs += n * context - (n * (n - 1) >> 1)  # causal: arith.causal_pairs
        counts = batch.num_new_tokens = [1] * len(seqs)
        for index, n in others:
            counts[index] = n
        return num_tokens, context_tokens, attention_pairs, took, crossed


def _meets_at(step: int, seq: Sequence, quiet: bool) -> int:
    """The step at which steady `seq`, its counters as of `step`'s start, is met again: its last
    token's, or where its room ends: at its last step of room, or, with a quiet allocator, at the
    next step, which asks grow for a new block."""
    room, out = seq.room, seq.max_tokens - seq.num_tokens
    return step + room if quiet and room < out else step + min(room, out) - 1
