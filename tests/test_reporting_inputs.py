"""bench-compare and bench-report on inputs they cannot use: one line, exit 2, and nothing
already written is lost; numbers that name a point match however a CSV column typed them."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.reporting import compare, report
from kvbench.reporting.results import identity_text, write_csv

from helpers.cli import in_process, refused


def row(allocator: str, throughput, **extra) -> dict:
    return {
        "scenario": "simulate",
        "allocator": allocator,
        "model": "opt-13b",
        "seed": 0,
        "status": "ok",
        "request_throughput": throughput,
        "normalized_latency_s_per_tok": 0.1,
        **extra,
    }


def sweep(root, rows: list[dict]):
    """A sweep directory: one point directory a row, each with its metrics.csv."""
    for i, point in enumerate(rows):
        write_csv(root / f"p{i}" / "metrics.csv", [point])
    return root


def summary_only(root, rows: list[dict]):
    """A directory that holds a summary.csv and no point directories (a copied report)."""
    write_csv(root / "summary.csv", pd.DataFrame(rows))
    return root


RATES = [row(a, 1.0 + r, rate=r, **{"workload.rate": r}) for a in ("contiguous", "paged") for r in (1, 8)]


def run_report(*args):
    return in_process(lambda: report.main([str(a) for a in args]), args)


def run_compare(*args):
    return in_process(lambda: compare.main([str(a) for a in args]), args)


# --- bench-report: its inputs are never overwritten, never counted twice -------------------------


@pytest.mark.parametrize("where", ["first", "out"])
def test_a_report_never_writes_over_a_summary_it_reads(tmp_path, where):
    only = summary_only(tmp_path / "onlysum", [row("paged", 2.0), row("pow2", 1.0)])
    other = sweep(tmp_path / "other", RATES)
    before = (only / "summary.csv").read_bytes()
    args = [only, other] if where == "first" else [other, only, "--out", only]
    message = refused(lambda: report.main([str(a) for a in args]))
    assert f"summary.csv in {only} is an input" in message and "give --out DIR" in message
    assert "untouched" not in message
    assert (only / "summary.csv").read_bytes() == before
    assert not (only / "report.html").exists()


def test_a_report_of_a_summary_alone_leaves_it_as_it_is(tmp_path):
    only = summary_only(tmp_path / "onlysum", [row("paged", 2.0), row("pow2", 1.0)])
    before = (only / "summary.csv").read_bytes()
    for _ in range(2):  # again and again: the file does not grow
        result = run_report(only)
        assert result.returncode == 0, result.stderr
        assert (only / "summary.csv").read_bytes() == before
    assert (only / "report.html").is_file() and "wrote" in result.stdout


def test_a_comparison_in_a_sweep_with_points_says_they_are_untouched(tmp_path):
    first = sweep(tmp_path / "first", [row("paged", 2.0), row("pow2", 1.0)])
    point = (first / "p0" / "metrics.csv").read_bytes()
    result = run_report(first, sweep(tmp_path / "second", RATES))
    assert result.returncode == 0, result.stderr
    assert "its points are untouched" in result.stdout
    assert (first / "p0" / "metrics.csv").read_bytes() == point
    assert len(pd.read_csv(first / "summary.csv")) == 2 + len(RATES)


@pytest.mark.parametrize("second", ["s", "./s", "x/../s"])
def test_the_same_input_twice_is_refused(tmp_path, monkeypatch, second):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").mkdir()
    sweep(tmp_path / "s", RATES)  # a rate sweep: its rows would silently count twice
    message = refused(lambda: report.main(["s", second, "--out", str(tmp_path / "out")]))
    assert "is given twice" in message and "give each input once" in message
    assert not (tmp_path / "out").exists()


def test_a_sweep_and_one_of_its_points_are_refused_together(tmp_path):
    whole = sweep(tmp_path / "s", [row("paged", 2.0), row("pow2", 1.0)])
    message = refused(lambda: report.main([str(whole), str(whole / "p0"), "--out", str(tmp_path / "out")]))
    assert "both hold" in message and "p0/metrics.csv" in message


@pytest.mark.parametrize(
    "text, said",
    [
        ("x,y\n", "has no result rows"),
        ("scenario,allocator,status,request_throughput\n", "has no result rows"),
        ("x,y\n1,2\n", "none of its columns (x, y) names a point; looked for scenario, allocator"),
        ("allocator,throughput\npaged,10\n", "neither a status column nor a result metric"),
        (
            "scenario,allocator,status,request_throughput\nsimulate,paged,ok,2\nsimulate,paged,ok,2\n",
            "holds two rows of one point (scenario=simulate, allocator=paged; its rows 1 and 2)",
        ),
    ],
)
def test_a_report_of_a_table_without_results_is_refused(tmp_path, text, said):
    (tmp_path / "in.csv").write_text(text)
    message = refused(lambda: report.main([str(tmp_path / "in.csv"), "--out", str(tmp_path / "out")]))
    assert said in message
    assert not (tmp_path / "out" / "report.html").exists()


def test_a_folder_whose_table_has_a_header_and_no_row_names_that_table(tmp_path):
    # it said the folder had "no */metrics.csv, metrics.csv or summary.csv in it", beside its summary.csv
    (tmp_path / "summary.csv").write_text("scenario,allocator,status,request_throughput\n")
    message = refused(lambda: report.main([str(tmp_path), "--out", str(tmp_path / "out")]))
    assert message.endswith(f"{tmp_path / 'summary.csv'} has no result rows")


@pytest.mark.parametrize(
    "slo, said",
    [
        ("inf", "--slo inf must be a number > 0 and <= 1e+06"),
        ("0", "--slo 0 must be a number > 0"),
        ("1e30", "--slo 1e+30 must be a number > 0 and <= 1e+06 (seconds per output token)"),  # it was taken
        ("nan", "--slo nan must be a number > 0"),
    ],
)
def test_an_infinite_latency_target_is_refused_as_the_sweep_setting_is(tmp_path, slo, said):
    source = sweep(tmp_path / "s", RATES)
    assert said in refused(lambda: report.main([str(source), "--slo", slo, "--out", str(tmp_path / "out")]))


# --- bench-compare: identity -------------------------------------------------------------------


def test_a_comparison_of_tables_without_identity_columns_is_refused(tmp_path):
    (tmp_path / "xy.csv").write_text("x,y\n1,2\n")
    message = refused(lambda: compare.main([str(tmp_path / "xy.csv")] * 2))
    assert f"the baseline ({tmp_path / 'xy.csv'}) has no identity column" in message
    assert "looked for scenario, allocator, backend" in message and "its columns: x, y" in message


def test_numbers_that_name_a_point_match_however_the_column_was_typed(tmp_path):
    frame = pd.DataFrame({"rate": [1.0, 0.5, float("inf"), None], "allocator": ["paged", "1.0", "pow2", None]})
    assert identity_text(frame, ["rate", "allocator"]).values.tolist() == [
        ["1", "paged"],
        ["0.5", "1.0"],  # a text is kept as it is
        ["inf", "pow2"],
        ["", ""],
    ]
    write_csv(tmp_path / "base.csv", [row("paged", 2.0, **{"workload.rate": r}) for r in (1, 8)])
    write_csv(tmp_path / "cur.csv", [row("paged", 2.0, **{"workload.rate": r}) for r in (1, 8, 0.5)])  # float
    result = run_compare(tmp_path / "base.csv", tmp_path / "cur.csv")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "OK: 2 point(s) match" in result.stdout and "new in current (no baseline): workload.rate=0.5" in result.stdout
    )


def test_a_blank_seed_elsewhere_does_not_make_seed_0_another_point(tmp_path):
    write_csv(tmp_path / "base.csv", [row("paged", 2.0), row("pow2", 1.0)])
    (tmp_path / "cur.csv").write_text(
        "scenario,allocator,model,seed,status,request_throughput,normalized_latency_s_per_tok\n"
        "simulate,paged,opt-13b,0,ok,2.0,0.1\nsimulate,pow2,opt-13b,0,ok,1.0,0.1\nsimulate,oracle,opt-13b,,ok,1.5,0.1\n"
    )
    result = run_compare(tmp_path / "base.csv", tmp_path / "cur.csv")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: 2 point(s) match" in result.stdout


def test_no_point_in_common_names_the_column_the_sides_part_on(tmp_path):
    write_csv(tmp_path / "base.csv", [row("paged", 2.0, rate=4), row("pow2", 1.0, rate=4)])
    write_csv(tmp_path / "cur.csv", [row("paged", 2.0, rate=2), row("pow2", 1.0, rate=2)])
    message = refused(lambda: compare.main([str(tmp_path / "base.csv"), str(tmp_path / "cur.csv")]))
    assert "no point of the current run matches the baseline" in message
    assert "no value in common: rate (baseline 4; current 2)" in message


# --- bench-compare: what is judged -------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, said",
    [
        (None, "the policy has completed, request_throughput"),
        ("metrics: {}\n", "the policy has no metrics"),
        ("metrics:\n  latency_us_p50: {better: lower, min_effect: 0.1}\n", "the policy has latency_us_p50"),
    ],
)
def test_a_comparison_that_judges_no_metric_is_refused_not_ok(tmp_path, policy, said):
    (tmp_path / "u1.csv").write_text("allocator,throughput\npaged,10\n")
    (tmp_path / "u2.csv").write_text("allocator,throughput\npaged,0.001\n")
    args = [str(tmp_path / "u1.csv"), str(tmp_path / "u2.csv")]
    if policy is not None:
        (tmp_path / "policy.yaml").write_text(policy)
        write_csv(tmp_path / "u1.csv", [row("paged", 10.0)])
        write_csv(tmp_path / "u2.csv", [row("paged", 0.001)])
        args += ["--policy", str(tmp_path / "policy.yaml")]
    message = refused(lambda: compare.main(args))
    assert "no metric of the policy is in both the baseline" in message and said in message


@pytest.mark.parametrize("identity", ["[nonexistent_col]", "[]"])
def test_a_policy_whose_identity_names_no_column_is_blamed_not_the_data(tmp_path, identity):
    """It said only that the baseline had two rows for one point, as if two sweeps were mixed."""
    write_csv(tmp_path / "s.csv", [row(a, 1.0, **{"workload.rate": 4}) for a in ("contiguous", "paged")])
    (tmp_path / "policy.yaml").write_text(
        f"identity: {identity}\nmetrics:\n  request_throughput: {{better: higher, tolerance: 0.01}}\n"
    )
    args = [str(tmp_path / "s.csv")] * 2 + ["--policy", str(tmp_path / "policy.yaml")]
    message = refused(lambda: compare.main(args))
    assert f"(the policy's identity, {identity}, names no column of either side: list the columns" in message
    write_csv(tmp_path / "s.csv", [row("paged", 1.0)] * 2)  # the data's fault: the policy's columns are there
    assert "policy's identity" not in refused(lambda: compare.main([str(tmp_path / "s.csv")] * 2))


def test_a_current_that_failed_everywhere_is_still_a_regression(tmp_path):
    write_csv(tmp_path / "base.csv", [row("paged", 2.0)])
    (tmp_path / "cur.csv").write_text(
        "scenario,allocator,model,seed,status,reason\nsimulate,paged,opt-13b,0,failed,out of memory\n"
    )
    result = run_compare(tmp_path / "base.csv", tmp_path / "cur.csv")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "point failed" in result.stdout


@pytest.mark.parametrize("side", ["baseline", "current"])
@pytest.mark.parametrize(
    "cell, said", [("abc", "is 'abc': not a number"), ("inf", "is inf: a point that ran has no infinite metric")]
)
def test_a_metric_cell_that_is_not_a_finite_number_is_bad_input(tmp_path, side, cell, said):
    good = [row("pow2", 0.71), row("paged", 0.72)]
    bad = [row("pow2", cell), row("paged", 0.72)]
    write_csv(tmp_path / "good.csv", good)
    write_csv(tmp_path / "bad.csv", bad)
    args = [tmp_path / "bad.csv", tmp_path / "good.csv"][:: 1 if side == "baseline" else -1]
    message = refused(lambda: compare.main([str(a) for a in args]))
    assert f"request_throughput of allocator=pow2 in the {side} ({tmp_path / 'bad.csv'}) {said}" in message


@pytest.mark.parametrize("side", ["baseline", "current"])
def test_a_serving_row_without_an_allocator_is_bad_input_not_a_missing_point(tmp_path, side):
    write_csv(tmp_path / "good.csv", [row("pow2", 0.71, kv_token_util=0.4), row("paged", 0.72, kv_token_util=0.9)])
    write_csv(tmp_path / "bad.csv", [row(" ", 0.71, kv_token_util=0.4), row("paged", 0.72, kv_token_util=0.9)])
    args = [tmp_path / "bad.csv", tmp_path / "good.csv"][:: 1 if side == "baseline" else -1]
    message = refused(lambda: compare.main([str(a) for a in args]))
    assert f"{tmp_path / 'bad.csv'}: row 1 has serving metrics but no allocator" in message


def test_blank_metrics_and_failed_rows_are_judged_as_before(tmp_path):
    write_csv(tmp_path / "good.csv", [row("pow2", 0.71), row("paged", 0.72)])
    write_csv(tmp_path / "blank.csv", [row("pow2", None), row("paged", 0.72)])
    result = run_compare(tmp_path / "blank.csv", tmp_path / "good.csv")  # the baseline had none
    assert result.returncode == 0, result.stdout + result.stderr
    assert "new" in result.stdout.split("allocator=pow2")[1].split("request_throughput")[1].splitlines()[0]
    result = run_compare(tmp_path / "good.csv", tmp_path / "blank.csv")  # the metric vanished
    assert result.returncode == 1 and "allocator=pow2: request_throughput 0.71 -> nan" in result.stdout
    failed = [{**row("pow2", float("inf")), "status": "failed", "reason": "out of memory"}, row("paged", 0.72)]
    write_csv(tmp_path / "failed.csv", failed)
    result = run_compare(tmp_path / "good.csv", tmp_path / "failed.csv")  # a failed row's cells are not judged
    assert result.returncode == 1 and "allocator=pow2: point failed" in result.stdout


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--repeats", "0"], "--repeats applies only with --against REF"),
        (["--out", "kept"], "--out applies only with --against REF"),
        (["--current-env", "X=1", "--repeats", "3"], "--repeats and --current-env apply only with --against REF"),
    ],
)
def test_options_of_against_without_it_are_refused(tmp_path, flags, said):
    write_csv(tmp_path / "s.csv", [row("paged", 2.0)])
    assert said in refused(lambda: compare.main([str(tmp_path / "s.csv")] * 2 + flags))


# --- tables whose shape pandas would read without a word ------------------------------------------

GOOD = "scenario,allocator,model,seed,status,request_throughput\nsimulate,paged,opt-13b,0,ok,2.0\n"


@pytest.mark.parametrize(
    "text, said",
    [
        (GOOD + "simulate,pow2,opt-13b,0,ok,1.0,\n", "line 3: 7 fields, but its header has 6"),
        (GOOD + "simulate,pow2\n", "line 3: 2 fields, but its header has 6"),
        (GOOD.replace("seed", "allocator"), "its header names allocator twice"),
        (GOOD.replace("ok,2.0", "ok,abc"), "request_throughput is 'abc' in row 1"),
        (GOOD.replace("ok,2.0", "ok,inf"), "request_throughput is inf in row 1; a point that ran has no infinite"),
        (GOOD.replace("allocator,", "").replace("paged,", ""), None),
    ],
    ids=["a field too many", "a row cut short", "a column named twice", "text in a metric", "inf", "no allocator"],
)
def test_a_malformed_table_is_refused_by_both_tools_not_read_shifted(tmp_path, text, said):
    table = tmp_path / "t.csv"
    table.write_text(text if said else text.replace("request_throughput", "kv_token_util"))
    message = refused(lambda: report.main([str(table), "--out", str(tmp_path / "out")]))
    assert (said or "has serving metrics but no allocator") in message
    assert not (tmp_path / "out" / "report.html").exists()
    if said and ("fields" in said or "twice" in said):  # compare reads the table the same way
        assert said in refused(lambda: compare.main([str(table), str(table)]))


def test_a_failed_points_infinite_cell_is_no_bad_input_nor_a_missing_reason_column(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text(GOOD + "simulate,pow2,opt-13b,0,failed,inf\n")
    assert run_report(table, "--out", str(tmp_path / "out")).returncode == 0
    assert "<b>pow2</b>: no reason recorded" in (tmp_path / "out" / "report.html").read_text()


def test_an_allocator_named_by_a_number_is_a_name(tmp_path):
    whole = sweep(tmp_path / "s", [row("1", 2.0), row("2", 1.0)])
    result = run_report(whole)
    assert result.returncode == 0, result.stderr
    assert pd.read_csv(whole / "summary.csv", dtype=str)["allocator"].tolist() == ["1", "2"]


def test_a_point_whose_metrics_lost_their_row_is_refused_not_dropped(tmp_path):
    whole = sweep(tmp_path / "s", [row("paged", 2.0), row("pow2", 1.0)])
    (whole / "p1" / "metrics.csv").write_text((whole / "p1" / "metrics.csv").read_text().splitlines()[0] + "\n")
    assert "p1/metrics.csv has a header but no row" in refused(lambda: report.main([str(whole)]))


@pytest.mark.parametrize(
    "bad, said",
    [
        ({"request_throughput": "abc"}, "request_throughput is 'abc' in row 1"),
        ({"status": "done"}, "status is 'done' in row 1"),
        ({"allocator": ""}, "row 1 has serving metrics but no allocator"),
        ({"status": ""}, "row 1 has no status (ok or failed)"),  # a file bench did not write: no blank point
    ],
)
def test_a_sweep_s_bad_cell_is_blamed_on_its_point_s_file(tmp_path, bad, said):
    whole = sweep(
        tmp_path / "s", [row("paged", 2.0, kv_token_util=0.9), {**row("pow2", 1.0, kv_token_util=0.4), **bad}]
    )
    assert f"{whole / 'p1' / 'metrics.csv'}: {said}" in refused(lambda: report.main([str(whole)]))
    if "request_throughput" not in bad:  # bench-compare names a bad metric by its point and side
        assert f"{whole / 'p1' / 'metrics.csv'}: {said}" in refused(lambda: compare.main([str(whole), str(whole)]))


def test_a_bad_cell_of_a_folder_with_only_a_summary_names_no_file_that_is_not_there(tmp_path):
    (tmp_path / "so").mkdir()
    write_csv(tmp_path / "so" / "summary.csv", [{**row("paged", "abc"), "point": "+allocator=paged"}])
    message = refused(lambda: report.main([str(tmp_path / "so"), "--out", str(tmp_path / "out")]))
    assert "request_throughput is 'abc' in row 1" in message and "+allocator=paged/metrics.csv" not in message


def test_a_folder_and_its_own_summary_are_not_counted_twice(tmp_path):
    whole = sweep(tmp_path / "s", [row("paged", 2.0), row("pow2", 1.0)])
    assert run_report(whole).returncode == 0
    message = refused(lambda: report.main([str(whole), str(whole / "summary.csv"), "--out", str(tmp_path / "o")]))
    assert "summary.csv is" in message and "own table" in message


def test_a_report_into_another_sweeps_folder_is_refused_and_a_stale_plot_goes(tmp_path):
    kv = dict(kv_token_util=0.5, median_ttft_ms=10.0, median_tpot_ms=1.0, mean_batch_size=3.0)
    rated = sweep(tmp_path / "rated", [{**point, **kv} for point in RATES])
    assert run_report(rated).returncode == 0 and (rated / "latency_vs_rate.png").is_file()
    other = sweep(tmp_path / "other", [row("paged", 2.0), row("pow2", 1.0)])
    summary = (rated / "summary.csv").read_bytes()
    assert "holds another sweep's points" in refused(lambda: report.main([str(other), "--out", str(rated)]))
    assert (rated / "summary.csv").read_bytes() == summary
    for point in ("p1", "p3"):  # the rate 8 points go: one rate left, no rate axis to draw
        (rated / point / "metrics.csv").unlink()
    assert run_report(rated).returncode == 0
    assert not (rated / "latency_vs_rate.png").exists()


def test_the_current_folder_is_named_by_its_name(tmp_path, monkeypatch):
    first = sweep(tmp_path / "first", [row("paged", 2.0)])
    second = sweep(tmp_path / "second", [row("paged", 1.0)])
    monkeypatch.chdir(first)
    assert run_report(".", second, "--out", tmp_path / "o").returncode == 0
    assert pd.read_csv(tmp_path / "o" / "summary.csv")["sweep"].tolist() == ["first", "second"]


def test_an_empty_baseline_name_is_refused(tmp_path):
    whole = sweep(tmp_path / "s", [row("paged", 2.0), row("pow2", 1.0)])
    assert "--baseline is empty" in refused(lambda: report.main([str(whole), "--baseline", " "]))


# --- bench-compare: nothing compared is no OK ------------------------------------------------------


def test_points_that_failed_on_both_sides_are_no_ok(tmp_path):
    failed = [row(a, None, status="failed", reason="weights leave no KV memory") for a in ("paged", "pow2")]
    write_csv(tmp_path / "f.csv", failed)
    message = refused(lambda: compare.main([str(tmp_path / "f.csv")] * 2))
    assert "no matched point ran in both" in message and "weights leave no KV memory" in message


@pytest.mark.parametrize(
    "samples, said",
    [
        ('{"request_throughput":["abc"]}', '["abc"] each metric\'s samples are a list of numbers'),
        ('{"request_throughput":5}', "as 5: each metric's samples are a list of numbers"),
        # not a mapping: it was read as a point that ran once, and went ungated
        ("[1]", "'[1]': it maps each metric to its samples"),
    ],
)
def test_a_samples_cell_that_is_not_lists_of_numbers_is_refused(tmp_path, samples, said):
    serve = dict(scenario="serve", repeats=2)
    write_csv(tmp_path / "base.csv", [row("paged", 2.0, **serve, samples='{"request_throughput":[2.0,2.0]}')])
    write_csv(tmp_path / "cur.csv", [row("paged", 2.0, **serve, samples=samples)])
    message = refused(lambda: compare.main([str(tmp_path / "base.csv"), str(tmp_path / "cur.csv")]))
    assert said.split(" each")[0] in message and ("maps each metric" in message or "a list of numbers" in message)


def test_a_measured_metric_that_fell_to_zero_is_judged_not_a_crash(tmp_path):
    serve = dict(scenario="serve", repeats=2)
    write_csv(tmp_path / "base.csv", [row("paged", 2.0, **serve, median_ttft_ms=50.0)])
    write_csv(tmp_path / "cur.csv", [row("paged", 2.0, **serve, median_ttft_ms=0.0)])
    result = run_compare(tmp_path / "base.csv", tmp_path / "cur.csv")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "median_ttft_ms" in result.stdout


# --- a third look at bad input: each of these crashed, lost a file or passed as OK ---------------


def test_a_swept_key_the_policy_also_names_is_one_identity_column(tmp_path):
    table = pd.DataFrame([row("paged", 1.0, **{"workload.rate": r}) for r in (2, 4)])
    write_csv(tmp_path / "a.csv", table)
    (tmp_path / "p.yaml").write_text(
        "identity: [scenario, allocator, workload.rate]\n"
        "metrics:\n  request_throughput: {better: higher, tolerance: 0}\n"
    )
    result = run_compare(tmp_path / "a.csv", tmp_path / "a.csv", "--policy", tmp_path / "p.yaml")
    assert result.returncode == 0 and "OK: 2 point(s)" in result.stdout


def test_a_point_run_into_two_folders_is_refused_before_anything_is_written(tmp_path):
    root = sweep(tmp_path / "s", [row("paged", 1.0), row("contiguous", 0.5)])
    report.main([str(root)])
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}
    write_csv(root / "p0-rerun" / "metrics.csv", [row("paged", 0.9)])
    message = refused(lambda: report.main([str(root)]))
    assert "holds two rows of one point" in message and "p0 and p0-rerun" in message
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()} == before


def test_a_report_into_a_folder_holding_other_points_summary_is_refused(tmp_path):
    kept = summary_only(tmp_path / "kept", [row("pow2", 3.0)])
    before = (kept / "summary.csv").read_bytes()
    root = sweep(tmp_path / "s", [row("paged", 1.0), row("contiguous", 0.5)])
    assert "holds a summary.csv of other points" in refused(lambda: report.main([str(root), "--out", str(kept)]))
    assert (kept / "summary.csv").read_bytes() == before
    out = tmp_path / "out"
    report.main([str(root), "--out", str(out)])
    report.main([str(root), "--out", str(out)])  # the same points again: the report is refreshed


@pytest.mark.parametrize("args", [["", "."], [".", ""]])
def test_an_empty_input_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch, args):
    monkeypatch.chdir(sweep(tmp_path, [row("paged", 1.0), row("contiguous", 0.5)]))
    assert "is empty" in refused(lambda: compare.main(args))
    assert "is empty" in refused(lambda: report.main(["."] + ["--out", ""]))


@pytest.mark.parametrize(
    "cell, said",
    [("OK", "status is 'OK' in row 1; a point's status is ok or failed"), ("done", "status is 'done'")],
)
def test_a_status_other_than_ok_or_failed_is_refused_by_both_tools(tmp_path, cell, said):
    write_csv(tmp_path / "a.csv", [row("paged", 1.0, status=cell)])
    assert said in refused(lambda: compare.main([str(tmp_path / "a.csv")] * 2))
    assert said in refused(lambda: report.main([str(tmp_path / "a.csv"), "--out", str(tmp_path / "o")]))


def test_a_negative_latency_is_bad_input_to_both_tools(tmp_path):
    write_csv(tmp_path / "a.csv", [row("paged", 1.0), row("contiguous", 0.5)])
    write_csv(tmp_path / "b.csv", [row("paged", 1.0, normalized_latency_s_per_tok=-5), row("contiguous", 0.5)])
    said = "is -5.0: normalized_latency_s_per_tok is never negative"
    assert said in refused(lambda: compare.main([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]))
    assert "is never negative" in refused(lambda: report.main([str(tmp_path / "b.csv"), "--out", str(tmp_path / "o")]))


def test_a_share_above_one_is_bad_input_to_both_tools(tmp_path):
    write_csv(tmp_path / "a.csv", [row("paged", 1.0, kv_token_util=0.9), row("contiguous", 0.5, kv_token_util=0.2)])
    write_csv(tmp_path / "b.csv", [row("paged", 1.0, kv_token_util=7.5), row("contiguous", 0.5, kv_token_util=0.2)])
    said = "is 7.5: kv_token_util is a share of a whole, at most 1"
    assert said in refused(lambda: compare.main([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]))
    assert "at most 1" in refused(lambda: report.main([str(tmp_path / "b.csv"), "--out", str(tmp_path / "o")]))


def test_blank_metrics_on_both_sides_judge_nothing(tmp_path):
    write_csv(tmp_path / "a.csv", [row("paged", None, normalized_latency_s_per_tok=None)])
    assert "every cell is blank, so nothing would be judged" in refused(
        lambda: compare.main([str(tmp_path / "a.csv")] * 2)
    )


def test_a_measured_metric_missing_from_the_current_is_a_regression(tmp_path):
    base = {
        **row("paged", 1.0),
        "scenario": "kernel",
        "latency_us_p50": 10.0,
        "samples": '{"latency_us_p50":[10,10.1,9.9]}',
    }
    write_csv(tmp_path / "a.csv", [base])
    write_csv(tmp_path / "b.csv", [{**base, "latency_us_p50": None, "samples": ""}])
    write_csv(tmp_path / "c.csv", [{**base, "latency_us_p50": 50.0, "samples": '{"latency_us_p50":[50,NaN,NaN]}'}])
    for current, lost in (("b.csv", "1 of the current's 1"), ("c.csv", "2 of the current's 3")):
        result = run_compare(tmp_path / "a.csv", tmp_path / current)
        assert result.returncode == 1 and f"latency_us_p50 has no value in {lost} run(s)" in result.stdout


def test_a_point_failed_on_both_sides_is_not_counted_as_matching(tmp_path):
    failed = row("contiguous", None, status="failed", reason="out of memory")
    write_csv(tmp_path / "a.csv", pd.DataFrame([row("paged", 1.0), failed]))
    result = run_compare(tmp_path / "a.csv", tmp_path / "a.csv")
    assert result.returncode == 0 and "failed in both (out of memory): not compared" in result.stdout
    assert "OK: 1 point(s) match the baseline within tolerance (1 failed in both, not compared)" in result.stdout


def test_columns_named_as_the_tools_own_are_refused_or_kept_apart(tmp_path):
    write_csv(tmp_path / "m.csv", [row("paged", 1.0, _merge="x")])
    assert "has a column '_merge'" in refused(lambda: compare.main([str(tmp_path / "m.csv")] * 2))
    write_csv(tmp_path / "d.csv", [row("paged", 1.0, point="p1", directory="/data/run1")])
    report.main([str(tmp_path / "d.csv"), "--out", str(tmp_path / "o")])
    assert "/data/run1" in (tmp_path / "o" / "report.html").read_text()


def test_a_policy_number_in_exponent_form_is_a_number(tmp_path):
    write_csv(tmp_path / "a.csv", [row("paged", 1.0)])
    (tmp_path / "p.yaml").write_text(
        "test: {alpha: 5e-2}\nmetrics:\n  request_throughput: {better: higher, tolerance: 1e-6}\n"
    )
    result = run_compare(tmp_path / "a.csv", tmp_path / "a.csv", "--policy", tmp_path / "p.yaml")
    assert result.returncode == 0 and "OK" in result.stdout


@pytest.mark.parametrize(
    "saved, said",
    [
        ("report:\n  slo_s_per_token: [0.5\n", "multirun.yaml is not the sweep's saved config"),
        ("report:\n  slo_s_per_token: fast\n", "report.slo_s_per_token='fast' must be a number > 0"),
        ("report:\n  slo_s_per_token: -1\n", "report.slo_s_per_token=-1 must be a number > 0"),
    ],
)
def test_a_sweeps_saved_config_that_does_not_read_is_one_line(tmp_path, saved, said):
    root = sweep(tmp_path / "s", [row("paged", 1.0), row("contiguous", 0.5)])
    (root / "multirun.yaml").write_text(saved)
    assert said in refused(lambda: report.main([str(root)]))
    report.main([str(root), "--slo", "0.5", "--baseline", "paged"])  # given both: the file is not read


def test_a_baseline_with_no_value_judges_nothing(tmp_path):
    write_csv(tmp_path / "blank.csv", [row("paged", None, normalized_latency_s_per_tok=None)])
    write_csv(tmp_path / "full.csv", [row("paged", 1.0)])
    said = "has no value of any metric of the policy in a point that ran in both"
    assert said in refused(lambda: compare.main([str(tmp_path / "blank.csv"), str(tmp_path / "full.csv")]))


def test_a_report_of_several_sweeps_reads_as_an_input_of_another(tmp_path):
    first = report.main  # a report of two sweeps, then that report's summary beside a third sweep
    a = sweep(tmp_path / "a", [row("paged", 1.0), row("contiguous", 0.5)])
    b = sweep(tmp_path / "b", [row("paged", 1.1), row("contiguous", 0.6)])
    first([str(a), str(b), "--out", str(tmp_path / "ab")])
    c = sweep(tmp_path / "c", [row("paged", 1.2), row("contiguous", 0.7)])
    report.main([str(tmp_path / "ab" / "summary.csv"), str(c), "--out", str(tmp_path / "abc")])
    sweeps = set(pd.read_csv(tmp_path / "abc" / "summary.csv")["sweep"])
    assert sweeps == {"ab:a", "ab:b", "c"}


def test_a_negative_latency_outside_the_key_metrics_is_refused_by_the_report(tmp_path):
    write_csv(tmp_path / "n.csv", [row("paged", 1.0, median_e2el_ms=-5.0)])
    said = "median_e2el_ms is -5"
    assert said in refused(lambda: report.main([str(tmp_path / "n.csv"), "--out", str(tmp_path / "o")]))


def test_an_empty_policy_path_is_refused(tmp_path):
    write_csv(tmp_path / "a.csv", [row("paged", 1.0)])
    assert "--policy is empty" in refused(lambda: compare.main([str(tmp_path / "a.csv")] * 2 + ["--policy", ""]))


def test_a_zero_latency_of_a_point_that_ran_is_refused_not_a_verdict(tmp_path):
    write_csv(tmp_path / "z.csv", [row("paged", 1.0), row("contiguous", 0.5, normalized_latency_s_per_tok=0.0)])
    said = "normalized_latency_s_per_tok of a point that ran is > 0"
    assert said in refused(lambda: report.main([str(tmp_path / "z.csv"), "--out", str(tmp_path / "o")]))


# --- a fourth look: a regression that passed, crashes, and checks that came too late ------------


def test_tables_without_a_status_column_are_compared_not_passed_as_failed(tmp_path):
    """No status column on either side reads as every point ok (as one side's blank cell does)."""
    base, worse = ([row(a, t, status=None) for a in ("paged", "pow2")] for t in (2.0, 1.0))
    write_csv(tmp_path / "base.csv", pd.DataFrame(base).drop(columns="status"))
    write_csv(tmp_path / "worse.csv", pd.DataFrame(worse).drop(columns="status"))
    same = run_compare(tmp_path / "base.csv", tmp_path / "base.csv")
    assert same.returncode == 0 and "OK: 2 point(s) match" in same.stdout, same.stdout
    halved = run_compare(tmp_path / "base.csv", tmp_path / "worse.csv")
    assert halved.returncode == 1, halved.stdout
    assert "allocator=paged: request_throughput 2 -> 1" in halved.stdout.split("REGRESSION:")[1]


def test_a_served_row_with_a_blank_allocator_is_refused_before_the_report_writes(tmp_path):
    write_csv(tmp_path / "a.csv", [row("contiguous", 0.5, kv_token_util=0.2), row("", 1.0, kv_token_util=0.9)])
    said = refused(lambda: report.main([str(tmp_path / "a.csv"), "--out", str(tmp_path / "o")]))
    assert "row 2 has serving metrics but no allocator" in said
    assert not (tmp_path / "o").exists()
    failed = row("", None, kv_token_util=None, status="failed", reason="no allocator chosen")
    write_csv(tmp_path / "f.csv", [row("contiguous", 0.5, kv_token_util=0.2), failed])
    assert run_report(tmp_path / "f.csv", "--out", tmp_path / "f").returncode == 0  # a failed point may lack one


@pytest.mark.parametrize(
    "samples, said",
    [
        ('{"request_throughput":[-1.0,-2.0]}', "request_throughput's samples of scenario=serve, allocator=paged"),
        ("{not json", "samples column is not JSON"),
        # read as "ran once": the point went ungated while another with the same slowdown failed
        ("[1, 2, 3]", "samples column is '[1, 2, 3]': it maps each metric to its samples"),
        ("42", "samples column is '42': it maps each metric"),
    ],
)
def test_bad_samples_are_refused_before_anything_is_printed(tmp_path, samples, said):
    serve = dict(scenario="serve", repeats=2)
    write_csv(tmp_path / "base.csv", [row("paged", 2.0, **serve, samples='{"request_throughput":[2.0,2.1]}')])
    write_csv(tmp_path / "cur.csv", [row("paged", 2.0, **serve, samples=samples)])  # a cell that passes
    result = in_process(lambda: compare.main([str(tmp_path / "base.csv"), str(tmp_path / "cur.csv")]))
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert said in result.stderr and len(result.stderr.splitlines()) == 1
    assert "allocator=paged, model=opt-13b, seed=0 in the current (" in result.stderr  # which point, which side


def test_a_judged_benchmark_count_given_as_text_is_refused_not_a_regression(tmp_path):
    import json

    def bench(calls):
        stats = {"median": 1e-3, "min": 1e-3}
        entry = {"fullname": "tests/b.py::test_step", "stats": stats, "extra_info": {"calls_per_step": calls}}
        return json.dumps({"benchmarks": [entry]})

    (tmp_path / "base.json").write_text(bench(519))
    (tmp_path / "cur.json").write_text("\ufeff" + bench("many"))  # a BOM is read past, as in a CSV
    said = refused(lambda: compare.main([str(tmp_path / "base.json"), str(tmp_path / "cur.json")]))
    assert "calls_per_step of benchmark=tests/b.py::test_step in the current" in said and "'many'" in said
    (tmp_path / "bad.json").write_text(json.dumps({"benchmarks": [{"stats": {}}]}))
    assert "a benchmark has no fullname" in refused(lambda: compare.main([str(tmp_path / "bad.json")] * 2))


def test_samples_too_few_for_the_test_are_said_not_judged(tmp_path):
    """Mann-Whitney's smallest p with 3 and 3 samples is 1/20 = alpha: it could never flag. The
    values shown are each side's best run (effect: best), and the line says so: they read as the
    rows' medians (4.1, 2.05) when it did not."""
    serve = dict(scenario="serve", repeats=3)
    write_csv(tmp_path / "base.csv", [row("paged", 4.0, **serve, samples='{"request_throughput":[4.0,4.1,4.2]}')])
    write_csv(tmp_path / "cur.csv", [row("paged", 2.0, **serve, samples='{"request_throughput":[2.0,2.05,2.1]}')])
    result = run_compare(tmp_path / "base.csv", tmp_path / "cur.csv")
    (line,) = [line.split() for line in result.stdout.splitlines() if line.strip().startswith("request_throughput")]
    assert line[1:4] == ["4.2", "2.1", "0.5000"]
    assert "not statistically meaningful (best runs, 3 vs 3 samples: Mann-Whitney's smallest p is 0.05" in result.stdout
    assert "run with repeats >= 4 a side" in result.stdout
    assert (
        result.returncode == 0 and "measured metric(s) not tested (too few samples)" in result.stdout.splitlines()[-1]
    )
    write_csv(tmp_path / "four.csv", [row("paged", 2.0, **serve, samples='{"request_throughput":[2.0,2.05,2.1,2.0]}')])
    write_csv(tmp_path / "base4.csv", [row("paged", 4.0, **serve, samples='{"request_throughput":[4.0,4.1,4.2,4.0]}')])
    assert run_compare(tmp_path / "base4.csv", tmp_path / "four.csv").returncode == 1


def test_a_header_name_s_spaces_are_no_part_of_it_and_a_semicolon_table_is_named(tmp_path):
    (tmp_path / "spaced.csv").write_text(
        "scenario, allocator ,seed,status,request_throughput\nsimulate,paged,0,ok,2\nsimulate,pow2,0,ok,1\n"
    )
    result = run_compare(tmp_path / "spaced.csv", tmp_path / "spaced.csv")
    assert result.returncode == 0 and "OK: 2 point(s) match" in result.stdout, result.stdout + result.stderr
    (tmp_path / "semi.csv").write_text("scenario;allocator;seed\nsimulate;paged;0\n")
    said = refused(lambda: compare.main([str(tmp_path / "semi.csv"), str(tmp_path / "spaced.csv")]))
    assert "its header is one column, 'scenario;allocator;seed': a result table is comma-separated" in said


def test_tied_samples_are_tested_and_an_infinite_sample_is_a_run_that_measured_nothing(tmp_path):
    from kvbench.reporting.policy import Rule, load_policy
    from kvbench.reporting.significance import NOT_MEANINGFUL, judge

    test = load_policy().test  # with ties scipy's p is the normal approximation's: it can fall below alpha
    assert judge([2.0, 2.0, 3.0], [1.0, 1.0, 1.0], Rule("higher", min_effect=0.1), test).verdict != NOT_MEANINGFUL
    assert judge([2.0, 2.5, 3.0], [1.0, 1.1, 1.2], Rule("higher", min_effect=0.1), test).verdict == NOT_MEANINGFUL
    serve = dict(scenario="serve", repeats=2)
    write_csv(tmp_path / "base.csv", [row("paged", 2.0, **serve, samples='{"request_throughput":[2.0,2.1]}')])
    write_csv(tmp_path / "cur.csv", [row("paged", 2.0, **serve, samples='{"request_throughput":[2.0,Infinity]}')])
    result = run_compare(tmp_path / "base.csv", tmp_path / "cur.csv")
    assert result.returncode == 1 and "REGRESSED (1 of 2 missing)" in result.stdout, result.stdout + result.stderr


def test_the_first_error_of_a_failed_benchmark_run_is_its_cause_not_a_banner():
    import subprocess

    from kvbench.reporting.ab import _first_error

    output = "\n==== ERRORS ====\n____ ERROR collecting tests/x.py ____\nImportError while importing test module\n"
    assert _first_error(subprocess.CompletedProcess([], 2, output, "")) == "ImportError while importing test module"
    missing = "ERROR: file or directory not found: nope.py\n"
    assert _first_error(subprocess.CompletedProcess([], 4, "", missing)).startswith("ERROR: file or directory")
    assert _first_error(subprocess.CompletedProcess([], 3, "", "")) == "exit code 3, no output"


@pytest.mark.parametrize(
    "stats, extra, said",
    [
        ({"median": True, "min": 1e-3}, {}, "has a time that is true or false, not a number of seconds"),
        ({"median": "abc", "min": 1e-3}, {}, "has a time that is not a number of seconds >= 0"),
        ({"median": 1e-3, "min": 1e-3}, {"calls_per_step": [1, 2]}, "extra_info calls_per_step is [1, 2], not a"),
    ],
)
def test_a_benchmark_time_or_count_of_the_wrong_kind_is_refused_on_either_side(tmp_path, stats, extra, said):
    """`median: true` read as 1 s, and a count given as a list dropped the work-count gate of a baseline."""
    import json

    def bench(stats, extra):
        return json.dumps({"benchmarks": [{"fullname": "tests/b.py::test_step", "stats": stats, "extra_info": extra}]})

    (tmp_path / "good.json").write_text(bench({"median": 1e-3, "min": 1e-3}, {"calls_per_step": 519}))
    (tmp_path / "bad.json").write_text(bench(stats, extra))
    for sides in (["good.json", "bad.json"], ["bad.json", "good.json"]):
        paths = [str(tmp_path / side) for side in sides]
        assert said in refused(lambda paths=paths: compare.main(paths))


def test_a_simulated_number_the_policy_does_not_judge_is_listed_when_it_moves(tmp_path):
    """Simulated numbers are exact for a seed: a change to one the policy does not gate (a
    latency's spread, the step count) passed in silence."""
    base = row("paged", 2.0, steps=2340, std_tpot_ms=65.0, kv_blocks_saved_frac=0.3, window_drained=False)
    write_csv(tmp_path / "base.csv", [base])
    write_csv(tmp_path / "cur.csv", [{**base, "steps": 2345, "std_tpot_ms": 130.0, "window_drained": True}])
    result = run_compare(tmp_path / "base.csv", tmp_path / "cur.csv")
    assert result.returncode == 0
    changed = "steps 2340 -> 2345, std_tpot_ms 65 -> 130, window_drained false -> true"  # a flag, not 0 -> 1
    assert f"  not judged by the policy, changed: {changed}" in result.stdout
    assert result.stdout.splitlines()[-1].endswith(
        "; 3 column(s) the policy does not judge changed (std_tpot_ms, steps, window_drained: see 'not judged by "
        "the policy')"
    )
    # the share of blocks sharing saves is judged: halved, it regresses
    write_csv(tmp_path / "halved.csv", [{**base, "kv_blocks_saved_frac": 0.15}])
    result = run_compare(tmp_path / "base.csv", tmp_path / "halved.csv")
    assert result.returncode == 1 and "kv_blocks_saved_frac 0.3 -> 0.15 (-50.000%, better: higher" in result.stdout
    assert "not judged by the policy" not in result.stdout


def test_a_simulated_number_that_went_blank_is_listed_and_host_time_and_commit_are_not(tmp_path):
    """A number that turned blank or text on one side moved too; the scheduler's host time and
    an all-digit commit id are no simulated numbers (a custom policy that names neither listed
    them on every point of identical sweeps)."""
    base = row("paged", 2.0, steps=2340, schedule_us_per_step=0.433, git_sha="123456789012")
    write_csv(tmp_path / "base.csv", [base])
    write_csv(tmp_path / "cur.csv", [{**base, "steps": "", "schedule_us_per_step": 0.476, "git_sha": "987654321098"}])
    (tmp_path / "policy.yaml").write_text("metrics:\n  request_throughput: {better: higher, tolerance: 0}\n")
    result = run_compare(tmp_path / "base.csv", tmp_path / "cur.csv", "--policy", tmp_path / "policy.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "  not judged by the policy, changed: steps 2340 -> (blank)" in result.stdout
    assert "schedule_us_per_step" not in result.stdout.split("changed:")[1] and "git_sha" not in result.stdout


def test_a_report_of_points_that_all_failed_says_why_it_has_no_plots(tmp_path):
    failed = {"status": "failed", "reason": "out of memory", "request_throughput": None}
    whole = sweep(tmp_path / "s", [{**row("paged", None), **failed}, {**row("pow2", None), **failed}])
    run_report(whole, "--out", tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Plots</h2>\n<p>No point ran, so there is nothing to plot.</p>" in page


def test_a_report_of_two_sweeps_says_which_code_each_ran(tmp_path):
    first = sweep(tmp_path / "a", [row("paged", 2.0, git_sha="aaaa"), row("pow2", 1.0, git_sha="aaaa")])
    second = sweep(tmp_path / "b", [row("paged", 2.1, git_sha="bbbb"), row("pow2", 1.0, git_sha="bbbb")])
    assert run_report(first, second, "--out", tmp_path / "out").returncode == 0
    page = (tmp_path / "out" / "report.html").read_text()
    environment = page.split("<h2>Environment</h2>")[1].split("</table>")[0]
    assert ">sweep<" in environment and "aaaa" in environment and "bbbb" in environment
    assert "These points ran different code (git_sha)" in page


def test_a_report_names_the_points_whose_window_was_their_batch_draining(tmp_path):
    """A 60-request rate sweep: from rate 4 up every request was admitted in the warm-up, and the
    plots read as paged using its memory worse under more load."""
    points = [row("paged", 1.0, rate=r, window_drained=r >= 4) for r in (1, 2, 4, 8)]
    whole = sweep(tmp_path / "s", points)
    run_report(whole, "--out", tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    assert "2 point(s) admitted every request within the warm-up (rate=4; rate=8)" in page


def test_the_sweep_table_names_a_drained_window_as_the_report_does():
    """A sweep's console table put block_size=8's 41 % token states beside block_size=32's 94 %
    with no word that the first point's window was its batch draining (a single run's log says
    so as it ends, where a sweep's scroll away)."""
    from kvbench.reporting.console import sweep_table

    points = [row("paged", 1.0, block_size=b, window_drained=b == 8) for b in (8, 32)]
    lines = sweep_table(pd.DataFrame(points)).splitlines()
    assert [line for line in lines if "warm-up" in line] == [
        "1 point(s) admitted every request within the warm-up (block_size=8): their window is the batch draining: "
        "mean_batch_size and the kv_* shares describe that drain, not a steady state (give more requests: "
        "workload.num_requests or workload.duration_s; or measure.warmup_frac=0)"
    ]
    assert "warm-up" not in sweep_table(pd.DataFrame(points[1:]))
