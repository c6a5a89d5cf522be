"""The `bench` command as a user meets it: one run, and one-line errors with exit code 2."""

import csv
import subprocess
import sys

import pytest


def bench(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "kvbench.cli", *args, "progress=false"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_run_writes_one_row_with_identity_serving_and_environment_columns(tmp_path):
    result = bench(tmp_path, "+allocator=pow2", "workload.num_requests=30")
    assert result.returncode == 0, result.stderr
    (metrics,) = tmp_path.glob("results/runs/*/metrics.csv")
    (row,) = csv.DictReader(metrics.open())
    identity = (row["scenario"], row["allocator"], row["model"], row["hardware"])
    assert identity == ("simulate", "pow2", "opt-13b", "a100-40gb")
    assert row["completed"] == "30" and row["status"] == "ok"
    assert (metrics.parent / "kv_breakdown.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for column in ("kv_token_util", "normalized_latency_s_per_tok", "p99_ttft_ms", "median_tpot_ms",
                   "kvbench_version", "git_sha", "torch", "device", "workload.num_requests"):
        assert column in row


def test_help_lists_the_groups_and_their_options(tmp_path):
    result = subprocess.run([sys.executable, "-m", "kvbench.cli", "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    section = result.stdout.split("== Config groups")[1].split("== Config ==")[0]
    groups = dict(line.split(": ", 1) for line in section.splitlines() if ": " in line)
    assert {"contiguous", "oracle", "pow2", "paged"} <= set(groups["allocator"].split(", "))
    assert {"eager", "triton_paged", "flashinfer"} <= set(groups["backend"].split(", "))
    assert "a100-40gb" in groups["hardware"] and "opt-13b" in groups["model"]
    assert "workload.rate" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["+allocator=bogus"], "unknown allocator 'bogus'; known: contiguous"),
    (["model=gpt-9"], "unknown model 'gpt-9'; known:"),
    (["hardware=tpu"], "unknown hardware 'tpu'; known:"),
    (["workload=bogus"], "unknown workload 'bogus'; known:"),
    (["+allocator=paged", "allocator.block_size=0"], "block_size=0 is not allowed"),
    (["+allocator=paged", "allocator.block_size=-16"], "block_size=-16 is not allowed"),
    (["+allocator=paged", "allocator.block_size=512"], "block_size=512 is not allowed"),
    (["workload=fixed", "workload.input_len=2000", "workload.output_len=100"], "more than max_model_len=2048"),
    (["+allocator=contiguous", "engine.kv_cache_bytes=1e8"], "smaller than one request"),
    (["workload.rate=0"], "workload.rate=0"),
    (["workload.rate=-2"], "workload.rate=-2"),
    (["workload=trace", "workload.path=missing.csv"], "does not exist"),
    (["workload.bogus_knob=3"], "bad override"),
])
def test_bad_input_is_one_line_on_stderr_with_exit_code_2(tmp_path, args, message):
    result = bench(tmp_path, *args, "workload.num_requests=5")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert message in lines[0]


def test_a_sweep_whose_every_point_fails_exits_2_and_keeps_the_failed_rows(tmp_path):
    result = bench(tmp_path, "-m", "+allocator=paged,contiguous", "workload.rate=-1", "hydra.sweep.dir=sweep")
    assert result.returncode == 2
    assert "error: every point of the sweep failed; the first: workload.rate=-1 must be > 0" in result.stderr
    rows = list(csv.DictReader((tmp_path / "sweep" / "summary.csv").open()))
    assert sorted(r["allocator"] for r in rows) == ["contiguous", "paged"]
    assert {r["status"] for r in rows} == {"failed"}
