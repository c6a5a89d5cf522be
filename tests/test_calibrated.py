"""The calibrated simulator: a profile's fit, its refusals, and the engine it runs in.

A synthetic profile is written from a known step-time formula; the fit must give the formula
back, simulate must refuse the profile for another model or device, and the calibrated
executor must drive the very scheduler and allocators every other executor does.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from kvbench.core.scheduler import Scheduler
from kvbench.errors import UserError
from kvbench.executors.calibrated import CalibratedExecutor, load_profile, local_device_name, model_shape
from kvbench.executors.step_fit import FEATURES, fit, heldout_split
from kvbench.registry import default_registry
from kvbench.reporting.results import write_csv
from kvbench.scenarios.build import load_specs
from kvbench.scenarios.run import run_point
from kvbench.scenarios.simulate import simulate
from kvbench.scenarios.synthetic_steps import Shape
from kvbench.scenarios.validate_simulator import HostReplay, ModelProbe, scenario_cfg

# decode: 1.5 ms + 0.4 ms per sequence + 0.3 us per context token; a prompt's step adds 2 us
# per token and 0.09 us per attention pair (what the tiny model measures on a CPU, roughly)
DECODE = (1.5e-3, 0.0, 0.4e-3, 0.3e-6, 0.0)
PREFILL = (1.8e-3, 2e-6, 0.4e-3, 0.3e-6, 0.09e-6)


def read_rows(path) -> list[dict]:
    """A CSV's rows as written: dicts of strings (results.read_csv gives a typed DataFrame)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def formula(shape: Shape) -> float:
    features = (shape.num_tokens, shape.prefill_seqs + shape.decode_seqs, context(shape), pairs(shape))
    c = DECODE if shape.phase == "decode" else PREFILL
    return c[0] + sum(ci * f for ci, f in zip(c[1:], features))


def context(shape: Shape) -> int:
    return shape.kv_tokens


def pairs(shape: Shape) -> int:
    return shape.prefill_seqs * shape.prefill_len**2 + shape.decode_seqs * shape.decode_context


def compose_cfg(*overrides: str):
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        return compose("bench", overrides=["progress=false", *overrides])


def synthetic_profile(path, model: str = "tiny", device: str | None = None, **changes) -> str:
    spec, _ = load_specs(compose_cfg(f"model={model}"))
    shapes = (
        [Shape(prefill_seqs=p, prefill_len=n) for p in (1, 4) for n in (16, 64, 256, 512)]
        + [Shape(decode_seqs=b, decode_context=c) for b in (1, 4, 16, 64) for c in (16, 128, 512)]
        + [
            Shape(prefill_seqs=1, prefill_len=n, decode_seqs=b, decode_context=c)
            for b in (4, 32)
            for n in (32, 256)
            for c in (16, 512)
        ]
    )
    rows = [
        {
            "model": spec.name,
            "model_shape": model_shape(spec),
            "dtype": spec.dtype,
            "device": device or local_device_name(),
            "backend": "eager",
            "graph": "eager",
            "phase": s.phase,
            "num_tokens": s.num_tokens,
            "num_seqs": s.prefill_seqs + s.decode_seqs,
            "context_tokens": context(s),
            "attention_pairs": pairs(s),
            "time_s_median": formula(s),
        }
        for s in shapes
    ]
    held = heldout_split(rows, 0.25, 0)
    for i, row in enumerate(rows):
        row.update(heldout=i in held, **changes)
    write_csv(path, rows)
    return str(path)


@pytest.fixture
def tiny_profile(tmp_path):
    return synthetic_profile(tmp_path / "profile.csv")


def test_the_fit_gives_back_the_formula_a_profile_was_generated_from(tiny_profile):
    report = load_profile(tiny_profile).report
    assert report.model.form == "per_phase"
    assert report.heldout_max < 0.01
    off_grid = [
        Shape(decode_seqs=37, decode_context=300),
        Shape(prefill_seqs=2, prefill_len=400),
        Shape(prefill_seqs=1, prefill_len=100, decode_seqs=10, decode_context=200),
    ]
    for shape in off_grid:
        features = (shape.num_tokens, shape.prefill_seqs + shape.decode_seqs, context(shape), pairs(shape))
        assert report.model.predict(*features) == pytest.approx(formula(shape), rel=0.01)


