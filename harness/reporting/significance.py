"""Judge a measured metric from two sides' samples: significant *and* larger than min_effect.

A wall-clock metric moves between identical runs on a shared host, so a fixed tolerance either
cries wolf (tight) or sleeps (loose). Here a change is a regression only when a one-sided test
on the repeats says it is real (Mann-Whitney U, or a bootstrap confidence interval of the ratio
of medians) and the medians (or, with `effect: best`, each side's best sample) differ by at least
the metric's minimum relevant change. One sample
on a side cannot support a test, nor can so few that the test's smallest p is not below alpha
(Mann-Whitney's exact test, which scipy runs on small samples without ties, with 3 and 3
samples: 1/20 = 0.05): that is said, never judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvbench.reporting.policy import Rule, SignificanceTest

NOT_MEANINGFUL = "not statistically meaningful"
NO_CHANGE = "no significant change"
SMALL = "below min_effect"  # significant, but smaller than the change that matters


@dataclass(frozen=True)
class Judgement:
    verdict: str  # REGRESSED | better | no significant change | below min_effect | not statistically meaningful
    base: float  # each side's value the change is measured between: the median, or the best run
    current: float  # (the rule's `effect`)
    change: float  # the worse way: 0.25 = 25 % worse, -0.2 = 1.25x better
    detail: str


def _worse_ratio(base: float, cur: float, better: str) -> float:
    """How many times worse current is than the baseline (> 1 worse, < 1 better)."""
    num, den = (cur, base) if better == "lower" else (base, cur)
    if num == den:
        return 1.0
    return num / den if den else math.inf


def _mannwhitneyu(worse: np.ndarray, other: np.ndarray, alpha: float) -> tuple[bool, bool, str]:
    """(significantly worse, significantly better, detail); `worse` is oriented so larger is worse."""
    if np.ptp(np.concatenate([worse, other])) == 0:
        return False, False, "p=1 (all samples equal)"
    from scipy import stats  # here: loading scipy.stats takes about a second

    p_worse = stats.mannwhitneyu(worse, other, alternative="greater").pvalue
    p_better = stats.mannwhitneyu(worse, other, alternative="less").pvalue
    p = min(p_worse, p_better)
    return p_worse < alpha, p_better < alpha, f"p={p:.3g}"


def _bootstrap(worse: np.ndarray, other: np.ndarray, test: SignificanceTest) -> tuple[bool, bool, str]:
    """The one-sided (1 - alpha) interval of median(worse) / median(other) excludes 1."""
    if np.ptp(np.concatenate([worse, other])) == 0 or np.median(other) == 0:
        return False, False, "ratio CI [1, 1]"
    from scipy import stats

    result = stats.bootstrap(
        (worse, other),
        lambda a, b, axis: np.median(a, axis=axis) / np.median(b, axis=axis),
        vectorized=True,
        paired=False,
        confidence_level=1 - 2 * test.alpha,
        n_resamples=test.resamples,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    low, high = result.confidence_interval
    return bool(low > 1), bool(high < 1), f"ratio CI [{low:.3g}, {high:.3g}]"


def fewest_runs(test: SignificanceTest) -> int:
    """The fewest samples a side (both sides alike) from which the test can flag a change at its
    alpha: the exact Mann-Whitney test's smallest one-sided p is 1 / C(2n, n) (4 a side: 0.014 <
    0.05). With ties scipy takes the normal approximation, whose p can be smaller."""
    if test.method != "mannwhitneyu":
        return 2
    return next(n for n in range(2, 1000) if 1 / math.comb(2 * n, n) < test.alpha)


def judge(base: list[float], cur: list[float], rule: Rule, test: SignificanceTest) -> Judgement:
    base_arr = np.array([v for v in base if math.isfinite(v)], dtype=float)
    cur_arr = np.array([v for v in cur if math.isfinite(v)], dtype=float)
    if len(base_arr) == 0 or len(cur_arr) == 0:
        return Judgement(NOT_MEANINGFUL, math.nan, math.nan, math.nan, "no finite sample on a side")
    if rule.effect == "best":  # each side's least disturbed sample
        pick = np.min if rule.better == "lower" else np.max
        b, c = float(pick(base_arr)), float(pick(cur_arr))
    else:
        b, c = float(np.median(base_arr)), float(np.median(cur_arr))
    ratio = _worse_ratio(b, c, rule.better)
    change = ratio - 1 if ratio >= 1 else -(1 / ratio - 1) if ratio > 0 else -math.inf  # 0: worse went to 0
    if len(base_arr) < 2 or len(cur_arr) < 2:
        return Judgement(
            NOT_MEANINGFUL,
            b,
            c,
            change,
            f"{len(base_arr)} vs {len(cur_arr)} samples; run with repeats >= 2 (5 or more for a useful test)",
        )
    smallest_p = 1 / math.comb(len(base_arr) + len(cur_arr), len(base_arr))
    tied = len(np.unique(np.concatenate([base_arr, cur_arr]))) < len(base_arr) + len(cur_arr)
    if test.method == "mannwhitneyu" and smallest_p >= test.alpha and not tied:  # scipy's exact test, then
        return Judgement(
            NOT_MEANINGFUL,
            b,
            c,
            change,
            f"{len(base_arr)} vs {len(cur_arr)} samples: Mann-Whitney's smallest p is {smallest_p:.3g}, never below "
            f"alpha={test.alpha:g}; run with repeats >= {fewest_runs(test)} a side",
        )
    worse, other = (cur_arr, base_arr) if rule.better == "lower" else (-cur_arr, -base_arr)
    if test.method == "bootstrap":
        worse, other = (cur_arr, base_arr) if rule.better == "lower" else (base_arr, cur_arr)
        significantly_worse, significantly_better, detail = _bootstrap(worse, other, test)
    else:
        significantly_worse, significantly_better, detail = _mannwhitneyu(worse, other, test.alpha)
    detail = f"n={len(base_arr)}/{len(cur_arr)}, {detail}"
    large = abs(change) >= rule.min_effect
    if significantly_worse and change > 0:
        verdict = "REGRESSED" if large else SMALL
    elif significantly_better and change < 0:
        verdict = "better" if large else SMALL
    else:
        verdict = NO_CHANGE
    if verdict == SMALL:  # which way: "below min_effect" alone did not say
        detail = (
            f"{abs(change):.1%} {'worse' if change > 0 else 'better'}, under min_effect {rule.min_effect:.0%}; {detail}"
        )
    return Judgement(verdict, b, c, change, detail)
