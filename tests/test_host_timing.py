"""CPU overhead: the lecture's async-scheduling arithmetic, the step time split, and async
scheduling that changes when steps run but never which tokens they produce."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported

from hydra import compose, initialize_config_module  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from kvbench.core.engine import Engine  # noqa: E402
from kvbench.core.recorder import Recorder  # noqa: E402
from kvbench.core.scheduler import Scheduler  # noqa: E402
from kvbench.core.sequence import Request  # noqa: E402
from kvbench.core.spec import ModelSpec  # noqa: E402
from kvbench.errors import UserError  # noqa: E402
from kvbench.executors.async_scheduling import PLACEHOLDER, AsyncScheduling, check_async_supported  # noqa: E402
from kvbench.executors.host_timing import DeviceClock, async_speedup, overhead_columns, overhead_share, step_time_s  # noqa: E402
from kvbench.executors.model_executor import ModelExecutor  # noqa: E402
from kvbench.model.decoder import TinyDecoder  # noqa: E402
from kvbench.model.sampling import SamplingParams  # noqa: E402
from kvbench.plugins.allocators.paged import PagedAllocator  # noqa: E402
from kvbench.plugins.backends.eager import EagerBackend  # noqa: E402
from kvbench.scenarios.run import run_point  # noqa: E402

# ---- the lecture's model ----


def test_async_scheduling_hides_2ms_of_scheduling_behind_an_8ms_step():
    assert step_time_s(8e-3, 2e-3, async_scheduling=False) == pytest.approx(10e-3)
    assert step_time_s(8e-3, 2e-3, async_scheduling=True) == pytest.approx(8e-3)
    assert async_speedup(8e-3, 2e-3) == pytest.approx(1.25)


def test_one_ms_of_host_work_costs_17_percent_at_5ms_and_1_percent_at_100ms():
    assert overhead_share(1e-3, 5e-3) == pytest.approx(1 / 6)  # ~17%
    assert overhead_share(1e-3, 100e-3) == pytest.approx(1 / 101)  # ~1%


def test_overhead_columns_from_wall_and_device_time():
    clock = DeviceClock(torch.device("cpu"), threaded=True)
    for device in (8e-3, 8e-3):
        clock.start()
        clock.stop()
        clock.ran(device)
    columns = overhead_columns([10e-3, 10e-3], clock)
    assert columns["device_s"] == pytest.approx(8e-3)
    assert columns["cpu_overhead_frac"] == pytest.approx(0.2)  # idle 2 of every 10 ms
    assert columns["async_bound_speedup"] == pytest.approx(1.25)  # the lecture's example again
    assert columns["launch_s"] < 1e-3


def test_cpu_clock_counts_the_forward_as_device_time_when_it_runs_inline():
    clock = DeviceClock(torch.device("cpu"))
    clock.start()
    sum(range(10_000))
    clock.stop()
    assert clock.device_s() == clock.launch_s and clock.launch_s[0] > 0


# ---- async scheduling in the real engine ----

TINY = OmegaConf.to_container(
    OmegaConf.load(os.path.join(os.path.dirname(__file__), "..", "conf", "model", "tiny.yaml"))
)


def serve(async_scheduling: bool, temperature: float, num_slots: int = 48):
    """Six requests through a pool small enough to preempt; the tokens each request produced."""
    spec = ModelSpec.from_cfg(TINY)
    rng = np.random.default_rng(0)
    requests = [
        Request(i, 0.0, int(p), int(o), prompt_tokens=rng.integers(0, spec.vocab_size, int(p)))
        for i, (p, o) in enumerate([(12, 9), (5, 14), (20, 6), (9, 11), (16, 8), (3, 12)])
    ]
    allocator = PagedAllocator(num_slots=num_slots, max_model_len=spec.max_model_len, block_size=4, model=spec)
    allocator.record_copies = True
    model = TinyDecoder(spec, seed=0).eval()
    executor = ModelExecutor(
        model, allocator, EagerBackend(), SamplingParams(temperature, 1.0, seed=3), async_scheduling=async_scheduling
    )
    recorder = Recorder(keep_sequences=True)
    engine = Engine(Scheduler(allocator, max_num_seqs=4, max_num_batched_tokens=32), executor, recorder, progress=False)
    if async_scheduling:
        check_async_supported(requests, allocator)
        engine.executor = AsyncScheduling(executor, recorder, len(requests))
    row = engine.run(requests)
    if async_scheduling:
        engine.executor.drain()
    tokens = {seq.request.request_id: seq.token_ids[seq.request.prompt_len :] for seq in recorder.finished}
    return tokens, row, recorder, executor


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_async_scheduling_produces_the_blocking_runs_tokens(temperature):
    blocking, blocking_row, _, _ = serve(False, temperature)
    overlapped, async_row, recorder, executor = serve(True, temperature)
    assert overlapped == blocking
    assert all(PLACEHOLDER not in t for t in overlapped.values())
    assert [len(blocking[i]) for i in range(6)] == [9, 14, 6, 11, 8, 12]
    assert async_row["preemptions"] == blocking_row["preemptions"] > 0  # same schedule, same evictions
    assert async_row["steps"] == blocking_row["steps"]
    # every first token and finish is stamped when the token existed, never before its step ran
    assert all(s.first_token_s <= s.finish_s for s in recorder.finished)
    assert len(executor.clock.device_s()) == async_row["steps"]


def test_async_scheduling_refuses_forks_and_prefix_caching():
    spec = ModelSpec.from_cfg(TINY)
    with pytest.raises(UserError, match="one sequence"):
        check_async_supported([Request(0, 0.0, 4, 4, n=2)], None)
    allocator = PagedAllocator(num_slots=64, max_model_len=512, block_size=4, prefix_caching=True, model=spec)
    with pytest.raises(UserError, match="prefix_caching"):
        check_async_supported([Request(0, 0.0, 4, 4)], allocator)


# ---- scenario=serve rows ----

HOST_SPLIT = ("schedule_s", "prepare_s", "launch_s", "device_s", "sample_s", "cpu_overhead_frac")


@pytest.mark.parametrize("graph, backend", [("eager", "eager"), ("full", "triton_paged"), ("piecewise", "eager")])
def test_serve_rows_carry_the_host_split_in_every_graph_mode(graph, backend):
    overrides = [
        "scenario=serve",
        "model=tiny",
        f"+graph={graph}",
        f"+backend={backend}",
        "workload=fixed",
        "workload.num_requests=3",
        "workload.input_len=6",
        "workload.output_len=3",
        "progress=false",
        "graph.capture_sizes=[1,2,4]" if graph != "eager" else "seed=0",
    ]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=overrides)
    [row] = run_point(cfg)
    assert row["graph"] == graph and row["completed"] == 3
    assert row["interpreted"] == (backend == "triton_paged")  # conftest runs Triton's kernels interpreted
    for column in HOST_SPLIT:
        assert row[column] >= 0, column
    assert 0 <= row["cpu_overhead_frac"] < 1 and row["device_s"] > 0
    if graph == "full":  # the 3-row decodes ran captured (padded to 4); the prefill ran eager
        assert row["graph_replays"] == 2 and "prefill" in row["graph_eager_reason"]
    if graph == "piecewise":
        assert row["graph_pieces"] == 3


def test_serve_async_scheduling_row_says_so():
    overrides = [
        "scenario=serve",
        "model=tiny",
        "engine.async_scheduling=true",
        "workload=fixed",
        "workload.num_requests=4",
        "workload.input_len=6",
        "workload.output_len=5",
        "progress=false",
    ]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=overrides)
    [row] = run_point(cfg)
    assert row["async_scheduling"] is True and row["completed"] == 4
    assert 0 <= row["cpu_overhead_frac"] < 1


def test_serve_times_its_phases_on_the_clock_that_times_its_steps(tmp_path, monkeypatch):
    """scenario.clock=cpu timed the steps in CPU time and their phases in wall time: on a host
    where the two part (here a CPU clock at half speed), the phases added up to more than the
    step, and the device's share was wall over CPU time."""
    import time

    import pandas as pd

    from kvbench import cli
    from kvbench.scenarios import serve

    from helpers.cli import in_process

    monkeypatch.setitem(serve.CLOCKS, "cpu", lambda: time.perf_counter() / 2)
    args = ["scenario=serve", "model=tiny", "scenario.num_requests=4", "scenario.clock=cpu", "plots=false"]
    assert in_process(lambda: cli.main([*args, f"hydra.run.dir={tmp_path}"])).returncode == 0
    row = pd.read_csv(tmp_path / "metrics.csv").iloc[0]
    step = row["duration_s"] / row["steps"]
    phases = sum(row[f"{phase}_s"] for phase in ("schedule", "copy", "prepare", "forward", "sample"))
    assert 0.5 * step < phases <= step  # the rest: bookkeeping between phases (about 1 %)
    assert row["device_s"] <= step