def calibrated(profile: str, *overrides: str) -> tuple[dict, object]:
    return simulate(
        compose_cfg(
            "executor=calibrated",
            f"executor.profile={profile}",
            "model=tiny",
            "engine.kv_cache_bytes=2097152",
            "workload.num_requests=40",
            "workload.rate=inf",
            *overrides,
        )
    )


def test_a_profile_of_another_model_is_refused(tmp_path):
    profile = synthetic_profile(tmp_path / "small.csv", model="small")
    with pytest.raises(UserError, match="measured for model='small', not 'tiny'"):
        calibrated(profile)


def test_a_cpu_profile_without_a_kv_pool_of_its_own_is_refused(tiny_profile, tmp_path):
    """Without engine.kv_cache_bytes the pool was the modelled A100's memory less tiny's weights:
    75 million slots, a run that could never fill its pool, without a word."""
    cfg = compose_cfg("executor=calibrated", f"executor.profile={tiny_profile}", "model=tiny")
    with pytest.raises(UserError, match=r"profile measured on cpu.*the KV pool would be hardware=a100-40gb's"):
        simulate(cfg)
    other = synthetic_profile(tmp_path / "rtx.csv", device="cuda:NVIDIA GeForce RTX 4090")
    other_cfg = compose_cfg("executor=calibrated", f"executor.profile={other}", "executor.device=any", "model=tiny")
    with pytest.raises(UserError, match=r"measured on cuda:NVIDIA GeForce RTX 4090: the KV pool would be hardware="):
        simulate(other_cfg)
    gpu = synthetic_profile(tmp_path / "gpu.csv", device="cuda:NVIDIA A100-SXM4-40GB")  # the GPU modelled
    cfg = compose_cfg("executor=calibrated", f"executor.profile={gpu}", "executor.device=any", "model=tiny")
    row, _ = simulate(OmegaConf.merge(cfg, {"workload": {"num_requests": 5}}))
    assert row["completed"] == 5


def test_a_model_of_the_same_name_but_another_shape_is_refused(tiny_profile):
    with pytest.raises(UserError, match="model_shape"):
        calibrated(tiny_profile, "model.num_layers=3")


def test_a_profile_of_another_device_is_refused_unless_asked_for(tmp_path):
    profile = synthetic_profile(tmp_path / "gpu.csv", device="cuda:NVIDIA H200")
    with pytest.raises(UserError, match="device='cuda:NVIDIA H200'"):
        calibrated(profile)
    row, _ = calibrated(profile, "executor.device=cuda:NVIDIA H200")
    assert row["executor_device"] == "cuda:NVIDIA H200"


def test_a_profile_of_another_backend_is_refused(tmp_path):
    profile = synthetic_profile(tmp_path / "triton.csv", backend="triton_paged")
    with pytest.raises(UserError, match="backend='triton_paged', not 'eager'"):
        calibrated(profile)


@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
def test_the_calibrated_executor_drives_the_same_scheduler_and_allocators(tiny_profile, allocator):
    row, engine = calibrated(tiny_profile, f"+allocator={allocator}")
    roofline, roofline_engine = simulate(
        compose_cfg(
            "model=tiny",
            "engine.kv_cache_bytes=2097152",
            "workload.num_requests=40",
            "workload.rate=inf",
            f"+allocator={allocator}",
        )
    )
    assert isinstance(engine.executor, CalibratedExecutor)
    assert type(engine.scheduler) is Scheduler
    assert type(engine.allocator) is default_registry().get("allocator", allocator)
    assert type(engine.allocator) is type(roofline_engine.allocator)
    # all requests arrive at once, so who runs when does not depend on step times: the same
    # batches, each timed by the profile instead of the roofline
    for key in ("completed", "steps", "preemptions", "max_batch_size", "recomputed_tokens"):
        assert row[key] == roofline[key]
    assert row["executor"] == "calibrated" and roofline["executor"] == "roofline"
    assert row["executor_profile_sha256"] == load_profile(tiny_profile).sha256
    assert row["duration_s"] != pytest.approx(roofline["duration_s"])


