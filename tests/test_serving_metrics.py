"""vLLM's serving metrics: a run prints its console table and writes requests.jsonl, and every
latency column of metrics.csv can be recomputed from that file; goodput SLOs are checked."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import numpy as np
import pandas as pd
import pytest

from kvbench.core.engine import Engine
from kvbench.core.recorder import Recorder
from kvbench.core.scheduler import Scheduler
from kvbench.core.sequence import Request
from kvbench.core.serving_metrics import STATS, ValueCounts, meets_slos
from kvbench.executors.base import StepResult
from kvbench.plugins.allocators.paged import PagedAllocator

SIMULATE = [
    "+allocator=paged",
    "workload.num_requests=120",
    "workload.duration_s=null",
    "report.goodput.ttft_ms=2000",
    "report.goodput.tpot_ms=60",
]
SERVE = [
    "scenario=serve",
    "model=tiny",
    "+allocator=paged",
    "workload=uniform",
    "workload.input_len=32",
    "workload.output_len=12",
    "scenario.num_requests=10",
    "scenario.rate=20",
    "report.goodput.e2el_ms=400",
]


def bench(cwd, *args):
    return subprocess.run(
        # `bench` as users start it: with its helper, which writes requests.jsonl from the run's spool
        [sys.executable, "-m", "kvbench.launch", *args, "progress=false"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def stats(values_ms: np.ndarray) -> list[float]:
    return [
        values_ms.mean(),
        np.median(values_ms),
        values_ms.std(),
        np.percentile(values_ms, 90),
        np.percentile(values_ms, 99),
    ]


def columns(row: pd.Series, name: str) -> list[float]:
    return [row[f"{stat}_{name}_ms"] for stat in ("mean", "median", "std", "p90", "p99")]


@pytest.fixture(scope="module", params=["simulate", "serve"])
def run(request, tmp_path_factory):
    cwd = tmp_path_factory.mktemp(request.param)
    result = bench(cwd, *(SIMULATE if request.param == "simulate" else SERVE))
    assert result.returncode == 0, result.stderr
    (run_dir,) = (cwd / "results" / "runs").iterdir()
    return (
        result.stdout,
        pd.read_csv(run_dir / "metrics.csv").iloc[0],
        pd.read_json(run_dir / "requests.jsonl", lines=True),
    )


def test_a_run_prints_its_console_table(run):
    stdout, row, _ = run
    assert "== kvbench result: " in stdout
    for line in (
        "Successful requests:",
        "Request throughput (req/s):",
        "Request goodput (req/s):",
        "Median TTFT (ms):",
        "Median TPOT (ms):",
        "P99 ITL (ms):",
        "Token states:",
        "Preemptions:",
    ):
        assert line in stdout
    assert f"{row['median_ttft_ms']:.2f}" in stdout and f"{100 * row['kv_token_util']:.1f}%" in stdout


def test_the_console_s_kv_shares_add_up_to_the_pool():
    """Five shares of one pool: a line left out (pow2's rounding, a quarter of its pool) would
    leave the console's percentages a quarter short of 100."""
    import re

    from kvbench.reporting.console import run_table

    shares = {"kv_token_util": 0.278, "kv_reserved_frac": 0.196, "kv_internal_frag_frac": 0.167}
    shares |= {"kv_rounding_frac": 0.268, "kv_external_frag_frac": 0.091}
    table = run_table({"scenario": "simulate", "allocator": "pow2", **shares})
    section = table.split("KV cache")[1].split("Mean batch size")[0]
    assert sum(float(p) for p in re.findall(r"([\d.]+)%", section)) == pytest.approx(100.0)


def test_a_measured_run_is_labelled_with_the_device_it_ran_on_not_a_hardware_profile(run):
    """A CPU serve's rows, report heading and plot titles read `tiny on a100-40gb`."""
    from kvbench.reporting.figures import context_title

    _, row, _ = run
    if row["scenario"] == "simulate":
        assert row["hardware"] == "a100-40gb"
        return
    assert row["hardware"] == "a100-40gb" and row["device"] == "cpu"  # the modelled costs' profile; the device
    assert context_title(pd.DataFrame([row])).startswith("tiny on cpu, ")


def test_a_run_s_title_names_what_it_measured():
    from kvbench.reporting.console import run_table

    served = {"scenario": "serve", "allocator": "paged", "model": "tiny", "hardware": "a100-40gb", "device": "cpu"}
    assert "serve · paged · tiny · cpu · sharegpt ==" in run_table({**served, "workload": "sharegpt"}).splitlines()[0]
    kernel = {**served, "scenario": "kernel", "backend": "triton_paged", "batch_spec": "2d64", "workload": "sharegpt"}
    title = run_table(kernel).splitlines()[0]
    assert "kernel · triton_paged · paged · tiny · cpu · 2d64" in title and "sharegpt" not in title


def test_a_profile_run_shows_its_fit_and_where_its_profile_is():
    from kvbench.reporting.console import run_table

    profiled = {"scenario": "profile", "model": "tiny", "device": "cpu", "profile": "/runs/p/profile.csv"}
    profiled |= {"profile_shapes": 42, "fit_form": "per_phase", "fit_heldout_median_err": 0.055}
    lines = run_table(profiled).splitlines()
    assert "Shapes measured:" in lines[2] and lines[2].endswith(" 42")
    assert lines[3].startswith("Fit:") and lines[3].endswith(" per_phase")
    assert lines[4].startswith("Held-out median error:") and lines[4].endswith(" 5.5%")
    assert lines[-1] == "profile: /runs/p/profile.csv (bench executor=calibrated executor.profile=PATH)"


def test_each_repeat_of_a_served_point_writes_its_own_requests_file(tmp_path):
    """repeats=2: the row holds the medians and every repeat's value as samples; each repeat's
    requests.K.jsonl recomputes that repeat's samples, and no requests.jsonl pretends to be the row's."""
    import json

    args = [a for a in SERVE if not a.startswith("report.")] + ["repeats=2", "plots=false"]
    result = bench(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (tmp_path / "results" / "runs").iterdir()
    assert sorted(p.name for p in run_dir.glob("requests*.jsonl")) == ["requests.1.jsonl", "requests.2.jsonl"]
    row = pd.read_csv(run_dir / "metrics.csv").iloc[0]
    samples = json.loads(row["samples"])["median_ttft_ms"]
    for index, sample in enumerate(samples, 1):
        requests = pd.read_json(run_dir / f"requests.{index}.jsonl", lines=True, precise_float=True)
        ttft = (requests["first_token_s"] - requests["arrival_s"]).to_numpy() * 1e3
        assert np.median(ttft) == pytest.approx(sample, rel=1e-9)
    assert row["median_ttft_ms"] == pytest.approx(np.median(samples))


def test_latencies_recomputed_from_requests_jsonl_equal_the_summary(run):
    _, row, requests = run
    assert len(requests) == row["completed"] == row["requests"]
    ttft = (requests["first_token_s"] - requests["arrival_s"]).to_numpy() * 1e3
    e2el = (requests["finish_s"] - requests["arrival_s"]).to_numpy() * 1e3
    many = requests["output_len"] > 1
    tpot = (e2el[many] - ttft[many]) / (requests["output_len"][many] - 1).to_numpy()
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2el", e2el)):
        assert columns(row, name) == pytest.approx(stats(values), rel=1e-9, abs=1e-6), name
    itl = np.concatenate(requests["itl_s"].map(np.asarray).to_list()) * 1e3
    assert len(itl) == (requests["output_len"] - 1).sum()
    assert columns(row, "itl") == pytest.approx(stats(itl), rel=1e-6, abs=1e-5)  # the file keeps ns
    # a request's TPOT is the mean of its inter-token latencies
    first = requests.iloc[int(np.argmax(many))]
    assert np.mean(first["itl_s"]) == pytest.approx(
        (first["finish_s"] - first["first_token_s"]) / (first["output_len"] - 1)
    )

    duration = row["duration_s"]
    # from the run's start, the first request's own gap included, as vLLM's benchmark times it
    assert duration == pytest.approx(requests["finish_s"].max()) and requests["arrival_s"].min() > 0
    assert row["request_throughput"] == pytest.approx(len(requests) / duration)
    assert row["output_throughput"] == pytest.approx(requests["output_len"].sum() / duration)
    assert row["total_token_throughput"] == pytest.approx(
        (requests["input_len"] + requests["output_len"]).sum() / duration
    )
    assert row["normalized_latency_s_per_tok"] == pytest.approx((e2el / 1e3 / requests["output_len"]).mean())
    assert requests["preemptions"].sum() == row["preemptions"]


def test_goodput_counts_the_requests_that_meet_every_slo(run):
    _, row, requests = run
    ttft = (requests["first_token_s"] - requests["arrival_s"]) * 1e3
    e2el = (requests["finish_s"] - requests["arrival_s"]) * 1e3
    tpot = ((e2el - ttft) / (requests["output_len"] - 1)).where(requests["output_len"] > 1, 0.0)
    if row["scenario"] == "simulate":
        good = (ttft <= 2000) & (tpot <= 60)
        assert 0 < good.sum() < len(requests)  # the SLOs are tight enough to matter
    else:  # wall-clock latencies: how many meet the SLO depends on the host
        good = e2el <= 400
    assert row["request_goodput"] == pytest.approx(good.sum() / row["duration_s"])


def test_exact_itl_percentiles_from_value_counts_equal_numpy():
    rng = np.random.default_rng(0)
    steps = rng.exponential(0.03, 50)
    gaps = rng.choice(steps, 20_000)  # the gaps of a run repeat: one per step
    counts = ValueCounts(merge_every=3_000)
    for part in np.array_split(gaps, 70):
        counts.add(part)
    assert len(counts.values) <= 50 and len(counts) == len(gaps)
    for q in (0, 50, 90, 99, 100):
        assert counts.percentile(q) == pytest.approx(np.percentile(gaps, q), rel=1e-12)
    got = counts.stats("itl")
    assert [got[f"{s}_itl_ms"] for s in ("mean", "median", "std", "p90", "p99")] == pytest.approx(stats(gaps * 1e3))


class FixedStep:
    simulated = True

    def execute(self, batch):
        return StepResult(0.01, None)


def test_the_recorder_lets_finished_sequences_go():
    allocator = PagedAllocator(num_slots=4096, max_model_len=256, block_size=16)
    requests = [Request(i, 0.01 * i, 20, 30) for i in range(40)]
    recorder = Recorder()
    engine = Engine(Scheduler(allocator, 8, 256), FixedStep(), recorder, progress=False)
    seen = []
    on_finish = recorder.on_finish
    recorder.on_finish = lambda seq: (seen.append(weakref.ref(seq)), on_finish(seq))
    row = engine.run(requests)
    gc.collect()
    assert row["completed"] == 40 and len(seen) == 40
    assert recorder.finished == [] and all(ref() is None for ref in seen)
    assert row["median_itl_ms"] == pytest.approx(10.0) and row["median_tpot_ms"] == pytest.approx(10.0)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["+report.goodput.itl_ms=5"],
            "report.goodput.itl_ms is not a key of report.goodput; did you mean "
            "report.goodput.ttft_ms? (its keys: ttft_ms, tpot_ms, e2el_ms)",
        ),
        (
            ["report.goodput.itl_ms=5"],
            "report.goodput.itl_ms is not a key of report.goodput; did you mean "
            "report.goodput.ttft_ms? (its keys: ttft_ms, tpot_ms, e2el_ms)",
        ),
        (["report.goodput.ttft_ms=0"], "report.goodput.ttft_ms=0 must be a number of milliseconds > 0"),
        (["report.goodput.e2el_ms=-5"], "report.goodput.e2el_ms=-5 must be a number of milliseconds > 0"),
        (["report.goodput.tpot_ms=fast"], "report.goodput.tpot_ms=fast must be a number of milliseconds > 0"),
    ],
)
def test_a_bad_goodput_slo_is_one_line_with_exit_code_2(tmp_path, args, message):
    result = bench(tmp_path, *args, "workload.num_requests=5")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert message in lines[0]


