"""The paper's figures as experiments: capacity at a latency target, the comparison tables,
and the experiment configs themselves."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from kvbench.errors import UserError
from kvbench.reporting.capacity import Capacity, capacities, capacity_note, capacity_row, capacity_rows
from kvbench.reporting.paper import (
    FIGURES,
    fig2,
    fig12,
    fig14_15,
    fig18,
    fig19,
    markdown,
    report_settings,
    setup_lines,
    write_comparison,
)


def curve(allocator: str, points: dict, workload: str = "sharegpt") -> list[dict]:
    return [
        {
            "allocator": allocator,
            "workload": workload,
            "rate": str(rate),
            "status": "ok",
            "normalized_latency_s_per_tok": str(latency),
        }
        for rate, latency in points.items()
    ]


def test_capacity_is_interpolated_at_the_target_and_given_as_a_ratio_to_the_baseline():
    rows = curve("contiguous", {0.5: 0.05, 1.0: 5.0, 2.0: 50.0}) + curve("paged", {1.0: 0.04, 2.0: 0.05, 3.0: 5.0})
    found = capacities(rows, slo=0.5)
    # log-linear between the last rate under the target and the first above it: half-way here
    assert found[("sharegpt", "contiguous")] == pytest.approx(0.75)
    assert found[("sharegpt", "paged")] == pytest.approx(2.5)
    ratios = {r["allocator"]: r["ratio_to_contiguous"] for r in capacity_rows(found, "contiguous")}
    assert ratios == {"contiguous": 1.0, "paged": pytest.approx(2.5 / 0.75, rel=1e-3)}


@pytest.mark.parametrize(
    "points, message",
    [
        ({1.0: 0.04, 2.0: 0.3}, "never exceeds report.slo_s_per_token=0.5 .* too short to find its knee"),
        ({1.0: 0.9, 2.0: 5.0}, "already at the lowest rate"),
        ({1.0: 0.04}, "fewer than 2 rates"),
    ],
)
def test_a_rate_sweep_without_a_knee_says_so_instead_of_inventing_one(points, message):
    with pytest.raises(UserError, match=message):
        capacities(curve("paged", points), slo=0.5)


def test_a_knee_hidden_by_a_failed_point_says_to_rerun_it_not_to_add_rates():
    """The lowest rate was swept and failed: "add lower rates" sent the user to run it again by another name."""
    failed = {"status": "failed", "workload": "sharegpt", "allocator": "paged", "rate": "0.5"}
    with pytest.raises(UserError, match="already at the lowest rate .* its points at 0.5 req/s failed"):
        capacities([*curve("paged", {1.0: 0.9, 2.0: 5.0}), failed], slo=0.5)
    with pytest.raises(UserError, match="or more requests a point"):  # a short run may never queue
        capacities(curve("paged", {1.0: 0.04, 2.0: 0.3}), slo=0.5)


def test_a_baseline_that_is_not_in_the_sweep_names_the_systems_that_are():
    found = capacities(curve("paged", {1.0: 0.04, 2.0: 5.0}), slo=0.5)
    with pytest.raises(UserError, match="report.baseline='oracle' .* known: paged"):
        capacity_rows(found, "oracle")


@pytest.mark.parametrize(
    "report, message",
    [
        ({"slo_s_per_token": 0}, "slo_s_per_token=0 must be a number > 0"),
        ({"slo_s_per_token": -1.5}, "slo_s_per_token=-1.5"),
        ({"slo_s_per_token": float("inf")}, "slo_s_per_token=inf must be a number > 0 and <= 1e6"),
        ({"paper": "fig99"}, "report.paper='fig99' is not one of fig2, fig12"),
    ],
)
def test_bad_report_settings_are_refused(report, message):
    with pytest.raises(UserError, match=message):
        report_settings(report)


FIG2_RUN = {"model": "opt-13b", "hardware": "a100-40gb"}


def ok_row(**values) -> dict:
    return {"status": "ok", "workload": "sharegpt", "normalized_latency_s_per_tok": "0.1", **values}


@pytest.mark.parametrize(
    "figure, rows, message",
    [  # each compared the paper with a sweep that cannot answer its question
        (fig2, [ok_row(allocator="paged", model="llama-3-8b", hardware="h100-sxm")], "fig2: the paper's numbers are"),
        # it compared llama-3-8b's batches with the paper's OPT-13B ones
        (
            FIGURES["fig13"],
            [ok_row(allocator="paged", model="llama-3-8b", hardware="a100-40gb", rate="2.0")],
            "fig13: the paper",
        ),
        (fig2, [ok_row(allocator="paged", workload="alpaca", **FIG2_RUN)], "this sweep ran workload=alpaca"),
        (fig2, [ok_row(allocator="paged", rate="100.0", block_size="128", **FIG2_RUN)], "ran block_size=128, rate=100"),
        (
            fig14_15,
            [ok_row(**{"fig14_15.sharing": "parallel", "fig14_15.width": "2", "workload.n": "3"})],
            "workload.n is set on the command line",
        ),
        (fig18, [ok_row(block_size="16"), ok_row(block_size="16", seed="1")], "fig18: sharegpt ran at one block size"),
        # compared Orca's block sizes with vLLM's, labelled vLLM
        (
            fig18,
            [ok_row(allocator="contiguous", block_size=b) for b in "8 16".split()],
            "this sweep ran allocator contig",
        ),
        (
            fig14_15,
            [ok_row(**{"fig14_15.sharing": "parallel", "fig14_15.width": "1", "kv_blocks_saved_frac": "0"})],
            "fig14_15.width=1 shares nothing",
        ),
        (fig19, [ok_row(block_size="16", **{"engine.preemption": "recompute"})], "no block size ran with both"),
        (
            fig19,
            [ok_row(block_size="16", preemptions="3", **{"engine.preemption": m}) for m in ("swap", "recompute")],
            "fig19: both preemptions ran at one block size",
        ),
        (
            fig19,
            [
                ok_row(block_size=b, preemptions="0", **{"engine.preemption": m, "swap_time_model_s": "0"})
                for b in ("16", "32")
                for m in ("swap", "recompute")
            ],
            "fig19: no point preempted a request",
        ),
    ],
)
def test_a_paper_figure_refuses_a_sweep_that_cannot_answer_it(figure, rows, message):
    with pytest.raises(UserError, match=message):
        figure(rows, {})


def test_fig2_files_rounding_under_external_and_other_as_the_paper_does():
    row = {
        "allocator": "pow2",
        "model": "opt-13b",
        "hardware": "a100-40gb",
        "workload": "sharegpt",
        "status": "ok",
        "kv_token_util": "0.27",
        "kv_reserved_frac": "0.18",
        "kv_internal_frag_frac": "0.14",
        "kv_rounding_frac": "0.3",
        "kv_external_frag_frac": "0.11",
    }
    compared = {r["quantity"]: r for r in fig2([row], {}) if r["system"] == "Orca (Pow2)"}
    assert compared["% external fragmentation & other"]["kvbench"] == pytest.approx(41.0)
    assert compared["% external fragmentation & other"]["delta"] == pytest.approx(41.0 - 41.6)
    assert compared["% token states"]["paper"] == "26.8"


def test_a_system_the_sweep_did_not_run_is_left_out_not_compared_as_nan(tmp_path):
    row = {"allocator": "pow2", "model": "opt-13b", "hardware": "a100-40gb", "workload": "sharegpt", "status": "ok"}
    row |= {"kv_token_util": "0.27", "kv_reserved_frac": "0.18", "kv_internal_frag_frac": "0.14"}
    row |= {"kv_rounding_frac": "0.3", "kv_external_frag_frac": "0.11", "rate": "2.0", "mean_batch_size": "9.5"}
    compared = fig2([{**row, "rate": "4.0"}], {})  # it compared all four, three of them as nan with runs=0
    assert {r["system"] for r in compared} == {"Orca (Pow2)"} and {r["runs"] for r in compared} == {1}
    fig13 = FIGURES["fig13"]([row], {})
    assert [(r["system"], r["kvbench"]) for r in fig13] == [("Orca (Pow2)", 9.5)]


def test_a_comparison_no_point_can_answer_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "p0").mkdir()
    (tmp_path / "p0" / "metrics.csv").write_text(
        "allocator,workload,status,rate,mean_batch_size\npaged,sharegpt,ok,4.0,30\n"
    )
    with pytest.raises(UserError, match="report.paper=fig13: no successful point of .* is one the paper measured"):
        write_comparison(tmp_path, {"paper": "fig13"})
    assert not (tmp_path / "paper_comparison.csv").exists()


@pytest.mark.parametrize(
    "overrides, rate, duration",
    [
        (["+experiment=fig2"], 4.0, 900),
        (["+experiment=fig13", "workload=alpaca"], 30.0, 300),
        (["+experiment=fig12", "workload=sharegpt", "fig12.point=r7"], 2.0, 1800),
        (["+experiment=fig12", "workload=alpaca", "fig12.point=r6"], 32, 800),
    ],
)
def test_an_experiment_fixes_the_paper_s_setup_and_its_sweep(overrides, rate, duration):
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=overrides, return_hydra_config=True)
    assert (cfg.model.name, cfg.hardware.name) == ("opt-13b", "a100-40gb")
    assert (cfg.workload.rate, cfg.workload.duration_s) == (rate, duration)
    assert cfg.hydra.mode.name == "MULTIRUN"
    assert cfg.hydra.sweeper.params["+allocator"] == "contiguous,pow2,oracle,paged"
    assert cfg.report.paper in FIGURES


@pytest.mark.parametrize(
    "name", sorted(p.stem for p in (Path(__file__).parent.parent / "conf" / "experiment").glob("*.yaml"))
)
def test_every_experiment_config_passes_the_schema(name):
    from kvbench import schema

    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=[f"+experiment={name}"])
    schema.validate(cfg)  # a key the schema does not know is a one-line refusal at run time


def test_an_unknown_experiment_is_one_line_with_the_known_ones(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kvbench.cli", "+experiment=fig99"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    # the shared unknown-option line (as for +allocator=page): the nearest name, then the known ones
    assert line.startswith("error: unknown experiment 'fig99'; did you mean fig19?; known: ") and "fig12" in line


def test_a_target_latency_of_zero_is_refused_before_the_sweep_runs(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvbench.cli",
            "-m",
            "+allocator=paged",
            "report.slo_s_per_token=0",
            "hydra.sweep.dir=sweep",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: report.slo_s_per_token=0 must be a number > 0 and <= 1e6 (seconds per output token)"
    )
    assert not list((tmp_path / "sweep").glob("*/metrics.csv"))


def test_a_rate_sweep_too_short_for_a_knee_is_one_line_exit_2_and_keeps_its_summary(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvbench.cli",
            "-m",
            "+allocator=paged,oracle",  # fig12's ratios need a pair of systems (refused before the sweep)
            "workload.rate=0.5,1",
            "workload.num_requests=20",
            "workload.duration_s=null",
            "report.paper=fig12",
            "progress=false",
            "hydra.sweep.dir=sweep",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "oracle on sharegpt (rates 0.5, 1) never exceeds" in errors[0]
    assert (tmp_path / "sweep" / "summary.csv").is_file()


def sharing_row(workload: str, sharing: str, width: int, saved: float) -> dict:
    return {
        "workload": workload,
        "status": "ok",
        "fig14_15.sharing": sharing,
        "fig14_15.width": str(width),
        "kv_blocks_saved_frac": str(saved),
    }


def test_fig14_15_compares_every_width_with_the_paper_s_range_over_the_widths(tmp_path):
    rows = [
        sharing_row("alpaca", "parallel", 4, 0.08),  # inside 6.1-9.8 %
        sharing_row("alpaca", "parallel", 2, 0.05),  # below it
        sharing_row("sharegpt", "beam", 6, 0.70),  # above 44.3-66.3 %
    ]
    compared = fig14_15(rows, {})
    assert [r["quantity"] for r in compared] == [
        "% KV blocks saved, parallel sampling n=2",
        "% KV blocks saved, parallel sampling n=4",
        "% KV blocks saved, beam search width=6",
    ]
    assert [r["paper"] for r in compared] == ["6.1-9.8", "6.1-9.8", "44.3-66.3"]
    (wide,) = fig14_15([sharing_row("alpaca", "beam", 8, 0.5)], {})
    assert wide["quantity"] == "% KV blocks saved, beam search width=8 (the paper's range is over 2, 4, 6)"
    assert [r["delta"] for r in compared] == [pytest.approx(5 - 6.1), 0.0, pytest.approx(70 - 66.3)]
    for point, row in enumerate(rows):
        (tmp_path / f"p{point}").mkdir()
        (tmp_path / f"p{point}" / "metrics.csv").write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    written = write_comparison(tmp_path, {"paper": "fig14_15"})
    assert [p.name for p in written] == ["paper_comparison.csv", "paper_comparison.md", "fig14_15_sharing.png"]
    (tmp_path / "fig14_15_sharing.png").unlink()
    written = write_comparison(tmp_path, {"paper": "fig14_15"}, plots=False)  # plots=false: no figure at all
    assert [p.name for p in written] == ["paper_comparison.csv", "paper_comparison.md"]
    assert not (tmp_path / "fig14_15_sharing.png").exists()


def test_report_baseline_null_is_the_default_not_an_error():
    assert report_settings({"baseline": None})["baseline"] == "contiguous"


def test_fig14_15_without_sharing_columns_says_which_experiment_makes_them():
    with pytest.raises(UserError, match="run bench \\+experiment=fig14_15"):
        fig14_15([{"workload": "alpaca", "status": "ok", "kv_blocks_saved_frac": "0.1"}], {})


@pytest.mark.parametrize("sharing, width, n, beam_width", [("parallel", 4, 4, 1), ("beam", 6, 1, 6)])
def test_fig14_15_sweeps_one_width_and_the_mode_that_says_what_it_sets(sharing, width, n, beam_width):
    overrides = ["+experiment=fig14_15", "workload=alpaca", f"fig14_15.sharing={sharing}", f"fig14_15.width={width}"]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=overrides, return_hydra_config=True)
    assert (cfg.workload.n, cfg.workload.beam_width) == (n, beam_width)
    assert (cfg.workload.rate, cfg.workload.duration_s) == (20.0, 40)
    assert (cfg.allocator.name, cfg.engine.preemption, cfg.report.paper) == ("paged", "swap", "fig14_15")
    params = cfg.hydra.sweeper.params
    assert (params["fig14_15.sharing"], params["fig14_15.width"]) == ("parallel,beam", "2,4,6")


def test_the_paper_figures_draw_from_the_sweep_s_text_cells(tmp_path):
    from kvbench.reporting import paper_plots

    parts = {"kv_token_util": "0.4", "kv_reserved_frac": "0.2", "kv_internal_frag_frac": "0.1"}
    parts |= {"kv_rounding_frac": "0.1", "kv_external_frag_frac": "0.2"}
    rows = [{**r, **parts} for r in curve("contiguous", {1.0: 0.1, 2.0: 5.0}) + curve("paged", {1.0: 0.04, 2.0: 0.9})]
    knees = capacities(rows, slo=0.5)
    written = [paper_plots.fig2_breakdown(rows, tmp_path), paper_plots.latency_knees(rows, knees, 0.5, tmp_path)]
    assert [p.name for p in written] == ["fig2_breakdown.png", "fig12_latency.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)


@pytest.mark.parametrize(
    "args, said",
    [
        (["+experiment=fig19", "engine.preemption=swap"], "+experiment=fig19 sweeps engine.preemption over"),
        (["+experiment=fig18", "allocator.block_size=16"], "allocator.block_size=16 fixes it to one"),
        (["+experiment=fig12", "fig12.point=r1"], "+experiment=fig12 sweeps fig12.point over"),
        # ran 96 points, each rate under every fig12.point, then found no knee
        (
            ["+experiment=fig12", "workload.rate=0.5,1,2"],
            "+experiment=fig12 takes each workload's rates from fig12.rates",
        ),
        # ran every point, then refused the rate and the workload
        (["+experiment=fig2", "workload.rate=2,4"], "this sweep would run rate=2: drop that override"),
        (["+experiment=fig2", "workload.rate=choice(2)"], "this sweep would run rate=2: drop that override"),
        (["+experiment=fig2", "workload=sharegpt,alpaca"], "this sweep would run workload=alpaca: drop that override"),
        # compared another pool's batches with the paper's
        (
            ["+experiment=fig13", "hardware.num_gpus=2"],
            "fig13: hardware.num_gpus=2 sizes the KV pool or changes a system",
        ),
        (["+experiment=fig2", "engine.kv_cache_bytes=1e9"], "engine.kv_cache_bytes=1e9 sizes the KV pool"),
        # "no allocator is chosen: add +allocator=NAME first", where the experiment sweeps it; and
        # then ran fig12 with blocks of 32 beside the paper's 16
        (["+experiment=fig12", "allocator.block_size=32"], "fig12: allocator.block_size=32 sizes the KV pool or"),
        # every point failed as it ran (Orca shares nothing), or was compared with vLLM's numbers
        (["+experiment=fig14_15", "allocator=contiguous"], "+experiment=fig14_15 measures vLLM's paged allocator"),
        (["+experiment=fig18", "allocator=paged,oracle"], "this sweep would run allocator oracle: drop that override"),
        # ran its points, then refused the rows
        (["+experiment=fig14_15", "workload.n=2"], "workload.n=2 would run another width than the one compared"),
        # every point failed as it ran: "ConfigTypeError raised while resolving interpolation"
        (["+experiment=fig12", "fig12.duration_s=5"], "fig12.duration_s is a table the config reads by key"),
        # all 80 points ran, and none read it
        (["+experiment=fig12", "+fig12.rates.sharegpt.r11=5"], "+fig12.rates.sharegpt.r11=5 is read by no point"),
    ],
)
def test_an_axis_the_comparison_needs_fixed_on_the_command_line_is_refused_before_the_sweep(tmp_path, args, said):
    from kvbench import cli

    from helpers.cli import refused

    line = refused(lambda: cli.main([*args, f"hydra.sweep.dir={tmp_path / 'sweep'}"]))
    assert said in line
    assert not list((tmp_path / "sweep").glob("*/metrics.csv"))


@pytest.mark.parametrize(
    "given, key, values",
    [
        ([], "workload", ["sharegpt", "alpaca"]),  # the experiment's params
        (["workload=sharegpt"], "workload", ["sharegpt"]),  # the command line's win
        (["workload='sharegpt','alpaca'"], "workload", ["sharegpt", "alpaca"]),  # quotes are not part of a value
        (['+allocator="paged","oracle"'], "allocator", ["paged", "oracle"]),
        (["+allocator=choice(paged,pow2)"], "allocator", ["paged", "pow2"]),
        (["+allocator=glob(p*)"], "allocator", None),  # only the sweeper can expand it: unknown, not refused
        (["~workload"], "workload", None),
        ([], "seed", None),
    ],
)
def test_the_values_a_sweep_runs_are_read_as_the_sweeper_combines_them(given, key, values):
    from omegaconf import OmegaConf

    from kvbench.reporting.experiment_checks import swept_values

    config = OmegaConf.create(
        {"hydra": {"sweeper": {"params": {"workload": "sharegpt,alpaca"}}, "overrides": {"task": given}}}
    )
    assert swept_values(config, key) == values


def test_a_fig12_curve_its_rates_cannot_place_leaves_the_others_compared_then_is_the_error(tmp_path):
    """ShareGPT's curves cross the target; Alpaca's oracle never does (its sweep too short): the
    ShareGPT ratios, the capacities placed and the figure are written, then the error names it."""
    slope = {"contiguous": 0.1, "oracle": 0.05, "paged": 0.02}  # s/token per req/s: cross 0.5 at 5, 10, 25
    rows = [
        {
            "allocator": a,
            "workload": "sharegpt",
            "rate": str(r),
            "status": "ok",
            "normalized_latency_s_per_tok": str(k * r),
        }
        for a, k in slope.items()
        for r in (1, 2, 4, 8, 16, 32)
    ]
    rows += [
        {
            "allocator": a,
            "workload": "alpaca",
            "rate": str(r),
            "status": "ok",
            "normalized_latency_s_per_tok": str(v * r),
        }
        for a, v in (("contiguous", 0.1), ("oracle", 0.001))
        for r in (4, 8, 16)
    ]
    for point, row in enumerate(rows):
        (tmp_path / f"p{point}").mkdir()
        (tmp_path / f"p{point}" / "metrics.csv").write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    with pytest.raises(UserError) as refused:
        write_comparison(tmp_path, {"paper": "fig12"})
    assert "oracle on alpaca (rates 4, 8, 16) never exceeds" in str(refused.value)
    assert "(paper_comparison.csv, paper_comparison.md, capacity.csv, fig12_latency.png written" in str(refused.value)
    compared = (tmp_path / "paper_comparison.csv").read_text()
    assert "vLLM / Orca (Oracle)" in compared and "vLLM / Orca (Max)" in compared
    capacity = (tmp_path / "capacity.csv").read_text().splitlines()
    assert len(capacity) == 1 + 3 + 1  # ShareGPT's three systems, Alpaca's contiguous: its oracle is left out


def short_fig14_15(tmp_path, widths: str):
    """fig14_15's parallel sampling on Alpaca for 5 s at `widths`, run in process: (its folder,
    the result, its one error line)."""
    from kvbench import cli

    from helpers.cli import in_process

    sweep = tmp_path / "sweep"
    args = ["+experiment=fig14_15", "workload=alpaca", "fig14_15.sharing=parallel", f"fig14_15.width={widths}"]
    result = in_process(
        lambda: cli.main([*args, "fig14_15.duration_s.alpaca=5", "progress=false", f"hydra.sweep.dir={sweep}"])
    )
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    return sweep, result, error


def test_a_sweep_with_a_failed_point_still_compares_the_points_that_ran(tmp_path):
    """The failed points' exit (2) came before the comparison, which was never written."""
    sweep, result, error = short_fig14_15(tmp_path, "2,300")
    assert result.returncode == 2
    assert "1 of 2 points of the sweep failed" in error and "paper_comparison.md compares the others" in error
    compared = pd.read_csv(sweep / "paper_comparison.csv")
    assert compared["quantity"].tolist() == ["% KV blocks saved, parallel sampling n=2"]
    listed = (sweep / "paper_comparison.md").read_text().split("failed and are not compared")[1]
    assert "fig14_15.width=300" in listed and "can never run with scheduler.max_num_seqs=256" in listed
    assert "fig14_15.width=2," not in listed
    # the report, written before the comparison, has it too: above the results, with its figure
    page = (sweep / "report.html").read_text()
    section = page.split("<h2>Against the paper</h2>")[1].split("<h2>Results</h2>")[0]
    assert "parallel sampling n=2" in section and "fig14_15_sharing.png" in section