def test_a_profile_timed_with_another_kv_layout_is_used_and_the_console_says_so(tmp_path):
    """A paged gather and a contiguous read take different times (17 % apart with the eager
    backend on a CPU): a contiguous run on a paged profile gets paged's step times, said after
    it; one on a profile of its own layout says nothing."""
    from kvbench.reporting.console import run_table

    paged = synthetic_profile(tmp_path / "paged.csv", allocator="paged")
    row, _ = calibrated(paged, "+allocator=contiguous")
    assert (row["executor_profile_layout"], row["kv_layout"]) == ("paged", "contiguous")
    assert row["executor_device"] in run_table(row).splitlines()[0]  # its steps' device, not the hardware YAML's
    said = run_table(row).splitlines()[-1]
    assert said.startswith("profile: its steps were timed with the paged KV layout, this run's allocator keeps")
    pow2 = synthetic_profile(tmp_path / "pow2.csv", allocator="pow2")  # the contiguous layout too
    row, _ = calibrated(pow2, "+allocator=oracle")
    assert row["executor_profile_layout"] == row["kv_layout"] == "contiguous"
    assert "KV layout" not in run_table(row)


def test_time_scale_stretches_every_step_and_changes_no_decision(tiny_profile):
    row, _ = calibrated(tiny_profile)
    slower, _ = calibrated(tiny_profile, "executor.time_scale=2")
    # all requests arrive at t=0: the same batches, each step twice as long
    for key in ("completed", "steps", "preemptions", "max_batch_size"):
        assert slower[key] == row[key]
    assert slower["duration_s"] == pytest.approx(2 * row["duration_s"])
    assert (row["executor_time_scale"], slower["executor_time_scale"]) == (1.0, 2.0)


def replayed(profile: str, starts, ratios, *overrides: str) -> dict:
    cfg = compose_cfg(
        "executor=calibrated",
        f"executor.profile={profile}",
        "model=tiny",
        "engine.kv_cache_bytes=2097152",
        "workload.num_requests=40",
        "workload.rate=50",
        *overrides,
    )
    replay = lambda engine: HostReplay(engine, np.asarray(starts, dtype=float), np.asarray(ratios, dtype=float))
    return simulate(cfg, prepare=replay)[0]


def test_a_constant_replayed_slowdown_is_the_time_scale(tiny_profile):
    """Requests arrive over time, so the clock matters: a host twice as slow all along is
    executor.time_scale=2, step for step (the same products, so the same floats)."""
    scaled, _ = calibrated(tiny_profile, "workload.rate=50", "executor.time_scale=2")
    row = replayed(tiny_profile, [0.0], [2.0])
    for key in ("completed", "steps", "duration_s", "mean_batch_size", "median_tpot_ms", "p99_ttft_ms"):
        assert row[key] == scaled[key]


def test_a_replayed_slow_period_slows_only_the_steps_inside_it(tiny_profile):
    plain, engine = calibrated(tiny_profile, "workload.rate=50")
    starts = np.asarray(engine.recorder.step_end) - np.asarray(engine.recorder.step_dt)
    middle = float(np.median(starts))
    row = replayed(tiny_profile, [0.0, middle], [1.0, 3.0])
    assert row["duration_s"] > plain["duration_s"]
    before = replayed(tiny_profile, [0.0, 1e9], [1.0, 3.0])  # a slow period after the run
    assert before["duration_s"] == plain["duration_s"] and before["steps"] == plain["steps"]


@pytest.mark.parametrize("allocator", ["paged", "contiguous", "pow2"])
def test_the_host_probe_times_the_model_s_own_step_whatever_the_allocator_reserves(allocator):
    """Its pool holds 4 sequences even where each reserves max_model_len (contiguous)."""
    cfg = compose_cfg("+experiment=validate_simulator", "model=small", f"+allocator={allocator}")
    probe = ModelProbe(scenario_cfg(cfg, "profile", cfg.scenario.profiling), int(cfg.model.max_model_len))
    assert 0 < probe.read(2) < 1.0  # one small-model decode step: milliseconds


def test_a_missing_profile_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvbench.cli",
            "executor=calibrated",
            f"executor.profile={tmp_path / 'none.csv'}",
            "model=tiny",
            "progress=false",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no such file" in result.stderr


def test_a_profile_path_that_is_a_directory_points_at_the_profile_inside(tiny_profile):
    folder = str(Path(tiny_profile).parent)  # it said "no such file" of a folder that exists
    with pytest.raises(UserError, match=r"executor.profile='.*' is a directory, not a profile.csv; did you mean "):
        load_profile(folder)
    empty = Path(folder) / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match=r"scenario.profile='.*' is a directory, not a profile.csv; write one"):
        load_profile(str(empty), key="scenario.profile")