def test_a_run_with_a_request_log_counts_its_gaps_once_in_the_log(tmp_path):
    from kvbench.core.request_log import RequestLog

    def run(recorder):
        allocator = PagedAllocator(num_slots=4096, max_model_len=256, block_size=16)
        requests = [Request(i, 0.013 * i, 20, 30 + i % 7) for i in range(40)]
        return Engine(Scheduler(allocator, 8, 256), FixedStep(), recorder, progress=False).run(requests)

    logged = Recorder(request_log=RequestLog(tmp_path / "requests.jsonl"))
    row, bare = run(logged), run(Recorder())
    assert len(logged.itl) == 0  # the log counted them, not the recorder as well
    columns = [f"{stat}_itl_ms" for stat in STATS]
    assert [row[c] for c in columns] == [logged.request_log.gap_stats[c] for c in columns] == [bare[c] for c in columns]
    gaps = np.concatenate(pd.read_json(tmp_path / "requests.jsonl", lines=True)["itl_s"].tolist())
    assert row["median_itl_ms"] == pytest.approx(np.median(gaps) * 1e3, abs=1e-6)


def test_a_kernel_timed_by_triton_s_interpreter_says_so():
    from kvbench.reporting.console import run_table

    row = {"scenario": "kernel", "backend": "triton_paged", "latency_us_p50": 9000.0, "achieved_gbps": 0.01}
    assert "times are not a GPU's" in run_table({**row, "interpreted": True}).splitlines()[-1]
    assert "interpreted" not in run_table({**row, "interpreted": False})


