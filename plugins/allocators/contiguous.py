"""Orca's reserving policies: a reservation size per request times a placement in a linear space.

Each admitted sequence reserves one slot range up front and keeps it until it ends. As the
paper's artifact builds its baselines, the reservation is `min(prompt + estimate,
max_model_len)` slots rounded up to whole blocks, where the estimate of the output length is the
policy (Max: max_model_len, Pow2: the next power of two of the output, Oracle: the output
itself); the placement (kvbench.plugins.allocators.placement) then decides where the range goes
and how much it really holds: the paper's buddy system rounds it up again to a power of two of
blocks, first-fit holds it as is.

Accounting of one range of `held` slots for a request of prompt + output = `max_tokens`:
token state and reserved fill `min(held, max_tokens)` (the request's own tokens, its last sampled
one included), internal fragmentation is the estimate's overshoot `reservation - max_tokens`
before any rounding (0 for Oracle), and the rest of the range is rounding (blocks, buddy chunk).

Every decode step inside the range is one token more and one reserved slot less, and nothing
else: the allocator grants it as room (`Sequence.room`), which the scheduler takes without a
call and reports in bulk (`took_room`), so that under lazy decode a sequence is left alone from
its first decode to its last.
"""

from __future__ import annotations

from kvbench.arith import cdiv
from kvbench.core.sequence import Request, Sequence
from kvbench.plugins.allocators.base import KVAllocator
from kvbench.plugins.allocators.placement import make_space