def test_validation_checks_a_given_profile_before_any_served_run(tmp_path, monkeypatch):
    # it served a whole run, then said `executor.profile=...: no such file` of scenario.profile
    import kvbench.scenarios.validate_simulator as validation

    monkeypatch.setattr(validation, "serve", lambda *a, **k: pytest.fail("served before the profile was checked"))
    given = lambda profile, *more: run_point(
        compose_cfg(
            "scenario=validate", "model=tiny", f"scenario.out_dir={tmp_path}", f"scenario.profile={profile}", *more
        )
    )
    with pytest.raises(UserError, match=r"^scenario.profile='.*none.csv': no such file"):
        given(tmp_path / "none.csv")
    other = synthetic_profile(tmp_path / "small.csv", model="small")  # measured on another model
    with pytest.raises(UserError, match="small"):
        given(other)
    # it calibrated cpu-clock serve runs with wall-clock steps, which hold other processes' time
    wall = synthetic_profile(tmp_path / "wall.csv", clock="wall")
    with pytest.raises(
        UserError, match="was measured with clock=wall, but the serve runs time their steps with clock=cpu"
    ):
        given(wall)
    # an fp32 profile predicted bf16 serve runs, labelled a validation like any other
    fp32 = synthetic_profile(tmp_path / "fp32.csv", clock="cpu")
    with pytest.raises(UserError, match=r"measured in dtype=fp32, but the serve runs run in bf16"):
        given(fp32, "+scenario.serve.dtype=bf16", "+scenario.profiling.dtype=bf16")
    # a bf16 profile then refused its own simulation (fp32 from the model): one dtype for both sides
    with pytest.raises(UserError, match=r"scenario.serve.dtype resolves to bf16 and scenario.profiling.dtype to fp32"):
        given(fp32, "+scenario.serve.dtype=bf16")


def test_validation_runs_both_sides_in_the_served_dtype_auto_being_fp32_on_a_cpu():
    import kvbench.scenarios.validate_simulator as validation

    cfg = compose_cfg("scenario=validate", "model=tiny", "+scenario.serve.dtype=bf16", "+scenario.profiling.dtype=bf16")
    assert validation.validated_dtype(cfg) == "bf16"
    assert validation.validated_dtype(compose_cfg("scenario=validate", "model=tiny")) == "fp32"  # auto on a CPU


def test_a_malformed_profile_names_the_row(tiny_profile):
    rows = read_rows(tiny_profile)
    rows[4]["time_s_median"] = "fast"
    write_csv(tiny_profile, rows)
    with pytest.raises(UserError, match=r"row 6: time_s_median='fast' is not a number"):
        load_profile(tiny_profile)


def test_a_profile_that_measures_a_shape_twice_names_both_rows(tiny_profile):
    """A row copied, or two profiles joined: it said only that a row's prediction had changed."""
    rows = read_rows(tiny_profile)
    write_csv(tiny_profile, rows + [dict(rows[3])])
    with pytest.raises(
        UserError, match=rf"row {len(rows) + 2} repeats row 5's shape \(prefill, num_tokens=512, num_seqs=1"
    ):
        load_profile(tiny_profile)


@pytest.mark.parametrize(
    "column, value, said",
    [
        ("time_s_mean", "0", "row 6: time_s_mean='0' must be a finite number > 0"),  # an SVD that did not converge
        ("num_tokens", "1e300", "row 6: num_tokens='1e300' is no step's"),  # a fit that predicted 0 s steps
        ("num_seqs", "2.5", "row 6: num_seqs='2.5' must be a whole number"),  # fitted as if half a sequence ran
        ("heldout", "yes", "row 6: heldout='yes' must be True or False"),  # read as False: an in-sample fit
    ],
)
def test_a_profile_row_no_step_could_have_is_refused(tiny_profile, column, value, said):
    rows = read_rows(tiny_profile)
    for row in rows:
        row["fit_to"] = "mean"
        row.setdefault("time_s_mean", row["time_s_median"])
    rows[4][column] = value
    write_csv(tiny_profile, rows)
    with pytest.raises(UserError, match=re.escape(said)):
        load_profile(tiny_profile)


def test_a_profile_whose_times_were_edited_since_it_was_written_is_refused(tiny_profile):
    """Its rows keep the predictions scenario=profile fitted; times rescaled to ms refit to others
    (and simulated every step 1,000 times too slow, without a word)."""
    rows = read_rows(tiny_profile)
    predicted = load_profile(tiny_profile).report.model.predict_rows(rows)
    for row, seconds in zip(rows, predicted):
        row["predicted_s"] = f"{seconds:.7g}"  # as a CSV keeps it
    write_csv(tiny_profile, rows)
    load_profile(tiny_profile)  # as written: accepted
    for row in rows:
        row["time_s_median"] = str(float(row["time_s_median"]) * 1000)
    write_csv(tiny_profile, rows)
    with pytest.raises(
        UserError, match=r"its times refit to other predictions than it was written with \(the first, row 2"
    ):
        load_profile(tiny_profile)


