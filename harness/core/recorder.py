"""The recorder: watches steps and requests, and turns them into the serving metrics (docs/metrics.md).

It only watches. Per step it appends a few numbers (O(1)); time-averaged metrics are taken over
the measurement window at the end: from `warmup_frac` of the run to the last admission (after
which the batch only drains), or to the end when the last admission came earlier.
"""

from __future__ import annotations

import numpy as np

from kvbench.core.sequence import Sequence


class Recorder:
    def __init__(self, warmup_frac: float = 1 / 3):
        self.warmup_frac = warmup_frac
        self.step_end: list[float] = []
        self.step_dt: list[float] = []
        self.batch_size: list[int] = []
        self.kv: list[tuple[int, int, int, int]] = []  # token, reserved, internal, rounding slots
        self.kv_by_kind: dict[str, list] = {}  # hybrid models: layer kind -> per-step fractions
        self.schedule_s: list[float] = []
        self.finished: list[Sequence] = []
        self.num_slots = 1

    def on_step(self, end_s: float, dt: float, batch_size: int, accounting, schedule_s: float) -> None:
        self.step_end.append(end_s)
        self.step_dt.append(dt)
        self.batch_size.append(batch_size)
        self.kv.append((accounting.token, accounting.reserved, accounting.internal, accounting.rounding))
        by_kind = getattr(accounting, "by_kind", None)  # hybrid models only
        if by_kind:
            for kind, acc in by_kind.items():
                self.kv_by_kind.setdefault(kind, []).append(acc.fractions()[:3])
        self.num_slots = accounting.num_slots
        self.schedule_s.append(schedule_s)

    def on_finish(self, seq: Sequence) -> None:
        self.finished.append(seq)

    def window(self, last_admit_s: float) -> tuple[float, float]:
        end = self.step_end[-1] if self.step_end else 0.0
        start = self.warmup_frac * end
        stop = last_admit_s if last_admit_s > start else end
        return start, stop

    def _kind_fractions(self, weight: np.ndarray) -> dict:
        """Time-averaged accounting of each layer kind's view of the pool (hybrid models)."""
        row = {}
        for kind, steps in self.kv_by_kind.items():
            token, reserved, internal = np.average(np.asarray(steps), axis=0, weights=weight)
            row.update({f"kv_token_util_{kind}": token, f"kv_reserved_frac_{kind}": reserved,
                        f"kv_internal_frag_frac_{kind}": internal,
                        f"kv_external_frag_frac_{kind}": 1.0 - token - reserved - internal})
        return row

    def summary(self, num_requests: int, last_admit_s: float, first_arrival_s: float) -> dict:
        ends = np.asarray(self.step_end)
        dts = np.asarray(self.step_dt)
        start, stop = self.window(last_admit_s)
        # weight each step by its overlap with the window
        weight = np.clip(np.minimum(ends, stop) - np.maximum(ends - dts, start), 0, None)
        if weight.sum() <= 0:
            weight = dts
        kv = np.asarray(self.kv, dtype=float).reshape(-1, 4) / self.num_slots
        token, reserved, internal, rounding = (np.average(kv[:, i], weights=weight) for i in range(4))

        requests = {}
        for seq in self.finished:  # a request ends with its last sequence
            r = seq.request
            first, last = requests.get(r.request_id, (seq.first_token_s, seq.finish_s))
            requests[r.request_id] = (min(first, seq.first_token_s), max(last, seq.finish_s))
        by_id = {s.request.request_id: s.request for s in self.finished}
        ttft = np.array([requests[i][0] - by_id[i].arrival_s for i in requests])
        e2e = np.array([requests[i][1] - by_id[i].arrival_s for i in requests])
        out = np.array([by_id[i].output_len for i in requests], dtype=float)
        multi = out > 1
        tpot = (e2e[multi] - ttft[multi]) / (out[multi] - 1)
        duration = (ends[-1] - first_arrival_s) if len(ends) else 0.0
        generated = sum(s.num_generated for s in self.finished)
        pct = lambda a, q: float(np.percentile(a, q)) if len(a) else float("nan")
        sched = np.asarray(self.schedule_s)
        return {
            "requests": num_requests,
            "completed": len(requests),
            "duration_s": duration,
            "throughput_req_s": len(requests) / duration if duration else 0.0,
            "throughput_tok_s": generated / duration if duration else 0.0,
            "mean_batch_size": float(np.average(self.batch_size, weights=weight)) if len(ends) else 0.0,
            "kv_token_util": token,
            "kv_reserved_frac": reserved,
            "kv_internal_frag_frac": internal,
            "kv_rounding_frac": rounding,
            "kv_external_frag_frac": 1.0 - token - reserved - internal - rounding,
            **self._kind_fractions(weight),
            "max_batch_size": max(self.batch_size, default=0),
            "normalized_latency_s_per_tok": float(np.mean(e2e / out)) if len(out) else float("nan"),
            "ttft_p50_s": pct(ttft, 50),
            "ttft_p99_s": pct(ttft, 99),
            "tpot_p50_s": pct(tpot, 50),
            "tpot_p99_s": pct(tpot, 99),
            "steps": len(ends),
            "window_start_s": start,
            "window_end_s": stop,
            "schedule_us_per_step": float(sched.mean() * 1e6) if len(sched) else 0.0,
        }
