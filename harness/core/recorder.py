"""The recorder: watches steps and requests, and turns them into the serving metrics of
docs/metrics.md (vLLM's names, beside the paper's normalized latency and KV accounting).

It only watches. Per step it appends a few numbers (O(1)); time-averaged metrics are taken over
the measurement window at the end: from `warmup_frac` of the run to the last admission (after
which the batch only drains), or to the end when the last admission came earlier. Request
metrics cover every completed request. A finished request is reduced to a few numbers and, when
a `request_log` is given, one line of requests.jsonl; its sequences are let go unless
`keep_sequences` (tests that read their tokens).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from itertools import chain

import numpy as np

from kvbench.core.request_log import RequestLog
from kvbench.core.sequence import Sequence
from kvbench.core.serving_metrics import ValueCounts, latency_stats, meets_slos
from kvbench.errors import UserError

# Where set, called once with a run's KV shares (the five columns of docs/paper.md's categories)
# as soon as its summary has them and its request log is closed: `bench`'s helper draws a single
# simulated run's figure from them while the rest of the summary, the row and the console table
# are made (kvbench.cli sets it).
shares_ready: ContextVar[Callable[[dict], None] | None] = ContextVar("shares_ready", default=None)
# kv_slots()'s five counts, in its order
KV_COUNTS = ("token", "reserved", "internal", "rounding", "named")


class Recorder:
    def __init__(
        self,
        warmup_frac: float = 1 / 3,
        request_log: RequestLog | None = None,
        goodput: dict | None = None,
        keep_sequences: bool = False,
    ):
        self.warmup_frac = warmup_frac
        self.drained = False  # whether the window is the batch draining (window())
        self.step_end: list[float] = []
        self.step_dt: list[float] = []
        self.batch_size: list[int] = []
        self.kv: list[tuple[int, ...]] = []  # token, reserved, internal, rounding, named slots
        self.kv_by_kind: dict[str, list] = {}  # hybrid models: layer kind -> per-step fractions
        self.schedule_s: list[float] = []
        self.num_slots = 1  # the pool's size in the units its accounting counts (watch())
        self.allocator_name = "?"  # whose accounting it is, for the error a bad count raises (watch())
        self._by_kind = False
        self.request_log = request_log  # which counts the inter-token gaps where there is one
        self.goodput = goodput or {}
        self.finished: list[Sequence] = []  # only with keep_sequences
        self.keep_sequences = keep_sequences
        self.num_finished = 0  # sequences
        # per completed request, in finishing order
        self.ttft: list[float] = []
        self.e2el: list[float] = []
        self.input_len: list[int] = []
        self.output_len: list[int] = []
        self.generated = 0  # tokens, every sequence of every request
        self.num_good = 0
        self.itl = ValueCounts()
        # Finishes wait one step before they are read: async scheduling stamps a step's token
        # times when the step after it collects the tokens.
        self._finishing: list[Sequence] = []
        self._finishing_step = -1

    def watch(self, allocator) -> None:
        """Before the first step: the KV pool whose accounting every step records."""
        accounting = allocator.accounting()
        self.num_slots = accounting.num_slots
        self.allocator_name = getattr(allocator, "name", type(allocator).__name__)
        self._by_kind = hasattr(accounting, "by_kind")  # hybrid models: each layer kind's view too

    def on_step(self, end_s: float, dt: float, batch_size: int, allocator, schedule_s: float) -> None:
        self.step_end.append(end_s)
        self.step_dt.append(dt)
        self.batch_size.append(batch_size)
        if self._by_kind:
            acc = allocator.accounting()  # kv_slots() and every kind's view, from one count
            self.kv.append(acc.slots())
            for kind, view in acc.by_kind.items():
                self.kv_by_kind.setdefault(kind, []).append(view.fractions()[:4])
        else:
            self.kv.append(allocator.kv_slots())
        self.schedule_s.append(schedule_s)

    def on_finish(self, seq: Sequence) -> None:
        self.num_finished += 1
        self.generated += seq.num_generated
        if self.keep_sequences:
            self.finished.append(seq)
        if seq.group is not None and seq is not seq.group[0]:
            return  # a request's sequences finish together; its root speaks for it
        if self._finishing_step != len(self.step_end):
            self._read_finished()
            self._finishing_step = len(self.step_end)
        self._finishing.append(seq)

    def _read_finished(self) -> None:
        for root in self._finishing:
            r = root.request
            ttft, e2el = root.first_token_s - r.arrival_s, root.finish_s - r.arrival_s
            times = np.frombuffer(root.token_times)  # a view of the array('d'): no copy
            itl = times[1:] - times[:-1]  # np.diff's arithmetic, without its checks
            del times  # the view would keep the array from growing
            self.ttft.append(ttft)
            self.e2el.append(e2el)
            self.input_len.append(r.prompt_len)
            self.output_len.append(r.output_len)
            if self.goodput:  # request_goodput is a column only where SLOs are set
                tpot = (e2el - ttft) / (r.output_len - 1) if r.output_len > 1 else 0.0
                self.num_good += meets_slos(self.goodput, ttft, tpot, e2el)
            if self.request_log is None:
                self.itl.add(itl)
            else:  # request_log.FIELDS, in their order; the log counts the gaps (a spooled one off this core)
                self.request_log.write(
                    (
                        r.request_id,
                        r.arrival_s,
                        root.first_token_s,
                        root.finish_s,
                        r.prompt_len,
                        r.output_len,
                        r.width,
                        root.num_cached,
                        root.num_preemptions,
                    ),
                    itl,
                )
        self._finishing.clear()

    def window(self, last_admit_s: float, first_arrival_s: float = 0.0) -> tuple[float, float]:
        """The measurement window: from `warmup_frac` of the run counted from its first arrival
        (an empty server's wait before it is no warm-up) to the last admission, or to the end
        where that came first."""
        end = self.step_end[-1] if self.step_end else 0.0
        first = min(first_arrival_s, end)
        start = first + self.warmup_frac * (end - first)
        self.drained = start > first and last_admit_s <= start
        if last_admit_s > start:
            return start, last_admit_s
        if self.drained:  # a few requests, all admitted early (a short trace): its averages describe a drain
            logging.getLogger("kvbench").warning(
                "every request was admitted within the warm-up (the first %.0f%% of the run), so the measurement "
                "window is the batch draining: mean_batch_size and the kv_* shares describe that; "
                "measure.warmup_frac=0 averages over the whole run",
                100 * self.warmup_frac,
            )
        return start, end

    def _kind_fractions(self, weight: np.ndarray) -> dict:
        """Time-averaged accounting of each layer kind's view of the pool (hybrid models)."""
        row = {}
        for kind, steps in self.kv_by_kind.items():
            token, reserved, internal, rounding = np.average(np.asarray(steps), axis=0, weights=weight)
            row.update(
                {
                    f"kv_token_util_{kind}": token,
                    f"kv_reserved_frac_{kind}": reserved,
                    f"kv_internal_frag_frac_{kind}": internal,
                    f"kv_rounding_frac_{kind}": rounding,
                    f"kv_external_frag_frac_{kind}": 1.0 - token - reserved - internal - rounding,
                }
            )
        return row

    @property
    def _accounting(self) -> str:
        return f"allocator {self.allocator_name}'s accounting"

    def _check_accounting(self, slots: np.ndarray) -> None:
        """Each step's counts (docs/paper.md's categories) are >= 0 and fill at most the pool:
        free space is what they leave, so a count that lies would show as negative free space or
        a share past 100 %, reported as a result."""
        held = slots[:, :4].sum(axis=1)
        bad = (slots < 0).any(axis=1) | (held > self.num_slots)
        if bad.any():
            step = int(bad.argmax())
            counts = ", ".join(f"{name} {int(v)}" for name, v in zip(KV_COUNTS, slots[step]))
            raise UserError(
                f"{self._accounting} at step {step} ({counts}) is not a split of its {self.num_slots} "
                f"slots: each count >= 0 and the first four at most the pool (KVAllocator.kv_slots)"
            )
        short = slots[:, 4] < held  # a held slot is named by one block table at least
        if short.any():
            step = int(short.argmax())
            raise UserError(
                f"{self._accounting} at step {step} names {int(slots[step, 4])} slots in its block tables but "
                f"holds {int(held[step])}: every slot held is named at least once (KVAllocator.kv_slots), "
                f"else the blocks sharing saves read negative"
            )

    def summary(self, num_requests: int, last_admit_s: float, first_arrival_s: float) -> dict:
        ends = np.asarray(self.step_end)
        dts = np.asarray(self.step_dt)
        start, stop = self.window(last_admit_s, first_arrival_s)
        # weight each step by its overlap with the window
        weight = np.clip(np.minimum(ends, stop) - np.maximum(ends - dts, start), 0, None)
        if weight.sum() <= 0:  # no step ran in it: the server sat idle until its last admission
            if len(ends):
                logging.getLogger("kvbench").warning(
                    "no step ran within the measurement window (%.6g s to %.6g s: the server was idle there), so "
                    "mean_batch_size and the kv_* shares average the whole run, as window_start_s and "
                    "window_end_s now say",
                    start,
                    stop,
                )
                start, stop = float(ends[0] - dts[0]), float(ends[-1])
            weight = dts
        # the steps' tuples read flat: half the time of np.asarray on a list of tuples
        try:  # read as floats, so that a fraction is seen, not cut to a whole number
            counts = np.fromiter(chain.from_iterable(self.kv), np.float64, 5 * len(self.kv)).reshape(-1, 5)
        except (TypeError, ValueError, OverflowError) as err:  # None, or a text
            raise UserError(f"{self._accounting}: kv_slots() gave a count that is no whole number ({err})") from None
        whole = np.isfinite(counts) & (counts == np.round(counts)) & (np.abs(counts) < 2**53)
        if not whole.all():
            step, column = np.argwhere(~whole)[0]
            raise UserError(
                f"{self._accounting}: kv_slots() gave {KV_COUNTS[column]} {float(counts[step, column])!r} at step "
                f"{step}, a count that is no whole number"
            )
        slots = counts.astype(np.int64)
        self._check_accounting(slots)
        kv = slots / self.num_slots
        token, reserved, internal, rounding = (np.average(kv[:, i], weights=weight) for i in range(4))
        # sharing saves what the block tables name beyond what the pool holds, over the window
        held = np.average(slots[:, :4].sum(axis=1), weights=weight)
        named = np.average(slots[:, 4], weights=weight)
        saved = float(1.0 - held / named) if named > 0 else 0.0

        self._read_finished()
        if self.request_log is not None:
            self.request_log.close()
        itl = self.itl.stats("itl") if self.request_log is None else self.request_log.gap_stats
        shares = {
            "kv_token_util": token,
            "kv_reserved_frac": reserved,
            "kv_internal_frag_frac": internal,
            "kv_rounding_frac": rounding,
            "kv_external_frag_frac": 1.0 - token - reserved - internal - rounding,
        }
        ready = shares_ready.get()
        if ready is not None:
            ready(shares)
        # from the run's start, the instant the first arrival's gap is drawn from, as `vllm bench
        # serve` times its `duration` from before it waits for its first request to go out
        duration = float(ends[-1]) if len(ends) else 0.0
        per_s = (lambda count: count / duration) if duration else (lambda count: 0.0)
        ttft, e2el = np.asarray(self.ttft), np.asarray(self.e2el)
        out = np.asarray(self.output_len, dtype=float)
        multi = out > 1
        tpot = (e2el[multi] - ttft[multi]) / (out[multi] - 1)
        input_tokens = int(sum(self.input_len))
        sched = np.asarray(self.schedule_s)
        return {
            "requests": num_requests,
            "completed": len(e2el),
            "duration_s": duration,
            "total_input_tokens": input_tokens,
            "total_output_tokens": self.generated,
            "request_throughput": per_s(len(e2el)),
            **({"request_goodput": per_s(self.num_good)} if self.goodput else {}),
            "output_throughput": per_s(self.generated),
            "total_token_throughput": per_s(input_tokens + self.generated),
            "mean_batch_size": float(np.average(self.batch_size, weights=weight)) if len(ends) else 0.0,
            **shares,
            "kv_blocks_saved_frac": saved,
            **self._kind_fractions(weight),
            "max_batch_size": max(self.batch_size, default=0),
            "normalized_latency_s_per_tok": float(np.mean(e2el / out)) if len(out) else float("nan"),
            **latency_stats("ttft", ttft),
            **latency_stats("tpot", tpot),
            **itl,
            **latency_stats("e2el", e2el),
            "steps": len(ends),
            "window_start_s": start,
            "window_end_s": stop,
            "window_drained": self.drained,
            "schedule_us_per_step": float(sched.mean() * 1e6) if len(sched) else 0.0,
        }