def test_a_profile_that_is_no_csv_names_the_setting(tmp_path):
    path = tmp_path / "binary.csv"
    path.write_bytes(bytes(range(256)) * 4)  # csv.Error: "new-line character seen in unquoted field"
    with pytest.raises(UserError, match=r"executor.profile='.*binary.csv' is not a readable CSV file"):
        load_profile(str(path))


def test_a_file_that_is_not_a_profile_is_refused(tmp_path):
    path = tmp_path / "metrics.csv"
    write_csv(path, [{"scenario": "simulate", "request_throughput": 1.0}])
    with pytest.raises(UserError, match="lacks column"):
        load_profile(str(path))


def test_calibrated_without_a_profile_says_so():
    with pytest.raises(UserError, match="needs executor.profile"):
        simulate(compose_cfg("executor=calibrated", "model=tiny"))


def profile(tmp_path, *overrides: str) -> list[dict]:
    return run_point(
        compose_cfg(
            "scenario=profile",
            "model=tiny",
            f"scenario.out_dir={tmp_path}",
            "scenario.repeats=1",
            "scenario.warmup=0",
            "scenario.prefill_len=[16,64]",
            "scenario.prefill_seqs=[1,2]",
            "scenario.decode_batch=[1,4]",
            "scenario.decode_context=[16,max]",
            "scenario.mixed_batch=[2]",
            "scenario.mixed_prefill_len=[16]",
            *overrides,
        )
    )


def test_a_profile_into_a_folder_that_holds_one_is_refused_and_the_first_kept(tmp_path):
    (first,) = profile(tmp_path)
    kept = (tmp_path / "profile.csv").read_bytes()
    with pytest.raises(UserError, match=r"scenario.out_dir=.* holds an earlier run's profile.csv"):
        profile(tmp_path, "+allocator=contiguous")
    assert (tmp_path / "profile.csv").read_bytes() == kept
    assert hashlib.sha256(kept).hexdigest() == first["profile_sha256"]  # the first row still names its file


def test_a_grid_longer_than_the_model_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"scenario.decode_context has 4096.*1..512"):
        profile(tmp_path, "scenario.decode_context=[16,4096]")


def test_a_grid_too_small_to_fit_says_how_many_shapes_the_fit_needs_before_measuring_any(tmp_path, monkeypatch):
    import kvbench.scenarios.profile as profiling

    # it measured every shape first, then threw the measurements away
    monkeypatch.setattr(profiling, "measure", lambda *a, **k: pytest.fail("measured a grid too small to fit"))
    small = ["scenario.prefill_len=[16]", "scenario.prefill_seqs=[1]", "scenario.decode_batch=[1]"]
    with pytest.raises(UserError, match=r"needs at least 5 measured shapes, and 3 of the grid's 3 can run; give"):
        profile(tmp_path, *small, "scenario.decode_context=[16]")
    # the shapes the limits ruled out count in the grid (it said "3 of the grid's 3 ran")
    limited = [*small, "scenario.decode_batch=[1,8]", "scenario.decode_context=[16]", "scheduler.max_num_seqs=4"]
    with pytest.raises(UserError, match=r"and 3 of the grid's 4 can run \(1 exceeds scheduler.max_num_seqs or"):
        profile(tmp_path, *limited)


def test_a_grid_whose_limits_leave_no_decode_step_is_refused_before_measuring_any(tmp_path, monkeypatch):
    """Every decode batch above scheduler.max_num_seqs left prefill and mixed shapes only: the
    profile was written, and a calibrated run timed its decode steps from the prompts' fit."""
    import kvbench.scenarios.profile as profiling

    monkeypatch.setattr(profiling, "measure", lambda *a, **k: pytest.fail("measured a grid with no decode step"))
    with pytest.raises(UserError, match=r"the grid keeps no decode step \(each of scenario.decode_batch x scenario"):
        profile(tmp_path, "scenario.decode_batch=[512]", "scenario.mixed_batch=[4]", "scheduler.max_num_seqs=256")


