"""Lazy decode (core/scheduler.py) decides exactly what the eager loop decides.

Two engines run the same random requests: one with an executor that asks for every scheduled
sequence (the eager loop), one with an executor that reads only a batch's totals (the scheduler
then advances steady decodes in bulk). Every step's totals, preemptions and accounting, every
request's token times, first-token and finish times, preemptions and finishing order must be
equal, and so must the result rows. The workloads mix parallel samples, beams, shared prefixes,
chunked prefill, swap and recompute, and pools small enough to preempt.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from kvbench.core.engine import Engine
from kvbench.core.scheduler import Scheduler
from kvbench.core.sequence import Request
from kvbench.plugins.allocators.paged import PagedAllocator

from helpers.decisions import REQUESTS, Totals, decisions


def run(
    requests,
    lazy,
    block_size,
    num_slots,
    prefix_caching,
    chunked_prefill,
    preemption,
    max_num_seqs,
    budget,
    max_model_len=256,
    watermark=0.02,
):
    allocator = PagedAllocator(
        num_slots, max_model_len, block_size=block_size, watermark=watermark, prefix_caching=prefix_caching
    )
    allocator.enable_swap(num_slots)
    scheduler = Scheduler(
        allocator,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        chunked_prefill=chunked_prefill,
        preemption=preemption,
    )
    return decisions(scheduler, requests, lazy)


def eager_and_lazy(
    made, num_slots, max_model_len, block_size, max_num_seqs, budget, preemption, prefix_caching=False, chunked=False
):
    """What the eager loop and lazy decode decided for `made` (`run`'s, with a 1 % watermark)."""
    pool = (block_size, num_slots, prefix_caching, chunked, preemption, max_num_seqs, budget, max_model_len, 0.01)
    return [run(made, lazy, *pool) for lazy in (False, True)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=REQUESTS,
    block_size=st.sampled_from([1, 4, 16]),
    num_slots=st.integers(112, 400),
    prefix_caching=st.booleans(),
    chunked_prefill=st.booleans(),
    preemption=st.sampled_from(["recompute", "swap"]),
    max_num_seqs=st.integers(3, 16),
    budget=st.sampled_from([16, 64, 128, 512]),
)
def test_lazy_decode_decides_every_step_as_the_eager_loop(
    requests, block_size, num_slots, prefix_caching, chunked_prefill, preemption, max_num_seqs, budget
):
    if not chunked_prefill:  # a recomputed request re-prefills prompt + output in one step
        budget = max(budget, 128)
    made = []
    for i, (arrival, prompt, output, prefix, (n, beam)) in enumerate(sorted(requests)):
        tokens = np.array([(prefix * 13 + p) % 11 if prefix >= 0 else (i * 31 + p) % 97 for p in range(prompt)])
        made.append(Request(i, arrival, prompt, output, tokens, n=n, beam_width=beam, prefix_id=prefix))
    if not made:
        return
    options = (block_size, num_slots, prefix_caching, chunked_prefill, preemption, max_num_seqs, budget)
    eager = run(made, False, *options)
    lazy = run(made, True, *options)
    if isinstance(eager, str):
        assert lazy == eager
        event("refused: a request larger than the pool")
        return
    event(f"preempted: {bool(eager[3]['preemptions'])}")
    assert lazy[0] == eager[0]  # every step's totals and preemptions
    assert lazy[1] == eager[1]  # the recorder's clock, batch sizes and accounting
    assert lazy[2] == eager[2]  # each sequence's tokens, times and preemptions, in finishing order
    assert lazy[3] == eager[3]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(
        st.tuples(
            st.floats(0.0, 0.2),  # arrival
            st.integers(1, 40),  # prompt
            st.integers(30, 150),  # output: long enough to decode through several blocks
            st.sampled_from([(1, 1)] * 6 + [(2, 1), (1, 2)]),  # (n, beam_width)
        ),
        min_size=20,
        max_size=60,
    ),
    block_size=st.sampled_from([2, 4, 16]),
    preemption=st.sampled_from(["recompute", "recompute", "swap"]),
    num_slots=st.integers(250, 1200),
    max_num_seqs=st.integers(16, 64),
)
def test_long_decodes_in_a_tight_pool_preempt_as_the_eager_loop(
    shapes, block_size, preemption, num_slots, max_num_seqs
):
    """Many sequences decoding through whole blocks in a pool that cannot hold them all: the
    quiet stretch meets steps whose crossings the free blocks do not cover and preempts for
    them itself (cross_quietly; with swap it leaves them to schedule()). The random workloads
    above reach such steps rarely; these reach them in about one example in four."""
    made = [
        Request(i, arrival, prompt, output, np.arange(prompt) + 7 * i, n=n, beam_width=beam)
        for i, (arrival, prompt, output, (n, beam)) in enumerate(sorted(shapes))
    ]
    eager, lazy = eager_and_lazy(made, num_slots, 256, block_size, max_num_seqs, 4096, preemption=preemption)
    if not isinstance(eager, str):
        event(f"preempted: {bool(eager[3]['preemptions'])}")
    assert lazy == eager


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(
        st.tuples(
            st.floats(0.0, 0.3),  # arrival: long prompts arrive while others decode
            st.sampled_from([2, 9, 30, 60, 150, 240]),  # prompt: many fed in chunks
            st.integers(1, 90),  # output
            st.sampled_from([(1, 1)] * 6 + [(2, 1), (1, 2)]),  # (n, beam_width)
            st.integers(-1, 1),  # shared prefix group, -1 = none
        ),
        min_size=10,
        max_size=50,
    ),
    block_size=st.sampled_from([1, 4, 16]),
    prefix_caching=st.booleans(),
    preemption=st.sampled_from(["recompute", "swap"]),
    num_slots=st.integers(300, 2000),
    max_num_seqs=st.integers(4, 48),
    budget=st.integers(4, 48),
)
@example(  # steady decodes over the budget began a quiet stretch: 5 tokens ran in a step of 4
    shapes=[(0.0, 2, 1, (1, 1), 0)] * 12
    + [(0.25, 2, 1, (1, 1), 0)] * 5
    + [(0.1875, 2, 27, (1, 1), 0), (0.1875, 9, 2, (2, 1), 0), (0.1796875, 150, 25, (2, 1), 0)],
    block_size=4,
    prefix_caching=False,
    preemption="recompute",
    num_slots=352,
    max_num_seqs=10,
    budget=4,
)
def test_prompts_fed_in_chunks_beside_steady_decodes_are_fed_as_the_eager_loop_feeds_them(
    shapes, block_size, prefix_caching, preemption, num_slots, max_num_seqs, budget
):
    """Chunked prefill with a budget that the decodes and a prompt's chunk overrun: the prompts
    fed in chunks take what the steady decodes ahead of them leave (none where the decodes take it
    all), where they are the newest running; elsewhere the eager loop decides. The random workloads
    above reach such steps rarely; these reach them in most examples."""
    made = [
        Request(
            i,
            arrival,
            prompt,
            output,
            np.array([(7 * p + prefix) % 13 if prefix >= 0 else (i * 31 + p) % 97 for p in range(prompt)]),
            n=n,
            beam_width=beam,
            prefix_id=prefix,
        )
        for i, (arrival, prompt, output, (n, beam), prefix) in enumerate(sorted(shapes))
    ]
    eager, lazy = eager_and_lazy(
        made, num_slots, 512, block_size, max_num_seqs, budget, preemption, prefix_caching, chunked=True
    )
    if not isinstance(eager, str):
        event(f"preempted: {bool(eager[3]['preemptions'])}")
        # a step that filled the budget with several sequences: decodes and a chunk shared it
        event(f"budget shared: {any(num_tokens == budget and num_seqs > 1 for num_tokens, num_seqs, *_ in eager[0])}")
    assert lazy == eager


