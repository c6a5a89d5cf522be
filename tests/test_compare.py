"""bench-compare: a regressed plugin fails the comparison and is named; bad input is one line, exit 2."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module

import kvbench.scenarios.build
import kvbench.scenarios.run
from kvbench.reporting.compare import Rule, compare, load_policy
from kvbench.hookspecs import hookimpl
from kvbench.plugins.allocators.contiguous import OracleAllocator
from kvbench.plugins.allocators.paged import PagedAllocator
from kvbench.registry import Registry
from kvbench.reporting.results import write_csv

SMALL = ["workload.num_requests=50", "workload.duration_s=null", "progress=false"]


class WastefulPagedAllocator(PagedAllocator):
    """A paged allocator with a regression: it leaves half of the KV pool unused."""

    def __init__(self, num_slots: int, max_model_len: int, **options):
        super().__init__(num_slots // 2, max_model_len, **options)


class DegradedPlugins:
    @hookimpl
    def kvbench_allocators(self):
        return [OracleAllocator, WastefulPagedAllocator]


def sweep_rows(allocators: list[str]) -> list[dict]:
    rows = []
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        for name in allocators:
            cfg = compose("bench", overrides=[f"+allocator={name}", *SMALL])
            rows += [{**row, "status": "ok", "reason": ""} for row in kvbench.scenarios.run.run_point(cfg)]
    return rows


@pytest.fixture(scope="module")
def baseline_rows():
    return sweep_rows(["oracle", "paged"])


@pytest.fixture
def degraded_registry(monkeypatch):
    """Runs see a registry whose `paged` is the wasteful one, as if the code had regressed."""
    registry = Registry(load_entry_points=False)
    registry.register(DegradedPlugins())
    monkeypatch.setattr(kvbench.scenarios.build, "default_registry", lambda: registry)


def run_compare(*args):
    return subprocess.run([sys.executable, "-m", "kvbench.reporting.compare", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_degraded_paged_plugin_fails_the_comparison_and_names_the_metric(tmp_path, baseline_rows,
                                                                          degraded_registry):
    write_csv(tmp_path / "baseline.csv", baseline_rows)
    degraded = sweep_rows(["oracle", "paged"])
    base_paged = next(r for r in baseline_rows if r["allocator"] == "paged")
    worse_paged = next(r for r in degraded if r["allocator"] == "paged")
    assert worse_paged["request_throughput"] < base_paged["request_throughput"]
    write_csv(tmp_path / "current.csv", degraded)

    result = run_compare(tmp_path / "baseline.csv", tmp_path / "current.csv")

    assert result.returncode == 1, result.stdout + result.stderr
    summary = result.stdout.split("REGRESSION:")[1]
    assert "allocator=paged: request_throughput" in summary
    assert "allocator=paged: mean_batch_size" in summary
    assert "allocator=oracle" not in summary  # the untouched plugin is not blamed


def test_an_identical_rerun_passes(tmp_path, baseline_rows):
    write_csv(tmp_path / "baseline.csv", baseline_rows)
    write_csv(tmp_path / "current.csv", sweep_rows(["oracle", "paged"]))
    result = run_compare(tmp_path / "baseline.csv", tmp_path / "current.csv")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: 2 point(s)" in result.stdout


@pytest.mark.parametrize("better, base, cur, verdict", [
    ("higher", 10.0, 9.0, "REGRESSED"),   # 10 % worse, tolerance 5 %
    ("higher", 10.0, 9.6, "worse"),       # 4 % worse: inside the tolerance
    ("higher", 10.0, 11.0, "better"),
    ("lower", 10.0, 11.0, "REGRESSED"),
    ("lower", 10.0, 9.0, "better"),
    ("lower", 10.0, 10.0, "same"),
    ("lower", 10.0, math.nan, "REGRESSED"),  # the metric vanished
])
def test_rule_direction_and_tolerance(better, base, cur, verdict):
    assert Rule(better, 0.05).verdict(base, cur) == verdict


def test_zero_baseline_needs_absolute_slack_and_report_only_never_fails():
    assert Rule("lower", 0.5).verdict(0.0, 1e-12) == "REGRESSED"
    assert Rule("lower", 0.5, abs_tolerance=1e-9).verdict(0.0, 1e-12) == "worse"
    assert Rule("lower", None).verdict(1.0, 100.0) == "worse"


def row(allocator, throughput, **extra):
    return {"scenario": "simulate", "allocator": allocator, "seed": "0", "status": "ok",
            "request_throughput": str(throughput), "torch": "2.13.0", **extra}


def test_missing_point_fails_new_point_and_environment_change_are_reported():
    policy = load_policy()
    out = io.StringIO()
    code = compare([row("paged", 2.0), row("pow2", 1.0)],
                   [row("paged", 2.0, torch="2.14.0"), row("oracle", 1.5, torch="2.14.0")], policy, out=out)
    text = out.getvalue()
    assert code == 1
    assert "missing in current: allocator=pow2" in text
    assert "new in current (no baseline): allocator=oracle" in text
    assert "environment changed: torch 2.13.0 -> 2.14.0" in text
    out = io.StringIO()
    assert compare([row("paged", 2.0), row("pow2", 1.0)], [row("paged", 2.0)], policy,
                   allow_missing=True, out=out) == 0


def test_a_point_that_failed_now_is_a_regression():
    out = io.StringIO()
    failed = {**row("paged", ""), "status": "failed", "reason": "out of memory"}
    assert compare([row("paged", 2.0)], [failed], load_policy(), out=out) == 1
    assert "point failed" in out.getvalue()


def test_swept_parameters_are_part_of_a_points_identity():
    out = io.StringIO()
    base = [row("paged", 2.0, **{"workload.rate": "2"}), row("paged", 4.0, **{"workload.rate": "8"})]
    cur = [row("paged", 4.0, **{"workload.rate": "8"}), row("paged", 1.0, **{"workload.rate": "2"})]
    assert compare(base, cur, load_policy(), out=out) == 1
    assert "workload.rate=2: request_throughput 2 -> 1" in out.getvalue()


def test_measured_serve_rows_get_loose_tolerances_simulated_rows_tight_ones():
    base = [row("paged", 2.0), {**row("paged", 2.0), "scenario": "serve"}]
    cur = [row("paged", 1.8), {**row("paged", 1.8), "scenario": "serve"}]  # 10 % lower each
    out = io.StringIO()
    assert compare(base, cur, load_policy(), out=out) == 1
    regressions = out.getvalue().split("REGRESSION:")[1]
    assert "scenario=simulate: request_throughput" in regressions
    assert "scenario=serve" not in regressions


def benchmark_json(path, medians: dict) -> None:
    path.write_text(json.dumps({
        "machine_info": {"python_version": "3.11.7", "cpu": {"brand_raw": "test cpu"}},
        "benchmarks": [{"fullname": name, "stats": {"median": m, "min": m, "rounds": 10}}
                       for name, m in medians.items()]}))


def test_benchmark_json_fails_only_beyond_twice_as_slow(tmp_path):
    benchmark_json(tmp_path / "base.json", {"test_step": 1.0e-3, "test_cost": 2.0e-6})
    benchmark_json(tmp_path / "slower.json", {"test_step": 1.9e-3, "test_cost": 2.0e-6})
    benchmark_json(tmp_path / "much_slower.json", {"test_step": 1.0e-3, "test_cost": 4.5e-6})
    assert run_compare(tmp_path / "base.json", tmp_path / "slower.json").returncode == 0
    result = run_compare(tmp_path / "base.json", tmp_path / "much_slower.json")
    assert result.returncode == 1
    assert "benchmark=test_cost: median_s" in result.stdout


def one_line_error(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_missing_baseline_is_a_user_error(tmp_path):
    write_csv(tmp_path / "current.csv", [row("paged", 2.0)])
    assert "does not exist" in one_line_error(run_compare(tmp_path / "nope.csv", tmp_path / "current.csv"))


def test_baseline_without_matching_points_is_a_user_error(tmp_path):
    write_csv(tmp_path / "base.csv", [row("pow2", 1.0)])
    write_csv(tmp_path / "current.csv", [row("paged", 2.0)])
    message = one_line_error(run_compare(tmp_path / "base.csv", tmp_path / "current.csv"))
    assert "no point of the current run matches the baseline" in message


def test_policy_naming_an_unknown_metric_is_a_user_error(tmp_path):
    write_csv(tmp_path / "base.csv", [row("paged", 2.0)])
    (tmp_path / "policy.yaml").write_text("metrics:\n  thruput_req: {better: higher, tolerance: 0.1}\n")
    message = one_line_error(run_compare(tmp_path / "base.csv", tmp_path / "base.csv",
                                         "--policy", tmp_path / "policy.yaml"))
    assert "unknown metric 'thruput_req'" in message and "request_throughput" in message


def test_sweep_directory_without_results_is_a_user_error(tmp_path):
    (tmp_path / "empty_sweep").mkdir()
    write_csv(tmp_path / "base.csv", [row("paged", 2.0)])
    assert "has no results" in one_line_error(run_compare(tmp_path / "base.csv", tmp_path / "empty_sweep"))