def test_a_fit_with_too_few_shapes_to_hold_any_out_reports_no_held_out_error():
    # it scored the forms on the shapes they were fitted to and reported that as held-out error
    rows = [
        {"num_tokens": n, "num_seqs": b, "context_tokens": n * 4, "attention_pairs": n * n, "phase": "prefill"}
        for n, b in ((16, 1), (64, 1), (256, 2), (512, 4), (128, 3))
    ]
    times = [1e-3 + 2e-6 * r["num_tokens"] + 4e-4 * r["num_seqs"] for r in rows]
    report = fit(rows, times, held=[0])  # 4 shapes left cannot fit 5 coefficients
    assert report.num_heldout == 0 and report.held == ()
    assert np.isnan(report.heldout_median) and np.isnan(report.heldout_max)
    assert report.fit_median < 0.01 and report.fit_max >= report.fit_median
    held = fit(rows * 3, times * 3, held=[0, 5])  # enough left: two shapes held out and scored
    assert held.num_heldout == 2 and held.held == (0, 5) and held.heldout_median < 0.01


def test_a_profile_that_holds_out_no_shape_marks_none_and_says_why(tmp_path, caplog):
    small = ["scenario.prefill_len=[16,32]", "scenario.prefill_seqs=[1]", "scenario.decode_batch=[1,2]"]
    with caplog.at_level("WARNING", logger="kvbench"):
        row = profile(tmp_path, *small, "scenario.decode_context=[16]", "scenario.mixed_batch=[1]")[0]
    assert row["profile_shapes"] == 5 and row["fit_heldout_shapes"] == 0
    assert np.isnan(row["fit_heldout_median_err"]) and row["fit_median_err"] >= 0
    assert {r["heldout"] for r in read_rows(tmp_path / "profile.csv")} == {"False"}
    assert "scenario.heldout_frac=0.25 holds out no shape: 5 measured leave too few" in caplog.text
    fit_doc = json.loads((tmp_path / "profile_fit.json").read_text(), parse_constant=pytest.fail)  # strict JSON
    assert fit_doc["fit_heldout_median_err"] is None and fit_doc["fit_median_err"] >= 0
    # the profile still calibrates a simulation, refitted to the same coefficients
    assert load_profile(str(tmp_path / "profile.csv")).report.num_heldout == 0


def test_repeats_below_one_are_refused(tmp_path):
    with pytest.raises(UserError, match="scenario.repeats=0 must be >= 1"):
        profile(tmp_path, "scenario.repeats=0")


