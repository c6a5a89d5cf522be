"""Sequences for allocator and scheduler scenarios, each with a fresh request id."""

import itertools

from kvbench.core.sequence import Request, Sequence

_ids = itertools.count()


def make_seq(prompt_len: int, output_len: int, generated: int = 0) -> Sequence:
    """A sequence of a `prompt_len`-token prompt that will produce `output_len` tokens, `generated` of
    them already."""
    request = Request(next(_ids), 0.0, prompt_len, output_len)
    return Sequence(next(_ids), request, prompt_len + generated)