def count_calls(scheduler, allocator, *names) -> dict:
    """Count the calls of the scheduler's or allocator's methods `names`; "grow_steady" counts
    the blocks steady crossings take: grow_steady's, grow_steady_all's (one call for several
    sequences and striding crossings) and take_striding's (the striding crossings of a step)."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        owner = scheduler if hasattr(scheduler, name) else allocator
        method = getattr(owner, name)

        def counted(*args, _method=method, _name=name):
            calls[_name] += 1
            return _method(*args)

        setattr(owner, name, counted)
    if "grow_steady" in names:
        many = allocator.grow_steady_all

        def counted_all(seqs, num_computed, striding=0):
            granted = many(seqs, num_computed, striding)
            calls["grow_steady"] += 0 if granted is None else len(granted) + striding
            return granted

        strides = allocator.take_striding

        def counted_strides(count):
            taken = strides(count)
            calls["grow_steady"] += count if taken else 0
            return taken

        allocator.grow_steady_all, allocator.take_striding = counted_all, counted_strides
    return calls


def test_steady_decodes_are_left_out_of_the_batch_but_counted():
    """64 requests decoding with room: most steps touch a few sequences and count the rest."""
    requests = [Request(i, 0.0, 20 + i % 16, 200, np.arange(20 + i % 16)) for i in range(64)]
    sizes = []

    class Watch(Totals):
        quiet_step_s = None  # every step scheduled and executed, quiet or not

        def execute(self, batch):
            sizes.append((len(batch.seqs), batch.num_steady, batch.num_seqs))
            return super().execute(batch)

    allocator = PagedAllocator(64 * 240, 256, block_size=16)
    scheduler = Scheduler(allocator, max_num_seqs=64, max_num_batched_tokens=4096)
    executor = Watch(needs_sequences=False)
    Engine(scheduler, executor, progress=False).run(requests)
    middle = sizes[20:150]  # every request decodes
    assert all(num_seqs == 64 and touched + steady == 64 for touched, steady, num_seqs in middle)
    assert max(touched for touched, _, _ in middle) <= 16  # one block boundary each per 16 steps
    assert sum(steady for _, steady, _ in middle) > 0.8 * 64 * len(middle)


def test_a_steady_decode_takes_each_new_block_without_being_brought_up_to_date():
    """64 requests of 200 tokens at block 16 cross 12 or 13 block boundaries each. paged's short
    path (grow_steady) takes each new block while the sequence stays steady: a sequence is
    brought up to date once, when its output ends, not once per block (13 times before)."""
    requests = [Request(i, 0.0, 20 + i % 16, 200, np.arange(20 + i % 16)) for i in range(64)]
    allocator = PagedAllocator(64 * 240, 256, block_size=16)
    scheduler = Scheduler(allocator, max_num_seqs=64, max_num_batched_tokens=4096)
    calls = count_calls(scheduler, allocator, "_unsteady", "grow_steady", "grow")
    row = Engine(scheduler, Totals(needs_sequences=False), progress=False).run(requests)
    assert row["completed"] == 64 and row["preemptions"] == 0
    assert calls["_unsteady"] == 64
    assert 64 * 12 <= calls["grow_steady"] <= 64 * 13
    assert calls["grow"] <= 2 * 64  # before the sequence is steady: its first decode steps


def test_steps_that_only_give_steady_decodes_new_blocks_are_not_scheduled():
    """The same 64 requests: after their first decode steps, a step meets a steady sequence
    only to give it a new block, or when its output ends. The quiet stretch runs through the
    first kind (Scheduler.cross_quietly), so schedule() is called at the admission and the
    finishing steps, a few hundred times, not at each of the ~215 steps x 64 block crossings."""
    requests = [Request(i, 0.0, 20 + i % 16, 200, np.arange(20 + i % 16)) for i in range(64)]
    allocator = PagedAllocator(64 * 240, 256, block_size=16)
    scheduler = Scheduler(allocator, max_num_seqs=64, max_num_batched_tokens=4096)
    calls = count_calls(scheduler, allocator, "schedule", "grow_steady")
    row = Engine(scheduler, Totals(needs_sequences=False), progress=False).run(requests)
    assert row["completed"] == 64 and row["steps"] >= 200
    assert 64 * 12 <= calls["grow_steady"] <= 64 * 13  # every block still taken one by one
    assert calls["schedule"] < 0.5 * row["steps"]
    lazy = decisions(Scheduler(PagedAllocator(64 * 240, 256, block_size=16), 64, 4096), requests, True)
    eager = decisions(Scheduler(PagedAllocator(64 * 240, 256, block_size=16), 64, 4096), requests, False)
    assert lazy == eager


def test_a_sequence_that_decodes_through_whole_blocks_strides_and_gets_their_blocks_when_met():
    """The same 64 requests: after a steady sequence's first crossing into a block it will fill,
    its next crossings (one every 16 steps) are counted in bulk, a step's all at once
    (take_striding), and the blocks are handed to it once, when it is next met (its last
    block, or its end). Every block is still taken and counted, and decisions are the eager
    loop's."""
    requests = [Request(i, 0.0, 20 + i % 16, 200, np.arange(20 + i % 16)) for i in range(64)]
    allocator = PagedAllocator(64 * 240, 256, block_size=16)
    scheduler = Scheduler(allocator, max_num_seqs=64, max_num_batched_tokens=4096)
    calls = count_calls(scheduler, allocator, "grow_steady", "hand_striding", "_start_stride")
    handed, fills = [], set()
    hand = allocator.hand_striding

    def watched_hand(seq, count):
        hand(seq, count)
        handed.append(count)
        table = allocator.block_tables[seq.seq_id]  # each block's fill as the crossings left it:
        fills.add((*{allocator.block_fill[b] for b in table[:-1]}, allocator.block_fill[table[-1]]))

    allocator.hand_striding = watched_hand
    row = Engine(scheduler, Totals(needs_sequences=False), progress=False).run(requests)
    assert fills == {(16, 1)}  # every block full but the newest, which holds its first token
    assert row["completed"] == 64 and row["preemptions"] == 0
    assert 64 * 12 <= calls["grow_steady"] <= 64 * 13  # every block, counted
    assert 64 <= calls["_start_stride"] <= 3 * 64  # a sequence starts striding once or twice...
    assert len(handed) <= 2 * 64 and sum(handed) >= 64 * 10  # ...and gets its ~11 blocks at once
    assert not allocator._striding and allocator.pool.num_free == allocator.num_blocks
    lazy = decisions(Scheduler(PagedAllocator(64 * 240, 256, block_size=16), 64, 4096), requests, True)
    eager = decisions(Scheduler(PagedAllocator(64 * 240, 256, block_size=16), 64, 4096), requests, False)
    assert lazy == eager