def test_a_measured_profile_calibrates_a_simulation(tmp_path):
    row = profile(tmp_path)[0]
    assert row["profile_shapes"] == 4 + 4 + 2
    rows = read_rows(tmp_path / "profile.csv")
    assert {r["phase"] for r in rows} == {"prefill", "decode", "mixed"}
    assert all(float(r["time_s_median"]) > 0 for r in rows)
    # the batch features are the scheduler's: 2 causal prompts of 64 tokens attend to 2 x 64 x 65 / 2 pairs
    two_prompts = next(r for r in rows if r["prefill_seqs"] == "2" and r["prefill_len"] == "64")
    assert [int(two_prompts[f]) for f in FEATURES] == [128, 2, 128, 2 * 64 * 65 // 2]
    sim, _ = calibrated(str(tmp_path / "profile.csv"))
    assert sim["executor_profile_sha256"] == row["profile_sha256"]
    assert sim["completed"] == 40


def test_validation_profiles_then_compares_serve_with_the_calibrated_simulator(tmp_path):
    rows = run_point(
        compose_cfg(
            "+experiment=validate_simulator",
            "model=tiny",
            "workload.num_requests=8",
            f"scenario.out_dir={tmp_path}",
            "scenario.runs=1",
            "++scenario.serve.warmup_steps=0",
            "++scenario.profiling.repeats=1",
            "++scenario.profiling.warmup=0",
            "++scenario.profiling.prefill_len=[16,128]",
            "++scenario.profiling.prefill_seqs=[1,2]",
            "++scenario.profiling.decode_batch=[1,8]",
            "++scenario.profiling.decode_context=[16,max]",
            "++scenario.profiling.mixed_batch=[4]",
            "++scenario.profiling.mixed_prefill_len=[32]",
            "scenario.replay_window=1",
        )
    )
    assert [r["metric"] for r in rows][:3] == ["throughput (req/s)", "throughput (tok/s)", "mean batch"]
    for name in ("profile.csv", "validation.csv", "validation.md", "step_time.png", "steps.csv"):
        assert (tmp_path / name).is_file()
    by_metric = {r["metric"]: r for r in rows}
    served = by_metric["throughput (tok/s)"]
    assert served["rel_error"] == pytest.approx(served["simulated_1"] / served["measured_1"] - 1)
    from kvbench.reporting.console import validation_table  # what the console prints of these rows

    table = validation_table(rows).splitlines()
    assert [line.split()[0] for line in table[2:-1]] == [r["column"] for r in rows]
    assert rows[0]["clock"] == "cpu"
    # the host's speed was probed while profiling and around the serve run, and the simulation
    # rerun at that speed: its error is a column of its own
    assert len(rows[0]["host_probe_ms"].split()) == 2 and rows[0]["host_drift"] >= 0  # profile, serve 1
    assert all("rel_error_at_host_speed" in r for r in rows)
    assert all(r["rel_error_host_probed"] == r["rel_error_host_probed"] for r in rows)  # and over time
    # the serve run's host speed replayed into a simulation, here step for step: the simulator
    # then makes the serve run's decisions at its times, so every metric comes out the same
    assert all(abs(r["rel_error_host_replayed"]) < 1e-6 for r in rows), [r["rel_error_host_replayed"] for r in rows]
    text = (tmp_path / "validation.md").read_text()
    assert "error at the host's measured speed" in text and "signed all (" in text
    assert "error with the host's speed over time replayed" in text
    assert rows[0]["executor_profile_layout"] == rows[0]["kv_layout"] == "paged" and "NOTE" not in text
    # that paged profile validating contiguous: +63 % on TPOT once, and nothing said why
    again = run_point(
        compose_cfg(
            "+experiment=validate_simulator",
            "model=tiny",
            "+allocator=contiguous",
            "workload.num_requests=8",
            f"scenario.profile={tmp_path / 'profile.csv'}",
            f"scenario.out_dir={tmp_path / 'contiguous'}",
            "scenario.runs=1",
            "++scenario.serve.warmup_steps=0",
            "scenario.replay_window=1",
        )
    )
    assert again[0]["executor_profile_layout"] == "paged" and again[0]["kv_layout"] == "contiguous"
    said = "NOTE the profile's steps were timed with the paged KV layout and the served allocator keeps the contiguous"
    assert said in (tmp_path / "contiguous" / "validation.md").read_text()
    assert validation_table(again).splitlines()[-1].startswith("profile: its steps were timed with the paged KV")


class PausingTimer:
    """A profile timer whose every third step is a pause: 10 ms against 1 ms."""

    def __init__(self):
        self.calls = 0

    def time(self, shape):
        from kvbench.scenarios.synthetic_steps import TimedStep

        self.calls += 1
        seconds = 0.010 if self.calls % 3 == 0 else 0.001
        return TimedStep(seconds, shape.decode_seqs, shape.decode_seqs, shape.decode_context, shape.decode_context)


def test_a_burst_keeps_one_slow_step_out_of_a_round():
    """Every third step is a pause (10x): with bursts of 3 each round keeps a normal step, so
    every timed row reads 1 ms; timed one step a round, some rounds read the pause."""
    from kvbench.scenarios.profile import measure

    shapes = [Shape(decode_seqs=n, decode_context=16) for n in (1, 2)]
    bursts = measure(PausingTimer(), shapes, warmup=1, repeats=4, progress=False, burst=3)
    assert all(len(steps) == 4 and {s.seconds for s in steps} == {0.001} for steps in bursts.values())
    singles = measure(PausingTimer(), shapes, warmup=1, repeats=4, progress=False, burst=1)
    assert any(s.seconds == 0.010 for steps in singles.values() for s in steps)


def test_step_bias_is_the_median_signed_error_of_each_phase():
    from kvbench.scenarios.validate_simulator import step_bias

    features = [(1, 1, 10, 10), (2, 2, 20, 20), (40, 2, 50, 900), (3, 3, 30, 30)]  # the third carries a prompt
    measured = [1.0, 2.0, 4.0, 1.0]
    predicted = np.array([1.1, 1.8, 5.0, 1.0])  # +10%, -10%, +25%, 0%
    bias = step_bias(features, measured, predicted)
    assert bias == pytest.approx(
        {
            "all (4 steps)": 0.05,
            "decode-only (3 steps)": 0.0,
            "with a prompt (1 steps)": 0.25,
            "total time (sum predicted / sum measured - 1)": 8.9 / 8 - 1,
        }
    )


def test_fit_to_mean_keeps_the_pauses_a_queue_of_steps_adds_up():
    """With statistic=mean a round keeps its burst's mean: the pause is in every row, 1/3 of it."""
    from kvbench.scenarios.profile import measure

    shapes = [Shape(decode_seqs=1, decode_context=16)]
    means = measure(PausingTimer(), shapes, warmup=0, repeats=4, progress=False, burst=3, statistic="mean")
    assert [s.seconds for s in means[shapes[0]]] == pytest.approx([0.004] * 4)


def test_a_profile_fitted_to_means_is_reloaded_from_its_means(tmp_path):
    """fit_to=mean: the loader fits time_s_mean (here the formula) and ignores the medians."""
    path = tmp_path / "profile.csv"
    synthetic_profile(path, fit_to="mean")
    rows = read_rows(path)
    for row in rows:
        row["time_s_mean"], row["time_s_median"] = row["time_s_median"], "0.5"
    write_csv(path, rows)
    report = load_profile(str(path)).report
    assert report.heldout_max < 0.01
    shape = Shape(decode_seqs=37, decode_context=300)
    features = (shape.num_tokens, 37, context(shape), pairs(shape))
    assert report.model.predict(*features) == pytest.approx(formula(shape), rel=0.01)


def test_a_machine_without_a_gpu_device_node_is_named_without_importing_torch(monkeypatch):
    """A calibrated simulation on a CPU host checks its profile's device without torch (2 s)."""
    import kvbench.executors.calibrated as calibrated

    monkeypatch.setattr(calibrated, "GPU_DEVICE_NODES", ("/nonexistent/nvidiactl",))
    monkeypatch.setitem(sys.modules, "torch", None)  # importing it now raises
    assert calibrated.local_device_name() == f"cpu:{calibrated._processor()}"


def test_a_profile_row_with_a_missing_field_is_named(tiny_profile):
    lines = Path(tiny_profile).read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0]  # line 4 loses its last cell
    Path(tiny_profile).write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"row 4: \d+ fields, the header has \d+"):
        load_profile(tiny_profile)


