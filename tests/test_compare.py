"""bench-compare: a regressed plugin fails the comparison and is named; bad input is one line, exit 2."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import warnings

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

import kvbench.scenarios.build
import kvbench.scenarios.run
from kvbench.errors import UserError
from kvbench.hookspecs import hookimpl
from kvbench.plugins.allocators.contiguous import OracleAllocator
from kvbench.plugins.allocators.paged import PagedAllocator
from kvbench.registry import Registry
from kvbench.reporting.compare import compare, main, read_side
from kvbench.reporting.policy import Rule, SignificanceTest, load_policy
from kvbench.reporting.results import write_csv
from kvbench.reporting.significance import judge
from kvbench.scenarios.repeats import run_interleaved

from helpers.cli import in_process

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
    """bench-compare's main() in this process, as a finished process: (returncode, stdout, stderr)."""
    return in_process(lambda: main([str(a) for a in args]), args)


def run_compare_process(*args):
    """bench-compare as its own process, through `python -m` (the entry point itself)."""
    return subprocess.run(
        [sys.executable, "-m", "kvbench.reporting.compare", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_degraded_paged_plugin_fails_the_comparison_and_names_the_metric(tmp_path, baseline_rows, degraded_registry):
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


def test_a_reported_metric_that_moved_says_it_is_not_gated(tmp_path, baseline_rows):
    """`schedule_us_per_step 2.2 worse` above `OK` read as a regression let through."""
    slower = [{**row, "schedule_us_per_step": 2.2 * row["schedule_us_per_step"]} for row in baseline_rows]
    write_csv(tmp_path / "baseline.csv", baseline_rows)
    write_csv(tmp_path / "current.csv", slower)
    result = run_compare(tmp_path / "baseline.csv", tmp_path / "current.csv")
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "schedule_us_per_step" in line][:1]
    assert line.endswith("worse (reported, not gated)")


@pytest.mark.parametrize(
    "better, base, cur, verdict",
    [
        ("higher", 10.0, 9.0, "REGRESSED"),  # 10 % worse, tolerance 5 %
        ("higher", 10.0, 9.6, "worse"),  # 4 % worse: inside the tolerance
        ("higher", 10.0, 11.0, "better"),
        ("lower", 10.0, 11.0, "REGRESSED"),
        ("lower", 10.0, 9.0, "better"),
        ("lower", 10.0, 10.0, "same"),
        ("lower", 10.0, math.nan, "REGRESSED"),  # the metric vanished
    ],
)
def test_rule_direction_and_tolerance(better, base, cur, verdict):
    assert Rule(better, 0.05).verdict(base, cur) == verdict


def test_zero_baseline_needs_absolute_slack_and_report_only_never_fails():
    assert Rule("lower", 0.5).verdict(0.0, 1e-12) == "REGRESSED"
    assert Rule("lower", 0.5, abs_tolerance=1e-9).verdict(0.0, 1e-12) == "worse"
    assert Rule("lower", None).verdict(1.0, 100.0) == "worse"


def row(allocator, throughput, **extra):
    return {
        "scenario": "simulate",
        "allocator": allocator,
        "seed": "0",
        "status": "ok",
        "request_throughput": str(throughput),
        "torch": "2.13.0",
        **extra,
    }


def test_missing_point_fails_new_point_and_environment_change_are_reported():
    policy = load_policy()
    out = io.StringIO()
    code = compare(
        [row("paged", 2.0), row("pow2", 1.0)],
        [row("paged", 2.0, torch="2.14.0"), row("oracle", 1.5, torch="2.14.0")],
        policy,
        out=out,
    )
    text = out.getvalue()
    assert code == 1
    assert "missing in current: allocator=pow2" in text
    assert "new in current (no baseline): allocator=oracle" in text
    assert "environment changed: torch 2.13.0 -> 2.14.0" in text
    out = io.StringIO()
    assert compare([row("paged", 2.0), row("pow2", 1.0)], [row("paged", 2.0)], policy, allow_missing=True, out=out) == 0


def test_a_gated_metric_blank_in_the_baseline_is_counted_as_not_judged():
    out = io.StringIO()
    base, cur = [row("paged", ""), row("pow2", 1.0)], [row("paged", 2.0), row("pow2", 1.0)]
    assert compare(base, cur, load_policy(), out=out) == 0
    text = out.getvalue()
    assert "(no baseline value: not judged)" in text
    assert text.rstrip().endswith("1 gated value(s) not judged, their baseline cell blank (request_throughput)")


def test_a_point_that_failed_now_is_a_regression():
    out = io.StringIO()
    failed = {**row("paged", ""), "status": "failed", "reason": "out of memory"}
    assert compare([row("paged", 2.0)], [failed], load_policy(), out=out) == 1
    assert "point failed" in out.getvalue()


def test_goodput_slos_score_a_point_without_naming_it_and_goodput_under_other_slos_is_not_judged():
    """`report.goodput.ttft_ms=2000` on one side made "no point of the current run matches the
    baseline": the SLO became an identity column, though the runs were the same."""
    base = [row("paged", 2.0, request_goodput="1.5"), row("pow2", 1.0, request_goodput="0.8")]
    strict = [
        row("paged", 2.0, request_goodput="0.5", **{"report.goodput.ttft_ms": "2000"}),
        row("pow2", 1.0, request_goodput="0.1", **{"report.goodput.ttft_ms": "2000"}),
    ]
    out = io.StringIO()
    assert compare(base, strict, load_policy(), out=out) == 0  # a stricter SLO is no regression
    text = out.getvalue()
    assert text.count("not compared: scored under other SLOs (report.goodput.ttft_ms: (unset) -> 2000)") == 2
    assert "allocator=paged" in text and "column(s) the policy does not judge changed" not in text
    out = io.StringIO()  # the same SLOs on both sides: goodput is judged as ever
    assert compare(strict, [{**strict[0], "request_goodput": "0.4"}, strict[1]], load_policy(), out=out) == 1
    assert "request_goodput" in out.getvalue() and "REGRESSED" in out.getvalue()


def test_swept_parameters_are_part_of_a_points_identity():
    out = io.StringIO()
    base = [row("paged", 2.0, **{"workload.rate": "2"}), row("paged", 4.0, **{"workload.rate": "8"})]
    cur = [row("paged", 4.0, **{"workload.rate": "8"}), row("paged", 1.0, **{"workload.rate": "2"})]
    assert compare(base, cur, load_policy(), out=out) == 1
    assert "workload.rate=2: request_throughput 2 -> 1" in out.getvalue()


def test_wide_summaries_read_from_csv_match_without_a_fragmented_frame(tmp_path):
    extra = {f"counter_{i}": str(i) for i in range(80)}  # a column each: read_csv's frames are one block a column
    sides = []
    for name, throughput in (("baseline", 2.0), ("current", 2.0)):
        write_csv(tmp_path / name / "summary.csv", [row("paged", throughput, **extra), row("pow2", 1.0, **extra)])
        sides.append(tmp_path / name / "summary.csv")
    out = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        assert compare(*map(read_side, sides), load_policy(), out=out) == 0
    assert "OK: 2 point(s) match" in out.getvalue()


def test_measured_serve_rows_are_judged_by_the_test_simulated_rows_exactly():
    base = [row("paged", 2.0), {**row("paged", 2.0), "scenario": "serve"}]
    cur = [row("paged", 1.8), {**row("paged", 1.8), "scenario": "serve"}]  # 10 % lower each, one sample
    out = io.StringIO()
    assert compare(base, cur, load_policy(), out=out) == 1
    text = out.getvalue()
    regressions = text.split("REGRESSION:")[1]
    assert "scenario=simulate: request_throughput" in regressions
    assert "scenario=serve" not in regressions
    assert "not statistically meaningful (1 vs 1 samples" in text


def benchmark_json(path, medians: dict, machine: str = "test cpu") -> None:
    """A merged A/B file: each benchmark's per-run statistics under `runs`."""
    path.write_text(
        json.dumps(
            {
                "machine_info": {"python_version": "3.11.7", "cpu": {"brand_raw": machine}},
                "benchmarks": [
                    {
                        "fullname": name,
                        "stats": {"median": runs[0], "min": runs[0], "rounds": 10},
                        "runs": [{"median": m, "min": m, "rounds": 10} for m in runs],
                    }
                    for name, runs in medians.items()
                ],
            }
        )
    )


def test_benchmark_runs_are_samples_a_25pc_slowdown_regresses_noise_does_not(tmp_path):
    noisy = [1.00e-3, 1.12e-3, 0.95e-3, 1.30e-3, 1.02e-3]
    benchmark_json(tmp_path / "base.json", {"test_step": noisy, "test_cost": [2.0e-6] * 5})
    benchmark_json(
        tmp_path / "same.json", {"test_step": [1.05e-3, 0.98e-3, 1.25e-3, 1.01e-3, 1.10e-3], "test_cost": [2.0e-6] * 5}
    )
    benchmark_json(tmp_path / "slower.json", {"test_step": [m * 1.25 for m in noisy], "test_cost": [2.0e-6] * 5})
    result = run_compare(tmp_path / "base.json", tmp_path / "same.json")
    assert result.returncode == 0, result.stdout
    assert "measured metrics: no significant change" in result.stdout
    result = run_compare(tmp_path / "base.json", tmp_path / "slower.json")
    assert result.returncode == 1, result.stdout
    assert "benchmark=test_step: min_s" in result.stdout.split("REGRESSION:")[1]


def test_significant_but_small_change_is_not_a_regression():
    rule = Rule("lower", min_effect=0.10)
    policy = load_policy()
    base = [1.00, 1.01, 1.02, 1.03, 1.04]
    result = judge(base, [v * 1.05 + 0.1 for v in base], rule, policy.test)  # fully separated, +15 %
    assert result.verdict == "REGRESSED"
    result = judge(base, [v + 0.06 for v in base], rule, policy.test)  # fully separated, +6 %
    assert result.verdict == "below min_effect" and result.detail.startswith("5.9% worse, under min_effect 10%")
    faster = judge(base, [v - 0.06 for v in base], rule, policy.test)  # which way, said
    assert faster.verdict == "below min_effect" and faster.detail.startswith("6.2% better")
    assert judge([1.0], [2.0], rule, policy.test).verdict == "not statistically meaningful"


def test_effect_best_measures_the_change_between_each_side_s_least_disturbed_run():
    rule = Rule("lower", min_effect=0.10, effect="best")
    test = load_policy().test
    base = [1.00, 1.01, 1.02, 1.01, 1.00]  # a quiet host
    loaded = [1.00, 1.25, 1.30, 1.22, 1.28]  # the same code, four of five runs during a burst of load
    assert judge(base, [v * 1.25 for v in base], Rule("lower", min_effect=0.10), test).verdict == "REGRESSED"
    assert judge(base, loaded, Rule("lower", min_effect=0.10), test).verdict == "REGRESSED"  # the median cries wolf
    result = judge(base, loaded, rule, test)
    assert (result.verdict, result.base, result.current) == ("no significant change", 1.00, 1.00)
    assert judge(base, [v * 1.25 for v in base], rule, test).verdict == "REGRESSED"  # 25 % slower everywhere
    assert judge(base, [v * 1.25 for v in loaded], rule, test).verdict == "REGRESSED"  # ... and under load


@pytest.mark.parametrize("method", ["mannwhitneyu", "bootstrap"])
def test_both_tests_see_a_clear_throughput_drop_and_not_an_overlap(method):
    test = SignificanceTest(method=method)
    rule = Rule("higher", min_effect=0.10)
    base = [10.0, 10.4, 9.8, 10.1, 9.9, 10.3]
    assert judge(base, [v / 1.4 for v in base], rule, test).verdict == "REGRESSED"
    assert judge(base, [10.2, 9.7, 10.0, 10.5, 9.9, 10.1], rule, test).verdict == "no significant change"
    assert judge(base, [v * 1.4 for v in base], rule, test).verdict == "better"


def test_files_from_different_machines_are_flagged(tmp_path):
    benchmark_json(tmp_path / "base.json", {"test_step": [1e-3, 1.1e-3]}, machine="cpu A")
    benchmark_json(tmp_path / "cur.json", {"test_step": [1e-3, 1.1e-3]}, machine="cpu B")
    result = run_compare(tmp_path / "base.json", tmp_path / "cur.json")
    assert "!! DIFFERENT MACHINE OR BUILD: cpu cpu A -> cpu B" in result.stdout


def one_line_error(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_missing_baseline_is_a_user_error(tmp_path):
    write_csv(tmp_path / "current.csv", [row("paged", 2.0)])
    assert "does not exist" in one_line_error(run_compare_process(tmp_path / "nope.csv", tmp_path / "current.csv"))


def test_baseline_without_matching_points_is_a_user_error(tmp_path):
    write_csv(tmp_path / "base.csv", [row("pow2", 1.0)])
    write_csv(tmp_path / "current.csv", [row("paged", 2.0)])
    message = one_line_error(run_compare(tmp_path / "base.csv", tmp_path / "current.csv"))
    assert "no point of the current run matches the baseline" in message


def test_policy_naming_an_unknown_metric_is_a_user_error(tmp_path):
    write_csv(tmp_path / "base.csv", [row("paged", 2.0)])
    (tmp_path / "policy.yaml").write_text("metrics:\n  thruput_req: {better: higher, tolerance: 0.1}\n")
    message = one_line_error(
        run_compare(tmp_path / "base.csv", tmp_path / "base.csv", "--policy", tmp_path / "policy.yaml")
    )
    assert "unknown metric 'thruput_req'" in message and "request_throughput" in message


def test_sweep_directory_without_results_is_a_user_error(tmp_path):
    (tmp_path / "empty_sweep").mkdir()
    write_csv(tmp_path / "base.csv", [row("paged", 2.0)])
    assert "has no results" in one_line_error(run_compare(tmp_path / "base.csv", tmp_path / "empty_sweep"))


@pytest.mark.parametrize(
    "policy, complaint",
    [
        ("test: {method: ttest}\nmetrics: {}\n", "test.method must be one of mannwhitneyu, bootstrap, not 'ttest'"),
        ("test: {alpha: 0.7}\nmetrics: {}\n", "alpha must be a number between 0 and 0.5"),
        ("metrics:\n  median_s: {better: lower, min_effect: 0}\n", "min_effect must be a number between 0 and 10"),
        ("metrics:\n  median_s: {better: lower, min_effect: ten}\n", "min_effect must be a number"),
        ("metrics:\n  median_s: {better: lower, min_effect: 0.1, tolerance: 1}\n", "not both"),
        ("metrics:\n  min_s: {better: lower, min_effect: 0.1, effect: mean}\n", "effect"),
        ("metrics:\n  min_s: {better: lower, tolerance: 0.1, effect: best}\n", "effect applies to measured metrics"),
    ],
)
def test_policy_with_an_invalid_test_or_effect_size_is_a_user_error(tmp_path, policy, complaint):
    benchmark_json(tmp_path / "base.json", {"test_step": [1e-3, 1.1e-3]})
    (tmp_path / "policy.yaml").write_text(policy)
    message = one_line_error(
        run_compare(tmp_path / "base.json", tmp_path / "base.json", "--policy", tmp_path / "policy.yaml")
    )
    assert complaint in message


SERVE = [
    "scenario=serve",
    "model=tiny",
    "workload=fixed",
    "workload.input_len=32",
    "workload.output_len=48",
    "scenario.num_requests=4",
    "+allocator=paged",
    "progress=false",
]


def serve_once() -> list[dict]:
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        rows = kvbench.scenarios.run.run_point(compose("bench", overrides=SERVE))
    return [{**row, "status": "ok"} for row in rows]


@pytest.fixture(scope="module")
def serve_sweeps():
    """Two identical serve sweeps and one 40 % slower, 5 repeats each, measured interleaved."""
    from slowdown import slowed

    from kvbench.executors.model_executor import ModelExecutor

    def slower():
        execute = ModelExecutor.execute
        ModelExecutor.execute = slowed(execute, 0.4)
        try:
            return serve_once()
        finally:
            ModelExecutor.execute = execute

    return run_interleaved({"base": serve_once, "same": serve_once, "slower": slower}, 5)


def test_a_repeated_serve_point_stores_every_repeat_and_reports_the_median(serve_sweeps):
    (point,) = serve_sweeps["base"]
    samples = json.loads(point["samples"])
    assert point["repeats"] == 5 and len(samples["request_throughput"]) == 5
    assert point["request_throughput"] == sorted(samples["request_throughput"])[2]
    assert samples["completed"] == [4.0] * 5


@pytest.mark.skipif(
    not os.environ.get("KVBENCH_TIMING_TESTS"),
    reason="asserts on wall-clock serve timings, which a shared 2-core host cannot promise; run with "
    "KVBENCH_TIMING_TESTS=1 (the A/B figures are measured by bench-compare --against)",
)
def test_identical_serve_sweeps_show_no_significant_change_a_40pc_slower_one_regresses(tmp_path, serve_sweeps):
    for name, rows in serve_sweeps.items():
        write_csv(tmp_path / f"{name}.csv", rows)
    result = run_compare(tmp_path / "base.csv", tmp_path / "same.csv")
    assert result.returncode == 0, result.stdout
    assert "REGRESSED" not in result.stdout and "no significant change" in result.stdout
    result = run_compare(tmp_path / "base.csv", tmp_path / "slower.csv")
    assert result.returncode == 1, result.stdout
    assert "rate=inf: request_throughput" in result.stdout.split("REGRESSION:")[1]


def test_a_serve_point_run_with_repeats_holds_its_samples():
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        (point,) = kvbench.scenarios.run.run_point(compose("bench", overrides=[*SERVE, "repeats=2"]))
    assert point["repeats"] == 2 and len(json.loads(point["samples"])["duration_s"]) == 2


def test_repeats_must_be_a_whole_number():
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        with pytest.raises(UserError, match="repeats=0 must be a whole number >= 1"):
            kvbench.scenarios.run.run_point(compose("bench", overrides=[*SERVE, "repeats=0"]))


def run_against(*args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "kvbench.reporting.compare", "--against", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        **kwargs,
    )


def test_ab_bad_ref_and_too_few_repeats_are_user_errors():
    assert "no such commit" in one_line_error(run_against("no-such-ref-anywhere"))
    assert "--repeats 1: the significance test needs at least 2" in one_line_error(
        run_against("HEAD", "--repeats", "1")
    )


def test_ab_a_test_path_that_is_not_there_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--against", "HEAD", "--repeats", "2", "no_such_test_path.py"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_such_test_path.py: no such test file or folder" in err[0]


@pytest.mark.parametrize(
    "what, said",
    [
        # the sweep ran, and tests/benchmarks was dropped without a word
        (["tests/benchmarks", "workload.rate=1"], "not both: tests/benchmarks beside workload.rate=1; give one kind"),
        # both sides' pytest started, then failed: exit 1, a regression's code
        (["README.md"], "README.md is not a test file (a .py file or a folder of them)"),
    ],
)
def test_ab_targets_it_would_drop_or_not_run_are_refused_before_anything_runs(capsys, what, said):
    with pytest.raises(SystemExit) as exit_info:
        main(["--against", "HEAD", "--repeats", "2", *what])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0]


@pytest.mark.parametrize("where", ["s1", "outside"])
def test_ab_a_target_that_is_no_path_in_the_tree_is_refused_not_run(tmp_path, capsys, where):
    """`s1` (no .py, no slash) and a folder outside the tree passed the check, and each side's
    pytest then failed: exit 1, a regression's code, for bad input."""
    (tmp_path / "outside").mkdir()
    target = "s1" if where == "s1" else str(tmp_path / "outside")
    with pytest.raises(SystemExit) as exit_info:
        main(["--against", "HEAD", "--repeats", "2", target])
    assert exit_info.value.code == 2
    assert f"{target}: no such test file or folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    "out, said",
    [
        ("", "--out is empty (an unset variable?)"),  # it wrote into the current folder
        ("a-file", "is a file: give a folder"),
        ("kept", "holds an earlier A/B's baseline.json, which this one would replace"),  # it replaced it
    ],
)
def test_ab_an_out_folder_that_is_empty_a_file_or_holds_an_earlier_ab_is_refused(tmp_path, capsys, out, said):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "baseline.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        main(["--against", "HEAD", "--repeats", "2", "--out", str(tmp_path / out) if out else ""])
    assert exit_info.value.code == 2 and said in capsys.readouterr().err


