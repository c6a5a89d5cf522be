"""The scheduler's fast decode path against the step logic it replaced, on random workloads.

`FrozenScheduler` and `FrozenPaged` keep the previous logic: every running sequence asks the
allocator to grow, one call each, and the allocator's own decode fast path fills the last block.
What did not change (the swapped and waiting loops, grow's other paths) they inherit.
Both sides get the same requests and the same sampled tokens; every step's batch, preemptions
and accounting must be equal.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.core.engine import Engine
from kvbench.core.scheduler import Batch, Scheduler
from kvbench.core.sequence import Request, Sequence
from kvbench.plugins.allocators.paged import PagedAllocator


class FrozenPaged(PagedAllocator):
    """The paged allocator as it was: no room granted; a decode token that has room in an
    unshared last block is counted inside grow (the rest of grow did not change)."""

    def _update_reserved(self, seq, num_tokens):
        super()._update_reserved(seq, num_tokens)
        seq.room = self._granted[seq.seq_id] = 0

    def grow(self, seq, num_tokens):
        before = seq.num_computed
        if num_tokens == 1 and before % self.block_size:
            seq_id, seq_reserved, block_fill = seq.seq_id, self._seq_reserved, self.block_fill
            block = self.block_tables[seq_id][-1]
            if self.ref_count[block] == 1 and seq_reserved[seq_id]:
                block_fill[block] += 1
                self._token += 1
                self._reserved -= 1
                seq_reserved[seq_id] -= 1
                if self.prefix_caching and block_fill[block] == self.block_size:
                    self._cache_full_blocks(seq, before + 1)
                return True
        grown = super().grow(seq, num_tokens)
        if seq.room:  # granted by a path that inlines _update_reserved (a new block's first token)
            seq.room = self._granted[seq.seq_id] = 0
        return grown


class FrozenScheduler(Scheduler):
    """The running sequences' loop as it was: one grow call per sequence, for requests of one
    sequence (the swapped and waiting loops did not change)."""

    def _schedule_running(self, batch: Batch, budget: int) -> int:
        allocator, running = self.allocator, self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            while not allocator.grow(seq, n):
                victim = running[-1]
                self.preempt(victim, batch)
                if victim is seq:
                    break
            else:
                self._add_to_batch(batch, seq, n)
                budget -= n
                i += 1
                continue
            break
        return budget

    _schedule_decodes = _schedule_running  # the loop without a budget replaces this one too


def frozen_advance(scheduler: Scheduler, batch: Batch, clock: float) -> None:
    finished = []
    for seq in batch.seqs:
        if seq.num_computed < seq.num_tokens:
            continue
        seq.token_ids.append(sampled(seq))
        seq.num_tokens += 1
        if seq.first_token_s is None:
            seq.first_token_s = clock
        if seq.num_tokens >= seq.request.max_tokens:
            finished.append(seq)
    for seq in finished:
        scheduler.finish(seq)


def sampled(seq: Sequence) -> int:
    """The token both sides sample: a request's text continues its prefix group's, so a later
    prompt of the group can hit blocks an earlier sequence filled while decoding."""
    return (seq.token_ids[0] + seq.num_tokens) % 11


REQUESTS = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 40), st.integers(1, 40), st.integers(0, 2)), min_size=1, max_size=30
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=REQUESTS,
    block_size=st.sampled_from([1, 4, 16]),
    num_slots=st.integers(96, 400),
    prefix_caching=st.booleans(),
    chunked_prefill=st.booleans(),
    preemption=st.sampled_from(["recompute", "swap"]),
    max_num_seqs=st.integers(1, 12),
    budget=st.sampled_from([16, 48, 256]),
)
def test_the_fast_decode_path_schedules_and_preempts_exactly_as_before(
    requests, block_size, num_slots, prefix_caching, chunked_prefill, preemption, max_num_seqs, budget
):
    sides = []
    for allocator_cls, scheduler_cls in ((FrozenPaged, FrozenScheduler), (PagedAllocator, Scheduler)):
        allocator = allocator_cls(num_slots, 256, block_size=block_size, watermark=0.02, prefix_caching=prefix_caching)
        allocator.enable_swap(num_slots)
        scheduler = scheduler_cls(
            allocator,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            chunked_prefill=chunked_prefill,
            preemption=preemption,
        )
        sides.append((scheduler, Engine(scheduler, executor=None, progress=False)))
    arrivals = sorted(
        (arrival, i, prompt, output, prefix) for i, (arrival, prompt, output, prefix) in enumerate(requests)
    )
    for step in range(400):
        observed = []
        for scheduler, engine in sides:
            for arrival, i, prompt, output, prefix in arrivals:
                if arrival == step and (chunked_prefill or prompt <= budget):
                    tokens = [(prefix * 13 + position) % 11 for position in range(prompt)]
                    scheduler.add(Sequence(i, Request(i, 0.0, prompt, output), prompt, token_ids=tokens))
            batch = scheduler.schedule(float(step))
            if scheduler is sides[0][0]:
                frozen_advance(scheduler, batch, float(step))
            else:
                engine._advance(batch, [sampled(seq) for seq in batch.seqs], float(step))
            acc = scheduler.allocator.accounting()
            observed.append(
                (
                    [(s.seq_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)],
                    [s.seq_id for s in batch.preempted],
                    batch.num_tokens,
                    batch.context_tokens,
                    batch.attention_pairs,
                    batch.swapped_blocks,
                    (acc.token, acc.reserved, acc.internal),
                    scheduler.allocator.prefix_hit_tokens,
                )
            )
        assert observed[0] == observed[1], f"step {step}"
        if not any(s.has_work() for s, _ in sides) and step > 30:
            break