def test_one_measured_run_has_no_spread_rather_than_none():
    """scenario.runs=1 reported a run-to-run spread of 0.0 % on every metric."""
    from kvbench.scenarios.validate_simulator import spread

    assert math.isnan(spread([5.0])) and spread([1.0, 3.0]) == 1.0


def test_a_profile_that_counted_prompts_square_is_refused(tmp_path):
    """Written before a prompt's attention pairs were counted causally (L x L): its per-pair
    cost would predict prefills at about half their measured time."""
    profile(tmp_path)
    path = tmp_path / "profile.csv"
    rows = read_rows(path)
    for row in rows:
        if row["phase"] == "prefill":
            n, length = int(row["prefill_seqs"]), int(row["prefill_len"])
            row["attention_pairs"] = str(n * length * length)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(UserError, match="counts 1 prompt\\(s\\) of 16 tokens as 256 attention pairs, where a causal"):
        load_profile(str(path))


def test_the_fit_is_the_non_negative_least_squares_optimum():
    """Karush-Kuhn-Tucker: at the optimum of min |Ac - 1|^2 over c >= 0, the gradient is 0 along
    every positive coefficient and >= 0 along every zero one. Dropping the most negative
    coefficient and refitting left this problem at 2.3x its optimal squared error."""
    from kvbench.executors.step_fit import _design, least_squares

    counts = [(202, 7, 928, 61282), (172, 61, 3909, 40552), (148, 1, 3089, 3058), (304, 22, 3494, 61974)]
    counts += [(183, 27, 331, 57682), (8, 12, 3471, 23979), (462, 44, 3361, 4935), (497, 35, 647, 85456)]
    rows = [dict(zip(("num_tokens", "num_seqs", "context_tokens", "attention_pairs"), c)) for c in counts]
    times = np.array([1.1347e-3, 12.5897e-3, 0.92279e-3, 4.01609e-3, 5.40845e-3, 2.35867e-3, 7.44649e-3, 6.51268e-3])
    a = _design(rows) / times[:, None]
    c = np.array(least_squares(rows, times))
    gradient = a.T @ (a @ c - 1.0)
    scale = np.abs(a).max(axis=0)  # the features' magnitudes differ by 10^5
    assert (c >= 0).all()
    assert np.allclose(gradient[c > 0] / scale[c > 0], 0.0, atol=1e-8)
    assert (gradient[c == 0] / scale[c == 0] >= -1e-8).all()
