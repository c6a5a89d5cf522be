"""bench-report: sweep directories become summary.csv, plots and one HTML page that opens with
its verdict, names every bar by its real point, and has no broken image."""

from __future__ import annotations

import base64
import html
import io
import math
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from kvbench.errors import UserError
from kvbench.reporting import inputs, plots, report
from kvbench.reporting import page as report_page
from kvbench.reporting.figures import KV_PARTS
from kvbench.reporting.results import rate_curves, read_csv, write_csv
from kvbench.reporting.winners import winners

SMALL = ["workload.num_requests=50", "workload.duration_s=null", "progress=false"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(cwd, *args):
    return subprocess.run(
        [sys.executable, "-m", "kvbench.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def bench_report(*args):
    return subprocess.run(
        [sys.executable, "-m", "kvbench.reporting.report", *map(str, args)], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    result = bench(root, "-m", "+allocator=oracle,paged", *SMALL, "hydra.sweep.dir=sweep")
    assert result.returncode == 0, result.stderr
    summary = read_csv(root / "sweep" / "summary.csv")
    assert (summary["status"] == "ok").all(), summary["reason"].tolist()
    return root / "sweep", result.stdout


@pytest.fixture(scope="module")
def sweep(swept):
    return swept[0]


class Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources, self.cells = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(dict(attrs).get("src", ""))

    def handle_data(self, data):
        self.cells.append(data.strip())


def decoded_images(page) -> tuple[list[bytes], list[str]]:
    parser = Images()
    parser.feed(page.read_text())
    images = []
    for src in parser.sources:
        assert src.startswith("data:image/png;base64,"), src[:60]
        images.append(base64.b64decode(src.split(",", 1)[1], validate=True))
    return images, parser.cells


def test_report_of_a_sweep_embeds_every_plot_as_a_png(sweep, tmp_path):
    result = bench_report(sweep, "--out", tmp_path)
    assert result.returncode == 0, result.stderr

    pngs = sorted(tmp_path.glob("*.png"))
    assert {p.name for p in pngs} >= {"kv_breakdown.png", "throughput_latency.png"}
    images, cells = decoded_images(tmp_path / "report.html")
    assert len(images) == len(pngs)
    for data in images:
        assert data.startswith(PNG_MAGIC)
        height, width, _ = matplotlib.image.imread(io.BytesIO(data), format="png").shape
        assert 100 < height and 100 < width <= 1400  # a figure fits the page unscaled
    assert {p.read_bytes() for p in pngs} == set(images)
    assert read_csv(tmp_path / "summary.csv")["allocator"].tolist() == ["oracle", "paged"]  # the paper's order
    assert {"oracle", "paged"} <= set(cells)


def test_sweep_end_writes_the_report_and_prints_the_sweep_table(swept):
    sweep, stdout = swept
    images, _ = decoded_images(sweep / "report.html")
    assert len(images) >= 2 and all(data.startswith(PNG_MAGIC) for data in images)
    table = stdout.split("kvbench sweep: 2 point(s)")[1].splitlines()
    assert table[1].split()[:4] == ["point", "status", "req/s", "out"]
    summary = read_csv(sweep / "summary.csv")
    for line, (_, row) in zip(table[2:4], summary.iterrows()):
        assert line.split()[:3] == [row["allocator"], "ok", f"{row['request_throughput']:.3f}"]
    assert "capacity at 0.5 s/token (req/s)" in table[5]
    assert table[6].startswith("none: the points were not taken at several finite request rates (rate: 4)")


def test_the_verdict_comes_first_and_names_the_winner_and_its_margin(sweep, tmp_path):
    assert bench_report(sweep, "--out", tmp_path).returncode == 0
    page = (tmp_path / "report.html").read_text()
    summary = read_csv(tmp_path / "summary.csv").set_index("allocator")
    ratio = summary.at["oracle", "normalized_latency_s_per_tok"] / summary.at["paged", "normalized_latency_s_per_tok"]
    assert ratio > 1.5
    verdict = page.split("<h2>Verdict</h2>")[1].split("<h2>Results</h2>")[0]
    assert page.index("<h2>Verdict</h2>") < page.index("<h2>Results</h2>") < page.index("<h2>Plots</h2>")
    # no contiguous point: the ratios are taken against the first system of the paper's order
    assert "ratios against <b>oracle</b> (report.baseline=contiguous is not in the sweep)" in verdict
    assert "<b>all points</b>: <b>paged</b>" in verdict
    assert f"{ratio:.2f}× lower normalized latency than oracle" in verdict
    assert "<h1>kvbench report: opt-13b on a100-40gb, sharegpt workload at 4 req/s (simulate)</h1>" in page


def test_the_verdict_says_when_the_baseline_itself_wins_and_gives_no_ratio_of_a_blank_cell(sweep, tmp_path):
    assert bench_report(sweep, "--out", tmp_path / "a", "--baseline", "paged").returncode == 0
    verdict = (tmp_path / "a" / "report.html").read_text().split("<h2>Verdict</h2>")[1].split("<h2>Results</h2>")[0]
    assert "<b>paged</b> (" in verdict and "the baseline, paged, wins here" in verdict and "1.00×" not in verdict
    summary = read_csv(sweep / "summary.csv")
    summary.loc[summary["allocator"] == "paged", "request_throughput"] = None
    write_csv(tmp_path / "blank.csv", summary)
    assert bench_report(tmp_path / "blank.csv", "--out", tmp_path / "b", "--baseline", "oracle").returncode == 0
    verdict = (tmp_path / "b" / "report.html").read_text().split("<h2>Verdict</h2>")[1].split("<h2>Results</h2>")[0]
    margin = verdict.split("lower normalized latency than oracle")[1].split("</li>")[0]
    assert "its request throughput" not in margin and "nan" not in verdict


def test_two_sweeps_make_one_report_with_failed_points_explained_and_highlighted(sweep, tmp_path):
    other = tmp_path / "other"
    budgets = "scheduler.max_num_batched_tokens=16,4096"  # 16 tokens: the point fails as it runs
    result = bench(tmp_path, "-m", "+allocator=pow2", budgets, *SMALL, f"hydra.sweep.dir={other}")
    assert result.returncode == 2, result.stderr  # the failed point is recorded, and the sweep says so
    result = bench_report(other, sweep)
    assert result.returncode == 0, result.stderr
    assert f"{other} now holds the comparison of all 2 inputs" in result.stdout
    rows = read_csv(other / "summary.csv")
    assert list(zip(rows["sweep"], rows["allocator"], rows["status"])) == [
        ("other", "pow2", "failed"),
        ("other", "pow2", "ok"),
        ("sweep", "oracle", "ok"),
        ("sweep", "paged", "ok"),
    ]
    _, cells = decoded_images(other / "report.html")
    assert "sweep" in cells
    page = (other / "report.html").read_text()
    verdict = page.split("<h2>Verdict</h2>")[1].split("<h2>Results</h2>")[0]
    reason = rows.loc[rows["status"] == "failed", "reason"].iloc[0]
    assert "exceeds scheduler.max_num_batched_tokens=16" in reason
    assert set(rows["device"]) == {"simulated"}  # the failed point's too: it was not run on this cpu
    assert f"<li><b>other, pow2, max_num_batched_tokens=16</b>: {html.escape(reason)}</li>" in verdict
    results = page.split("<h2>Results</h2>")[1].split("<h2>Plots</h2>")[0]
    assert results.count("<tr>") == 5  # the header and four points
    assert re.findall(r'class="data (row\d+) col0 failed"', results) == ["row0"]  # the failed one, highlighted
    # the reason is prose: its header sits over it on the left, not right-aligned as the numbers' are
    (at,) = re.findall(r'<th id="\w+" class="col_heading level0 col(\d+)" >reason</th>', results)
    assert f"th.col{at} {{\n  text-align: left;" in results.split("<table")[0]


def scaled_copy(sweep: Path, to: Path, factor: dict) -> Path:
    """The same sweep as if measured by other code: each allocator's numbers times its factor."""
    for metrics in sweep.glob("*/metrics.csv"):
        rows = read_csv(metrics)
        f = rows["allocator"].map(factor)
        for column in ("request_throughput", "mean_batch_size", "median_ttft_ms", "median_tpot_ms"):
            rows[column] = rows[column] * f
        rows["kv_token_util"] = rows["kv_token_util"] * f / 4
        write_csv(to / metrics.parent.name / "metrics.csv", rows)
    return to


def bars(ax) -> dict:
    """(tick label, bar label) -> height of every bar of an axes."""
    ticks = list(zip(ax.get_xticks(), (t.get_text() for t in ax.get_xticklabels())))
    found = {}
    for container in ax.containers:
        for patch in container:
            center = patch.get_x() + patch.get_width() / 2
            tick = min(ticks, key=lambda t: abs(t[0] - center))[1]
            assert (tick, container.get_label()) not in found, "two bars share a label"
            found[tick, container.get_label()] = patch.get_height()
    return found


def test_bench_report_of_two_sweeps_of_the_same_allocators_labels_every_bar(sweep, tmp_path, monkeypatch):
    first = shutil.copytree(sweep, tmp_path / "first", ignore=shutil.ignore_patterns("*.png", "*.html"))
    second = scaled_copy(sweep, tmp_path / "second", {"oracle": 0.5, "paged": 3.0})
    figures, save = {}, plots.save_figure

    def keep(fig, path):
        figures[Path(path).name] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    report.summarize([first, second], tmp_path / "out")

    truth = read_csv(tmp_path / "out" / "summary.csv").set_index(["sweep", "allocator"])
    panels = {ax.get_ylabel(): ax for ax in figures["throughput_latency.png"].axes}
    for column, text, _ in plots.PANELS:
        drawn = bars(panels[text])
        assert drawn == pytest.approx({key: truth.at[key, column] for key in truth.index}), column
    assert truth.at[("second", "paged"), "request_throughput"] == pytest.approx(
        3 * truth.at[("first", "paged"), "request_throughput"]
    )
    (kv,) = figures["kv_breakdown.png"].axes
    tokens = {tick: height for (tick, part), height in bars(kv).items() if part == "token states"}
    assert tokens == pytest.approx({f"{s}, {a}": 100 * truth.at[(s, a), "kv_token_util"] for s, a in truth.index})


def test_a_baseline_not_in_the_sweep_is_one_line_exit_2(sweep, tmp_path):
    result = bench_report(sweep, "--out", tmp_path, "--baseline", "pow2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: report.baseline='pow2' is not in the sweep; its allocators: oracle, paged"
    ]
    result = bench(
        tmp_path,
        "-m",
        "+allocator=oracle,paged",
        "report.baseline=contiguous",
        *SMALL,
        "workload.num_requests=10",
        "hydra.sweep.dir=named",
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: report.baseline='contiguous' is not in the sweep; its allocators: oracle, paged"
    ]


def test_a_directory_without_results_is_one_line_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    result = bench_report(tmp_path / "empty")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'empty'} has no results (no */metrics.csv, metrics.csv or summary.csv in it)"
    ]


def test_the_winner_at_each_rate_with_ties_shared_and_a_failed_baseline_said():
    rows = pd.DataFrame(
        [
            {
                "allocator": a,
                "rate": rate,
                "status": status,
                "normalized_latency_s_per_tok": latency,
                "request_throughput": tput,
            }
            for a, rate, status, latency, tput in [
                ("contiguous", 1, "ok", 0.30, 0.5),
                ("pow2", 1, "ok", 0.10, 0.9),
                ("paged", 1, "ok", 0.10, 0.9),
                ("contiguous", 2, "failed", None, None),
                ("pow2", 2, "ok", 0.40, 1.0),
                ("paged", 2, "ok", 0.05, 1.8),
            ]
        ]
    )
    found = winners(rows, "contiguous").set_index("setting")
    assert found.at["rate=1", "winner"] == "pow2 = paged"
    assert found.at["rate=1", "latency_vs_baseline"] == pytest.approx(3.0)
    assert found.at["rate=1", "throughput_vs_baseline"] == pytest.approx(1.8)
    assert found.at["rate=2", "winner"] == "paged" and found["latency_vs_baseline"].isna().tolist() == [False, True]


def test_of_several_sweeps_one_without_the_baseline_is_compared_with_its_own_first_system():
    """bench-report A B, where B never ran contiguous: its settings said "contiguous has no
    successful point here" (nothing failed), and a sweep of one system was crowned at each rate."""
    rows = [
        ("a", "contiguous", 2, "ok", 0.30, 0.5),
        ("a", "paged", 2, "ok", 0.10, 0.9),
        ("b", "oracle", 2, "ok", 0.20, 0.6),
        ("b", "paged", 2, "ok", 0.05, 1.2),
        ("c", "paged", 2, "ok", 0.07, 1.0),
        ("d", "contiguous", 2, "failed", None, None),
        ("d", "paged", 2, "ok", 0.06, 1.1),
    ]
    frame = pd.DataFrame(
        rows, columns=["sweep", "allocator", "rate", "status", "normalized_latency_s_per_tok", "request_throughput"]
    )
    found = winners(frame, "contiguous").set_index("setting")
    assert found["baseline"].tolist() == ["contiguous", "oracle", "", "contiguous"]
    assert found["baseline_state"].tolist() == ["ok", "ok", "absent", "failed"]
    assert found.at["b", "latency_vs_baseline"] == pytest.approx(4.0)
    page = verdict_of(frame)
    assert "4.00× lower normalized latency than oracle, 2.00× its request throughput (contiguous is not in this" in page
    assert "<b>c</b>: <b>paged</b> (0.07 s/token); the only system of its sweep" in page
    assert "<b>d</b>: <b>paged</b> (0.06 s/token); contiguous has no successful point here" in page


def linear_sweep(rates) -> pd.DataFrame:
    """Normalized latency linear in rate: contiguous reaches 0.5 s/token at 5 req/s, paged at 10."""
    slope = {"contiguous": 0.1, "paged": 0.05}
    return pd.DataFrame(
        [
            {
                "allocator": a,
                "workload": "sharegpt",
                "rate": r,
                "normalized_latency_s_per_tok": k * r,
                "request_throughput": r,
            }
            for r in rates
            for a, k in slope.items()
        ]
    )


def verdict_of(frame: pd.DataFrame, slo: float = 0.5, baseline: str = "contiguous") -> str:
    page = report_page.render_html(frame, [], [Path("sweep")], baseline, baseline, slo)
    return page.split("<h2>Verdict</h2>")[1].split("<h2>Results</h2>")[0]


def test_the_verdict_opens_with_each_system_s_capacity_at_the_latency_target_and_its_ratio():
    verdict = verdict_of(linear_sweep(range(1, 13)))
    assert "within 0.5 s/token of normalized latency" in verdict
    assert (
        "<li><b>contiguous</b>: 5 req/s, 1.00× contiguous's <small>(between the swept 5-6 req/s)</small></li>"
        in verdict
    )
    assert (
        "<li><b>paged</b>: 10 req/s, 2.00× contiguous's <small>(between the swept 10-11 req/s)</small></li>" in verdict
    )
    assert verdict.index("Capacity") < verdict.index("Winner")
    tighter = verdict_of(linear_sweep(range(1, 13)), slo=0.3)  # the target moves the crossing
    assert "<li><b>contiguous</b>: 3 req/s" in tighter and "<li><b>paged</b>: 6 req/s, 2.00×" in tighter


def test_without_a_rate_axis_or_a_crossing_the_verdict_says_why_instead_of_a_capacity():
    one_rate = verdict_of(linear_sweep([4]))
    assert "<p>No capacity at 0.5 s/token (report.slo_s_per_token): the points were not taken at " in one_rate
    assert one_rate.count("capacity") == 1 and "req/s," not in one_rate
    short = verdict_of(linear_sweep(range(1, 7)))  # paged stays under the target
    assert "<li><b>contiguous</b>: 5 req/s, 1.00× contiguous's <small>" in short
    assert "paged on sharegpt (rates 1, 2, 3, 4, 5, 6) never exceeds report.slo_s_per_token=0.5" in short


def test_a_curve_the_rates_cannot_place_is_named_by_its_setting():
    seeds = pd.concat([linear_sweep(range(1, 7)).assign(seed=seed) for seed in (0, 1)], ignore_index=True)
    verdict = verdict_of(seeds)  # paged stays under the target on both seeds' curves
    for seed in (0, 1):
        assert f"seed={seed}: paged on sharegpt (rates 1, 2, 3, 4, 5, 6) never exceeds" in verdict


def fig12_like(points: int = 12) -> pd.DataFrame:
    """fig12's shape: each workload's curve at its own rates, each rate named by a point
    (fig12.point r1..rN), so that point and workload both pair one to one with the rate."""
    frames = []
    for workload, scale in (("sharegpt", 1), ("alpaca", 10)):
        frame = linear_sweep([scale * r for r in range(1, points + 1)]).assign(workload=workload)
        frame["normalized_latency_s_per_tok"] /= scale
        frames.append(frame.assign(**{"fig12.point": [f"r{i // 2 + 1}" for i in range(len(frame))]}))
    return pd.concat(frames, ignore_index=True)


def test_a_key_that_only_names_the_rate_does_not_cut_the_curves():
    from kvbench.reporting.results import curve_keys

    frame = fig12_like()
    assert curve_keys(frame, ["allocator", "workload", "fig12.point"]) == ["allocator", "workload"]
    seeds = pd.concat([linear_sweep(range(1, 4)).assign(seed=s) for s in (0, 1)], ignore_index=True)
    assert curve_keys(seeds, ["allocator", "seed"]) == ["allocator", "seed"]  # a real key stays
    # failed points can leave a real key one value a rate: seed 0 at rate 1, seed 1 at rate 2
    survivors = linear_sweep([1, 2]).assign(seed=[0, 0, 1, 1])
    assert curve_keys(survivors, ["allocator", "seed"]) == ["allocator", "seed"]
    series = [(name, len(rows)) for name, _, _, rows in plots._series(frame, rate_curves(frame))]
    assert sorted(series) == sorted(
        (f"{a}, workload={w}", 12) for a in ("contiguous", "paged") for w in ("sharegpt", "alpaca")
    )
    verdict = verdict_of(frame)  # each workload's capacity, not "fewer than 2 rates" for every point
    assert "<li><b>workload=sharegpt, paged</b>: 10 req/s, 2.00× contiguous's <small>" in verdict, verdict
    assert "<li><b>workload=alpaca, contiguous</b>: 50 req/s" in verdict and "no capacity" not in verdict


def fig13_like() -> pd.DataFrame:
    """fig13's shape: each workload at its own one rate, three seeds, four systems."""
    rows = []
    for workload, rate in (("sharegpt", 2.0), ("alpaca", 30.0)):
        for seed in range(3):
            for i, allocator in enumerate(("contiguous", "pow2", "oracle", "paged")):
                rows.append(
                    {
                        "allocator": allocator,
                        "workload": workload,
                        "seed": seed,
                        "rate": rate,
                        "status": "ok",
                        "normalized_latency_s_per_tok": 1.0 / (i + 1),
                        "request_throughput": rate * (i + 1) / 4,
                        "mean_batch_size": 8.0 * (i + 1),
                        "median_ttft_ms": 100.0,
                        "median_tpot_ms": 30.0,
                        **{key: share for (key, _, _), share in zip(KV_PARTS, (0.2, 0.1, 0.3, 0.1, 0.3))},
                    }
                )
    return pd.DataFrame(rows)


def test_workloads_each_at_their_own_rate_are_no_rate_sweep(monkeypatch):
    frame = fig13_like()
    assert rate_curves(frame) is None  # two rates, but each curve has one
    assert rate_curves(frame.assign(rate=frame["rate"] * (1 + frame["seed"]))) is not None  # a real rate sweep
    verdict = verdict_of(frame)
    assert "each curve was taken at one request rate (rates: 2, 30); sweep workload.rate" in verdict
    assert "fewer than 2 rates" not in verdict
    drawn = []
    monkeypatch.setattr(plots, "kv_figure", lambda panels, rates, title: drawn.append(panels))
    plots.kv_breakdown(frame)  # a panel per setting, a bar per system, not 24 bars in one
    ((*panels,),) = drawn
    assert [name for name, _, _ in panels] == [
        f"workload={w}, seed={s}, rate={r}" for w, r in (("sharegpt", 2), ("alpaca", 30)) for s in range(3)
    ]
    assert all(list(labels) == ["contiguous", "pow2", "oracle", "paged"] for _, labels, _ in panels)
    figure = plots.throughput_latency(frame)  # six settings of bars: two panels a row
    assert figure.axes[0].get_subplotspec().get_gridspec().get_geometry() == (2, 2)


def test_latencies_of_millions_of_ms_are_drawn_in_seconds_not_under_an_offset():
    frame = fig13_like().query("workload == 'sharegpt' and seed == 0")  # one setting: one row of panels
    frame = frame.assign(median_ttft_ms=[2_316_056.8, 1_716_930.1, 1_182_129.0, 331_426.1])  # the default sweep's
    figure = plots.throughput_latency(frame)
    figure.canvas.draw()
    ttft = next(ax for ax in figure.axes if ax.get_ylabel() == "median TTFT (s)")  # was 2M ms
    assert ttft.get_yscale() == "linear" and ttft.yaxis.get_offset_text().get_text() == ""
    assert {"1000", "2000"} <= {label.get_text() for label in ttft.get_yticklabels()}
    assert ttft.get_xticks().size == 0  # one setting: the legend names its bars, no empty tick
    tpot = next(ax for ax in figure.axes if ax.get_ylabel() == "median TPOT (ms)")
    assert "30" in {label.get_text() for label in tpot.get_yticklabels()}  # tens stay as they are


def test_a_key_one_sweep_did_not_set_is_left_out_of_its_points_names():
    from kvbench.reporting.results import point_labels

    frame = pd.DataFrame(
        {
            "sweep": ["a", "a", "b"],
            "allocator": ["paged", "paged", "pow2"],
            "rate": [1.0, 5.0, 4.0],
            "workload.duration_s": [30.0, 30.0, float("nan")],  # sweep b kept the default
        }
    )
    assert point_labels(frame).tolist() == [
        "a, paged, rate=1, duration_s=30",
        "a, paged, rate=5, duration_s=30",
        "b, pow2, rate=4",
    ]


def validation(model: str, column: str, measured: tuple, simulated: float) -> dict:
    """One row of scenario=validate: a metric, its served runs and its simulated runs."""
    return {
        "scenario": "validate",
        "allocator": "paged",
        "model": model,
        "device": "cpu",
        "workload": "sharegpt",
        "status": "ok",
        "metric": column.upper(),
        "column": column,
        "measured_1": measured[0],
        "measured_2": measured[1],
        "simulated_1": simulated,
        "simulated_2": simulated,
        "measured_spread": 0.1,
        "rel_error": -0.05,
    }


def test_a_validation_prints_a_line_a_metric_measured_beside_simulated():
    from kvbench.reporting.console import sweep_table, validation_table

    rows = [validation("tiny", "median_ttft_ms", (4.0, 6.0), 4.75), validation("tiny", "preemptions", (0, 0), 0)]
    lines = validation_table(rows).splitlines()
    assert "the calibrated simulator against serve · paged · tiny · cpu · sharegpt" in lines[0]
    assert lines[1].split() == ["metric", "measured", "simulated", "error", "spread"]
    assert lines[2].split() == ["median_ttft_ms", "5", "4.75", "-5.0%", "10.0%"]  # the served runs' mean
    assert len(lines) == 5 and len(lines[0]) == len(lines[-1])
    swept = pd.DataFrame([*rows, validation("small", "median_ttft_ms", (8.0, 8.0), 8.8)])
    table = sweep_table(swept, 0.5, None).splitlines()
    assert table[2].split()[:2] == ["model=tiny", "median_ttft_ms"]
    assert table[4].split()[:3] == ["model=small", "median_ttft_ms", "8"]
    assert not any("capacity" in line for line in table)  # a validation has no rate curves


def test_a_single_runs_row_is_written_as_pandas_writes_it(tmp_path):
    row = {
        "completed": 30,
        "kv_token_util": 0.123456789123,
        "mean_ttft_ms": 1234567.123456789,
        "p99_itl_ms": float("nan"),
        "tiny": 1e-10,
        "huge": 1.2345678901234567e17,
        "ratio": np.float64(2.5),
        "steps": np.int64(7),
        "window_end_s": float("inf"),
        "reason": "",
        "note": 'a "quoted", comma',
        "prefix_hit_rate": None,
        "ok": True,
        "device": "cpu",
        "scenario": "simulate",
        "allocator": "paged",
    }
    write_csv(tmp_path / "one.csv", [row])
    write_csv(tmp_path / "pandas.csv", pd.DataFrame([row]))
    assert (tmp_path / "one.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_an_infinite_rate_is_on_no_curve_and_the_finite_rates_still_make_one():
    from kvbench.reporting.winners import capacity

    frame = linear_sweep([*range(1, 13), float("inf")])
    frame.loc[frame["rate"] == float("inf"), "normalized_latency_s_per_tok"] = 9.0
    assert rate_curves(frame) == ["allocator"]
    found, unplaced = capacity(frame, 0.5, "contiguous")
    assert unplaced == [] and found.set_index("allocator")["capacity_req_s"].round(3).to_dict() == {
        "contiguous": 5.0,
        "paged": 10.0,
    }
    assert rate_curves(linear_sweep([4, float("inf")])) is None  # one finite rate: no curve


def test_two_sweeps_of_one_system_each_keep_one_panel_of_bars(monkeypatch):
    """A per-setting panel is for settings that hold several systems: two sweeps of one system
    each (an A/B comparison) would give a panel per bar."""
    frame = fig13_like()
    frame = frame[frame["allocator"].isin(["paged", "oracle"])]
    frame = frame.assign(sweep=frame["allocator"].map({"paged": "a", "oracle": "b"}))
    drawn = []
    monkeypatch.setattr(plots, "kv_figure", lambda panels, rates, title: drawn.append(panels))
    plots.kv_breakdown(frame)
    ((panel,),) = drawn
    assert len(panel[1]) == 12


def test_a_tall_figure_keeps_its_panels_below_its_title():
    frame = pd.concat([fig13_like().assign(block_size=b) for b in (8, 16, 32)], ignore_index=True)
    fig = plots.kv_breakdown(frame)  # 18 panels, 9 rows
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (title,) = [t for t in fig.texts if t.get_text() == fig.get_suptitle()]
    reach = max(ax.get_tightbbox(renderer).y1 for ax in fig.axes if ax.get_visible())
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 18
    assert reach < title.get_window_extent(renderer).y0


def test_a_kernel_sweep_names_its_points_by_batch_and_gives_no_latency_capacity(tmp_path):
    from kvbench.reporting.console import sweep_table

    rows = [
        {"scenario": "kernel", "allocator": a, "batch_spec": b, "status": "ok", "latency_us_p50": 100.0 + i}
        for i, (a, b) in enumerate((a, b) for b in ("2d64", "4d128") for a in ("paged", "contiguous"))
    ]
    table = sweep_table(pd.DataFrame(rows), 0.5, None)
    assert "contiguous, batch_spec=2d64" in table and "paged, batch_spec=4d128" in table
    assert "capacity" not in table
    write_csv(tmp_path / "k.csv", rows)
    report.main([str(tmp_path / "k.csv"), "--out", str(tmp_path / "out")])  # no figure: its columns are not there
    page = (tmp_path / "out" / "report.html").read_text()
    assert "capacity" not in page.split("<h2>Verdict</h2>")[1].split("<h2>Results")[0].lower()
    assert "paged, batch_spec=2d64" in page and not (tmp_path / "out" / "latency_vs_context.png").exists()


def test_a_validation_sweep_s_rows_a_metric_each_are_not_taken_for_repeated_points():
    """The validation sweep docs/simulator.md gives wrote no summary or report: its points' rows,
    one a metric, each carry the point's identity, which read as one point given twice."""
    rows = [
        {"scenario": "validate", "allocator": a, "model": "tiny", "metric": m, "rel_error": 0.1, "status": "ok"}
        for a in ("paged", "contiguous")
        for m in ("request_throughput", "median_ttft_ms")
    ]
    inputs.refuse_repeated_points(pd.DataFrame(rows), "sweep")
    with pytest.raises(UserError, match="holds two rows of one point"):
        inputs.refuse_repeated_points(pd.DataFrame(rows + rows[:1]), "sweep")


def test_a_share_that_rounds_to_zero_is_written_0_not_minus_0(tmp_path):
    """1 - (a sum of shares) is -5.5e-17 where they add to a hair over 1: it read -0.0."""
    write_csv(tmp_path / "one.csv", [{"kv_external_frag_frac": -5.5e-17}])
    write_csv(tmp_path / "two.csv", [{"kv_external_frag_frac": -5.5e-17}, {"kv_external_frag_frac": 0.25}])
    assert (tmp_path / "one.csv").read_text().splitlines()[1] == "0.0"
    assert (tmp_path / "two.csv").read_text().splitlines()[1:] == ["0.0", "0.25"]


def test_a_point_s_name_shows_a_measured_rate_to_six_digits():
    """A validate sweep's rates are measured (0.8 of the saturated rate): `rate=10.100226994`."""
    from kvbench.reporting.results import point_labels

    frame = pd.DataFrame({"allocator": ["paged", "contiguous"], "rate": [10.100226994, 128.0]})
    assert point_labels(frame).tolist() == ["paged, rate=10.1002", "contiguous, rate=128"]


def test_a_report_of_an_interrupted_sweep_says_which_share_of_its_points_it_holds(sweep, tmp_path, capsys):
    """bench-report of a sweep stopped after 2 of 5 points wrote a two-row report, exit 0, with
    nothing to say that the sweep had listed three more."""
    partial = tmp_path / "partial"
    shutil.copytree(sweep, partial)
    assert report.listed_points(partial) == 2 and report.missing_points(partial) is None
    (next(partial.glob("*/metrics.csv"))).unlink()  # the second point, interrupted
    report.main([str(partial)])
    said = capsys.readouterr().out
    assert f"note: {partial}'s sweep lists 2 points and 1 has a result" in said
    assert "the others were interrupted or never ran" in (partial / "report.html").read_text()
    assert report.missing_points(partial / "nosuch") is None


def test_a_sweep_names_the_points_whose_swap_pool_filled_and_how_many_preemptions_recomputed():
    from kvbench.reporting.console import sweep_table

    rows = [
        {"allocator": "paged", "workload.n": n, "status": "ok", "preemptions": p, "swap_fallbacks": f}
        for n, p, f in ((2, 138, 0), (4, 590, 105), (6, 723, 137))
    ]
    full = [line for line in sweep_table(pd.DataFrame(rows)).splitlines() if line.startswith("swap pool full")]
    assert full == [
        "swap pool full: n=4: 105 of 590 preemptions recomputed instead (engine.swap_space_bytes; "
        "serve: scenario.swap_space_tokens)",
        "swap pool full: n=6: 137 of 723 preemptions recomputed instead (engine.swap_space_bytes; "
        "serve: scenario.swap_space_tokens)",
    ]


def many_settings() -> pd.DataFrame:
    """24 points of contiguous and paged over three settings and two preemption modes, where
    contiguous's swap points failed: a bar a point, named by three or four settings each."""
    rows = []
    for preemption in ("recompute", "swap"):
        for seqs in (64, 256):
            for tokens in (2560, 4096):
                for duration in (120, 121):
                    for i, allocator in enumerate(("contiguous", "paged")):
                        ok = not (allocator == "contiguous" and preemption == "swap")
                        rows.append(
                            {
                                "allocator": allocator,
                                "engine.preemption": preemption,
                                "scheduler.max_num_seqs": seqs,
                                "scheduler.max_num_batched_tokens": tokens,
                                "workload.duration_s": duration,
                                "status": "ok" if ok else "failed",
                                "request_throughput": 0.6 + i,
                                "mean_batch_size": 7.0 + 25 * i,
                                "median_ttft_ms": 240_000.0 - 220_000 * i,
                                "median_tpot_ms": 33.0 + 12 * i,
                                **{key: share for (key, _, _), share in zip(KV_PARTS, (0.2, 0.15, 0.55, 0, 0.1))},
                            }
                        )
    return pd.DataFrame(rows)


def test_bars_named_by_many_settings_lie_on_their_side_with_every_name_shown(tmp_path):
    """Their names tilted under the bars overlapped, and the breakdown's layout then failed
    (`bottom cannot be >= top`), which cost the sweep its plots, its report and its exit code."""
    frame = many_settings()
    drawn = plots.draw_all(frame, tmp_path)
    assert {p.name for p in drawn} == {"kv_breakdown.png", "throughput_latency.png"}
    ok = frame[frame["status"] == "ok"]
    (panel,) = [ax for ax in plots.kv_breakdown(plots.in_paper_order(ok)).axes if ax.get_visible()]
    names = [t.get_text() for t in panel.get_yticklabels()]
    assert len(names) == len(ok) == 24 and all("max_num_seqs=" in name for name in names)
    assert [t.get_text() for t in panel.get_xticklabels()][0] == "0"  # the shares run across
    fig = plots.throughput_latency(plots.in_paper_order(ok))
    groups = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(groups) == 16 and groups[0].startswith("preemption=recompute, max_num_batched_tokens=2560")
    fig.canvas.draw()  # every name left of its bars, inside the figure
    renderer = fig.canvas.get_renderer()
    assert min(t.get_window_extent(renderer).x0 for t in fig.axes[0].get_yticklabels()) >= 0


@pytest.mark.parametrize("cols", [1, 2, 3, 4])
def test_the_width_bars_are_laid_out_by_is_the_width_matplotlib_gives_a_panel(cols):
    """Whether the bars lie on their side is decided by how wide a panel will be: an estimate 20 %
    too wide rotated names that fitted standing, and squeezed every panel."""
    from kvbench.reporting.figures import MAX_WIDTH_IN, subplots

    fig, axes = subplots(1, cols, figsize=(MAX_WIDTH_IN, 3.9), squeeze=False)
    for ax in axes.flat:
        assert ax.get_position().width * MAX_WIDTH_IN == pytest.approx(plots.panel_width_in(cols), rel=1e-3)


@pytest.mark.parametrize("rates, scale", [([3, 4, 5, 32, 96], "log"), ([0.4, 1, 2, 4, 8], "linear"), ([], "linear")])
def test_rates_over_decades_of_load_lie_on_a_log_axis_in_every_figure(tmp_path, monkeypatch, rates, scale):
    """fig12's Alpaca panel ran 3-96 req/s on a linear axis: the knees at 3-5 req/s, where Orca
    crosses the target, lay on top of each other at its left edge."""
    from kvbench.reporting import paper_plots
    from kvbench.reporting.figures import rate_axis, subplots

    fig, ax = subplots()
    rate_axis(ax, rates)
    assert ax.get_xscale() == scale and ax.get_xlabel() == "request rate (req/s)"
    if not rates:
        return
    rows = [
        {"allocator": a, "workload": "alpaca", "rate": str(r), "normalized_latency_s_per_tok": str(0.01 * r)}
        for a in ("contiguous", "paged")
        for r in rates
    ]
    seen = []
    real = paper_plots.save_figure
    monkeypatch.setattr(
        paper_plots, "save_figure", lambda fig, path: seen.append(fig.axes[0].get_xscale()) or real(fig, path)
    )
    paper_plots.latency_knees(rows, {}, 0.5, tmp_path)
    assert seen == [scale]


def test_a_figure_that_fails_to_draw_costs_only_itself(tmp_path, monkeypatch, caplog):
    def broken(*args):
        raise ValueError("bottom cannot be >= top")

    monkeypatch.setattr(plots, "kv_breakdown", broken)
    drawn = plots.draw_all(fig13_like(), tmp_path)
    assert [p.name for p in drawn] == ["throughput_latency.png"]
    assert "kv_breakdown.png was not drawn: ValueError: bottom cannot be >= top" in caplog.text


def test_a_ratio_against_a_baseline_past_its_capacity_says_it_grows_with_the_run():
    """A baseline whose requests waited 2,311 s on average for a first token, while they arrived
    over 880 s, has a queue, and a latency, that grew for as long as they arrived: its ratio to
    the winner is the run's length as much as the systems. One that started them within 56 ms
    kept up, though a short run's drain left its throughput under the rate offered (0.217 of
    0.25 req/s), which the first version of this note took for the sign."""
    columns = ["allocator", "rate", "requests", "normalized_latency_s_per_tok", "request_throughput", "mean_ttft_ms"]
    frame = pd.DataFrame(
        [
            ("contiguous", 4.0, 3523, 140.0, 0.633, 2_310_931.0),
            ("paged", 4.0, 3523, 20.5, 2.144, 334_251.0),
            ("contiguous", 0.25, 50, 0.0367, 0.217, 56.0),
            ("paged", 0.25, 50, 0.0350, 0.218, 50.0),
        ],
        columns=columns,
    )
    page = verdict_of(frame)
    assert (
        "(contiguous's requests waited 2,311 s on average for a first token, 262% of the 880 s they arrived "
        "over: its queue grew through the run, so its latency, and this ratio, grow with the run's length)" in page
    )
    assert page.count("its queue grew") == 1  # at 0.25 req/s contiguous kept up
    # 8 ms, one prefill, is 11 % of 4 requests' 75 ms span: no queue grew
    light = [("paged", 40.0, 4, 0.02, 30.0, 7.92), ("contiguous", 40.0, 4, 0.01, 35.0, 5.0)]
    assert "its queue grew" not in verdict_of(pd.DataFrame(light, columns=columns), baseline="paged")
    # all at once: the waits grow with the number of requests, whatever the server
    burst = [("contiguous", math.inf, 24, 0.9, 5.0, 4600.0), ("paged", math.inf, 24, 0.1, 9.0, 40.0)]
    assert (
        "(every request arrived at once: the waits of contiguous's, 4.6 s on average for a first token, and so "
        "this ratio, grow with their number)" in verdict_of(pd.DataFrame(burst, columns=columns))
    )


def test_winners_measured_once_on_the_wall_clock_carry_a_note_and_repeated_ones_do_not():
    rows = [("serve", "contiguous", 0.2, 1.0), ("serve", "paged", 0.1, 1.5)]
    frame = pd.DataFrame(rows, columns=["scenario", "allocator", "normalized_latency_s_per_tok", "request_throughput"])
    page = verdict_of(frame)
    assert "2 point(s) here are wall-clock measurements (scenario=serve), each run once" in page
    assert "not a finding" in page and "repeats=5" in page
    assert "wall-clock measurements" not in verdict_of(frame.assign(repeats=5))
    assert "wall-clock measurements" not in verdict_of(frame.assign(scenario="simulate"))
    kernels = pd.DataFrame({"scenario": ["kernel"] * 2, "allocator": ["contiguous", "paged"], "latency_us_p50": [9, 8]})
    mixed = pd.concat([frame.assign(scenario="simulate"), kernels], ignore_index=True)
    assert "wall-clock measurements" not in verdict_of(mixed)  # the winners are the simulated runs' alone


def test_a_report_of_kernel_points_beside_served_runs_says_they_share_no_metric():
    frame = pd.DataFrame({"scenario": ["kernel", "kernel", "simulate"], "allocator": ["paged"] * 3})
    (line,) = report.mixed_scenarios(frame)
    assert line.startswith("These inputs mix kernel points") and "with simulate runs" in line
    assert report.mixed_scenarios(frame.iloc[:2]) == [] and report.mixed_scenarios(frame.iloc[2:]) == []


def test_a_sweep_over_goodput_slos_shows_each_point_s_goodput():
    """Two points that differ only in their SLOs printed two identical lines."""
    from kvbench.reporting.console import sweep_table

    rows = [
        {"allocator": "paged", "report.goodput.ttft_ms": t, "request_throughput": 1.5, "request_goodput": g}
        for t, g in ((100, 0.875), (1e5, 1.156))
    ]
    lines = sweep_table(pd.DataFrame(rows)).splitlines()
    assert lines[1].split()[-2:] == ["goodput", "req/s"]
    assert [line.split()[-1] for line in lines[2:4]] == ["0.875", "1.156"]
    assert "goodput" not in sweep_table(pd.DataFrame(rows).drop(columns="request_goodput"))


def test_a_served_sweep_without_rates_is_told_to_sweep_the_rate_serve_reads():
    """It said "sweep workload.rate", which scenario=serve refuses (its rate is scenario.rate)."""
    import pandas as pd

    from kvbench.reporting.winners import capacity

    rows = [
        {"scenario": "serve", "allocator": a, "rate": "inf", "status": "ok", "normalized_latency_s_per_tok": 0.1}
        for a in ("contiguous", "paged")
    ]
    found, why = capacity(pd.DataFrame(rows), 0.5, "contiguous")
    assert found.empty and "sweep scenario.rate (e.g. scenario.rate=1,2,4,8)" in why[0]
    simulated = pd.DataFrame([{**row, "scenario": "simulate"} for row in rows])
    assert "sweep workload.rate" in capacity(simulated, 0.5, "contiguous")[1][0]


def test_plots_keep_the_paper_s_order_when_the_baseline_s_first_point_failed():
    """contiguous failed at the lowest rate, so paged's row came first: its bars, curves and legend went left."""
    import pandas as pd

    from kvbench.reporting.plots import _series, bar_table

    rows = [
        {"allocator": a, "rate": r, "kv_token_util": 0.5, "normalized_latency_s_per_tok": 0.1}
        for r in (0.5, 1.0, 2.0)
        for a in ("contiguous", "paged")
        if (a, r) != ("contiguous", 0.5)
    ]
    frame = pd.DataFrame(rows)
    assert [rows["allocator"].iloc[0] for *_, rows in _series(frame, ["allocator"])] == ["contiguous", "paged"]
    values, _ = bar_table(frame, "kv_token_util")
    assert list(values.columns) == ["contiguous", "paged"]


def test_a_near_tie_s_ratio_shows_the_digits_that_tell_it_from_one():
    """paged 0.022665 vs contiguous 0.022706 s/token read "1.00× lower" beside exact ties that read "shares the win"."""
    from kvbench.reporting.winners import times

    assert [times(x) for x in (1.0, 0.022706 / 0.022665, 0.9996, 2.5)] == ["1.00", "1.002", "0.9996", "2.50"]
    # however near: a ratio that is not 1 never reads as 1.0000, nor one far below it as 0.00
    assert [times(x) for x in (1.00001, 0.999996, 0.003)] == ["1.00001", "0.999996", "0.003"]
    assert times(1 + 2**-52) == times(1 - 2**-53) == "1.00"  # one float's rounding against another's: a tie


def test_a_sweep_of_one_system_over_its_settings_names_the_best_setting_at_each_rate():
    """`-m +allocator=paged allocator.block_size=8,16,32` read "One system only (paged): nothing
    to compare", though its points compare block sizes."""
    latency = {(1, 8): 0.030, (1, 16): 0.020, (1, 32): 0.025, (2, 8): 0.050, (2, 16): 0.060, (2, 32): 0.040}
    frame = pd.DataFrame(
        [
            {"allocator": "paged", "rate": r, "block_size": b, "status": "ok", "normalized_latency_s_per_tok": v}
            for (r, b), v in latency.items()
        ]
    )
    text = re.sub("<[^>]+>", "", "".join(report_page._verdict(frame, None, "contiguous", 0.5)))
    assert "One system only (paged); its settings by normalized latency:" in text
    assert "rate=1: block_size=16 (0.02 s/token), 1.50× lower normalized latency than block_size=8" in text
    assert "rate=2: block_size=32 (0.04 s/token), 1.50× lower normalized latency than block_size=16" in text
    alone = frame[frame["block_size"] == 16]  # a rate sweep of one setting: nothing to compare
    assert "nothing to compare" in "".join(report_page._verdict(alone, None, "contiguous", 0.5))
