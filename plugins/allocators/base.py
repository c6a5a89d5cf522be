"""The allocator contract and the five-way KV accounting every allocator keeps.

An allocator decides where a sequence's tokens live; the scheduler decides who runs. The
scheduler calls, per sequence and step, only O(1) or O(blocks touched) operations:

    admit(seq)          reserve what the policy reserves up front; False = not yet
    grow(seq, n)        make room for `n` more tokens and count them as token state;
                        False = out of memory (the scheduler preempts and retries)
    fork(parent, child) the child shares (paged) or copies (contiguous) the parent's tokens
    free(seq)           give everything back

Optional, room for decode steps: an allocator may set `seq.room` to the number of coming
single-token grows of `seq` it has already made room for; the scheduler then takes them without
calling grow (a decode step costs it no allocator call), calls room_ran_out(seq) where it
takes the last of a sequence's room (in batch order, as grow would have been called) and
reports the total with took_room(n) in the same step. Any other operation on `seq` first
settles what was taken.

Optional, for preemption by swapping (`supports_swap`): swap_out(seqs) moves a request's
blocks to a CPU pool (False = the pool is full: recompute instead), swap_in(seqs) brings them
back (False = not yet). Data movement the executor must replay before the next forward (copy-on-
write, contiguous forks, swaps) is logged in order in `copy_log` when `record_copies` is set.

Accounting (docs/paper.md): every slot of the pool is exactly one of token state, reserved (set
aside for a token this request will really produce), internal fragmentation (set aside beyond
the request's length because its length was over-estimated), rounding (set aside only because
space is handed out in blocks or power-of-two chunks) or free / external fragmentation. The
counters are kept incrementally, so `accounting()` is O(1) and the five parts always add up to
`num_slots`. An allocator that never over-estimates (paged) leaves `_internal` at 0: whatever
it holds beyond token state and reserved slots is rounding (the empty tail of a last block).

Sharing: `named` is the slots the sequences' block tables name, a block held by k tables counted
k times. An allocator that shares blocks keeps that count as tables grow, fork, shrink and go,
so it too is O(1) to read; one that shares nothing names exactly the slots it holds. What sharing
saves is `1 - held / named` (docs/metrics.md, `kv_blocks_saved_frac`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from kvbench.core.sequence import Sequence, stand_in_ids
from kvbench.errors import UserError


@dataclass(slots=True)  # not frozen: one is made every step, and a frozen one costs 3x as much
class KVAccounting:
    """A snapshot of where the pool's slots are, in token slots (read it; do not change it)."""

    num_slots: int
    token: int
    reserved: int
    internal: int
    rounding: int = field(default=0, kw_only=True)
    named: int = field(kw_only=True)  # slots the block tables name, a shared block once per table

    @property
    def free(self) -> int:
        return self.num_slots - self.token - self.reserved - self.internal - self.rounding

    @property
    def held(self) -> int:
        return self.num_slots - self.free

    def slots(self) -> tuple[int, int, int, int, int]:
        """Token, reserved, internal, rounding and named slots (KVAllocator.kv_slots)."""
        return self.token, self.reserved, self.internal, self.rounding, self.named

    def fractions(self) -> tuple[float, float, float, float, float]:
        """Token, reserved, internal, rounding and free, as shares of the pool."""
        n = self.num_slots
        return self.token / n, self.reserved / n, self.internal / n, self.rounding / n, self.free / n


