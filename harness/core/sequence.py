"""A sequence's life in the engine: its tokens, how many have KV stored, and when things happened.

A request with `n` samples or `beam_width` beams becomes several sequences that share the
request (a group); the allocator only ever sees sequences, the scheduler moves groups whole.
"""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field
from functools import partial

import numpy as np


@dataclass(eq=False)
class Request:
    """One user request as the workload generates it (lengths in tokens, times in seconds)."""

    request_id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    prompt_tokens: np.ndarray | None = None  # token ids; None when only lengths are simulated
    n: int = 1  # parallel samples
    beam_width: int = 1
    prefix_id: int = -1  # which shared system prompt it starts with, -1 = none

    def __post_init__(self):
        # Tokens whose KV is stored when the request ends (the last sampled token is never fed).
        self.final_len = self.prompt_len + self.output_len - 1
        self.max_tokens = self.prompt_len + self.output_len
        self.width = max(self.n, self.beam_width)  # sequences the request runs once its prompt is done


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(eq=False, slots=True, weakref_slot=True)  # slots: its counters are read and written every step;
# weakref_slot: a finished sequence can be watched being freed (tests/test_serving_metrics.py)
class Sequence:
    """Token state of one sequence.

    Invariant: `num_computed <= num_tokens`; the tokens in [num_computed, num_tokens) are the
    ones the next step feeds to the model. `num_tokens - request.prompt_len` tokens have been
    generated.
    """

    seq_id: int
    request: Request
    num_tokens: int
    num_computed: int = 0
    status: SeqStatus = SeqStatus.WAITING
    token_ids: list = field(default_factory=list)  # prompt + generated ids (serve only)
    num_cached: int = 0  # prompt tokens whose KV a prefix-cache hit supplied at its first admission
    first_token_s: float | None = None
    # when each generated token came (a group's root): float64s in a C array, which numpy reads
    # without a copy when the request's inter-token latencies are taken
    token_times: array = field(default_factory=partial(array, "d"))
    finish_s: float | None = None
    num_preemptions: int = 0
    dropped: int = 0  # tokens its last preemption by recompute dropped (a hit on readmission finds some again)
    parent: Sequence | None = None
    cumulative_logprob: float = 0.0
    # A request of width > 1 forks when its prompt is done; from then on its live sequences,
    # root first, are scheduled, preempted and finished together. None for a lone sequence.
    group: list | None = None
    sample_index: int = 0  # which of the request's samples / beam slots (seeds its sampling)
    # Single-token steps the allocator has already made room for (KVAllocator.grant_room): the
    # scheduler takes them without asking it, one a step, and reports how many it took.
    room: int = 0
    # Lazy decode (Scheduler.lazy): the step from which the scheduler advances this sequence in
    # bulk (its counters and token_times are as of that step's start), -1 when it does not.
    steady_since: int = -1
    # Striding (lazy decode, an allocator with `stride`): a steady sequence that decodes through
    # whole blocks crosses into a new one every `stride` steps. From its crossing at step
    # `stride_start` on, its next `stride_len` crossings are counted in bulk; the blocks of the
    # first `stride_done` of them are in its table, the others are handed to it when it is next
    # met (LazyDecode._end_stride). -1: not striding.
    stride_start: int = -1
    stride_len: int = 0
    stride_done: int = 0
    run_order: int = 0  # when it joined the running list: the running list is in this order
    # the request's final_len, max_tokens and width, read on every step
    final_len: int = field(init=False)
    max_tokens: int = field(init=False)
    width: int = field(init=False)

    @property
    def num_generated(self) -> int:
        return self.num_tokens - self.request.prompt_len

    def __post_init__(self):
        request = self.request
        self.final_len, self.max_tokens, self.width = request.final_len, request.max_tokens, request.width


# A stand-in id's span of positions: one sequence's ids never reach another's range
STAND_IN_SPAN = 1 << 32


def stand_in_ids(seq: Sequence, upto: int) -> list:
    """`seq.token_ids`, first extended to `upto` ids where a simulated run has none to give.

    A simulated run draws no token ids (only lengths), yet the prefix cache names a block by its
    ids, and vLLM's finds a preempted request's own blocks again when it is readmitted, decoded
    tokens included. A missing id is a stand-in: a negative number (a real id is >= 0) unique to
    its position and owner, the request for a prompt position (its samples share the prompt),
    the sequence for a generated one. So a request matches no other request's blocks, as
    distinct prompts and outputs do not, and every block of its own."""
    tokens = seq.token_ids
    if len(tokens) < upto:
        prompt = seq.request.prompt_len
        asked = -(2 * seq.request.request_id + 1) * STAND_IN_SPAN  # odd multiples: prompt positions
        generated = -(2 * seq.seq_id + 2) * STAND_IN_SPAN  # even multiples: generated ones
        tokens.extend([asked - p if p < prompt else generated - p for p in range(len(tokens), upto)])
    return tokens
