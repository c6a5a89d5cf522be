"""bench-compare --policy on a policy whose values would be ignored or would mislead: one line
that says what is wrong and what is allowed, exit 2, never a comparison judged by another rule."""

from __future__ import annotations

import pytest

from kvbench.reporting import compare

from helpers.cli import refused

GOOD = "scenario,allocator,model,seed,status,completed\nsimulate,paged,opt-13b,0,ok,1.5\n"
RULE = "metrics:\n  completed: {better: higher, tolerance: 0}\n"
POLICIES = {  # name -> (the policy's text, what the error line says)
    "duplicate metric": (
        "metrics:\n  completed: {better: higher, tolerance: 0}\n  completed: {better: lower, tolerance: 0}\n",
        "key 'completed' is given twice in one mapping (lines 2 and 3); give each key once",
    ),
    "duplicate rule field": (
        "metrics:\n  completed: {better: higher, tolerance: 0, better: lower}\n",
        "key 'better' is given twice in one mapping (line 2)",
    ),
    "duplicate section": (RULE + "metrics:\n  completed: {better: lower}\n", "key 'metrics' is given twice"),
    "duplicate scenario rule": (
        RULE + "scenarios:\n  serve:\n    completed: {better: higher, tolerance: 0}\n"
        "    completed: {better: lower, tolerance: 0}\n",
        "key 'completed' is given twice in one mapping (lines 5 and 6)",
    ),
    "unknown test key": (
        "test: {alfa: 0.1}\n" + RULE,
        "test.alfa is not a key of test; did you mean test.alpha? (its keys: method, alpha, resamples)",
    ),
    "unknown test key, nothing near": ("test: {seed: 3}\n" + RULE, "test.seed is not a key of test (its keys:"),
    "unknown scenario": (
        RULE + "scenarios:\n  simulat:\n    completed: {better: lower, tolerance: 0}\n",
        "scenarios.simulat is not a scenario; did you mean simulate? "
        "(the scenarios: simulate, serve, kernel, profile, validate)",
    ),
    "too many resamples": (
        "test: {method: bootstrap, resamples: 1000000000000}\n" + RULE,
        "test.resamples must be a whole number from 100 to 1,000,000, not 1000000000000",
    ),
    "too many resamples, exponent": (
        "test: {method: bootstrap, resamples: 1e12}\n" + RULE,
        "test.resamples must be a whole number from 100 to 1,000,000",
    ),
    "identity column twice": (
        "identity: [scenario, seed, seed]\n" + RULE,
        "identity lists 'seed' twice; list each column once",
    ),
    "environment column twice": ("environment: [torch, torch]\n" + RULE, "environment lists 'torch' twice"),
    "abs_tolerance of a report-only metric": (
        "metrics:\n  completed: {better: higher, tolerance: null, abs_tolerance: 1}\n",
        "abs_tolerance applies to exact metrics with a tolerance (tolerance null reports only; "
        "give tolerance: 0 for an absolute slack alone)",
    ),
    "abs_tolerance of a measured metric": (
        "metrics:\n  min_s: {better: lower, min_effect: 0.1, abs_tolerance: 1.0e-6}\n",
        "abs_tolerance applies to exact metrics with a tolerance (a measured metric is judged by min_effect)",
    ),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_policy_that_would_be_misread_is_refused_with_one_line_and_exit_2(name, tmp_path):
    text, message = POLICIES[name]
    (tmp_path / "good.csv").write_text(GOOD)
    (tmp_path / "policy.yaml").write_text(text)
    args = [str(tmp_path / "good.csv"), str(tmp_path / "good.csv"), "--policy", str(tmp_path / "policy.yaml")]
    assert message in refused(lambda: compare.main(args))