def test_sigterm_while_measuring_removes_refs_worktree_and_exits_143(monkeypatch, capsys):
    """A CI job's time limit sends SIGTERM: REF's worktree must not stay registered."""
    import signal
    import time

    import kvbench.reporting.ab as ab

    seen = {}

    def terminated(sides, bench_overrides, targets, repeats, ref, ref_tree, *rest, **kwargs):
        seen["tree"] = ref_tree
        assert ref_tree.is_dir()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts it
        raise AssertionError("SIGTERM did not end the measurement")

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(ab, "measure", terminated)
    with pytest.raises(SystemExit) as exit_info:
        ab.run_ab("HEAD", 2, [], load_policy(None), out=io.StringIO())
    assert exit_info.value.code == 143
    assert not seen["tree"].exists()
    listed = subprocess.run(["git", "worktree", "list"], capture_output=True, text=True, cwd=ab.source_tree()).stdout
    assert str(seen["tree"]) not in listed
    assert signal.getsignal(signal.SIGTERM) == before
    assert capsys.readouterr().err.splitlines() == ["terminated: nothing was compared"]


def test_a_second_sigterm_during_the_cleanup_does_not_stop_it(monkeypatch, capsys):
    """CI's runner may send SIGTERM again while REF's worktree is being removed: it is ignored
    until the worktree is gone, then the handler from before is back."""
    import signal

    import kvbench.reporting.ab as ab

    seen, git = {}, ab._git

    def measured(sides, bench_overrides, targets, repeats, ref, ref_tree, *rest, **kwargs):
        seen["tree"] = ref_tree
        os.kill(os.getpid(), signal.SIGTERM)

    def removing(tree, *args):
        if args[:2] == ("worktree", "remove"):
            os.kill(os.getpid(), signal.SIGTERM)  # delivered now, at the next bytecode: ignored
            seen["removed"] = True
        return git(tree, *args)

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(ab, "measure", measured)
    monkeypatch.setattr(ab, "_git", removing)
    with pytest.raises(SystemExit) as exit_info:
        ab.run_ab("HEAD", 2, [], load_policy(None), out=io.StringIO())
    assert exit_info.value.code == 143 and seen["removed"]
    assert not seen["tree"].exists()
    listed = subprocess.run(["git", "worktree", "list"], capture_output=True, text=True, cwd=ab.source_tree()).stdout
    assert str(seen["tree"]) not in listed
    assert signal.getsignal(signal.SIGTERM) == before
    assert capsys.readouterr().err.splitlines() == ["terminated: nothing was compared"]


