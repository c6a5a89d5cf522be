"""Sweeps: launchers, sweep functions, resuming (after an interrupt, a kill, a config change, a
corrupt point), failing points, time limits, a full disk, one sweep per directory, profiler traces."""

from __future__ import annotations

import csv
import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

from kvbench import cli
from kvbench.errors import GuardedStdout
from kvbench.profiling import chrome_trace
from kvbench.sweep import FINGERPRINT, PointTimeout, SweepLock, deadline

SMALL = ["workload.duration_s=null", "progress=false"]
BENCH = [sys.executable, "-m", "kvbench.launch"]  # the `bench` script's entry: its helper does the sweep's end


def bench(cwd, *args):
    return subprocess.run([*BENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def summary(sweep_dir) -> list[dict]:
    with open(sweep_dir / "summary.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("entry", ["kvbench.launch", "kvbench.cli"])  # cli: as bench-compare --against runs it
def test_four_point_sweep_under_the_joblib_launcher(tmp_path, entry):
    """Run as `python -m kvbench.cli`, a joblib worker could not unpickle __main__'s functions: a
    traceback."""
    args = [
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "+allocator=contiguous,oracle,pow2,paged",
        "workload.num_requests=50",
        *SMALL,
        "hydra.sweep.dir=sweep",
    ]
    result = subprocess.run(
        [sys.executable, "-m", entry, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "Joblib.Parallel(n_jobs=2" in result.stdout + result.stderr
    rows = summary(tmp_path / "sweep")  # written by the SweepSummary callback after the jobs
    assert sorted(r["allocator"] for r in rows) == ["contiguous", "oracle", "paged", "pow2"]
    assert all(r["status"] == "ok" and r["completed"] == "50" for r in rows)
    assert len(list((tmp_path / "sweep").glob("*/metrics.csv"))) == 4
    assert (tmp_path / "sweep" / "report.html").is_file()


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_interrupted_sweep_resumes_without_redoing_finished_points(tmp_path, stop):
    # The third point is long enough to be interrupted (Ctrl-C, or killed) while it runs: about 4 s
    # alone, so that a loaded host that notices the second point late still signals during it.
    args = ["-m", "+allocator=paged", "workload.num_requests=40,41,20000", *SMALL, "hydra.sweep.dir=sweep"]
    sweep = tmp_path / "sweep"
    # A shell that starts jobs in the background makes them ignore SIGINT: give it back.
    proc = subprocess.Popen(
        [*BENCH, *args],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while len(list(sweep.glob("*/fingerprint.json"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(stop)
    _, err = proc.communicate(timeout=60)

    finished = sorted(sweep.glob("*/metrics.csv"))
    assert [p.parent.name.split("=")[-1] for p in finished] == ["40", "41"], (
        f"the third point was not interrupted (exit {proc.returncode}); its stderr ends: {err.decode()[-1500:]}"
    )
    assert not (sweep / "summary.csv").exists()
    if stop != signal.SIGKILL:  # SIGTERM ended the process where it stood: a 70 MB spool left, no line said
        assert not [p for p in sweep.rglob("*") if p.name.endswith(".tmp")]  # no half-written file
        assert proc.returncode == 128 + stop
        said = "interrupted" if stop == signal.SIGINT else "terminated by SIGTERM"
        assert err.decode().splitlines()[-1].startswith(f"{said}: the points that finished keep their rows")
    mtimes = {p: p.stat().st_mtime_ns for p in finished}

    result = bench(tmp_path, *args)  # the killed sweep's lock went with its process
    assert result.returncode == 0, result.stderr
    assert not [p for p in sweep.rglob("*") if p.name.endswith(".tmp")]  # a killed point's spool: gone as it reran
    assert result.stdout.count("skipped") + result.stderr.count("skipped") == 2
    assert {p: p.stat().st_mtime_ns for p in finished} == mtimes
    rows = summary(sweep)
    assert sorted(int(r["workload.num_requests"]) for r in rows) == [40, 41, 20000]
    assert all(r["status"] == "ok" for r in rows)


def test_a_failing_point_is_recorded_and_the_sweep_goes_on_then_retried(tmp_path):
    # a prompt longer than a step's token budget: the config is valid, the run refuses it
    args = [
        "-m",
        "+allocator=paged",
        "scheduler.max_num_batched_tokens=16,4096",
        "workload.num_requests=40",
        *SMALL,
        "hydra.sweep.dir=sweep",
    ]
    result = bench(tmp_path, *args)
    assert result.returncode == 2  # a point was refused: the sweep says so, after recording every point
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: 1 of 2 points of the sweep failed") and "max_num_batched_tokens=16" in line
    rows = {r["scheduler.max_num_batched_tokens"]: r for r in summary(tmp_path / "sweep")}
    assert rows["4096"]["status"] == "ok" and rows["4096"]["completed"] == "40"
    assert rows["16"]["status"] == "failed"
    assert "exceeds scheduler.max_num_batched_tokens=16" in rows["16"]["reason"]

    metrics = {p.parent.name: p for p in (tmp_path / "sweep").glob("*/metrics.csv")}
    before = {name: p.stat().st_mtime_ns for name, p in metrics.items()}
    time.sleep(0.01)
    assert bench(tmp_path, *args).returncode == 2
    after = {name: p.stat().st_mtime_ns for name, p in metrics.items()}
    ok_point = next(n for n in metrics if "tokens=4096" in n)
    failed_point = next(n for n in metrics if "tokens=16" in n)
    assert after[ok_point] == before[ok_point]  # complete: skipped
    assert after[failed_point] > before[failed_point]  # failed: tried again


def sweep_in_process(tmp_path, monkeypatch, *args):
    monkeypatch.chdir(tmp_path)
    try:
        cli.main(["-m", *args, *SMALL, "hydra.sweep.dir=sweep"])
    finally:
        GlobalHydra.instance().clear()


def refused_sweep(tmp_path, monkeypatch, capsys, *args) -> str:
    """A sweep run in process that must end with exit code 2; its error line, the one line it
    writes to stderr (what earlier commands of the test wrote is dropped first)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        sweep_in_process(tmp_path, monkeypatch, *args)
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()  # one line, nothing else
    return line


def test_the_helper_ends_a_sweep_as_the_sweep_does_itself(tmp_path, monkeypatch):
    from kvbench import launch
    from kvbench.reporting.report import end_of_sweep

    with pytest.raises(SystemExit) as stop:  # a budget of 16 tokens fails its points: exit code 2
        sweep_in_process(
            tmp_path,
            monkeypatch,
            "+allocator=pow2,paged",
            "scheduler.max_num_batched_tokens=16,4096",
            "workload.num_requests=20",
        )
    assert stop.value.code == 2
    sweep = tmp_path / "sweep"
    itself = end_of_sweep(sweep, plots=True)
    assert itself["rows"] == 4 and len(itself["failed"]) == 2  # the two points of a 16-token budget
    files = {name: (sweep / name).read_bytes() for name in ("summary.csv", "kv_breakdown.png")}
    for name in ("summary.csv", "report.html", "kv_breakdown.png", "throughput_latency.png"):
        (sweep / name).unlink()
    helper = launch.Helper("sweep")
    helper.send({"job": "sweep", "dir": str(sweep), "plots": True})
    assert helper.result() == itself  # the same files named, the same table, the same failed points
    assert {name: (sweep / name).read_bytes() for name in files} == files
    assert (sweep / "report.html").is_file()


@pytest.mark.parametrize(
    "swept, point, reason",
    [
        ("allocator.block_size=16,300", "allocator.block_size=300", "allocator.block_size=300 must be <= 256"),
        (
            "model=tiny,tiny-gemma3",
            "model=tiny-gemma3",
            "allocator paged cannot hold the window layers of model tiny-gemma3",
        ),
    ],
    ids=["schema", "layers"],
)
def test_a_point_a_run_would_refuse_stops_the_sweep_before_any_point_runs(
    tmp_path, monkeypatch, capsys, swept, point, reason
):
    line = refused_sweep(tmp_path, monkeypatch, capsys, "+allocator=paged", swept, "workload.num_requests=20")
    assert line.startswith(f"error: the sweep's point +allocator=paged,{point}") and reason in line
    assert line.endswith("no point has run: fix or drop that value")
    assert not list((tmp_path / "sweep").glob("*/metrics.csv"))


def test_a_value_that_resolves_only_as_its_point_launches_is_left_to_the_point(tmp_path, monkeypatch):
    """`seed=${hydra:job.num}` (a seed per point, a Hydra idiom) resolves in each point's own
    Hydra settings: the check before the first point leaves it alone, and the sweep's end reads
    the command line without resolving it (it raised "HydraConfig was not set" there)."""
    sweep_in_process(
        tmp_path, monkeypatch, "+allocator=paged,pow2", "seed=${hydra:job.num}", "workload.num_requests=20"
    )
    rows = summary(tmp_path / "sweep")
    assert sorted((r["allocator"], r["seed"], r["status"]) for r in rows) == [("paged", "0", "ok"), ("pow2", "1", "ok")]
    assert (tmp_path / "sweep" / "report.html").is_file()


def test_a_subdir_that_puts_points_outside_the_sweep_as_they_launch_is_refused(tmp_path, monkeypatch, capsys):
    """`hydra.sweep.subdir=../x${hydra.job.num}` resolves only as each point launches, so the
    check before the sweep cannot see it; the first point refuses it before it runs (the points
    ran into ../x0, ../x1, and the sweep's end said it had no points)."""
    line = refused_sweep(
        tmp_path,
        monkeypatch,
        capsys,
        "+allocator=paged,pow2",
        "workload.num_requests=10",
        "hydra.sweep.subdir=../x${hydra.job.num}",
    )
    assert line.startswith(
        "error: hydra.sweep.subdir gives a point the folder '../x0', not a folder directly in the sweep's"
    )
    assert not list(tmp_path.glob("*/metrics.csv")) and not (tmp_path / "x1").exists()
    assert not (tmp_path / "x0").exists() and not (tmp_path / "sweep").exists()  # Hydra's files for them: removed


@pytest.mark.parametrize(
    "swept, said",
    [
        ("workload.rate=range(1,9,0)", "error: range(start, stop, step) needs a step other than 0"),
        ("+allocator=glob(x*)", "error: the sweep has no points: a value list on the command line is empty"),
        ("seed=range(0,1000000)", "error: the sweep has 1,000,000 points (seed=range(0,1000000): 1,000,000)"),
    ],
)
def test_a_sweep_refused_before_its_points_are_checked_leaves_no_folder(tmp_path, monkeypatch, capsys, swept, said):
    """Each took the sweep folder's lock first, and left the folder behind holding only it (a
    million-point range ran silently for minutes, checking its points, before any refusal)."""
    line = refused_sweep(tmp_path, monkeypatch, capsys, swept)
    assert line.startswith(said)
    assert not (tmp_path / "sweep").exists()


def test_a_range_sweep_runs_one_point_per_value(tmp_path, monkeypatch):
    sweep_in_process(tmp_path, monkeypatch, "workload.rate=range(1,4)", "workload.num_requests=20")
    rows = summary(tmp_path / "sweep")
    assert sorted(r["workload.rate"] for r in rows) == ["1", "2", "3"]
    assert all(r["status"] == "ok" for r in rows)


def test_glob_and_choice_sweeps_and_interpolations_compose(tmp_path, monkeypatch):
    sweep_in_process(
        tmp_path,
        monkeypatch,
        "+allocator=glob(p*)",
        "seed=choice(0,1)",
        "workload.num_requests=${scheduler.max_num_seqs}",
        "scheduler.max_num_seqs=12",
    )
    rows = summary(tmp_path / "sweep")
    assert sorted((r["allocator"], r["seed"]) for r in rows) == [
        ("paged", "0"),
        ("paged", "1"),
        ("pow2", "0"),
        ("pow2", "1"),
    ]
    assert {r["completed"] for r in rows} == {"12"}


def test_a_resume_reruns_points_whose_config_changed_or_whose_metrics_are_corrupt(tmp_path, monkeypatch, capsys):
    args = ("workload.rate=1,2,3,4", "workload.num_requests=20")
    sweep_in_process(tmp_path, monkeypatch, *args)
    points = {p.name.split("=")[-1]: p for p in (tmp_path / "sweep").iterdir() if p.is_dir()}
    header, cells = (line.split(",") for line in (points["4"] / "metrics.csv").read_text().splitlines())
    cells[header.index("request_throughput")] = "abc"  # read back as the report reads it, not skipped
    (points["4"] / "metrics.csv").write_text(",".join(header) + "\n" + ",".join(cells) + "\n")
    changed = json.loads((points["1"] / FINGERPRINT).read_text())
    changed["config_sha256"] = "0" * 64  # as if computed from another config
    (points["1"] / FINGERPRINT).write_text(json.dumps(changed))
    (points["2"] / "metrics.csv").write_bytes(b"\xff\x00 half a row")
    kept = (points["3"] / "metrics.csv").stat().st_mtime_ns
    capsys.readouterr()

    sweep_in_process(tmp_path, monkeypatch, *args)
    log = capsys.readouterr().out
    assert f"re-running {points['1'].name}: changed since it ran: its config" in log
    assert f"re-running {points['2'].name}: its metrics.csv is unreadable" in log
    assert f"re-running {points['4'].name}: its metrics.csv is unreadable (request_throughput is 'abc'" in log
    assert f"skipped {points['3'].name}" in log
    assert (points["3"] / "metrics.csv").stat().st_mtime_ns == kept
    assert json.loads((points["1"] / FINGERPRINT).read_text())["config_sha256"] != "0" * 64
    assert sorted(r["status"] for r in summary(tmp_path / "sweep")) == ["ok"] * 4


@pytest.mark.parametrize(
    "stored, why",
    [
        ([1], "its fingerprint is not one a run wrote (not a JSON object)"),
        ({"config_sha256": "a", "input_files": 5}, "changed since it ran: the file at t.csv"),
    ],
)
def test_a_fingerprint_that_is_json_but_not_a_run_s_reruns_its_point(tmp_path, stored, why):
    from kvbench.sweep import resume

    (tmp_path / "metrics.csv").write_text("scenario,allocator,status,request_throughput\nsimulate,paged,ok,2.0\n")
    (tmp_path / FINGERPRINT).write_text(json.dumps(stored))
    assert resume(tmp_path, {"config_sha256": "a", "input_files": {"t.csv": "sha"}}) == (False, why)


def test_a_resume_reruns_the_points_of_a_trace_rewritten_in_place(tmp_path, monkeypatch, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("input_len,output_len\n20,5\n30,6\n25,4\n")
    args = ("+allocator=contiguous,paged", "workload=trace", f"workload.path={trace}")
    sweep_in_process(tmp_path, monkeypatch, *args)
    assert {r["total_input_tokens"] for r in summary(tmp_path / "sweep")} == {"75"}
    capsys.readouterr()
    sweep_in_process(tmp_path, monkeypatch, *args)  # the same file: nothing to redo
    assert capsys.readouterr().out.count("skipped ") == 2

    trace.write_text("input_len,output_len\n1000,500\n1000,500\n")  # the config names the same path
    sweep_in_process(tmp_path, monkeypatch, *args)
    assert capsys.readouterr().out.count("changed since it ran: the file at workload.path") == 2
    assert {r["total_input_tokens"] for r in summary(tmp_path / "sweep")} == {"2000"}


PLUGIN = """
from kvbench.hookspecs import hookimpl
from kvbench.plugins.allocators.contiguous import OracleAllocator


class ThirdPartyOracle(OracleAllocator):
    name = "third_party_oracle"


@hookimpl
def kvbench_allocators():
    return [ThirdPartyOracle]
"""


def test_a_resume_reruns_the_points_of_a_third_party_plugin_edited_in_place(tmp_path, monkeypatch, capsys):
    """kvbench's git sha names its own plugins' code, not another package's: that one's source
    file is in the fingerprint, so an edit (or an upgrade in place) runs its points again."""
    import importlib

    from kvbench.registry import default_registry

    (tmp_path / "third_party_alloc.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("third_party_alloc")
    default_registry().register(module)
    try:
        args = ("+allocator=oracle", "allocator.name=third_party_oracle", "workload.rate=1,2")
        args = (*args, "workload.num_requests=20")
        sweep_in_process(tmp_path, monkeypatch, *args)
        sweep_in_process(tmp_path, monkeypatch, *args)
        assert capsys.readouterr().out.count("skipped ") == 2
        (tmp_path / "third_party_alloc.py").write_text(PLUGIN + "# a fix\n")
        sweep_in_process(tmp_path, monkeypatch, *args)
        log = capsys.readouterr().out
        assert log.count("changed since it ran: the allocator plugin's code (third_party_alloc)") == 2
        assert "skipped " not in log
    finally:
        default_registry().unregister(module)
    rows = summary(tmp_path / "sweep")
    assert sorted(r["allocator"] for r in rows) == ["third_party_oracle"] * 2
    # its options as its YAML set them are columns: a YAML changed between two sweeps makes other points
    assert {r["allocator.placement"] for r in rows} == {"buddy"}


def test_a_sweep_into_a_folder_holding_another_sweep_s_points_is_refused_before_its_first(
    tmp_path, monkeypatch, capsys
):
    """A corrected sweep (a 16-token budget -> 32 tokens) into the first one's folder: its summary counted the
    old failed points, and it exited 2 for ever after; the whole list again resumes."""
    with pytest.raises(SystemExit):  # a budget of 16 tokens fails as it runs: exit 2
        sweep_in_process(
            tmp_path,
            monkeypatch,
            "+allocator=paged",
            "scheduler.max_num_batched_tokens=16,4096",
            "workload.num_requests=20",
        )
    said = refused_sweep(
        tmp_path,
        monkeypatch,
        capsys,
        "+allocator=paged",
        "scheduler.max_num_batched_tokens=4096,8192",
        "workload.num_requests=20",
    )
    assert said.startswith(
        "error: sweep holds points this sweep does not run (+allocator=paged,scheduler.max_num_batched_tokens=16"
    )
    assert not list((tmp_path / "sweep").glob("*tokens=8192*"))  # nothing ran
    with pytest.raises(SystemExit):  # the first list again: 4096 is skipped, 16 fails again
        sweep_in_process(
            tmp_path,
            monkeypatch,
            "+allocator=paged",
            "scheduler.max_num_batched_tokens=16,4096",
            "workload.num_requests=20",
        )
    assert "skipped +allocator=paged,scheduler.max_num_batched_tokens=4096" in capsys.readouterr().out


def test_plots_and_progress_name_no_point_and_a_rerun_that_only_draws_skips_every_point(tmp_path, monkeypatch, capsys):
    sweep_in_process(tmp_path, monkeypatch, "workload.rate=1,2", "workload.num_requests=20", "plots=false")
    points = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert points == [f"workload.duration_s=null,workload.num_requests=20,workload.rate={r}" for r in (1, 2)]
    assert "plots" not in summary(tmp_path / "sweep")[0]
    capsys.readouterr()

    rerun = ("workload.rate=1,2", "workload.num_requests=20", "plots=true", "sweep.point_timeout_s=999")
    sweep_in_process(tmp_path, monkeypatch, *rerun)  # a dotted key of exclude_keys is left out too
    log = capsys.readouterr().out
    assert all(f"skipped {name}" in log for name in points)
    assert (tmp_path / "sweep" / "kv_breakdown.png").is_file()


def test_how_a_sweep_is_reported_names_no_point_and_a_baseline_it_lacks_is_refused_before_any_point(
    tmp_path, monkeypatch, capsys
):
    report = ("report.baseline=pow2", "report.slo_s_per_token=0.3", "measure.save_requests=false")
    sweep_in_process(tmp_path, monkeypatch, "+allocator=paged,pow2", "workload.num_requests=20", "plots=false", *report)
    points = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert points == [f"+allocator={a},workload.duration_s=null,workload.num_requests=20" for a in ("paged", "pow2")]
    assert not {"report.baseline", "report.slo_s_per_token", "measure.save_requests"} & set(
        summary(tmp_path / "sweep")[0]
    )
    capsys.readouterr()
    sweep_in_process(tmp_path, monkeypatch, "+allocator=paged,pow2", "workload.num_requests=20", "plots=false")
    log = capsys.readouterr().out
    assert all(f"skipped {name}" in log for name in points), log  # the same measurements

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main(["-m", "+allocator=paged,pow2", "report.baseline=contiguous", *SMALL, "hydra.sweep.dir=other"])
    GlobalHydra.instance().clear()
    assert stop.value.code == 2
    assert "report.baseline='contiguous' is not in the sweep; its allocators: paged, pow2" in capsys.readouterr().err
    assert not list((tmp_path / "other").glob("*/metrics.csv"))  # it ran every point before it said so


def test_a_key_of_a_swept_plugin_group_applies_to_every_point(tmp_path, monkeypatch):
    # it was refused: the sweep's master config composes without the group its points choose
    args = ("+allocator=hybrid,paged", "allocator.block_size=32", "workload.num_requests=20", "plots=false")
    sweep_in_process(tmp_path, monkeypatch, *args)
    rows = summary(tmp_path / "sweep")
    assert sorted((r["allocator"], r["block_size"]) for r in rows) == [("hybrid", "32"), ("paged", "32")]


def test_ctrl_c_in_a_sweep_is_one_line_exit_130_and_a_rerun_skips_the_points_that_finished(
    tmp_path, monkeypatch, capsys
):
    from kvbench.scenarios import run

    real_run_point, started = run.run_point, []

    def interrupted_at_the_second(cfg):
        started.append(cfg.workload.num_requests)
        if len(started) == 2:
            raise KeyboardInterrupt
        return real_run_point(cfg)

    monkeypatch.setattr(run, "run_point", interrupted_at_the_second)
    with pytest.raises(SystemExit) as exit_info:
        sweep_in_process(tmp_path, monkeypatch, "workload.num_requests=10,20")
    assert exit_info.value.code == 130
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("interrupted: the points that finished keep their rows in sweep")
    assert "the same command with hydra.sweep.dir=sweep runs only the rest" in line
    assert [p.parent.name for p in (tmp_path / "sweep").glob("*/metrics.csv")] == [
        "workload.duration_s=null,workload.num_requests=10"
    ]
    sweep_in_process(tmp_path, monkeypatch, "workload.num_requests=10,20")  # the rerun the line asks for
    assert started == [10, 20, 20]
    assert len(list((tmp_path / "sweep").glob("*/metrics.csv"))) == 2


# the alarm may fire inside a garbage-collector callback, where Python prints the swallowed
# PointTimeout as "Exception ignored" (the deadline re-arms itself: the next test holds that)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_point_that_runs_past_its_time_limit_is_recorded_as_failed(tmp_path, monkeypatch, capsys):
    # 30,000 requests: a whole run of them took 4.9 s where 3,000 took 0.8 s (the point alone
    # 0.45 s), under the limit, once the simulator got faster; the margin is the point's, not the host's
    with pytest.raises(SystemExit) as exit_info:
        sweep_in_process(tmp_path, monkeypatch, "workload.num_requests=20,30000", "sweep.point_timeout_s=0.5")
    assert exit_info.value.code == 2
    rows = {r["workload.num_requests"]: r for r in summary(tmp_path / "sweep")}
    assert rows["20"]["status"] == "ok"
    assert rows["30000"]["status"] == "failed"
    assert "ran longer than sweep.point_timeout_s=0.5 s" in rows["30000"]["reason"]
    (line,) = capsys.readouterr().err.splitlines()
    assert "1 of 2 points of the sweep failed" in line


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_deadline_that_expires_inside_a_finalizer_still_stops_the_point():
    # The alarm fires while a finalizer runs, where Python swallows the handler's exception
    # (as it did once in a weakref callback the garbage collector ran during a point).
    class SlowToFree:
        def __del__(self):
            time.sleep(0.3)

    with pytest.raises(PointTimeout, match="ran longer than sweep.point_timeout_s=0.05 s"):
        with deadline(0.05):
            doomed = SlowToFree()
            del doomed  # the old deadline let the body end normally from here


def test_a_deadline_too_short_to_enter_leaves_no_alarm_behind():
    """A limit of a nanosecond fired before the body was entered, and its retry alarm then killed
    the process (SIGALRM, exit 142) with the sweep's summary unwritten."""
    before = signal.getsignal(signal.SIGALRM)
    for _ in range(20):
        with pytest.raises(PointTimeout, match="ran longer than sweep.point_timeout_s=1e-09 s"):
            with deadline(1e-9):
                time.sleep(0.01)
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is before
    time.sleep(0.1)  # a retry left armed would fire here, with the default handler: the process would end


def test_a_full_disk_at_the_end_of_a_sweep_exits_2_and_keeps_the_finished_points(tmp_path, monkeypatch, capsys):
    real_replace = os.replace

    def full(src, dst, *args, **kwargs):
        if os.path.basename(dst) == "summary.csv":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(SystemExit) as exit_info:
        sweep_in_process(tmp_path, monkeypatch, "workload.rate=1,2", "workload.num_requests=20")
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "summary.csv" in line and "the disk is full" in line and "finished points are intact" in line
    sweep = tmp_path / "sweep"
    assert not (sweep / "summary.csv").exists()
    for metrics in sweep.glob("*/metrics.csv"):
        assert [r["status"] for r in csv.DictReader(metrics.open())] == ["ok"]
    assert len(list(sweep.glob("*/metrics.csv"))) == 2
    assert not list(sweep.rglob("*.tmp"))


def sweep_to_a_closed_console(tmp_path, stderr) -> subprocess.Popen:
    """A sweep with a failed point whose reader is gone before the first line (`| head -1`)."""
    proc = subprocess.Popen(
        [*BENCH, "-m", "scheduler.max_num_batched_tokens=10,4096", "workload.num_requests=20", "plots=false"]
        + [*SMALL, "hydra.sweep.dir=sweep"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    proc.stdout.close()
    return proc


def test_a_console_closed_early_keeps_a_failed_sweeps_exit_code_and_shows_no_traceback(tmp_path):
    # `bench -m ... | head -1`: the summary callback's print used to raise BrokenPipeError, which
    # Hydra turns into a warning: exit 0, a failed point unsaid.
    proc = sweep_to_a_closed_console(tmp_path, subprocess.PIPE)
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 2, err
    assert "Traceback" not in err and "Logging error" not in err
    assert err.count("note: the standard output was closed early (a pipe)") == 1
    assert err.splitlines()[-1].startswith("error: 1 of 2 points of the sweep failed")
    assert sorted(r["status"] for r in summary(tmp_path / "sweep")) == ["failed", "ok"]


def test_a_failed_sweeps_exit_code_survives_stderr_closed_with_stdout(tmp_path):
    # `bench -m ... 2>&1 | head -1`: the error line itself went to the closed pipe, and its
    # BrokenPipeError, raised in the summary callback, became a warning and exit 0
    proc = sweep_to_a_closed_console(tmp_path, subprocess.STDOUT)
    assert proc.wait(timeout=300) == 2
    assert sorted(r["status"] for r in summary(tmp_path / "sweep")) == ["failed", "ok"]


def test_a_full_console_drops_the_rest_of_its_output_once_and_says_so(capsys):
    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    stream = GuardedStdout(Full())
    assert stream.write("a table\n") == len("a table\n")  # print's contract: every character taken
    stream.write("more\n")
    stream.flush()
    assert isinstance(stream.lost, OSError) and stream.lost.errno == errno.ENOSPC
    (line,) = capsys.readouterr().err.splitlines()  # said once, not once a write
    assert line.startswith("note: the standard output cannot be written (No space left on device)")


def test_a_second_sweep_into_a_directory_in_use_is_refused(tmp_path, monkeypatch, capsys):
    other = SweepLock(tmp_path / "sweep")
    other.acquire()  # another sweep holds the directory
    try:
        with pytest.raises(SystemExit) as exit_info:
            sweep_in_process(tmp_path, monkeypatch, "workload.rate=1,2", "workload.num_requests=20")
    finally:
        other.release()
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "is in use by another sweep (pid" in line
    assert not list((tmp_path / "sweep").glob("*/metrics.csv"))


def test_profile_on_a_simulated_run_is_one_line_exit_2(tmp_path):
    result = bench(tmp_path, "profile=true", "workload.num_requests=10", *SMALL)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: profile=true traces torch operators, and scenario=simulate runs none; "
        "use it with scenario=serve or scenario=kernel"
    ]


@pytest.mark.slow
def test_profile_on_a_kernel_run_writes_a_chrome_trace_beside_the_metrics(tmp_path):
    result = bench(
        tmp_path,
        "scenario=kernel",
        "model=tiny",
        "+backend=eager",
        "batch=2d64",
        "scenario.min_run_time_s=0.01",
        "profile=true",
        "progress=false",
        "hydra.run.dir=run",
    )
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


def test_a_sweep_over_an_absolute_trace_path_writes_its_summary(tmp_path):
    trace = tmp_path / "lengths" / "trace.csv"
    trace.parent.mkdir()
    trace.write_text(
        "input_len,output_len\n" + "".join(f"{10 + i},{5 + i % 7}\n" for i in range(40)) + "2000,100\n"
    )  # one pair longer than OPT's 2048: dropped and counted
    result = bench(
        tmp_path,
        "-m",
        "+allocator=paged,oracle",
        "workload=trace",
        f"workload.path={trace}",
        "progress=false",
        "hydra.sweep.dir=sweep",
    )
    assert result.returncode == 0, result.stderr
    rows = summary(tmp_path / "sweep")
    assert sorted(r["allocator"] for r in rows) == ["oracle", "paged"]
    assert all(r["status"] == "ok" and r["completed"] == "40" and r["dropped_requests"] == "1" for r in rows)
    points = [p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
    assert len(points) == 2 and all("workload.path=" in p and "/" not in p for p in points)


def test_the_default_allocator_is_a_baseline_a_sweep_can_name(tmp_path, monkeypatch):
    # the points name no allocator and run paged: report.baseline=paged is in the sweep
    sweep_in_process(tmp_path, monkeypatch, "seed=0,1", "report.baseline=paged", "workload.num_requests=5")
    assert {r["allocator"] for r in summary(tmp_path / "sweep")} == {"paged"}


def test_a_measured_key_added_to_exclude_keys_still_reruns_a_point_it_changes(tmp_path, monkeypatch):
    excluded = "hydra.job.config.override_dirname.exclude_keys=[workload.num_requests]"
    sweep_in_process(tmp_path, monkeypatch, "seed=0,1", "workload.num_requests=5", excluded)
    sweep_in_process(tmp_path, monkeypatch, "seed=0,1", "workload.num_requests=8", excluded)
    assert {r["requests"] for r in summary(tmp_path / "sweep")} == {"8"}


def test_points_told_apart_by_a_key_no_column_holds_are_two_points_not_one(tmp_path, monkeypatch):
    # executor is a group choice no column names; its calibrated point without a profile is refused
    # before the sweep's first point (it failed as it ran, beside the roofline point)
    with pytest.raises(SystemExit) as stop:
        sweep_in_process(tmp_path, monkeypatch, "executor=roofline,calibrated", "workload.num_requests=5")
    assert stop.value.code == 2 and not list((tmp_path / "sweep").glob("*/metrics.csv"))
    # two points whose rows hold the same identity, told apart by their folders' overrides only
    alike = tmp_path / "alike"
    alike.mkdir()
    sweep_in_process(alike, monkeypatch, "seed=0,1", "workload.num_requests=5")
    (second,) = (alike / "sweep").glob("seed=1*/metrics.csv")
    rows = list(csv.DictReader(second.open()))
    with second.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows([{**row, "seed": "0"} for row in rows])
    from kvbench.reporting import report

    report.summarize(alike / "sweep", plots=False)
    assert [r["seed"] for r in summary(alike / "sweep")] == ["0", "0"]


def test_a_subdir_spelled_with_a_trailing_slash_is_the_same_folder(tmp_path, monkeypatch):
    sweep_in_process(tmp_path, monkeypatch, "seed=0,1", "hydra.sweep.subdir=s${seed}/", "workload.num_requests=5")
    assert sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/metrics.csv")) == ["s0", "s1"]


def test_a_dirty_checkout_marks_its_rows_and_a_resume_reruns_points_its_edits_changed(tmp_path, monkeypatch, capsys):
    """A row's git_sha names its code only for a clean checkout: an edit between two runs of a
    sweep, with HEAD the same, reruns its points rather than keeping rows the old code made."""
    from kvbench.reporting import results

    status = {"text": " M harness/core/engine.py\n"}
    git = {"rev-parse": "0123456789ab\n", "diff": "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n"}

    def fake_git(*args):
        return status["text"] if args[0] == "status" else git[args[0]]

    monkeypatch.setattr(results, "_git", fake_git)
    results.environment.cache_clear()
    args = ("workload.rate=1,2", "workload.num_requests=20")
    try:
        sweep_in_process(tmp_path, monkeypatch, *args)
        assert {r["git_sha"] for r in summary(tmp_path / "sweep")} == {"0123456789ab-dirty"}
        capsys.readouterr()
        sweep_in_process(tmp_path, monkeypatch, *args)  # the same edits: nothing to redo
        assert capsys.readouterr().out.count("skipped ") == 2

        git["diff"] = git["diff"].replace("+new", "+newer")  # edited again, still uncommitted
        sweep_in_process(tmp_path, monkeypatch, *args)
        assert capsys.readouterr().out.count("changed since it ran: kvbench's uncommitted changes") == 2

        status["text"] = ""  # committed nothing, reverted everything: clean at the same HEAD
        results.environment.cache_clear()
        sweep_in_process(tmp_path, monkeypatch, *args)
        assert capsys.readouterr().out.count("git_sha 0123456789ab-dirty -> 0123456789ab") == 2
        assert {r["git_sha"] for r in summary(tmp_path / "sweep")} == {"0123456789ab"}
    finally:
        results.environment.cache_clear()


def test_a_dead_launcher_worker_is_one_line_naming_what_was_kept(tmp_path, monkeypatch, capsys):
    """joblib's TerminatedWorkerError (a worker killed, or out of memory) was a 50-line traceback."""

    class TerminatedWorkerError(Exception):  # joblib.externals.loky's, by name
        pass

    def killed(cfg, out_dir, multirun):
        raise TerminatedWorkerError("A worker process managed by the executor was unexpectedly terminated.")

    monkeypatch.setattr(cli, "run_point_and_record", killed)
    with pytest.raises(SystemExit) as stop:
        sweep_in_process(tmp_path, monkeypatch, "seed=0,1", "workload.num_requests=5")
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: a worker process of the joblib launcher died while it ran a point")
    assert "the same command with hydra.sweep.dir=sweep runs only the rest" in line


def test_a_sweep_whose_summary_crashes_exits_1_with_one_line_and_its_points_intact(tmp_path, monkeypatch, capsys):
    """A bug in the summary raised inside Hydra's callback, which only warns: the sweep exited 0
    with no summary, no report and its failed points unsaid."""
    from kvbench.reporting import report

    def crash(sweep_dir, plots):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(report, "end_of_sweep", crash)
    with pytest.raises(SystemExit) as stop:
        sweep_in_process(tmp_path, monkeypatch, "+allocator=paged,oracle", "workload.num_requests=20")
    assert stop.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: the sweep's summary, plots or report in sweep could not be written (")
    assert "ZeroDivisionError: a bug); its finished points are intact in */metrics.csv" in err[-1]
    assert len(list((tmp_path / "sweep").glob("*/metrics.csv"))) == 2