def test_a_kernel_s_console_shows_a_cpu_s_small_bandwidth_and_the_paging_overhead():
    """0.0025 GB/s printed as 0.0, and paging_overhead was in the CSV only."""
    from kvbench.reporting.console import run_table

    lines = run_table({"scenario": "kernel", "achieved_gbps": 0.0025, "paging_overhead": 1.13}).splitlines()
    assert next(line for line in lines if line.startswith("Achieved bandwidth")).endswith(" 0.0025")
    assert next(line for line in lines if line.startswith("Paged / contiguous latency")).endswith(" 1.13x")


class PowerOfTwoStep:
    """Every step takes 1/64 s, so a request's latencies are exact binary fractions."""

    simulated = True

    def execute(self, batch):
        return StepResult(1 / 64, None)


def goodput_of_one_request(slos: dict) -> float:
    """request_goodput of one request (prompt 20, output 30) alone: its first token ends step 1 and
    its last step 30, so TTFT = 1/64 s = 15.625 ms, E2EL = 30/64 s = 468.75 ms and
    TPOT = (E2EL - TTFT) / (30 - 1) = (29/64 s) / 29 = 15.625 ms; the run lasts 30/64 s."""
    allocator = PagedAllocator(num_slots=4096, max_model_len=256, block_size=16)
    recorder = Recorder(warmup_frac=0, goodput=slos)
    engine = Engine(Scheduler(allocator, 8, 256), PowerOfTwoStep(), recorder, progress=False)
    row = engine.run([Request(0, 0.0, 20, 30)])
    assert (recorder.ttft, recorder.e2el, row["median_tpot_ms"]) == ([1 / 64], [30 / 64], 15.625)
    return row["request_goodput"]


