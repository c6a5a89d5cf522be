"""The kernel scenario's batch-shape grammar: `32d1k`, `2p512+16d2k`, `8d4k:w512`.

    spec   := group ("+" group)* (":w" LENGTH)?
    group  := COUNT ("d" | "p") LENGTH       d = decodes at LENGTH context, p = prefills of LENGTH
    number := digits, or digits "k" (x 1024)

A decode has one query token at the end of its context; a prefill's queries are its whole
prompt (no cached prefix). `:wN` gives every sequence a sliding window of N tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvbench.errors import UserError

_NUMBER = r"(\d+)(k?)"
_GROUP = re.compile(rf"{_NUMBER}([dp]){_NUMBER}")
_WINDOW = re.compile(rf"w{_NUMBER}")
EXAMPLES = "e.g. 32d1k, 2p512+16d2k, 8d4k:w512"


def _number(digits: str, kilo: str) -> int:
    return int(digits) * (1024 if kilo else 1)


@dataclass(frozen=True)
class SeqGroup:
    count: int
    kind: str  # "d" (decode) or "p" (prefill)
    length: int  # context tokens (decode) or prompt tokens (prefill)

    @property
    def query_len(self) -> int:
        return 1 if self.kind == "d" else self.length


@dataclass(frozen=True)
class BatchSpec:
    text: str
    groups: tuple
    window: int = 0

    @property
    def seq_lens(self) -> list[int]:
        return [g.length for g in self.groups for _ in range(g.count)]

    @property
    def query_lens(self) -> list[int]:
        return [g.query_len for g in self.groups for _ in range(g.count)]

    @property
    def num_seqs(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def kv_tokens(self) -> int:
        """Context tokens held in the cache across the batch (what attention reads)."""
        return sum(self.seq_lens)

    @property
    def is_decode_only(self) -> bool:
        return all(g.kind == "d" for g in self.groups)


def parse(text) -> BatchSpec:
    """A BatchSpec from its text; a malformed part raises UserError naming that part."""
    text = str(text).strip()
    body, sep, window_part = text.partition(":")
    window = 0
    if sep:
        match = _WINDOW.fullmatch(window_part)
        if not match or _number(*match.groups()) == 0:
            raise UserError(f"batch={text!r}: bad window {window_part!r}; write :wN with N >= 1 tokens ({EXAMPLES})")
        window = _number(*match.groups())
    groups = []
    for part in body.split("+"):
        match = _GROUP.fullmatch(part)
        if not match:
            raise UserError(
                f"batch={text!r}: bad part {part!r}; each part is COUNT d|p LENGTH, "
                f"numbers plain or with k = 1024 ({EXAMPLES})"
            )
        count_digits, count_k, kind, length_digits, length_k = match.groups()
        count, length = _number(count_digits, count_k), _number(length_digits, length_k)
        if count == 0 or length == 0:
            raise UserError(f"batch={text!r}: part {part!r} has a zero count or length; both must be >= 1")
        groups.append(SeqGroup(count, kind, length))
    return BatchSpec(text, tuple(groups), window)
