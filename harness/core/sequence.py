"""A sequence's life in the engine: its tokens, how many have KV stored, and when things happened.

A request with `n` samples or `beam_width` beams becomes several sequences that share the
request (a group); the allocator only ever sees sequences, the scheduler moves groups whole.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

import numpy as np


@dataclass(eq=False)
class Request:
    """One user request as the workload generates it (lengths in tokens, times in seconds)."""

    request_id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    prompt_tokens: Optional[np.ndarray] = None  # token ids; None when only lengths are simulated
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


@dataclass(eq=False)
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
    num_cached: int = 0  # tokens whose KV a prefix-cache hit supplied at admission
    first_token_s: Optional[float] = None
    token_times: list = field(default_factory=list)  # when each generated token came (a group's root)
    finish_s: Optional[float] = None
    num_preemptions: int = 0
    parent: Optional["Sequence"] = None
    cumulative_logprob: float = 0.0
    # A request of width > 1 forks when its prompt is done; from then on its live sequences,
    # root first, are scheduled, preempted and finished together. None for a lone sequence.
    group: Optional[list] = None
    sample_index: int = 0  # which of the request's samples / beam slots (seeds its sampling)

    @property
    def num_generated(self) -> int:
        return self.num_tokens - self.request.prompt_len

    def __post_init__(self):
        self.final_len = self.request.final_len  # read on every step: a plain attribute