def test_a_step_whose_crossings_the_pool_cannot_all_take_preempts_in_the_stretch_as_eagerly():
    """The 64 requests in a pool that holds about half their blocks: the quiet stretch reaches
    steps at which the free blocks do not cover every crossing (grow_steady_all or
    take_striding refuses them, changing nothing). The stretch runs them itself, preempting
    the newest requests as `_meet` would (cross_quietly): exactly the eager loop's preemptions,
    at the same steps, and schedule() is not called for them."""
    requests = [Request(i, 0.0, 20 + i % 16, 200, np.arange(20 + i % 16)) for i in range(64)]
    refused, scheduled_preemptions = [], []
    allocator = PagedAllocator(64 * 120, 256, block_size=16)
    grow_steady_all = allocator.grow_steady_all

    take_striding = allocator.take_striding

    def watched(seqs, num_computed, striding=0):
        granted = grow_steady_all(seqs, num_computed, striding)
        refused.append(granted is None)
        return granted

    def watched_strides(count):
        taken = take_striding(count)
        refused.append(not taken)
        return taken

    allocator.grow_steady_all, allocator.take_striding = watched, watched_strides
    scheduler = Scheduler(allocator, 64, 4096)
    schedule = scheduler.schedule

    def watched_schedule(now=0.0):
        batch = schedule(now)
        scheduled_preemptions.extend(batch.preempted)
        return batch

    scheduler.schedule = watched_schedule
    lazy = decisions(scheduler, requests, True)
    eager = decisions(Scheduler(PagedAllocator(64 * 120, 256, block_size=16), 64, 4096), requests, False)
    assert eager[3]["preemptions"] > 0
    assert any(refused) and not all(refused)
    assert len(scheduled_preemptions) < eager[3]["preemptions"]  # the others: in the stretch
    assert lazy == eager


