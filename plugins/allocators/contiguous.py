"""Contiguous reservation in a linear slot space, first-fit: Orca(Max) and Orca(Oracle).

Each admitted sequence reserves one slot range up front and keeps it until it ends; the
reservation size is the policy. Free space is a sorted list of holes, merged with their
neighbours on free, so external fragmentation is what the placement really leaves behind.
"""

from __future__ import annotations

import bisect

from kvbench.core.sequence import Sequence
from kvbench.plugins.allocators.base import KVAllocator


class FirstFitSpace:
    """Holes of a linear space of `size` slots; allocation takes the lowest hole that fits."""

    def __init__(self, size: int):
        self.starts = [0]  # sorted hole starts
        self.lengths = {0: size}

    def allocate(self, length: int) -> int | None:
        for start in self.starts:  # one entry per hole: O(live reservations)
            hole = self.lengths[start]
            if hole >= length:
                i = bisect.bisect_left(self.starts, start)
                del self.starts[i]
                del self.lengths[start]
                if hole > length:
                    self.starts.insert(i, start + length)
                    self.lengths[start + length] = hole - length
                return start
        return None

    def release(self, start: int, length: int) -> None:
        i = bisect.bisect_left(self.starts, start)
        if i < len(self.starts) and start + length == self.starts[i]:  # merge with the next hole
            nxt = self.starts.pop(i)
            length += self.lengths.pop(nxt)
        if i > 0:
            prev = self.starts[i - 1]
            if prev + self.lengths[prev] == start:  # merge with the previous hole
                self.lengths[prev] += length
                return
        self.starts.insert(i, start)
        self.lengths[start] = length


class ReservingAllocator(KVAllocator):
    """A policy that reserves `reservation(seq)` contiguous slots at admission.

    The reservation never grows: a sequence that outgrows it is a policy bug, reported loudly.
    A request of n samples or beams reserves a range per sequence when its prompt is admitted
    (Orca reserves for every output it will produce); its forks take those ranges and copy the
    parent's tokens into them.
    """

    layout = "contiguous"

    def __init__(self, num_slots: int, max_model_len: int, block_size: int = 16, **options):
        super().__init__(num_slots, max_model_len, block_size, **options)
        self._space = self._make_space()
        self._range: dict[int, tuple[int, int]] = {}  # seq_id -> (start, length)
        self._seq_reserved: dict[int, int] = {}
        self._spares: dict[int, list[tuple[int, int]]] = {}  # root seq_id -> ranges for its forks

    def _make_space(self):
        return FirstFitSpace(self.num_slots)

    def reservation(self, seq: Sequence) -> int:
        raise NotImplementedError

    def footprint(self, request_len: int) -> int:
        raise NotImplementedError

    def _place(self, length: int) -> int | None:
        return self._space.allocate(length)

    def _release(self, start: int, length: int) -> None:
        self._space.release(start, length)

    def admit(self, seq: Sequence) -> bool:
        length = self.reservation(seq)
        count = seq.request.width if seq.num_generated == 0 else 1
        ranges = []
        for _ in range(count):
            start = self._place(length)
            if start is None:
                for placed in ranges:
                    self._release(placed, length)
                if self.num_free_slots >= count * length:
                    self.external_frag_waits += 1
                return False
            ranges.append(start)
        self._allocated += count * length
        self._take_range(seq, ranges[0], length)
        if count > 1:
            self._spares[seq.seq_id] = [(start, length) for start in ranges[1:]]
            self._reserved += (count - 1) * min(length, seq.final_len)  # each fork will fill it
        return True

    def _take_range(self, seq: Sequence, start: int, length: int) -> None:
        self._range[seq.seq_id] = (start, length)
        self._seq_reserved[seq.seq_id] = 0
        self._update(seq, seq.num_computed)

    def _update(self, seq: Sequence, num_tokens: int) -> None:
        _, length = self._range[seq.seq_id]
        new = self._reserved_for(length, num_tokens, seq.final_len)
        self._reserved += new - self._seq_reserved[seq.seq_id]
        self._seq_reserved[seq.seq_id] = new

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        start, length = self._range[seq.seq_id]
        after = seq.num_computed + num_tokens
        if after > length:
            raise RuntimeError(f"{self.name}: sequence {seq.seq_id} outgrew its reservation "
                               f"({after} > {length} slots)")
        self._token += num_tokens
        self._update(seq, after)
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """A contiguous child needs its own range: take one (a spare of the parent's request,
        else a new one) and copy the parent's tokens into it."""
        child.num_computed = 0
        spares = self._spares.get(parent.seq_id)
        if spares:
            start, length = spares.pop()
            self._reserved -= min(length, parent.final_len)
            self._take_range(child, start, length)
        else:
            length = self.reservation(child)
            start = self._place(length)
            if start is None:
                raise MemoryError(f"{self.name}: no room to fork sequence {parent.seq_id}")
            self._allocated += length
            self._take_range(child, start, length)
        self.grow(child, parent.num_computed)
        child.num_computed = parent.num_computed
        self._log_copy("device", self._range[parent.seq_id][0], start, parent.num_computed)
        self.num_copies += 1

    def free(self, seq: Sequence) -> None:
        start, length = self._range.pop(seq.seq_id)
        self._release(start, length)
        self._allocated -= length
        self._token -= seq.num_computed
        self._reserved -= self._seq_reserved.pop(seq.seq_id)
        for start, length in self._spares.pop(seq.seq_id, ()):  # a request preempted before it forked
            self._release(start, length)
            self._allocated -= length
            self._reserved -= min(length, seq.final_len)

    def capacity(self, seq: Sequence) -> int:
        return self._range[seq.seq_id][1]

    def slot_start(self, seq: Sequence) -> int:
        return self._range[seq.seq_id][0]


class ContiguousAllocator(ReservingAllocator):
    """Orca(Max): reserve max_model_len slots per request, first-fit."""

    name = "contiguous"

    def reservation(self, seq: Sequence) -> int:
        return self.max_model_len

    def footprint(self, request_len: int) -> int:
        return self.max_model_len


class OracleAllocator(ReservingAllocator):
    """Orca(Oracle): reserve exactly prompt + true output length, first-fit."""

    name = "oracle"

    def reservation(self, seq: Sequence) -> int:
        # The paper's Oracle reserves prompt + output; the last sampled token's slot stays empty.
        return seq.request.max_tokens

    def footprint(self, request_len: int) -> int:
        return request_len

