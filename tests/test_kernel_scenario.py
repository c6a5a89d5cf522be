"""scenario=kernel: the KV laid out by the allocator, the roofline columns, the sweep and its plot.

Without a GPU the Triton backend runs under the interpreter (~10 ms per program-iteration),
so batch specs stay tiny and the rows say `interpreted=True`.
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
import types

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_module

from kvbench.core.spec import ModelSpec
from kvbench.errors import UserError
from kvbench.hookspecs import hookimpl
from kvbench.plugins.allocators.contiguous import ContiguousAllocator
from kvbench.plugins.allocators.paged import PagedAllocator
from kvbench.plugins.backends.eager import EagerBackend
from kvbench.registry import default_registry
from kvbench.reporting import console
from kvbench.scenarios import kernel as kernel_scenario
from kvbench.scenarios import kernel_case
from kvbench.scenarios.batch_spec import parse

BENCH = [sys.executable, "-m", "kvbench.cli"]
TINY = ModelSpec(
    name="tiny",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    num_params=1e5,
    max_model_len=512,
    dtype="fp32",
)


def bench(cwd, *args, env=None):
    return subprocess.run(
        [*BENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})}
    )


def kernel_cfg(*overrides):
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        return compose("bench", overrides=["scenario=kernel", "model=tiny", "scenario.min_run_time_s=0.01", *overrides])


def flat_slots(meta, seq: int, seq_len: int, block_size: int) -> list[int]:
    if meta.block_tables is not None:
        return [int(meta.block_tables[seq, i // block_size]) * block_size + i % block_size for i in range(seq_len)]
    return [int(meta.seq_starts[seq]) + i for i in range(seq_len)]


def test_paged_layout_scatters_blocks_and_keeps_a_contiguous_reference():
    spec = parse("3d40+1p20")
    allocator = PagedAllocator(num_slots=4096, max_model_len=512, block_size=8)
    case = kernel_case.build(spec, TINY, allocator, torch.float32, torch.device("cpu"), seed=0)
    tables = case.meta.block_tables
    assert tables.shape == (4, 5)  # 40 tokens = 5 blocks of 8
    # The allocator handed out blocks 0..17 in order; the shuffle leaves no sequence in order.
    assert all(tables[s, 1:3].tolist() != [tables[s, 0] + 1, tables[s, 0] + 2] for s in range(4))
    slots = [flat_slots(case.meta, s, n, 8) for s, n in enumerate(spec.seq_lens)]
    everything = [x for seq in slots for x in seq]
    assert len(set(everything)) == spec.kv_tokens == 140  # no slot shared between sequences
    reference = case.contiguous_meta
    assert reference.seq_starts.tolist() == [0, 40, 80, 120]  # back to back
    assert case.k_cache.shape[0] * 8 >= max(everything) + 1 and case.k_cache.shape[0] * 8 >= 140
    # The query tokens' slots: one per decode, the whole prompt of the prefill.
    assert case.meta.slot_mapping.tolist()[:3] == [slots[s][39] for s in range(3)]
    assert case.meta.slot_mapping.tolist()[3:] == slots[3]
    assert case.query.shape == (3 + 20, 4, 16)


def test_contiguous_allocator_gives_slot_ranges_and_no_reference():
    spec = parse("3d100")
    allocator = ContiguousAllocator(num_slots=4096, max_model_len=512, block_size=16)
    case = kernel_case.build(spec, TINY, allocator, torch.float32, torch.device("cpu"), seed=0)
    assert case.meta.seq_starts.tolist() == [0, 512, 1024]  # Orca(Max) reserves max_model_len each
    assert case.contiguous_meta is None


def test_bytes_moved_counts_visible_kv_queries_outputs_and_layout():
    # 4 decodes at 64 tokens, 2 kv heads x 16 dims fp32: K+V 65,536 B; q+o 2,048 B;
    # 16 block-table entries 64 B; seq_lens 16 B.
    assert kernel_scenario.bytes_moved(parse("4d64"), TINY, 4, 16, paged=True) == 65536 + 2048 + 64 + 16
    # A window of 32 reads only the last 32 keys of each 128-token context.
    windowed = kernel_scenario.bytes_moved(parse("2d128:w32"), TINY, 4, 16, paged=False)
    assert windowed == 2 * 32 * 2 * 16 * 2 * 4 + 2 * 4 * 16 * 2 * 4 + 2 * 8 + 2 * 4


def test_eager_kernel_row_has_every_kernel_column():
    [row] = kernel_scenario.run(kernel_cfg("+backend=eager", "batch=2d16+1p8"))
    assert row["batch_spec"] == "2d16+1p8" and row["kv_tokens"] == 40 and row["num_seqs"] == 3
    assert row["max_abs_err_vs_eager"] == 0.0
    assert 0 < row["latency_us_p10"] <= row["latency_us_p50"] <= row["latency_us_p90"]
    assert row["achieved_gbps"] == pytest.approx(row["bytes_moved"] / row["latency_us_p50"] / 1e3)
    if torch.cuda.is_available():
        assert row["roofline_frac"] > 0 and row["roofline_hardware"]
    else:  # a CPU has no profiled peak: it read as 0.0% of the A100's 1,555 GB/s
        assert math.isnan(row["roofline_frac"]) and row["roofline_hardware"] == ""
        assert "roofline" not in console.run_table({"scenario": "kernel", **row})
    assert row["paging_overhead"] > 0 and row["layout"] == "paged"
    assert row["interpreted"] is False  # torch's attention: Triton's interpreter runs none of it


def test_triton_kernel_matches_eager_on_a_shuffled_paged_cache():
    [row] = kernel_scenario.run(
        kernel_cfg("+backend=triton_paged", "batch=2d24:w16", "+allocator=paged", "allocator.block_size=4")
    )
    assert row["max_abs_err_vs_eager"] < 1e-4
    assert row["window"] == 16 and row["layout"] == "paged"


def test_sweep_over_backends_and_specs_writes_summary_and_plot(tmp_path):
    result = bench(
        tmp_path,
        "-m",
        "scenario=kernel",
        "model=tiny",
        "+backend=eager,triton_paged",
        "batch=1d16,2d32",
        "scenario.min_run_time_s=0.01",
        "hydra.sweep.dir=sweep",
        env={"TRITON_INTERPRET": "1"},
    )
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "sweep" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["backend"], r["batch_spec"]) for r in rows) == [
        ("eager", "1d16"),
        ("eager", "2d32"),
        ("triton_paged", "1d16"),
        ("triton_paged", "2d32"),
    ]
    assert all(r["status"] == "ok" for r in rows)
    if not torch.cuda.is_available():
        assert all(r["interpreted"] == str(r["backend"] == "triton_paged") for r in rows)  # eager's is torch's
    assert (tmp_path / "sweep" / "latency_vs_context.png").stat().st_size > 10_000


def test_malformed_batch_spec_is_one_line_exit_2(tmp_path):
    result = bench(tmp_path, "scenario=kernel", "model=tiny", "batch=4d1k+3x2")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "'3x2'" in result.stderr
    assert "Traceback" not in result.stderr


def test_backend_that_cannot_run_says_why(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("triton_paged runs on the GPU here")
    result = bench(
        tmp_path, "scenario=kernel", "model=tiny", "+backend=triton_paged", "batch=1d16", env={"TRITON_INTERPRET": "0"}
    )
    assert result.returncode == 2 and "TRITON_INTERPRET=1" in result.stderr
    assert result.stderr.strip().count("\n") == 0


@pytest.mark.slow
def test_gpu_check_script_runs_its_whole_pipeline_in_cpu_mode(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "gpu_check.sh")
    result = subprocess.run(
        ["bash", script, "--cpu"],
        capture_output=True,
        text=True,
        timeout=900,
        # TMPDIR: the script keeps its work folder (the stages' logs); in /tmp, one was left a run
        env={**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    with open(tmp_path / "kernel.csv") as f:
        kernel = list(csv.DictReader(f))
    assert sorted((r["backend"], r["batch_spec"]) for r in kernel) == [
        ("eager", "1d16"),
        ("eager", "2d16"),
        ("triton_paged", "1d16"),
        ("triton_paged", "2d16"),
    ]
    with open(tmp_path / "graphs.csv") as f:
        graphs = list(csv.DictReader(f))
    # 3 graph modes x blocking / async, each with the per-step host split
    assert sorted((r["graph"], r["async_scheduling"]) for r in graphs) == sorted(
        (g, a) for g in ("eager", "full", "piecewise") for a in ("False", "True")
    )
    assert all(r["cpu_overhead_frac"] != "" for r in graphs)
    figures = (tmp_path / "figures.txt").read_text()
    assert "triton_paged 2d16 fp32" in figures and "batch   2 piecewise" in figures
    assert (tmp_path / "latency_vs_context.png").is_file()


class OneRow(EagerBackend):
    name = "one_row"

    def forward(self, query, *args):
        return super().forward(query, *args)[:1]


class NaNs(EagerBackend):
    name = "nans"

    def forward(self, query, *args):
        return torch.full_like(super().forward(query, *args), math.nan)


class Forgetful(EagerBackend):
    name = "forgetful"

    def forward(self, query, *args):
        super().forward(query, *args)  # its return forgotten: a traceback from the shape check


@pytest.mark.parametrize(
    "backend, said",
    [
        (OneRow, r"backend one_row returned attention of shape \(1, 4, 16\) for a query of \(10, 4, 16\)"),
        (Forgetful, "backend forgetful returned NoneType from forward, not a tensor"),
        (NaNs, "backend nans's attention holds NaN or inf where eager's does not"),
    ],
)
def test_a_kernel_whose_output_is_not_attention_is_refused_not_timed(backend, said):
    """It was timed and reported (335 GB/s) for one row of 131 tokens; NaN left the error blank."""
    registry = default_registry()
    module = types.ModuleType("odd_backends")
    module.kvbench_backends = hookimpl(lambda: [backend])
    registry.register(module)
    try:
        with pytest.raises(UserError, match=said):
            kernel_scenario.run(kernel_cfg("+backend=eager", f"backend.name={backend.name}", "batch=2d16+1p8"))
    finally:
        registry.unregister(module)


def test_a_kernel_row_records_no_workload_rate_or_hardware_it_never_read():
    from kvbench.scenarios.run import run_point

    [row] = run_point(kernel_cfg("+backend=eager", "batch=1d16", "scenario.paging_overhead=false"))
    assert (row["workload"], row["rate"], row["hardware"]) == ("", "", "")
    assert row["model"] == "tiny" and row["scenario"] == "kernel"


def test_a_kernel_series_names_each_value_once_and_a_batch_with_prompts_by_its_spec():
    """`paged paged B=4`, and `2p256+4d512` drawn as B=6 with nothing to say 2 were prompts."""
    from kvbench.reporting.kernel_plots import series_label

    row = pd.Series({"allocator": "paged", "layout": "paged", "num_seqs": 6, "batch_spec": "2p256+4d512"})
    assert series_label(row, ["allocator", "layout"], interpreted=False) == "paged B=6 (2p256+4d512)"
    decode = row.copy()
    decode["num_seqs"], decode["batch_spec"] = 4, "4d1k"
    assert series_label(decode, ["allocator", "layout"], interpreted=True) == "paged B=4 (interpreted)"


@pytest.mark.parametrize(
    "device_name,profile",
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "a100-40gb"),  # 2.0 TB/s, not the SXM's 3.35: the configured profile
        ("NVIDIA GH200 480GB", "a100-40gb"),  # not an H200
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100 80GB PCIe", "a100-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
    ],
)
def test_a_gpu_s_roofline_is_its_own_profile_only_where_one_describes_it(monkeypatch, device_name, profile):
    """Matched by fragment, an H100 PCIe took the SXM's bandwidth and a GH200 the H200's."""
    from hydra import compose, initialize_config_module

    from kvbench.scenarios import kernel

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: device_name)
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=["scenario=kernel", "model=tiny", "hardware=a100-40gb"])
    assert kernel.roofline_hardware(cfg, torch.device("cuda")).name == profile


def test_a_repeated_kernel_run_shows_the_range_of_its_runs_beside_their_medians():
    """Five runs of one kernel on a busy host read 0.50x to 2.69x paged over contiguous; the
    table showed only their median, 1.57x."""
    row = {
        "scenario": "kernel",
        "latency_us_p50": 100.0,
        "paging_overhead": 1.57,
        "max_abs_err_vs_eager": 0.0,
        "samples": '{"paging_overhead": [0.5, 1.57, 1.57, 1.18, 2.69], "latency_us_p50": [90, 100, 100, 100, 130],'
        ' "max_abs_err_vs_eager": [0, 0, 0, 0, 0]}',
    }
    lines = console.run_table(row).splitlines()
    assert lines[-1] == (
        "the table shows the runs' medians; over the 5 runs (lowest - highest): "
        "Latency p50 (us) 90.00 - 130.00; "
        "Paged / contiguous latency 0.50x - 2.69x"
    )  # a number every run agrees on has no range to show
    assert "over the" not in console.run_table({**row, "samples": ""})  # one run: no range