def test_a_group_larger_than_the_budget_waits_while_steady_sequences_run():
    """A preempted group whose re-prefill exceeds the token budget runs alone, and only alone:
    steady sequences, though left out of `batch.seqs`, make the batch non-empty."""
    shapes = [(21, 10, 4), (31, 58, 3), (36, 12, 3), (13, 58, 1), (22, 61, 1), (9, 55, 3), (34, 30, 1)]
    arrivals = [0.00017, 0.00745, 0.01157, 0.0124, 0.01781, 0.01921, 0.02898]
    made = [
        Request(i, arrival, prompt, output, np.arange(prompt) + 100 * i, n=n)
        for i, (arrival, (prompt, output, n)) in enumerate(zip(arrivals, shapes))
    ]
    options = (4, 400, False, False, "recompute", 11, 128)
    eager, lazy = run(made, False, *options), run(made, True, *options)
    assert eager[3]["preemptions"] > 0
    assert lazy == eager


def test_a_prefill_chunk_that_leaves_one_token_keeps_its_first_token_time():
    """Chunked prefill can leave a prompt's last token for a step of room: the sequence is
    steady before its first token, which must still be timed at that step (found by search)."""
    shapes = [(25, 32, 1, 0), (8, 51, 2, 0), (30, 12, 2, 0), (29, 10, 1, 1), (38, 13, 1, 1), (9, 39, 2, 1)]
    arrivals = [0.0039009504, 0.0039719545, 0.0091001497, 0.0179417794, 0.0192798631, 0.0222479908]
    made = [
        Request(i, arrival, prompt, output, np.arange(prompt) % 7 + 50 * prefix, n=n, prefix_id=prefix)
        for i, (arrival, (prompt, output, n, prefix)) in enumerate(zip(arrivals, shapes))
    ]
    options = (16, 409, False, True, "recompute", 4, 16)
    eager, lazy = run(made, False, *options), run(made, True, *options)
    assert lazy == eager


