"""A single run's figure: drawn from its row without pandas, the same figure a sweep draws for one
point, and by the helper process `bench` starts, or by the run itself where the helper fails."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hydra.core.global_hydra import GlobalHydra

from kvbench import launch
from kvbench.reporting import plots
from kvbench.reporting.run_figure import breakdown_of_row, draw_run

PNG = b"\x89PNG\r\n\x1a\n"
KV_COLUMNS = ["kv_token_util", "kv_reserved_frac", "kv_internal_frag_frac", "kv_rounding_frac", "kv_external_frag_frac"]
ROW = {
    "scenario": "simulate",
    "allocator": "pow2",
    "model": "opt-13b",
    "hardware": "a100-40gb",
    "workload": "sharegpt",
    "kv_token_util": 0.412,
    "kv_reserved_frac": 0.301,
    "kv_internal_frag_frac": 0.087,
    "kv_rounding_frac": math.nan,  # drawn as 0, as the sweep's figure fills a missing share
    "kv_external_frag_frac": 0.2,
    "status": "ok",
}


def drawn(fig) -> dict:
    """What a KV breakdown shows: each stack's heights and bottoms, the ticks, titles and legend."""
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    shown = {
        "stacks": [[(bar.get_height(), bar.get_y()) for bar in stack] for stack in ax.containers],
        "ticks": [t.get_text() for t in ax.get_xticklabels()],
        "xlim": ax.get_xlim(),
        "title": fig.get_suptitle(),
        "legend": [t.get_text() for t in fig.legends[0].get_texts()],
        "size": tuple(fig.get_size_inches()),
    }
    return shown


def test_a_single_runs_figure_is_the_sweeps_figure_of_its_one_point():
    one = drawn(breakdown_of_row(ROW))
    assert one == drawn(plots.kv_breakdown(pd.DataFrame([ROW])))
    heights = [stack[0][0] for stack in one["stacks"]]
    assert heights == pytest.approx([41.2, 30.1, 8.7, 0.0, 20.0])
    assert one["ticks"] == ["pow2"] and "opt-13b on a100-40gb, sharegpt workload (simulate)" in one["title"]


@pytest.mark.parametrize("allocator", ["pow2", "contiguous", "a-third-party-allocator-with-a-long-name"])
def test_a_single_runs_figure_holds_all_it_draws_so_it_is_saved_uncropped(allocator):
    """draw_run saves it without bbox_inches="tight", laid out by fixed margins: nothing drawn
    (legend, titles, tick and axis labels) may reach past the figure's edges, or the PNG would
    cut it off, nor overlap another."""
    fig = breakdown_of_row({**ROW, "allocator": allocator, "model": "qwen3-next-like", "hardware": "h100-sxm"})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    drawn_box = fig.get_tightbbox(renderer)  # in inches, as the crop would take it
    width, height = fig.get_size_inches()
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    (tick,) = ax.get_xticklabels()
    tick_box, legend_box = tick.get_window_extent(renderer), fig.legends[0].get_window_extent(renderer)
    title_box, axes_box = fig._suptitle.get_window_extent(renderer), ax.get_window_extent(renderer)
    label_box = ax.yaxis.label.get_window_extent(renderer)
    assert 0 <= drawn_box.x0 and drawn_box.x1 <= width and 0 <= drawn_box.y0 and drawn_box.y1 <= height
    assert tick.get_text() == allocator and legend_box.y1 < tick_box.y0  # the label above the legend
    assert axes_box.y1 < title_box.y0 and label_box.x0 > 0


