"""The Orca allocators' room and remembered refusals against the logic they replaced.

`Frozen` keeps the previous behaviour of contiguous, oracle and pow2: no room granted (every
decode asks the allocator to grow, one call per sequence and step) and every admission searches
the placement again, however often the same sequence was refused with nothing placed or freed
since. The same random requests run on the frozen allocator (eager loop) and on today's, with
the eager loop and with lazy decode (where an Orca sequence is now left alone from its first
decode to its last); every step's totals, accounting and batch size, every request's times and
the result rows, external-fragmentation waits included, must be equal.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.core.engine import Engine
from kvbench.core.scheduler import Scheduler
from kvbench.core.sequence import Request
from kvbench.plugins.allocators.contiguous import ContiguousAllocator, OracleAllocator
from kvbench.plugins.allocators.pow2 import Pow2Allocator

from helpers.decisions import REQUESTS, Totals, decisions

POLICIES = {"contiguous": ContiguousAllocator, "oracle": OracleAllocator, "pow2": Pow2Allocator}


def frozen(policy):
    class Frozen(policy):
        def _update(self, seq, num_tokens):
            super()._update(seq, num_tokens)
            seq.room = self._granted[seq.seq_id] = 0

        def admit(self, seq):
            self._refused = None  # search the space every time, as before
            return super().admit(seq)

    return Frozen


def run(cls, requests, lazy, num_slots, block_size, placement, max_num_seqs, chunked_prefill=False, budget=512):
    allocator = cls(num_slots, 256, block_size=block_size, placement=placement)
    scheduler = Scheduler(
        allocator, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, chunked_prefill=chunked_prefill
    )
    return decisions(scheduler, requests, lazy)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=REQUESTS,
    policy=st.sampled_from(sorted(POLICIES)),
    placement=st.sampled_from(["buddy", "first_fit"]),
    block_size=st.sampled_from([1, 4, 16]),
    num_slots=st.integers(256, 1600),
    max_num_seqs=st.integers(3, 16),
    chunked_prefill=st.booleans(),
    budget=st.sampled_from([16, 512]),
)
def test_room_and_remembered_refusals_decide_every_step_as_before(
    requests, policy, placement, block_size, num_slots, max_num_seqs, chunked_prefill, budget
):
    made = [
        Request(i, arrival, prompt, output, np.arange(prompt) % 97, n=n, beam_width=beam)
        for i, (arrival, prompt, output, _, (n, beam)) in enumerate(sorted(requests))
    ]
    if not chunked_prefill:  # a recomputed request re-prefills prompt + output in one step
        budget = 512
    options = (num_slots, block_size, placement, max_num_seqs, chunked_prefill, budget)
    before = run(frozen(POLICIES[policy]), made, False, *options)
    for lazy in (False, True):
        now = run(POLICIES[policy], made, lazy, *options)
        if isinstance(before, str):
            assert now == before
            continue
        assert now[0] == before[0]  # every step's totals
        assert now[1] == before[1]  # the clock, batch sizes and accounting of every step
        assert now[2] == before[2]  # each sequence's tokens, times and preemptions, in finishing order
        assert now[3] == before[3]  # the result row, external_frag_waits included


def test_an_orca_sequence_is_left_alone_from_its_first_decode_to_its_last():
    """Under lazy decode a reserving allocator's decodes are steady: per step the batch lists
    only the sequences that start or end, and the allocator is asked to grow for prefills only."""
    requests = [Request(i, 0.0, 20 + i % 16, 200, np.arange(20 + i % 16)) for i in range(32)]
    listed, grows = [], []

    class Watch(Totals):
        def execute(self, batch):
            listed.append((len(batch.seqs), batch.num_seqs))
            return super().execute(batch)

    class Counting(OracleAllocator):
        def grow(self, seq, num_tokens):
            grows.append(num_tokens)
            return super().grow(seq, num_tokens)

    allocator = Counting(32 * 256, 256, block_size=16)
    Engine(Scheduler(allocator, max_num_seqs=32), Watch(needs_sequences=False), progress=False).run(requests)
    middle = listed[5:190]  # every request decodes, none has ended
    assert all(num_seqs == 32 and touched == 0 for touched, num_seqs in middle)
    assert len(grows) == 32 and all(n > 1 for n in grows)  # the prompts; no decode asked
    assert allocator.accounting().token == 0 and allocator._reserved == 0  # all given back
