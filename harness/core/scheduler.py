"""Iteration-level continuous batching: who runs this step, and who is preempted to make room.

Each step, running sequences are served first, oldest first, each with its remaining tokens (one
for a decode, the rest of the prompt for a prefill, at most the step's token budget with chunked
prefill). When the allocator cannot grow a sequence, whole requests are preempted, newest
first, until it can (FCFS order protected): `recompute` drops their KV and re-prefills prompt +
generated tokens later, `swap` copies their blocks to the allocator's CPU pool and back (falling
back to recompute when the pool is full). Swapped requests come back before new ones are
admitted; then waiting sequences are admitted in arrival order while the allocator admits them
and the budgets (`max_num_seqs`, `max_num_batched_tokens`) allow. Without chunked prefill, a
recomputed request longer than the token budget (prompt + output so far) runs alone in a step.

The allocator's admission watermark (a fraction of blocks kept free) applies to every admission
by default. With `watermark_when_idle=False` an admission made while no request is running
ignores it, as vLLM's scheduler does (the `vllm` preset): a request that fits an idle pool is
never held back by headroom meant to protect running requests.

A request with n samples or beams is one entry in `running` / `waiting` / `swapped`: its root
sequence, whose `group` lists the live sequences. It counts as its width against `max_num_seqs`
from admission on (as in vLLM), so its forks never overrun the limit. Groups are scheduled whole
(all members in the same step, consecutively in the batch, root first), so beams always step
together. Per step the work is O(scheduled sequences); nothing scans the KV pool. A decode step
for which the allocator already made room (`Sequence.room`) is taken in a tight run without an
allocator call: most running sequences, most steps. Without chunked prefill, while the running
requests' widths fit the token budget, every running sequence decodes one token and the loop
counts no budget (`_schedule_decodes`).

Lazy decode (`lazy = True`, for executors that read only a batch's totals) is core/lazy_decode.py:
it leaves out of the batch the decodes that nothing happens to.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvbench.core.lazy_decode import LazyDecode
from kvbench.core.sequence import SeqStatus, Sequence
from kvbench.errors import UserError
from kvbench.plugins.allocators.base import KVAllocator

PREEMPTION_MODES = ("recompute", "swap")


@dataclass(slots=True)
class Batch:
    """One step's work: `num_new_tokens[i]` tokens of `seqs[i]`, the last ones of its context."""

    seqs: list = field(default_factory=list)
    num_new_tokens: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    num_tokens: int = 0  # tokens fed to the model
    context_tokens: int = 0  # sum of context lengths after the step (KV read by attention)
    attention_pairs: int = 0  # (query, key) pairs causal attention computes (arith.causal_pairs): FLOPs / 4 / dims
    swapped_blocks: int = 0  # blocks copied to or from the CPU swap pool before this step
    swapped_slots: int = 0
    # KV copied within the device cache since the last step (copy-on-write, forks), in slots: the
    # copies are made before this step's forward (KVAllocator.copied_slots)
    copied_slots: float = 0
    num_steady: int = 0  # lazy decode: sequences decoding one token each that `seqs` leaves out
    num_plain: int = 0  # the first `num_plain` of `seqs` are lone sequences decoding one token

    @property
    def num_seqs(self) -> int:
        """Sequences scheduled, `seqs` and the steady ones."""
        return len(self.seqs) + self.num_steady

    def __len__(self) -> int:
        return self.num_seqs