def test_a_single_run_draws_its_figure_without_loading_pandas(tmp_path):
    code = (
        "import json, sys; from pathlib import Path; from kvbench.reporting.run_figure import draw_run; "
        "print([p.name for p in draw_run([json.loads(sys.argv[2])], Path(sys.argv[1]))], 'pandas' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), json.dumps(ROW)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["['kv_breakdown.png']", "False"]
    assert (tmp_path / "kv_breakdown.png").read_bytes()[:8] == PNG


def test_rows_without_serving_metrics_draw_nothing_and_a_kernel_runs_rows_go_to_the_sweep_plots(tmp_path, monkeypatch):
    assert draw_run([{**ROW, "kv_token_util": math.nan}], tmp_path) == []
    assert draw_run([{"scenario": "profile", "status": "ok"}], tmp_path) == []
    assert list(tmp_path.iterdir()) == []
    handed = []
    monkeypatch.setattr(plots, "draw_all", lambda rows, out: handed.append((rows, out)) or [])
    kernel = [{"scenario": "kernel", "latency_us_p50": 12.5, "context_len": n} for n in (256, 1024)]
    draw_run(kernel, tmp_path)
    draw_run(kernel[:1], tmp_path)  # one kernel row too: not a KV breakdown
    assert handed == [(kernel, tmp_path), (kernel[:1], tmp_path)]


def run_job(out) -> dict:
    return {"job": "run", "rows": [ROW], "out": str(out)}


def test_the_helper_draws_the_run_it_is_sent_and_names_the_file(tmp_path):
    helper = launch.Helper("run")
    helper.send(run_job(tmp_path))
    assert helper.result() == {"written": [str(tmp_path / "kv_breakdown.png")]}
    assert (tmp_path / "kv_breakdown.png").read_bytes()[:8] == PNG
    assert helper._process.returncode == 0


def test_a_helper_that_died_gives_no_result_and_the_run_draws_its_own_figure(tmp_path, monkeypatch):
    helper = launch.Helper("run")
    helper._process.kill()
    helper._process.wait()
    monkeypatch.setattr(launch, "_helper", helper)
    assert launch.helper_does(run_job(tmp_path)) is None
    assert launch.current() is None  # its one job was handed over
    assert not (tmp_path / "kv_breakdown.png").exists()


def test_a_job_that_fails_in_the_helper_gives_no_result(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    helper = launch.Helper("run")
    helper.send({"job": "run", "rows": [ROW], "out": str(tmp_path / "a-file")})
    assert helper.result() is None
    assert helper._process.returncode == 1


def test_a_helper_given_no_job_is_stopped_when_the_run_ends():
    helper = launch.Helper("sweep")
    helper.close()
    assert helper._process.poll() is not None


@pytest.mark.parametrize(
    "args, kind",
    [
        ([], "run"),
        (["+allocator=paged", "workload.num_requests=10"], "run"),
        (["plots=true"], "run"),
        (["plots=false"], None),
        (["plots=auto"], None),
        (["-m", "+allocator=paged,pow2"], "sweep"),
        (["--multirun", "+allocator=paged", "plots=false"], "sweep"),  # its summary and report still
        (["--help"], None),
        (["--cfg", "job"], None),
        (["-m", "--info"], None),
    ],
)
def test_the_command_line_decides_which_helper_is_started(args, kind):
    assert launch.helper_kind(args) == kind


def run_bench(monkeypatch, tmp_path, cpus: int) -> list:
    """`bench` (launch.main) in this process, as the console script runs it; the helpers started.
    The run succeeds, so `bench` leaves without the interpreter's teardown (launch.leave, which
    is recorded here instead: it would end the test process)."""
    started, left = [], []
    monkeypatch.setattr(launch, "leave", lambda: left.append(True))

    class Recorded(launch.Helper):
        def __init__(self, kind):
            super().__init__(kind)
            self.answers = []
            started.append(self)

        def ask(self, message, timeout_s):
            self.answers.append(super().ask(message, timeout_s))
            return self.answers[-1]

        def send(self, job):
            self.jobs = [*getattr(self, "jobs", []), job]
            super().send(job)

    monkeypatch.setattr(launch, "Helper", Recorded)
    monkeypatch.setattr(launch, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(
        sys, "argv", ["bench", "workload.num_requests=5", "progress=false", f"hydra.run.dir={tmp_path}"]
    )
    try:
        launch.main()
    finally:
        GlobalHydra.instance().clear()
    assert (tmp_path / "kv_breakdown.png").read_bytes()[:8] == PNG
    assert left == [True]
    return started


def test_bench_on_two_cores_has_its_helper_draw_the_figure_and_write_the_requests(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")  # restored (unset) after the test
    (helper,) = run_bench(monkeypatch, tmp_path, cpus=2)
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"  # set before numpy's import; the helper inherits it
    assert helper.sent and helper._process.returncode == 0  # it drew the figure and left
    # it wrote the 5 requests' lines from the run's spool and counted their gaps: the row's ITL columns
    ((answer,),) = [helper.answers]
    assert answer["written"] == 5
    requests = pd.read_json(tmp_path / "requests.jsonl", lines=True)
    assert len(requests) == 5
    (row,) = pd.read_csv(tmp_path / "metrics.csv").to_dict("records")
    gaps_ms = np.concatenate(requests["itl_s"].tolist()) * 1e3
    assert answer["itl"]["median_itl_ms"] == pytest.approx(np.median(gaps_ms), abs=1e-5)  # itl_s: to the ns
    assert [row[f"{s}_itl_ms"] for s in ("mean", "median", "p99")] == pytest.approx(
        [answer["itl"][f"{s}_itl_ms"] for s in ("mean", "median", "p99")], abs=1e-8
    )
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".requests")) == []
    assert launch.current() is None
    # the figure's job left as the summary had the KV shares, before the latencies and the row
    # (recorder.shares_ready): its row is the identity and the shares, and draws the same bytes
    ((job_row,),) = [job["rows"] for job in helper.jobs]
    assert "request_throughput" not in job_row and job_row["allocator"] == row["allocator"]
    assert [job_row[k] for k in KV_COLUMNS] == pytest.approx([row[k] for k in KV_COLUMNS], abs=1e-9)
    drawn = draw_run([row], tmp_path / "again")
    assert drawn[0].read_bytes() == (tmp_path / "kv_breakdown.png").read_bytes()


def test_bench_on_one_core_draws_its_figure_itself(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert run_bench(monkeypatch, tmp_path, cpus=1) == []
    assert os.environ["OPENBLAS_NUM_THREADS"] == "2"  # the user's setting stands


def test_bench_leaves_at_once_only_where_torch_was_not_loaded(monkeypatch):
    """launch.leave ends the process without the interpreter's teardown: flushed, exit code 0;
    where torch was loaded (its worker pools shut down at exit) it leaves that to the teardown."""
    exits = []
    monkeypatch.setattr(launch.os, "_exit", exits.append)
    monkeypatch.setitem(sys.modules, "torch", object())
    launch.leave()
    assert exits == []
    monkeypatch.delitem(sys.modules, "torch")
    launch.leave()
    assert exits == [0]
