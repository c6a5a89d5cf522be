"""bench-compare's verdicts at their boundaries: an exact metric worse by exactly its tolerance,
a measured change of exactly min_effect, and one-sided tests (Mann-Whitney U, the bootstrap
interval) whose evidence lies between alpha and 2 * alpha, where a two-sided reading flips them."""

from __future__ import annotations

import numpy as np
from scipy import stats

from kvbench.reporting.policy import Rule, SignificanceTest
from kvbench.reporting.significance import NO_CHANGE, judge


def test_an_exact_metric_worse_by_exactly_its_tolerance_is_worse_and_by_more_regressed():
    """Catches `worse_by >= tolerance * |base| + abs_tolerance`: the tolerance itself must pass."""
    rule = Rule("lower", tolerance=0.25)
    assert rule.verdict(4.0, 5.0) == "worse"  # worse by 1.0 = 0.25 * 4.0, exactly (all powers of two)
    assert rule.verdict(4.0, 5.0 + 2**-20) == "REGRESSED"  # a hair more
    with_slack = Rule("higher", tolerance=0.25, abs_tolerance=0.5)
    assert with_slack.verdict(4.0, 2.5) == "worse"  # worse by 1.5 = 0.25 * 4.0 + 0.5
    assert with_slack.verdict(4.0, 2.5 - 2**-20) == "REGRESSED"


def test_a_significant_change_of_exactly_min_effect_counts():
    """Catches `abs(change) > min_effect`: a change of exactly min_effect is large enough."""
    base = [0.875, 0.9375, 1.0, 1.0625, 1.125]  # median 1.0
    cur = [1.1875, 1.21875, 1.25, 1.28125, 1.3125]  # median 1.25: change 1.25 / 1.0 - 1 = 0.25 exactly
    # every cur above every base: one-sided Mann-Whitney p = 1 / C(10, 5) = 1/252 < 0.05
    result = judge(base, cur, Rule("lower", min_effect=0.25), SignificanceTest())
    assert (result.change, result.verdict) == (0.25, "REGRESSED"), result
    faster = judge(cur, base, Rule("lower", min_effect=0.25), SignificanceTest())  # 1.25x faster, the other way
    assert (faster.change, faster.verdict) == (-0.25, "better"), faster  # ratio 0.8; -(1 / 0.8 - 1) = -0.25


def test_a_one_sided_mann_whitney_p_between_alpha_and_twice_alpha_is_no_regression():
    """Catches `p_worse < 2 * alpha` (a two-sided reading of the one-sided p): p = 0.075 > 0.05."""
    base = [1.00, 1.01, 1.02, 1.03, 1.04]
    cur = [0.90, 1.50, 1.51, 1.52, 1.53]  # cur's ranks 1, 7, 8, 9, 10 of 10: U = 4 * 5 = 20 of 25
    # P(U >= 20) = (number of partitions of 0..5 into at most 5 parts <= 5) / C(10, 5)
    #            = (1 + 1 + 2 + 3 + 5 + 7) / 252 = 19/252 = 0.0754: between 0.05 and 0.10
    p = stats.mannwhitneyu(cur, base, alternative="greater").pvalue
    assert 0.05 < p < 0.10 and p == 19 / 252
    result = judge(base, cur, Rule("lower", min_effect=0.10), SignificanceTest(alpha=0.05))
    assert result.change > 0.10  # medians 1.51 vs 1.02: 48 % worse, so only the test can say no
    assert result.verdict == NO_CHANGE, result


def bootstrap_low(worse, other, confidence_level: float) -> float:
    """significance._bootstrap's interval (same statistic, resamples and seed), its lower end."""
    result = stats.bootstrap(
        (np.asarray(worse), np.asarray(other)),
        lambda a, b, axis: np.median(a, axis=axis) / np.median(b, axis=axis),
        vectorized=True,
        paired=False,
        confidence_level=confidence_level,
        n_resamples=2000,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    return float(result.confidence_interval.low)


def test_the_bootstrap_flags_a_change_at_one_sided_alpha_not_at_half_of_it():
    """Catches `confidence_level=1 - alpha`: the one-sided 95 % bound is the two-sided 90 % interval's."""
    base = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    cur = [v * 1.21 for v in base]  # medians 1.25 vs 1.5125: 21 % slower, min_effect 10 %
    # the ratio of resampled medians is 1.21 * median(b*) / median(b'*); with seed 0 its 5th percentile
    # is about 1.21 * 0.84 = 1.016 > 1 (significant at one-sided 5 %), its 2.5th about 1.21 * 0.815 = 0.986
    assert bootstrap_low(cur, base, 0.90) > 1 >= bootstrap_low(cur, base, 0.95)
    test = SignificanceTest(method="bootstrap", alpha=0.05, resamples=2000)
    assert judge(base, cur, Rule("lower", min_effect=0.10), test).verdict == "REGRESSED"
