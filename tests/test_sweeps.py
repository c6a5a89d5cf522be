"""Sweeps: the joblib launcher, resuming an interrupted sweep, failing points, profiler traces."""

from __future__ import annotations

import csv
import gzip
import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from kvbench.profiling import chrome_trace

SMALL = ["workload.duration_s=null", "progress=false"]
BENCH = [sys.executable, "-m", "kvbench.cli"]


def bench(cwd, *args):
    return subprocess.run([*BENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def summary(sweep_dir) -> list[dict]:
    with open(sweep_dir / "summary.csv") as f:
        return list(csv.DictReader(f))


def test_four_point_sweep_under_the_joblib_launcher(tmp_path):
    result = bench(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                   "+allocator=contiguous,oracle,pow2,paged", "workload.num_requests=50", *SMALL,
                   "hydra.sweep.dir=sweep")
    assert result.returncode == 0, result.stderr
    assert "Joblib.Parallel(n_jobs=2" in result.stdout + result.stderr
    rows = summary(tmp_path / "sweep")  # written by the SweepSummary callback after the jobs
    assert sorted(r["allocator"] for r in rows) == ["contiguous", "oracle", "paged", "pow2"]
    assert all(r["status"] == "ok" and r["completed"] == "50" for r in rows)
    assert len(list((tmp_path / "sweep").glob("*/metrics.csv"))) == 4
    assert (tmp_path / "sweep" / "report.html").is_file()


def test_interrupted_sweep_resumes_without_redoing_finished_points(tmp_path):
    # The third point is long enough to be interrupted (Ctrl-C) while it runs.
    args = ["-m", "+allocator=paged", "workload.num_requests=40,41,5000", *SMALL, "hydra.sweep.dir=sweep"]
    sweep = tmp_path / "sweep"
    # A shell that starts jobs in the background makes them ignore SIGINT: give it back.
    proc = subprocess.Popen([*BENCH, *args], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while len(list(sweep.glob("*/metrics.csv"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)

    finished = sorted(sweep.glob("*/metrics.csv"))
    assert [p.parent.name.split("=")[-1] for p in finished] == ["40", "41"], "the third point was not interrupted"
    assert not (sweep / "summary.csv").exists()
    assert not [p for p in sweep.rglob("*") if p.name.endswith(".tmp")]  # no half-written file
    mtimes = {p: p.stat().st_mtime_ns for p in finished}

    result = bench(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("skipped") + result.stderr.count("skipped") == 2
    assert {p: p.stat().st_mtime_ns for p in finished} == mtimes
    rows = summary(sweep)
    assert sorted(int(r["workload.num_requests"]) for r in rows) == [40, 41, 5000]
    assert all(r["status"] == "ok" for r in rows)


def test_a_failing_point_is_recorded_and_the_sweep_goes_on_then_retried(tmp_path):
    args = ["-m", "+allocator=paged", "allocator.block_size=300,16", "workload.num_requests=40", *SMALL,
            "hydra.sweep.dir=sweep"]
    result = bench(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    rows = {r["block_size"]: r for r in summary(tmp_path / "sweep")}
    assert rows["16"]["status"] == "ok" and rows["16"]["completed"] == "40"
    assert rows["300"]["status"] == "failed"
    assert "allocator.block_size=300 is not allowed for paged" in rows["300"]["reason"]

    metrics = {p.parent.name: p for p in (tmp_path / "sweep").glob("*/metrics.csv")}
    before = {name: p.stat().st_mtime_ns for name, p in metrics.items()}
    time.sleep(0.01)
    assert bench(tmp_path, *args).returncode == 0
    after = {name: p.stat().st_mtime_ns for name, p in metrics.items()}
    ok_point = next(n for n in metrics if "block_size=16" in n)
    failed_point = next(n for n in metrics if "block_size=300" in n)
    assert after[ok_point] == before[ok_point]  # complete: skipped
    assert after[failed_point] > before[failed_point]  # failed: tried again


def test_profile_on_a_simulated_run_is_one_line_exit_2(tmp_path):
    result = bench(tmp_path, "profile=true", "workload.num_requests=10", *SMALL)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: profile=true traces torch operators, and scenario=simulate runs none; "
        "use it with scenario=serve or scenario=kernel"]


@pytest.mark.slow
def test_profile_on_a_kernel_run_writes_a_chrome_trace_beside_the_metrics(tmp_path):
    result = bench(tmp_path, "scenario=kernel", "model=tiny", "+backend=eager", "batch=2d64",
                   "scenario.min_run_time_s=0.01", "profile=true", "progress=false", "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "metrics.csv").is_file()
    events = json.loads(gzip.open(tmp_path / "run" / "trace.json.gz").read())["traceEvents"]
    assert any(str(e.get("name", "")).startswith("aten::") for e in events)


def test_chrome_trace_records_the_torch_operators_of_its_body(tmp_path):
    a = torch.randn(64, 64)
    with chrome_trace(tmp_path / "trace.json.gz"):
        (a @ a).relu()
    events = json.loads(gzip.open(tmp_path / "trace.json.gz").read())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"aten::matmul", "aten::relu"} <= names
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json.gz"]


def test_chrome_trace_writes_nothing_when_the_body_fails(tmp_path):
    with pytest.raises(RuntimeError):
        with chrome_trace(tmp_path / "trace.json.gz"):
            raise RuntimeError("out of memory")
    assert list(tmp_path.iterdir()) == []