class Scheduler(LazyDecode):
    def __init__(
        self,
        allocator: KVAllocator,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2560,
        chunked_prefill: bool = False,
        preemption: str = "recompute",
        watermark_when_idle: bool = True,
    ):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise UserError(
                f"scheduler.max_num_seqs={max_num_seqs} and max_num_batched_tokens="
                f"{max_num_batched_tokens} must be >= 1"
            )
        if preemption not in PREEMPTION_MODES:
            raise UserError(f"engine.preemption={preemption!r} is not one of {', '.join(PREEMPTION_MODES)}")
        self.preemption = preemption
        self.allocator = allocator
        # the most tokens one grow asks for: the budget when prompts are chunked; without chunking
        # a prompt or a recompute is prefilled whole (one longer than the budget runs alone)
        allocator.max_step_tokens = max_num_batched_tokens if chunked_prefill else None
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.watermark_when_idle = bool(watermark_when_idle)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.num_running_seqs = 0  # sequences of the running requests, each counted at its width
        self.num_preemptions = 0
        self.recomputed_tokens = 0
        self.swap_fallbacks = 0  # preemptions by swap that recomputed: the swap pool was full
        self.recomputed_pairs = 0  # sum over recomputed sequences of L(L+1)/2: their attention work
        self.last_admit_s = 0.0
        self._copied_seen = 0  # the allocator's copied_slots at the last step scheduled
        self.lazy = False  # lazy decode (core/lazy_decode.py): set before the first step
        self._init_lazy_decode()

    def add(self, seq: Sequence) -> None:
        if not self.chunked_prefill and seq.num_tokens > self.max_num_batched_tokens:
            raise UserError(
                f"a prompt of {seq.num_tokens} tokens exceeds scheduler.max_num_batched_tokens="
                f"{self.max_num_batched_tokens}; raise it or set scheduler.chunked_prefill=true"
            )
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def preempt(self, seq: Sequence, batch: Batch, unrun: bool = False) -> None:
        """Preempt the request of running entry `seq`: swap its blocks out, or drop them to
        recompute. `unrun`: this round grew it, and that growth never runs (allocator.free_unrun)."""
        if seq.steady_since >= 0:
            self._unsteady(seq)
        self._active.discard(seq)
        if seq is self.running[-1]:
            self.running.pop()
        else:
            self.running.remove(seq)
        self.num_running_seqs -= seq.request.width
        members = seq.group or (seq,)
        swapped = False
        if unrun:  # what this round's growth named, swapped out or freed: never written
            self.allocator.forget_unrun(members)
        if self.preemption == "swap":  # an allocator that cannot swap is refused with it (scenarios.build)
            swapped = self.allocator.swap_out(members)
            self.swap_fallbacks += not swapped
        for member in members:
            if swapped:
                member.status = SeqStatus.SWAPPED
            else:
                self.allocator.free(member)
                self.recomputed_tokens += member.num_computed
                self.recomputed_pairs += member.num_computed * (member.num_computed + 1) // 2
                member.dropped = member.num_computed
                member.num_computed = 0
                member.status = SeqStatus.WAITING
            member.num_preemptions += 1
        self.num_preemptions += 1
        (self.swapped if swapped else self.waiting).appendleft(seq)
        batch.preempted.append(seq)

    def schedule(self, now: float = 0.0) -> Batch:
        batch = Batch()
        swapped_before = self.allocator.swapped_blocks
        budget = self.max_num_batched_tokens
        if self.lazy:
            budget = self._schedule_running_lazy(batch, budget)
        elif self.chunked_prefill or self.num_running_seqs > budget:
            budget = self._schedule_running(batch, budget)
        else:  # every running sequence decodes one token, and the budget covers them all
            budget = self._schedule_decodes(batch, budget)
        if self.swapped:
            budget = self._schedule_swapped(batch, budget)
        batch.swapped_blocks = self.allocator.swapped_blocks - swapped_before
        batch.swapped_slots = batch.swapped_blocks * self.allocator.block_size
        self._schedule_waiting(batch, budget, now)
        copied = self.allocator.copied_slots  # this step's copies-on-write, and the last step's forks
        if copied != self._copied_seen and (batch.seqs or batch.num_steady):  # an empty batch does not run
            batch.copied_slots = copied - self._copied_seen
            self._copied_seen = copied
        return batch

    def _run(self, seq: Sequence) -> None:
        """`seq` joins the running list (at its end: the list stays in run_order)."""
        self._runs += 1
        seq.run_order = self._runs
        self.running.append(seq)
        self._active.add(seq)

    def _schedule_running(self, batch: Batch, budget: int) -> int:
        """Running sequences first, oldest first, preempting the newest where one cannot grow;
        returns the token budget left."""
        allocator, running = self.allocator, self.running
        seqs = batch.seqs
        append = seqs.append
        num_tokens = context_tokens = attention_pairs = decode_context = 0
        others = []  # (index in batch, tokens) of running sequences scheduled for more than 1
        room_ran_out = allocator.room_ran_out
        took = 0
        # Iterating a list while preemption pops from its end: the iterator stops where it ends.
        for seq in running:
            if budget <= 0:
                break
            room = seq.room
            if room:  # the allocator grants room only to sequences scheduled alone
                context = seq.num_computed + 1
                if context == seq.num_tokens:  # a decode step into room the allocator granted
                    seq.room = room - 1
                    seq.num_computed = context
                    if room == 1:
                        room_ran_out(seq)
                    append(seq)
                    decode_context += context
                    took += 1
                    budget -= 1
                    continue
            if seq.group is not None:  # a request's samples or beams: one decode token each
                group = seq.group
                if len(group) > budget or not self._grow_group(group, batch):
                    break
                for member in group:
                    member.num_computed = context = member.num_computed + 1
                    append(member)
                    context_tokens += context
                    attention_pairs += context
                num_tokens += len(group)
                budget -= len(group)
                continue
            n = seq.num_tokens - seq.num_computed
            if n > budget:
                n = budget
            while not allocator.grow(seq, n):
                victim = running[-1]  # newest first
                self.preempt(victim, batch)
                if victim is seq:
                    break
            else:
                seq.num_computed = context = seq.num_computed + n
                if n != 1:
                    others.append((len(seqs), n))
                append(seq)
                num_tokens += n
                context_tokens += context
                attention_pairs += n * context - (n * (n - 1) >> 1)  # causal: arith.causal_pairs
                budget -= n
                continue
            break
        if took:
            allocator.took_room(took)
        counts = batch.num_new_tokens = [1] * len(seqs)
        for index, n in others:
            counts[index] = n
        num_tokens += took
        context_tokens += decode_context
        attention_pairs += decode_context
        batch.num_tokens, batch.context_tokens = num_tokens, context_tokens
        batch.attention_pairs = attention_pairs
        return budget

    def _schedule_decodes(self, batch: Batch, budget: int) -> int:
        """`_schedule_running` where the budget cannot run out: without chunked prefill every
        running sequence decodes one token (a prompt is prefilled whole when it is admitted), so
        its request's width is what it needs, and the widths fit the budget. Serve's common step,
        with nothing counted per sequence but its context."""
        allocator, running = self.allocator, self.running
        seqs = batch.seqs
        append = seqs.append
        room_ran_out = allocator.room_ran_out
        context_tokens = grown = 0  # grown: sequences that asked the allocator; the rest took room
        plain = True  # no request of several sequences among them
        for seq in running:  # preemption pops from the list's end: the iterator stops there
            room = seq.room
            if room:  # a decode step into room the allocator granted
                seq.room = room - 1
                seq.num_computed = context = seq.num_computed + 1
                if room == 1:
                    room_ran_out(seq)
                append(seq)
                context_tokens += context
                continue
            if seq.group is not None:  # a request's samples or beams: one decode token each
                plain = False
                group = seq.group
                if not self._grow_group(group, batch):
                    break
                for member in group:
                    member.num_computed = context = member.num_computed + 1
                    append(member)
                    context_tokens += context
                grown += len(group)
                continue
            while not allocator.grow(seq, 1):
                victim = running[-1]  # newest first
                self.preempt(victim, batch)
                if victim is seq:
                    break
            else:
                seq.num_computed = context = seq.num_computed + 1
                append(seq)
                context_tokens += context
                grown += 1
                continue
            break
        num_tokens = len(seqs)
        if num_tokens > grown:
            allocator.took_room(num_tokens - grown)
        batch.num_new_tokens = [1] * num_tokens
        batch.num_tokens = num_tokens
        batch.context_tokens = batch.attention_pairs = context_tokens  # one new token each
        if plain:
            batch.num_plain = num_tokens
        return budget - num_tokens

    def _schedule_swapped(self, batch: Batch, budget: int) -> int:
        """Swapped requests come back, in the order they left, before anything new is admitted."""
        allocator, swapped = self.allocator, self.swapped
        while swapped and budget > 0 and not batch.preempted:
            seq = swapped[0]
            members = seq.group or (seq,)
            if (
                len(members) > budget
                or self.num_running_seqs + seq.request.width > self.max_num_seqs
                or not allocator.swap_in(members)
            ):
                break
            swapped.popleft()
            self._run(seq)
            self.num_running_seqs += seq.request.width
            for member in members:
                member.status = SeqStatus.RUNNING
                if not allocator.grow(member, 1):  # swap_in keeps a block per member free
                    raise RuntimeError(f"{allocator.name}: no room to decode a swapped-in sequence")
                self._add_to_batch(batch, member, 1)
            budget -= len(members)
        return budget

    def _schedule_waiting(self, batch: Batch, budget: int, now: float) -> None:
        """Waiting sequences in arrival order while the allocator admits them and the budgets allow."""
        allocator, running, swapped = self.allocator, self.running, self.swapped
        waiting = self.waiting
        idle_exempt = not self.watermark_when_idle
        while waiting and budget > 0 and not batch.preempted and not swapped:
            seq = waiting[0]
            if self.num_running_seqs + seq.request.width > self.max_num_seqs:
                break
            if idle_exempt:
                allocator.watermark_exempt = not running
            if seq.group is not None:  # a preempted group comes back whole, its prompts re-prefilled
                admitted = self._admit_group(batch, seq, budget)
                if not admitted:
                    break
                waiting.popleft()
                self._run(seq)
                self.num_running_seqs += seq.request.width
                self.last_admit_s = now
                budget -= admitted
                continue
            n = seq.num_tokens - seq.num_computed
            if n > budget:
                if self.chunked_prefill:
                    n = budget
                elif len(batch) or n <= self.max_num_batched_tokens:
                    break
                # else a recomputed request (prompt + its output so far) longer than the budget
                # runs alone in a step, rather than never: add() refuses longer prompts
            if not allocator.admit(seq):
                break
            n = min(n, seq.num_tokens - seq.num_computed)  # a prefix-cache hit may cover some
            if not allocator.grow(seq, n):
                allocator.free(seq)
                seq.num_computed = 0
                if not seq.num_preemptions:  # a first admission undone; a victim keeps its first's hit
                    seq.num_cached = 0
                break
            waiting.popleft()
            if seq.dropped and seq.num_computed:  # what its readmission found cached is not recomputed
                self._found_again(seq)
            seq.status = SeqStatus.RUNNING
            self._run(seq)
            self.num_running_seqs += seq.request.width
            self.last_admit_s = now
            self._add_to_batch(batch, seq, n)
            budget -= n
        allocator.watermark_exempt = False

    def _grow_group(self, group: list, batch: Batch) -> bool:
        """Room for one more token in every member, preempting newest requests as needed;
        False when the group itself had to go."""
        allocator, running = self.allocator, self.running
        for member in group:
            while not allocator.grow(member, 1):
                victim = running[-1]
                self.preempt(victim, batch, unrun=victim is group[0])  # its members grew, and will not run
                if victim is group[0]:
                    return False
        return True

    def _admit_group(self, batch: Batch, root: Sequence, budget: int) -> int:
        """Admit every member of a preempted group and schedule its whole remaining prefill;
        the tokens scheduled, 0 if it does not fit yet. A group larger than the token budget
        runs alone in a step rather than never."""
        allocator, group = self.allocator, root.group
        admitted = []
        for member in group:
            if not allocator.admit(member):
                break
            admitted.append(member)
            if not allocator.grow(member, member.num_tokens - member.num_computed):
                break
        else:
            tokens = sum(m.num_tokens - m.num_computed for m in group)
            if tokens <= budget or not len(batch):  # steady sequences count too
                for member in group:
                    if member.dropped and member.num_computed:
                        self._found_again(member)
                    member.status = SeqStatus.RUNNING
                    self._add_to_batch(batch, member, member.num_tokens - member.num_computed)
                return tokens
        allocator.free_unrun(admitted)  # what their growth named was never computed
        for member in admitted:
            member.num_computed = 0  # num_cached: its first admission's, kept
        return 0

    def _found_again(self, seq: Sequence) -> None:
        """A request its preemption dropped `seq.dropped` tokens of comes back with a prefix-cache
        hit of `seq.num_computed`: those tokens (and their attention) are not recomputed."""
        hit = min(seq.dropped, seq.num_computed)
        self.recomputed_tokens -= hit
        self.recomputed_pairs -= hit * (hit + 1) // 2
        seq.dropped = 0

    @staticmethod
    def _add_to_batch(batch: Batch, seq: Sequence, n: int) -> None:
        seq.num_computed += n
        context = seq.num_computed
        batch.seqs.append(seq)
        batch.num_new_tokens.append(n)
        batch.num_tokens += n
        batch.context_tokens += context
        batch.attention_pairs += n * context - (n * (n - 1) >> 1)  # causal: arith.causal_pairs

    def finish(self, seq: Sequence) -> None:
        """Retire running entry `seq` and every sequence of its group."""
        self.running.remove(seq)
        self._active.discard(seq)
        self.num_running_seqs -= seq.request.width
        for member in seq.group or (seq,):
            self.allocator.free(member)
            member.status = SeqStatus.FINISHED