def test_a_request_exactly_at_every_slo_counts_toward_goodput():
    """Catches `measured < limit`: vLLM's --goodput counts a request whose every metric is <= its SLO."""
    exact = {"ttft_ms": 15.625, "tpot_ms": 15.625, "e2el_ms": 468.75}
    assert goodput_of_one_request(exact) == 64 / 30  # 1 good request in 30/64 s


def test_goodput_s_tpot_excludes_the_first_token_as_vllm_s_does():
    """Catches TPOT = (E2EL - TTFT) / output_len: 29/64 s over 30 tokens is 15.10 ms, under a 15.5 ms
    SLO that the true TPOT of 15.625 ms (over 29 gaps) misses."""
    assert goodput_of_one_request({"tpot_ms": 15.5}) == 0.0
    assert goodput_of_one_request({"tpot_ms": 15.625}) == 64 / 30  # the same request at its true TPOT


def test_a_latency_exactly_at_its_slo_meets_it_in_seconds_as_vllm_converts_it():
    """vLLM divides the SLO by 1000; multiplying the latency by 1000 instead made a request of
    exactly 2.007 s miss `e2el_ms: 2007` (2.007 * 1e3 is 2007.0000000000002)."""
    assert 2.007 * 1e3 > 2007  # the rounding the rule must not depend on
    assert meets_slos({"e2el_ms": 2007}, 0.0, 0.0, 2.007)
    assert meets_slos({"e2el_ms": 8191.9, "ttft_ms": 100}, 0.1, 0.0, 8191.9 / 1000)
    assert not meets_slos({"e2el_ms": 2007}, 0.0, 0.0, 2.0070001)


def test_a_goodput_slo_given_as_an_interpolation_is_resolved():
    """`report.goodput.ttft_ms=${report.goodput.tpot_ms}` was refused as the text '${...}'."""
    from omegaconf import OmegaConf

    from kvbench.scenarios.build import build_recorder

    cfg = OmegaConf.create(
        {
            "report": {"goodput": {"ttft_ms": "${report.goodput.tpot_ms}", "tpot_ms": 50, "e2el_ms": None}},
            "measure": {"warmup_frac": 0.1},
        }
    )
    assert build_recorder(cfg).goodput == {"ttft_ms": 50.0, "tpot_ms": 50.0}