class KVAllocator(ABC):
    """Base of every allocator plugin. Subclasses set `name` and `layout`.

    `layout` is "paged" (sequences have block tables of `block_size`-slot blocks, read by
    `block_table(seq)`: the list of block ids) or "contiguous" (each sequence owns one slot range
    starting at `slot_start(seq)`); a real run (serve, kernel) reads the layout by that method,
    and an allocator without it is refused when chosen.
    """

    name: ClassVar[str]
    layout: ClassVar[str]
    min_block_size: ClassVar[int] = 1
    max_block_size: ClassVar[int] = 256
    layer_kinds: ClassVar[tuple] = ("full",)  # layer kinds (spec.LAYER_KINDS) whose KV it can hold
    # True when each layer kind gets its own block tables / state slots: the serve engine then
    # runs the executor that reads that layout (kvbench.executors.hybrid_executor)
    per_layer_kind_layout: ClassVar[bool] = False

    def __init__(self, num_slots: int, max_model_len: int, block_size: int = 16, model=None, **options):
        if not isinstance(block_size, int) or not (self.min_block_size <= block_size <= self.max_block_size):
            raise UserError(
                f"allocator.block_size={block_size!r} is not allowed for {self.name}: "
                f"use an integer in {self.min_block_size}..{self.max_block_size}"
            )
        if "placement" in options:
            raise UserError(
                f"allocator.placement={options['placement']!r} cannot be used with {self.name}: "
                f"only the reserving allocators (contiguous, oracle, pow2) place a "
                f"reservation; {self.name} hands out blocks on demand"
            )
        if options:
            raise UserError(f"allocator {self.name} has no option(s) {sorted(options)}")
        self.block_size = block_size
        self.model = model  # the ModelSpec served (None in unit tests of full-attention policies)
        self.num_slots = num_slots
        self.max_model_len = max_model_len
        self._token = 0
        self._reserved = 0
        self._internal = 0  # slots reserved beyond a request's length by an over-estimate
        self._allocated = 0  # slots set aside for some sequence (token + reserved + internal + rounding)
        self.external_frag_waits = 0  # admissions refused although total free space sufficed
        self.num_copies = 0  # block or slot-range copies (copy-on-write, fork of a reservation)
        self.swapped_blocks = 0  # blocks copied to or from the CPU swap pool
        # KV copied within the device cache (copy-on-write, a reservation's fork), in slots: one
        # token's KV over every layer. The simulated executors charge it to the next step.
        self.copied_slots = 0
        # (kind, src_slot, dst_slot, num_slots), kind "device" (within the cache), "out" (cache ->
        # swap pool) or "in" (swap pool -> cache); kept only for an executor that replays them.
        self.record_copies = False
        self.max_step_tokens = None  # the most tokens one grow may ask for (the scheduler sets it)
        # True while the scheduler admits with nothing running and scheduler.watermark_when_idle
        # is false: an allocator with an admission watermark then ignores it for that admission
        self.watermark_exempt = False
        self.copy_log: list[tuple[str, int, int, int]] = []

    # --- the contract -------------------------------------------------------------------
    @abstractmethod
    def admit(self, seq: Sequence) -> bool: ...

    @abstractmethod
    def grow(self, seq: Sequence, num_tokens: int) -> bool: ...

    @abstractmethod
    def fork(self, parent: Sequence, child: Sequence) -> None: ...

    @abstractmethod
    def free(self, seq: Sequence) -> None: ...

    def forget_unrun(self, seqs) -> None:  # noqa: B027 (a default: nothing to forget)
        """`seqs`' latest growth never ran: an admission or a group's step the scheduler undid
        before its forward. What each holds beyond its `num_computed` tokens was never written,
        so an allocator with a prefix cache takes it out of the cache (a later hit would read K/V
        nobody computed), whether the sequences are then freed or swapped out; one without a
        cache has nothing to forget."""

    def free_unrun(self, seqs) -> None:
        """forget_unrun, then free each of `seqs`."""
        self.forget_unrun(seqs)
        for seq in seqs:
            self.free(seq)

    @abstractmethod
    def capacity(self, seq: Sequence) -> int:
        """Slots set aside for `seq` now (its block table's slots, or its reservation)."""

    def took_room(self, num_tokens: int) -> None:
        """The scheduler took `num_tokens` steps of room (`Sequence.room`) this step."""
        raise NotImplementedError(f"{self.name} grants no room")

    def room_ran_out(self, seq: Sequence) -> None:
        """The scheduler took the last of `seq`'s room."""
        raise NotImplementedError(f"{self.name} grants no room")

    def refuses_again(self, seq: Sequence, times: int) -> bool:
        """Whether admit(seq), which just refused `seq`, would refuse it at each of the next
        `times` steps in which the pool changes only by room taken (nothing placed, grown into a
        new block or freed). When True, those refusals are counted as the admit() calls would
        count them, and the engine runs such steps without scheduling them one by one; False,
        the default, keeps every step scheduled."""
        return False

    # Set by an engine whose executor is simulated, where the allocator caches prefixes: its
    # sequences carry no token ids, and the cache names their blocks by stand-ins
    # (sequence.stand_in_ids)
    stand_in_tokens: bool = False

    def token_ids(self, seq: Sequence, upto: int) -> list:
        """The token ids a prefix cache names `seq`'s first `upto` positions' blocks by: its own,
        or where it has none (a simulated run) stand-ins."""
        tokens = seq.token_ids
        return stand_in_ids(seq, upto) if len(tokens) < upto and self.stand_in_tokens else tokens

    # True when room_ran_out does nothing: lazy decode then meets a sequence whose room ends
    # only at its next allocator call, not at its last step of room.
    quiet_room: bool = False

    def grow_steady(self, seq: Sequence, num_computed: int) -> int | None:
        """A quiet allocator's short path for lazy decode, asked only while `quiet_room`: `seq`,
        which has taken all its room and holds `num_computed` computed tokens (its own counters
        lag behind: it is steady), decodes one token that starts a new block. Does what
        grow(seq, 1) does then and returns the room granted after that token; None, changing
        nothing, where grow would have to do more (no free block, a block not full): the
        scheduler then calls grow itself."""
        return None

    def grow_steady_all(self, seqs: list[Sequence], num_computed: list[int], striding: int = 0) -> list[int] | None:
        """grow_steady for each of `seqs` in order (`num_computed[i]` is the i-th one's), and
        `striding` striding crossings (take_striding), as one call: the rooms granted; None,
        changing nothing, where grow_steady would refuse one of them or the pool cannot give
        them all. An answer other than None also promises what lets the engine run the step
        that gives these blocks without scheduling it (Engine._run_quiet_steps): refuses_again
        counts nothing and its answer does not depend on `times`, and a refusal stands while
        blocks are taken this way.
        None, the default, keeps such a step scheduled."""
        return None

    def steady_blocks(self, seqs=(), num_computed=()) -> int | None:
        """The blocks grow_steady_all and take_striding could take now, where each of `seqs`
        would take one as grow_steady does (`num_computed[i]` is the i-th one's); None where one
        of them would need more, or where the allocator has no such path (the default). Lazy
        decode reads it at a step whose crossings the free blocks do not cover, to preempt for
        them without scheduling the step."""
        return None

    # Striding: the steps between a steady sequence's block crossings where the allocator can
    # count its crossings in bulk (paged without prefix caching: its block size); 0 where not.
    # Lazy decode then meets a sequence that decodes through whole blocks once, not per block.
    stride: int = 0

    def crossings_ahead(self, seq: Sequence, num_computed: int) -> int:
        """After grow_steady started a new block for steady `seq` at `num_computed` tokens: how
        many crossings alike follow every `stride` steps (each into a block that the sequence
        will fill, granting a whole block's room), which take_striding may count in bulk."""
        return 0

    def take_striding(self, count: int) -> bool:
        """`count` striding sequences cross into a new block this step: take the blocks and count
        them (tokens, reservations) as grow_steady would, but hand each block to its sequence
        only later (hand_striding). False, changing nothing, where the pool cannot give them
        all; the grow_steady_all promise holds for these blocks too."""
        return False

    def hand_striding(self, seq: Sequence, count: int) -> None:
        """Give striding `seq` the blocks of its next `count` crossings, which take_striding
        already took and counted: its table, and each block's fill, as grow_steady leaves them."""
        raise NotImplementedError(f"{self.name} does not stride")

    supports_swap: ClassVar[bool] = False

    def swap_out(self, seqs) -> bool:
        return False

    def swap_in(self, seqs) -> bool:
        raise NotImplementedError(f"{self.name} does not swap")

    def take_copies(self) -> list[tuple[str, int, int, int]]:
        """The logged copies since the last call, in the order they must be replayed."""
        copies, self.copy_log = self.copy_log, []
        return copies

    def _log_copy(self, kind: str, src_slot: int, dst_slot: int, num_slots: int) -> None:
        if kind == "device":
            self.copied_slots += num_slots
        if self.record_copies:
            self.copy_log.append((kind, src_slot, dst_slot, num_slots))

    def footprint(self, final_len: int) -> int:
        """Slots this policy sets aside for a sequence that stores `final_len` tokens at its end
        (its prompt and every output token but the last, which is sampled and never stored)."""
        return final_len

    def group_footprint(self, final_len: int) -> int:
        """footprint() of one sequence of a request of several, which a preemption brings back
        together: where it differs (a window layer that holds a whole prefill step), larger."""
        return self.footprint(final_len)

    def can_ever_admit(self, final_len: int, width: int = 1) -> bool:
        """False when `width` sequences of `final_len` tokens (a request's samples or beams, which
        a preempted request brings back together) would not fit even in an empty pool."""
        return self.footprint(final_len) * width <= self.num_slots

    def kv_slots(self) -> tuple[int, int, int, int, int]:
        """Token, reserved, internal, rounding and named slots now: `accounting()`'s numbers as
        one tuple, which is what a recorder keeps of every step."""
        token, reserved, internal = self._token, self._reserved, self._internal
        return token, reserved, internal, self._allocated - token - reserved - internal, self.named_slots()

    def accounting(self) -> KVAccounting:
        token, reserved, internal, rounding, named = self.kv_slots()
        return KVAccounting(self.num_slots, token, reserved, internal, rounding=rounding, named=named)

    def named_slots(self) -> int:
        """Slots the sequences' block tables name, a shared block once per table; an allocator
        that shares nothing names what it holds."""
        return self._allocated

    @property
    def num_free_slots(self) -> int:
        return self.num_slots - self._allocated

    def stats(self) -> dict:
        """Counters a result row records beside the accounting."""
        per_slot = self.model.kv_bytes_per_token if self.model is not None else 0
        return {
            "external_frag_waits": self.external_frag_waits,
            "copies": self.num_copies,
            "copied_bytes": round(self.copied_slots * per_slot),
        }

    # --- helpers for subclasses ----------------------------------------------------------
    @staticmethod
    def _reserved_for(capacity: int, num_tokens: int, final_len: int) -> int:
        """Empty slots of a sequence's capacity that it will fill before it ends."""
        return max(0, min(capacity, final_len) - num_tokens)