def test_ab_worktree_that_cannot_be_created_is_a_user_error(tmp_path, monkeypatch, capsys):
    import kvbench.reporting.ab as ab

    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "in-the-way").write_text("")  # git refuses a non-empty worktree folder
    monkeypatch.setattr(ab.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        main(["--against", "HEAD", "--repeats", "2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot create a git worktree of HEAD" in err[0]


def test_ab_against_head_runs_both_sides_interleaved_and_finds_no_change(tmp_path):
    target = "tests/benchmarks/test_hot_paths.py::test_cost_model_step_256_running"
    result = run_against("HEAD", "--repeats", "2", "--out", tmp_path, target)
    assert result.returncode == 0, result.stdout + result.stderr
    order = [line.split(": ")[0].split()[-1] for line in result.stdout.splitlines() if line.startswith("  run ")]
    assert order == ["baseline", "current", "current", "baseline"]  # ABBA
    merged = json.loads((tmp_path / "current.json").read_text())
    assert len(merged["benchmarks"][0]["runs"]) == 2 and merged["benchmarks"][0]["runs"][0]["data"]
    assert "A/B against HEAD" in result.stdout


def benchmark_rows(min_s: list[float], calls: int = 100) -> pd.DataFrame:
    """One benchmark's runs, as `measure` merges them."""
    samples = {"min_s": min_s, "median_s": [2 * t for t in min_s]}
    row = {"benchmark": "tests/benchmarks/test_x.py::test_step", "runs": len(min_s), "calls_per_step": calls}
    return pd.DataFrame(
        [{**row, **{m: pd.Series(v).median() for m, v in samples.items()}, "status": "ok", "samples": samples}]
    )


@pytest.mark.parametrize(
    "rounds, code, said",
    [
        # a slow spell on the first round's current runs only: measured again, not confirmed
        ([(1.0, 1.5), (1.0, 1.0)], 0, "not confirmed"),
        ([(1.0, 1.5), (1.0, 1.5)], 1, "the regression was confirmed"),
        ([(1.0, 1.0)], 0, None),  # nothing flagged: no second round
    ],
)
def test_ab_measures_a_flagged_benchmark_again_and_fails_only_if_it_regresses_twice(
    tmp_path, monkeypatch, rounds, code, said
):
    import kvbench.reporting.ab as ab

    calls = []

    def fake_measure(sides, bench_overrides, targets, repeats, ref, ref_tree, out, keep, round_name=""):
        base, cur = rounds[len(calls)]
        calls.append((list(targets), repeats))
        noise = [1.0, 1.01, 1.02, 1.03, 1.04]
        return {
            "baseline": benchmark_rows([base * n for n in noise]),
            "current": benchmark_rows([cur * n for n in noise]),
        }

    monkeypatch.setattr(ab, "measure", fake_measure)
    out = io.StringIO()
    assert ab.run_ab("HEAD", 5, [], load_policy(None), out=out) == code
    assert len(calls) == len(rounds)
    if len(rounds) == 2:  # the second round runs the flagged benchmark alone
        assert calls[1] == (["tests/benchmarks/test_x.py::test_step"], 10)  # twice the runs
        assert said in out.getvalue()


def test_ab_does_not_rerun_a_work_count_that_changed(monkeypatch):
    """A changed work count is exact: no fresh sample can change it, so it fails at once."""
    import kvbench.reporting.ab as ab

    calls = []

    def fake_measure(*args):
        calls.append(1)
        noise = [1.0, 1.01, 1.02, 1.03, 1.04]
        return {"baseline": benchmark_rows(noise), "current": benchmark_rows([1.5 * n for n in noise], calls=200)}

    monkeypatch.setattr(ab, "measure", fake_measure)
    out = io.StringIO()
    assert ab.run_ab("HEAD", 5, [], load_policy(None), out=out) == 1
    assert calls == [1]
    # the measured flag beside it stands unconfirmed, and the output says so
    assert "note: the 1 measured point(s) flagged above were not measured again" in out.getvalue()


def test_ctrl_c_during_a_comparison_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    import kvbench.reporting.compare as compare_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    write_csv(tmp_path / "summary.csv", [row("paged", 2.0)])
    monkeypatch.setattr(compare_module, "compare", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "summary.csv"), str(tmp_path / "summary.csv")])
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.splitlines() == ["interrupted: nothing was compared"]


def test_repeats_keep_the_kv_shares_of_one_repeat_so_they_add_up():
    """Five medians taken apart need not add up to 1; the median repeat's five do."""
    from kvbench.scenarios.repeats import KV_SHARES, aggregate

    shares = [(0.5, 0.2, 0.1, 0.05, 0.15), (0.7, 0.1, 0.0, 0.05, 0.15), (0.6, 0.3, 0.05, 0.0, 0.05)]
    runs = [[{"allocator": "paged", "request_throughput": t, **dict(zip(KV_SHARES, s))}] for t, s in enumerate(shares)]
    runs[0][0] |= {"kv_token_util_full": 0.4, "kv_reserved_frac_full": 0.6}  # a layer kind's view, likewise
    runs[1][0] |= {"kv_token_util_full": 0.9, "kv_reserved_frac_full": 0.1}
    runs[2][0] |= {"kv_token_util_full": 0.5, "kv_reserved_frac_full": 0.5}
    (row,) = aggregate(runs)
    assert [row[c] for c in KV_SHARES] == list(shares[2])  # kv_token_util 0.6 is the median repeat's
    assert sum(row[c] for c in KV_SHARES) == pytest.approx(1.0, abs=1e-12)
    assert (row["kv_token_util_full"], row["kv_reserved_frac_full"]) == (0.5, 0.5)
    assert row["request_throughput"] == 1  # every other column: its own median
    (even,) = aggregate(runs[:2])  # the middle two's mean
    assert [even[c] for c in KV_SHARES] == pytest.approx([0.6, 0.15, 0.05, 0.05, 0.15])
    assert json.loads(row["samples"])["kv_reserved_frac"] == [0.2, 0.1, 0.3]  # the samples stay every repeat's


def test_repeats_say_a_window_was_a_drain_where_any_repeat_s_was():
    """The row kept the first repeat's flag beside the medians of repeats that drained."""
    from kvbench.scenarios.repeats import aggregate

    repeats = [(2.0, False), (1.0, True), (1.1, True)]
    runs = [[{"allocator": "paged", "mean_batch_size": b, "window_drained": d}] for b, d in repeats]
    (row,) = aggregate(runs)
    assert row["mean_batch_size"] == 1.1 and row["window_drained"] is True
    (row,) = aggregate(runs[:1] * 2)
    assert row["window_drained"] is False


def test_a_swept_key_that_names_an_identity_column_is_matched_by_that_column(tmp_path, baseline_rows):
    """A rate sweep (workload.rate=1,4) against the default sweep, whose rate 4 is the
    config's: `no value in common: workload.rate (baseline (unset); current 1, 4)`."""
    swept = [{**row, "workload.rate": row["rate"]} for row in baseline_rows]
    other = [{**row, "rate": 1.0, "workload.rate": 1.0} for row in baseline_rows]
    write_csv(tmp_path / "baseline.csv", baseline_rows)
    write_csv(tmp_path / "current.csv", swept + other)
    result = run_compare(tmp_path / "baseline.csv", tmp_path / "current.csv")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: 2 point(s)" in result.stdout and result.stdout.count("new in current (no baseline)") == 2


def test_a_measured_metric_undefined_on_both_sides_is_not_counted_as_too_few_samples(tmp_path):
    """roofline_frac is NaN on a CPU in every repeat: it was 'not statistically meaningful (no
    finite sample on a side)', one of the footer's 'too few samples'."""
    nan = float("nan")
    row = {"scenario": "kernel", "backend": "eager", "model": "tiny", "batch_spec": "4d1k", "status": "ok"}
    samples = json.dumps({"latency_us_p50": [10.0, 10.2, 10.1, 10.3, 10.0], "roofline_frac": [nan] * 5})
    write_csv(tmp_path / "a.csv", [{**row, "latency_us_p50": 10.1, "roofline_frac": nan, "samples": samples}])
    write_csv(tmp_path / "b.csv", [{**row, "latency_us_p50": 10.1, "roofline_frac": nan, "samples": samples}])
    result = run_compare(tmp_path / "a.csv", tmp_path / "b.csv")
    assert result.returncode == 0, result.stdout + result.stderr
    assert next(line for line in result.stdout.splitlines() if "roofline_frac" in line).endswith(
        "not measured on either side"
    )
    assert "0 not statistically meaningful" in result.stdout


def test_a_benchmark_whose_own_check_fails_fails_its_side(tmp_path):
    """pytest-benchmark writes the time of a benchmark whose check fails after the timed part:
    a block table returning another sequence's blocks was judged 0.82x, "better", exit 0."""
    import subprocess
    from pathlib import Path
    from types import SimpleNamespace

    import kvbench.reporting.ab as ab

    def run(command):
        output = next(arg.split("=", 1)[1] for arg in command if arg.startswith("--benchmark-json="))
        Path(output).write_text(json.dumps({"benchmarks": [{"fullname": "t.py::test_x", "stats": {}}]}))
        said = "F\nFAILED t.py::test_x - AssertionError: assert [1, 2] == [3, 4]\n1 failed in 0.5s\n"
        return subprocess.CompletedProcess(command, 1, said, "")

    side = SimpleNamespace(folder=tmp_path, launcher=["python", "-m"], run=run, outputs=[])
    with pytest.raises(RuntimeError, match=r"^FAILED t.py::test_x - AssertionError: assert \[1, 2\] == \[3, 4\]$"):
        ab._benchmark_run(side, ["t.py"], 0)
    assert side.outputs == []  # its times are not merged


@pytest.mark.parametrize(
    "paths, code",
    [
        (("150/300 steps", "150/300 steps"), 1),  # the same run: its extra work per step is a regression
        (("150/300 steps", "151/304 steps"), 0),  # another run (simulated numbers moved): not comparable
        ((None, "151/304 steps"), 1),  # a reference that names no path is compared as before
    ],
)
def test_a_benchmark_whose_run_took_another_path_is_not_compared(paths, code):
    """A cost-model constant changed in one commit changes the simulated run a work count is taken
    over; its work per step moved with the path, not with the code, so the gate must not fail it."""
    noise = [1.0, 1.01, 1.02, 1.03, 1.04]
    base, cur = benchmark_rows(noise), benchmark_rows([1.5 * n for n in noise], calls=101)
    for frame, path in zip((base, cur), paths):
        if path is not None:
            frame["trajectory"] = path
    out = io.StringIO()
    assert compare(base, cur, load_policy(None), out=out) == code
    said = out.getvalue()
    if code == 0:
        assert "not compared: its run took another path (150/300 steps -> 151/304 steps)" in said
        assert "OK: 0 point(s) match the baseline within tolerance" in said and "1 took another path" in said
    else:
        assert "calls_per_step" in said and "REGRESSED" in said


def test_the_reference_side_drops_kvbench_s_editable_finder_and_keeps_a_plugin_s(tmp_path):
    """A plugin installed editable beside kvbench failed every --against run: the reference
    side dropped every editable import finder, the plugin's too, and its import failed."""
    from kvbench.reporting.ab import BOOTSTRAP

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "mine = type('_EditableFinder', (), {'find_spec': classmethod(lambda *a, **k: None)})\n"
        "mine.__module__ = '__editable___my_plugin_0_1_finder'\n"
        "sys.meta_path.append(mine)\n"
    )
    (site / "show_finders.py").write_text("import sys\nprint([getattr(f, '__module__', '') for f in sys.meta_path])\n")
    result = subprocess.run(
        [sys.executable, "-c", BOOTSTRAP, "show_finders"],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "__editable___my_plugin_0_1_finder" in result.stdout
    assert "__editable___kvbench_" not in result.stdout
