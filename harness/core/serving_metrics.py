"""vLLM's serving metrics from per-request times: latency statistics, goodput SLOs, and the
inter-token latencies of a whole run kept exactly in memory that does not grow with its tokens.

Names and definitions are `vllm bench serve`'s: TTFT, TPOT = (E2EL - TTFT) / (output tokens - 1),
ITL (the gap before each token after the first), E2EL; each as mean, median, std, p90 and p99 in
milliseconds (`mean_ttft_ms`, `p99_tpot_ms`, ...). Percentiles interpolate linearly, as numpy's
default does; std is the population std.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from kvbench.errors import UserError

STATS = ("mean", "median", "std", "p90", "p99")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


def latency_stats(name: str, seconds) -> dict:
    """`mean_<name>_ms`, ... of an array of latencies in seconds (NaN when it is empty)."""
    ms = np.asarray(seconds, dtype=float) * 1e3
    if not len(ms):
        return {f"{stat}_{name}_ms": math.nan for stat in STATS}
    return {
        f"mean_{name}_ms": float(ms.mean()),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(ms.std()),
        f"p90_{name}_ms": float(np.percentile(ms, 90)),
        f"p99_{name}_ms": float(np.percentile(ms, 99)),
    }


class ValueCounts:
    """A multiset of floats held as distinct values and their counts.

    Every token is produced at a step's end, so a run's inter-token latencies repeat: all the
    sequences decoding in two consecutive steps see the same gap. Kept this way, a run of 100k
    requests needs memory for its distinct gaps (about one per step), not for its 30M tokens,
    and its percentiles are still exact.
    """

    def __init__(self, merge_every: int = 1 << 20):
        self.values = np.empty(0)
        self.counts = np.empty(0, dtype=np.int64)
        self.merge_every = merge_every
        self._pending: list[np.ndarray] = []
        self._num_pending = 0

    def add(self, values: np.ndarray) -> None:
        self._pending.append(values)
        self._num_pending += len(values)
        if self._num_pending >= self.merge_every:
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        new, new_counts = np.unique(np.concatenate(self._pending), return_counts=True)
        self.values, where = np.unique(np.concatenate([self.values, new]), return_inverse=True)
        self.counts = np.bincount(
            where, weights=np.concatenate([self.counts, new_counts]), minlength=len(self.values)
        ).astype(np.int64)
        self._pending, self._num_pending = [], 0

    def __len__(self) -> int:
        self._merge()
        return int(self.counts.sum())

    def percentile(self, q: float) -> float:
        """numpy's default (linear) percentile of the multiset, without expanding it."""
        self._merge()
        ends = np.cumsum(self.counts)  # the value of sorted rank k is values[first end > k]
        rank = q / 100 * (ends[-1] - 1)
        below, above = self.values[np.searchsorted(ends, [math.floor(rank), math.ceil(rank)], side="right")]
        return float(below + (rank - math.floor(rank)) * (above - below))

    def stats(self, name: str) -> dict:
        """The same columns as `latency_stats`, the values taken to be seconds."""
        if not len(self):
            return latency_stats(name, [])
        ms, counts = self.values * 1e3, self.counts
        mean = float(np.average(ms, weights=counts))
        return {
            f"mean_{name}_ms": mean,
            f"median_{name}_ms": self.percentile(50) * 1e3,
            f"std_{name}_ms": float(np.sqrt(np.average((ms - mean) ** 2, weights=counts))),
            f"p90_{name}_ms": self.percentile(90) * 1e3,
            f"p99_{name}_ms": self.percentile(99) * 1e3,
        }


def goodput_slos(spec: Mapping | None) -> dict[str, float]:
    """`report.goodput` as {ttft_ms, tpot_ms, e2el_ms: limit}: the SLOs a request must all meet to
    count toward request_goodput (vLLM's --goodput). Unset (null) keys set no limit."""
    slos = {}
    for key, value in dict(spec or {}).items():
        if key not in SLO_KEYS:
            raise UserError(
                f"report.goodput.{key} is not a goodput SLO; allowed: {', '.join(SLO_KEYS)} "
                f"(milliseconds, as vLLM's --goodput ttft:MS tpot:MS e2el:MS)"
            )
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise UserError(f"report.goodput.{key}={value!r} must be a number of milliseconds > 0 (or null)")
        slos[key] = float(value)
    return slos


def meets_slos(slos: dict[str, float], ttft_s: float, tpot_s: float, e2el_s: float) -> bool:
    """vLLM's rule: every SLO set must hold; a one-token request's TPOT counts as 0. Compared in
    seconds, the SLO converted as vLLM converts it (ms / 1000): a latency of exactly 2.007 s
    meets `e2el_ms: 2007`, which 2.007 * 1e3 = 2007.0000000000002 ms would not."""
    measured = {"ttft_ms": ttft_s, "tpot_ms": tpot_s, "e2el_ms": e2el_s}
    return all(measured[key] <= limit / 1000 for key, limit in slos.items())