def test_a_last_prompt_token_that_starts_a_block_forks_its_samples_rather_than_going_steady():
    """A request of two samples whose chunked prefill leaves its last prompt token at a block
    boundary: grow gives it a new block with room, but the token ends the prompt and forks the
    request, so the sequence must not go steady there (it did with a quiet allocator, and then
    decoded as one sequence instead of two; found by search)."""
    shapes = [(1, 1, 1)] * 17 + [(2, 1, 1), (9, 2, 2)]
    made = [
        Request(i, 0.0, prompt, output, np.arange(prompt) % 11, n=n) for i, (prompt, output, n) in enumerate(shapes)
    ]
    options = (4, 112, False, True, "recompute", 11, 16)
    eager, lazy = run(made, False, *options), run(made, True, *options)
    # the step after the 9-token prompt's last chunk (8 then 1): both samples decode
    assert eager[0][3][:2] == (2, 2)
    assert lazy == eager


def test_a_group_that_fills_the_pool_is_refused_before_it_can_wait_forever():
    """Three samples of 88 slots each fill a 264-slot pool exactly. Preempted late, the group must
    come back whole with the admission watermark kept free, and never fits again: the run is
    refused up front with a one-line reason, not left stuck with "no sequence can run" (found
    by search)."""
    shapes = [(1, 1, 1)] * 8 + [(1, 60, 1), (26, 60, 3)]
    made = [
        Request(i, 0.0, prompt, output, np.arange(prompt) % 97, n=n) for i, (prompt, output, n) in enumerate(shapes)
    ]
    options = (4, 264, False, False, "recompute", 4, 128)
    eager, lazy = run(made, False, *options), run(made, True, *options)
    assert isinstance(eager, str) and "cannot hold the 3 sequences of one request" in eager
    assert lazy == eager
    wider_pool = (4, 272, False, False, "recompute", 4, 128)  # room for the watermark: it runs
    assert run(made, True, *wider_pool) == run(made, False, *wider_pool)
    assert not isinstance(run(made, False, *wider_pool), str)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(
        st.tuples(
            st.floats(0.0, 0.3),  # arrival
            st.integers(1, 8),  # prompt: within the budget, so that no request is refused outright
            st.integers(1, 60),  # output: a recompute (prompt + output so far) outgrows the budget
            st.sampled_from([(1, 1)] * 4 + [(2, 1), (3, 1), (1, 2)]),  # (n, beam_width)
        ),
        min_size=2,
        max_size=30,
    ),
    preemption=st.sampled_from(["recompute", "swap"]),
    num_slots=st.integers(120, 600),
    max_num_seqs=st.integers(4, 24),
    budget=st.integers(8, 24),
)
@example(  # a recompute over the whole budget behind a stale meeting: lazy ran an empty step first
    shapes=[(0.0, 1, 1, (1, 1)), (0.25, 5, 45, (3, 1)), (0.28125, 1, 22, (1, 1))],
    preemption="recompute",
    num_slots=192,
    max_num_seqs=4,
    budget=5,
)
def test_a_small_budget_without_chunked_prefill_is_spent_as_the_eager_loop_spends_it(
    shapes, preemption, num_slots, max_num_seqs, budget
):
    """Without chunked prefill the budget bounds whole prompts and recomputes: one longer than it
    runs alone in a step, decodes beyond it wait. The workloads above draw budgets of 128 and
    more here, and the small-budget test feeds prompts in chunks."""
    made = [
        Request(i, arrival, prompt, output, np.arange(prompt) + 7 * i, n=n, beam_width=beam)
        for i, (arrival, prompt, output, (n, beam)) in enumerate(sorted(shapes))
    ]
    eager, lazy = eager_and_lazy(made, num_slots, 512, 16, max_num_seqs, budget, preemption)
    if not isinstance(eager, str):
        event(f"preempted: {bool(eager[3]['preemptions'])}")
    assert lazy == eager