def test_a_sweep_whose_paper_comparison_crashes_exits_1_with_one_line(tmp_path, monkeypatch):
    """A bug there raised inside Hydra's callback, which only warns: the sweep exited 0."""
    from kvbench.reporting import paper

    def crash(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(paper, "write_comparison", crash)
    sweep, result, error = short_fig14_15(tmp_path, "2")
    assert result.returncode == 1
    assert error.startswith(f"error: the sweep's paper comparison in {sweep} could not be written (KeyError: ")
    assert (sweep / "report.html").is_file() and (sweep / "summary.csv").is_file()


LOST = {"8": "0.10", "16": "0.12", "32": "0.10", "64": "0.20"}


def test_fig18_names_block_sizes_that_tie_and_decides_nothing_from_a_tie_with_16():
    """A load no block size strains ties them all: the first folder's (128, in text order) was
    reported as the best, 700 % off the paper; then the one nearest 16, a match by construction."""
    tied = [ok_row(allocator="paged", block_size=b) for b in ("128", "16", "8")]
    (row,) = fig18(tied, {})
    assert (
        row["quantity"]
        == "block size of lowest normalized latency (tied: 8, 16, 128; this load does not tell them apart)"
    )
    assert math.isnan(row["kvbench"]) and math.isnan(row["delta"])
    assert "| 16 | n/a | n/a | n/a |" in markdown([row], "fig18")
    slower = [ok_row(allocator="paged", block_size="8", normalized_latency_s_per_tok="0.3"), *tied[:2]]
    (row,) = fig18(slower, {})
    assert row["quantity"].startswith("block size of lowest normalized latency (tied: 16, 128;")
    (row,) = fig18([ok_row(allocator="paged", block_size="8", normalized_latency_s_per_tok=""), *tied[:2]], {})
    assert "tied: 16, 128;" in row["quantity"]  # a block size whose points finished nothing is no candidate
    # a tie without 16, which is slower: the paper's choice lost, and the delta says by how much
    lost = [ok_row(allocator="paged", block_size=b, normalized_latency_s_per_tok=t) for b, t in LOST.items()]
    (row,) = fig18(lost, {})
    assert row["quantity"] == "block size of lowest normalized latency (tied: 8, 32)"
    assert (row["kvbench"], row["delta"]) == (8, -8)
    # 16 not run: the best of the others says nothing of it
    (row,) = fig18([r for r in lost if r["block_size"] != "16"], {})
    assert row["quantity"].endswith("(tied: 8, 32; 16 not run: of the blocks run, 8 and 32 lowest)")
    assert math.isnan(row["kvbench"])
    no_finish = [r if r["block_size"] != "16" else {**r, "normalized_latency_s_per_tok": ""} for r in lost]
    (row,) = fig18(no_finish, {})
    assert "16 finished no request: of the blocks run, 8 and 32 lowest" in row["quantity"]
    (row,) = fig18([ok_row(block_size="32", normalized_latency_s_per_tok="0.05"), *tied], {})
    assert row["quantity"] == "block size of lowest normalized latency" and row["kvbench"] == 32
    assert "| 16 | 32 | +16 | +100.0 |" in markdown([row], "fig18")


def test_fig13_compares_a_point_only_with_its_own_workload_s_number():
    """Matched by rate alone, ShareGPT at 30 req/s was scored against Alpaca's batch, and two
    workloads at one rate were averaged into one row."""
    at = {"allocator": "paged", "model": "opt-13b", "hardware": "a100-40gb"}
    wrong = [ok_row(**at, workload="sharegpt", rate="30.0", mean_batch_size="34")]
    assert FIGURES["fig13"](wrong, {}) == []
    both = [ok_row(**at, workload=w, rate="2.0", mean_batch_size=b) for w, b in (("sharegpt", "30"), ("trace", "20"))]
    both.append(ok_row(**at, workload="alpaca", rate="2.0", mean_batch_size="90"))
    compared = FIGURES["fig13"](both, {})
    assert [(r["workload"], r["kvbench"], r["runs"]) for r in compared] == [
        ("sharegpt", 30, 1),
        ("sharegpt (trace)", 20, 1),
    ]


def test_fig12_narrowed_to_paged_and_oracle_takes_its_ratios_against_oracle(tmp_path):
    """The experiment allows the pair; its capacity.csv was refused ("report.baseline='contiguous'
    is not a system of the sharegpt sweep") after every point had run."""
    rows = curve("oracle", {1: 0.1, 2: 0.2, 4: 2.0}) + curve("paged", {1: 0.05, 2: 0.1, 4: 0.2, 8: 5.0})
    for point, row in enumerate(rows):
        (tmp_path / f"p{point}").mkdir()
        (tmp_path / f"p{point}" / "metrics.csv").write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    write_comparison(tmp_path, {"paper": "fig12"}, plots=False)
    capacity = pd.read_csv(tmp_path / "capacity.csv").set_index("allocator")
    assert capacity.loc["oracle", "ratio_to_oracle"] == 1.0 and capacity.loc["paged", "ratio_to_oracle"] > 1
    assert capacity.loc["paged", "between_req_s"] == "4-8"


def test_a_curve_whose_higher_rates_failed_says_so_rather_than_to_sweep_higher():
    rows = curve("paged", {1: 0.05, 2: 0.1}) + [{**curve("paged", {4: ""})[0], "status": "failed"}]
    with pytest.raises(UserError, match=r"its points at 4 req/s failed \(summary.csv says why\): rerun them"):
        capacities(rows, slo=0.5)


def test_a_capacity_well_above_what_its_system_served_says_a_finer_sweep_would_place_it_lower():
    """1, 2, 4, 8 req/s put paged's capacity at 2.62 req/s, interpolated in log latency across
    its knee, where it served 2.22 at most (and a sweep between 2.2 and 2.4 placed it at 2.29):
    the console and the report said 2.62 with nothing but its bracket."""
    served = {1: 0.93, 2: 1.885, 4: 2.146, 8: 2.221}
    rows = curve("paged", {1: 0.0363, 2: 0.0949, 4: 20.4014, 8: 67.7697})
    rows = [{**r, "request_throughput": str(served[float(r["rate"])])} for r in rows]
    (found,) = capacities(rows, slo=0.5).values()
    assert round(found, 2) == 2.62 and found.served == 2.221
    row = capacity_row("sharegpt", "paged", found)
    assert row["over_served"] and row["served_max_req_s"] == 2.221 and row["between_req_s"] == "2-4"
    assert capacity_note(pd.Series(row)) == (
        "; above the 2.22 req/s it served at most: a finer sweep between 2 and 4, or a longer "
        "workload.duration_s, places it lower"
    )
    close = [{**r, "request_throughput": "2.14"} for r in curve("paged", {2.2: 0.2649, 2.4: 1.2291})]
    (found,) = capacities(close, slo=0.5).values()  # 2.28, within 10 % of the 2.14 served: the rates' own gap
    assert not capacity_row("sharegpt", "paged", found)["over_served"]
    tiny = {"over_served": True, "served_max_req_s": 1e-05, "between_req_s": "2e-05-4e-05"}
    assert capacity_note(pd.Series(tiny)).endswith(
        "between 2e-05 and 4e-05, or a longer workload.duration_s, places it lower"
    )
    (found,) = capacities(curve("paged", {1: 0.05, 2: 5.0}), slo=0.5).values()  # no throughput column
    assert not capacity_row("sharegpt", "paged", found)["over_served"] and capacity_note(pd.Series({})) == ""


def test_a_fig12_ratio_whose_capacity_is_above_what_its_system_served_says_so():
    """A capacity past what a system served is the window's, not the system's (a short window
    keeps latency under the target at rates it cannot sustain): its ratio names it."""
    found = {
        ("sharegpt", "paged"): Capacity(2.53, (2.5, 3.0), served=2.05),
        ("sharegpt", "oracle"): Capacity(1.15, (1.0, 1.25), served=1.11),
        ("sharegpt", "contiguous"): Capacity(0.67, (0.5, 0.75), served=0.70),
    }
    rows = {row["system"]: row["quantity"] for row in fig12(found, 0.5)}
    assert rows["vLLM / Orca (Oracle)"] == (
        "capacity ratio at 0.5 s/token (vLLM above what it served: capacity.csv, over_served)"
    )
    found[("sharegpt", "paged")] = Capacity(2.16, (2.0, 2.25), served=2.14)
    assert [row["quantity"] for row in fig12(found, 0.5)] == ["capacity ratio at 0.5 s/token"] * 2


def test_the_comparison_says_what_ran_and_that_another_model_is_compared_by_its_shape():
    """fig14_15 served on the tiny model at its default rate read as the paper's OPT-13B figures,
    'delta +0', with nothing saying what had run."""
    simulated = [ok_row(scenario="simulate", model="opt-13b", hardware="a100-40gb", workload="alpaca", rate="20.0")]
    assert setup_lines(simulated) == ["kvbench ran: opt-13b on a100-40gb (simulate): alpaca at 20 req/s."]
    swept = [  # a rate sweep of two workloads: each workload's rates once, in order (they were 20 entries)
        ok_row(scenario="simulate", model="opt-13b", hardware="a100-40gb", workload=w, rate=r, allocator=a)
        for r in ("2", "1", "1.5")
        for w in ("sharegpt", "alpaca")
        for a in ("paged", "contiguous")
    ]
    assert setup_lines(swept) == [
        "kvbench ran: opt-13b on a100-40gb (simulate): sharegpt at 1, 1.5, 2 req/s; alpaca at 1, 1.5, 2 req/s."
    ]
    served = [ok_row(scenario="serve", model="tiny", hardware="a100-40gb", device="cpu", workload="alpaca", rate="inf")]
    ran, caveat = setup_lines(served)
    assert ran == "kvbench ran: tiny on cpu (serve): alpaca at inf req/s."
    assert caveat.startswith("The paper's numbers are OPT-13B's on an A100-40GB; these points ran another model")
    page = markdown([], "fig14_15", setup=[ran, caveat])
    assert page.index(ran) < page.index(caveat) < page.index("| figure |")


def test_a_comparison_from_runs_too_short_for_their_rate_says_so_and_names_what_the_command_line_set(tmp_path):
    """`+experiment=fig2 workload.num_requests=20` wrote vLLM's 21 % token states beside the
    paper's 96.3 % with nothing saying its window was a batch draining, nor that 20 was asked."""
    from omegaconf import OmegaConf

    from kvbench.reporting.paper import command_line_settings

    rows = [
        ok_row(
            scenario="simulate",
            model="opt-13b",
            hardware="a100-40gb",
            workload="sharegpt",
            rate="4.0",
            allocator=a,
            window_drained=drained,
        )
        for a, drained in (("contiguous", "False"), ("paged", "True"))
    ]
    task = ["+experiment=fig2", "workload.num_requests=20", "progress=false", "hydra.sweep.dir=x", "seed=1"]
    OmegaConf.save(OmegaConf.create({"hydra": {"overrides": {"task": task}}}), tmp_path / "multirun.yaml")
    given = command_line_settings(tmp_path)
    assert given == ["workload.num_requests=20", "seed=1"]  # not the experiment, Hydra's keys, nor how it ran
    ran, said, drained = setup_lines(rows, given)
    assert said == "Besides the experiment, the command line set: workload.num_requests=20, seed=1."
    assert drained.startswith("1 of the 2 points compared admitted every request within their warm-up")
    assert setup_lines(rows[:1]) == [ran]  # a steady window, nothing set: nothing said
    assert command_line_settings(tmp_path / "nowhere") == []


def test_a_paper_figure_s_title_names_the_device_a_served_point_ran_on():
    """A served fig14_15 on the tiny model was titled "tiny on a100-40gb": the profile its preemption costs read."""
    import pandas as pd

    from kvbench.reporting.paper_plots import _setup

    served = {"scenario": "serve", "model": "tiny", "hardware": "a100-40gb", "device": "cpu"}
    assert _setup(pd.DataFrame([served])) == "tiny on cpu"
    simulated = {"scenario": "simulate", "model": "opt-13b", "hardware": "a100-40gb", "device": "simulated"}
    assert _setup(pd.DataFrame([simulated])) == "opt-13b on a100-40gb"