class ReservingAllocator(KVAllocator):
    """A policy that reserves a contiguous range per sequence at admission; it never grows.

    A sequence that outgrows its range is a policy bug, reported loudly. A request of n samples
    or beams reserves a range per sequence when its prompt is admitted (Orca reserves for every
    output it will produce); its forks take those ranges and copy the parent's tokens into them.
    """

    layout = "contiguous"
    quiet_room = True

    def __init__(self, num_slots: int, max_model_len: int, block_size: int = 16, placement: str = "buddy", **options):
        super().__init__(num_slots, max_model_len, block_size, **options)
        self.placement = placement
        self.num_slots = num_slots // block_size * block_size  # a partial block at the end is unusable
        self._space = make_space(placement, num_slots // block_size, block_size, max_model_len)
        self._range: dict[int, tuple[int, int]] = {}  # seq_id -> (start, held slots)
        self._seq_reserved: dict[int, int] = {}
        self._granted: dict[int, int] = {}  # seq_id -> the room last granted, as of its last count
        # A sequence the space could not place is refused again, without a search, until the
        # space changes (its version): the queue's head is tried every step while the pool is
        # full. (seq_id, space version, whether the refusal counted an external-fragmentation wait)
        self._refused: tuple[int, int, bool] | None = None
        self._spares: dict[int, list[tuple[int, int]]] = {}  # root seq_id -> ranges for its forks

    def estimate(self, output_len: int) -> int:
        """The policy's guess of the output length it reserves for."""
        raise NotImplementedError

    def reservation(self, prompt_len: int, output_len: int) -> int:
        """Slots asked of the placement: the estimate, capped, rounded up to whole blocks."""
        wanted = min(prompt_len + self.estimate(output_len), self.max_model_len)
        return cdiv(wanted, self.block_size) * self.block_size

    def _overshoot(self, request: Request) -> int:
        """Internal fragmentation of one range: the estimate beyond the request's real length."""
        wanted = min(request.prompt_len + self.estimate(request.output_len), self.max_model_len)
        return max(0, wanted - request.max_tokens)

    def footprint_of(self, request: Request) -> int:
        """The slots this policy sets aside for one sequence of `request`: its own reservation as
        placed, where footprint() takes the worst split of its length (the check before a run
        asks this of every request: pow2 first-fit set a 1000 + 24-token request at 1,536
        slots, the worst split's, not its 1,040)."""
        return self._space.held(self.reservation(request.prompt_len, request.output_len))

    def footprint(self, final_len: int) -> int:
        # the most any split of the request (final_len + 1 tokens, its last output token never
        # stored) into prompt + output holds (once per run)
        request_len = final_len + 1
        return max(
            self._space.held(self.reservation(request_len - output, output)) for output in range(1, request_len + 1)
        )

    def admit(self, seq: Sequence) -> bool:
        refused = self._refused
        if refused is not None and refused[0] == seq.seq_id and refused[1] == self._space.version:
            self.external_frag_waits += refused[2]
            return False
        request = seq.request
        length = self.reservation(request.prompt_len, request.output_len)
        held = self._space.held(length)
        count = request.width if seq.num_generated == 0 else 1
        starts = []
        for _ in range(count):
            start = self._space.allocate(length)
            if start is None:
                for placed in starts:
                    self._space.release(placed, length)
                waited = self.num_free_slots >= count * held  # the slots are there, not in one piece
                self.external_frag_waits += waited
                # remembered only when nothing was placed: a partial placement given back moved the space
                self._refused = (seq.seq_id, self._space.version, waited) if not starts else None
                return False
            starts.append(start)
        self._allocated += count * held
        self._internal += count * self._overshoot(request)
        self._take_range(seq, starts[0], held)
        if count > 1:
            self._spares[seq.seq_id] = [(start, held) for start in starts[1:]]
            self._reserved += (count - 1) * min(held, request.max_tokens)  # each fork will fill it
        return True

    def refuses_again(self, seq: Sequence, times: int) -> bool:
        refused = self._refused  # admit()'s remembered refusal stands while the space is unchanged
        if refused is None or refused[0] != seq.seq_id or refused[1] != self._space.version:
            return False
        self.external_frag_waits += times * refused[2]
        return True

    def _take_range(self, seq: Sequence, start: int, held: int) -> None:
        self._range[seq.seq_id] = (start, held)
        self._seq_reserved[seq.seq_id] = 0
        self._update(seq, seq.num_computed)

    def _update(self, seq: Sequence, num_tokens: int) -> None:
        """Recount `seq`'s reservation once it holds `num_tokens` tokens, and grant its room:
        every slot still reserved (not to a request's samples, which grow as a group)."""
        seq_id = seq.seq_id
        _, held = self._range[seq_id]
        new = max(0, min(held, seq.request.max_tokens) - num_tokens)
        self._reserved += new - self._seq_reserved[seq_id]
        self._seq_reserved[seq_id] = new
        seq.room = self._granted[seq_id] = new if seq.group is None else 0

    def _settle(self, seq: Sequence) -> None:
        """Count the room `seq` took since it was last counted out of its reservation."""
        taken = self._granted.get(seq.seq_id, 0) - seq.room
        if taken:
            self._seq_reserved[seq.seq_id] -= taken
            self._granted[seq.seq_id] = seq.room

    def took_room(self, num_tokens: int) -> None:
        self._token += num_tokens
        self._reserved -= num_tokens

    def room_ran_out(self, seq: Sequence) -> None:
        """Nothing to do: the range is used up, and a grow past it is the policy bug grow reports."""

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        _, held = self._range[seq.seq_id]
        after = seq.num_computed + num_tokens
        if after > held:
            raise RuntimeError(f"{self.name}: sequence {seq.seq_id} outgrew its reservation ({after} > {held} slots)")
        self._settle(seq)
        self._token += num_tokens
        self._update(seq, after)
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """A contiguous child needs its own range: take one (a spare of the parent's request,
        else a new one) and copy the parent's tokens into it, where the child runs another step
        to read them."""
        child.num_computed = 0
        request = child.request
        self._settle(parent)
        self._update(parent, parent.num_computed)  # a group's members take no room
        spares = self._spares.get(parent.seq_id)
        if spares:
            start, held = spares.pop()
            self._reserved -= min(held, request.max_tokens)
        else:
            length = self.reservation(request.prompt_len, request.output_len)
            start = self._space.allocate(length)
            if start is None:
                raise MemoryError(f"{self.name}: no room to fork sequence {parent.seq_id}")
            held = self._space.held(length)
            self._allocated += held
            self._internal += self._overshoot(request)
        self._take_range(child, start, held)
        self.grow(child, parent.num_computed)
        child.num_computed = parent.num_computed
        if parent.num_computed < child.final_len:  # one whose first token is its last runs no step: no copy
            self._log_copy("device", self._range[parent.seq_id][0], start, parent.num_computed)
            self.num_copies += 1

    def _release(self, request: Request, start: int, held: int) -> None:
        self._space.release(start, held)
        self._allocated -= held
        self._internal -= self._overshoot(request)

    def free(self, seq: Sequence) -> None:
        self._settle(seq)
        start, held = self._range.pop(seq.seq_id)
        self._release(seq.request, start, held)
        self._token -= seq.num_computed
        self._reserved -= self._seq_reserved.pop(seq.seq_id)
        self._granted.pop(seq.seq_id, None)
        seq.room = 0
        for start, held in self._spares.pop(seq.seq_id, ()):  # a request preempted before it forked
            self._release(seq.request, start, held)
            self._reserved -= min(held, seq.request.max_tokens)

    def capacity(self, seq: Sequence) -> int:
        return self._range[seq.seq_id][1]

    def slot_start(self, seq: Sequence) -> int:
        return self._range[seq.seq_id][0]

    def stats(self) -> dict:
        return {**super().stats(), "placement": self.placement}


class ContiguousAllocator(ReservingAllocator):
    """Orca(Max): reserve max_model_len slots per request, prompt included."""

    name = "contiguous"

    def estimate(self, output_len: int) -> int:
        return self.max_model_len


class OracleAllocator(ReservingAllocator):
    """Orca(Oracle): reserve the prompt plus the true output length."""

    name = "oracle"

    def estimate(self, output_len: int) -> int:
        return output_len
