"""Quiet steps: after a simulated step in which every running sequence was steady, the engine
runs the steps up to the next one that meets a sequence without scheduling them one by one
(Engine._run_quiet_steps, Scheduler.quiet_stretch). Those steps must decide and record exactly
what scheduling them does: the property tests of lazy decode (test_lazy_decode, test_orca_room)
hold the quiet steps of their random workloads to the eager loop; here the roofline's own runs
are held to themselves with the quiet steps scheduled."""

import pytest
from hydra import compose, initialize_config_module

from kvbench.scenarios.simulate import simulate


def run(allocator: str, quiet: bool, *overrides: str):
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=[f"+allocator={allocator}", "progress=false", *overrides])
    executed = []

    def prepare(engine):
        execute = engine.executor.execute
        engine.executor.execute = lambda batch: executed.append(1) or execute(batch)
        if not quiet:
            engine.executor.quiet_step_s = None  # every step scheduled and executed

    row, engine = simulate(cfg, prepare)
    row.pop("schedule_us_per_step")  # host wall time, not simulated
    recorder = engine.recorder
    return row, (recorder.step_end, recorder.step_dt, recorder.batch_size, recorder.kv), len(executed)


@pytest.mark.parametrize("allocator", ["contiguous", "pow2", "oracle", "paged"])
def test_quiet_steps_run_in_a_stretch_decide_and_record_what_scheduling_them_does(allocator):
    """ShareGPT at 4 req/s: the Orca allocators' queue grows behind a refused head (arrivals
    join it mid-stretch; external fragmentation waits are counted per step), paged preempts."""
    overrides = ("workload.num_requests=400", "workload.duration_s=null")
    stretched, steps, executed = run(allocator, True, *overrides)
    scheduled, steps_one_by_one, executed_one_by_one = run(allocator, False, *overrides)
    assert stretched == scheduled
    assert steps == steps_one_by_one
    assert executed_one_by_one == len(steps[0])
    if allocator != "paged":  # steady inside their reservations, an Orca batch is mostly quiet
        assert executed < 0.2 * len(steps[0])


def test_with_nobody_waiting_an_arrival_ends_the_stretch():
    """At 0.5 req/s nobody waits: each arrival must be admitted at the step it arrives in."""
    overrides = ("workload.rate=0.5", "workload.num_requests=60", "workload.duration_s=null")
    stretched, steps, executed = run("oracle", True, *overrides)
    scheduled, steps_one_by_one, _ = run("oracle", False, *overrides)
    assert stretched == scheduled and steps == steps_one_by_one
    assert executed < len(steps[0])


SPECS = [("opt-13b", "a100-40gb"), ("llama-3-70b", "h100-sxm"), ("opt-175b", "a100-80gb"), ("small", "h200")]
SPECS += [("opt-66b", "a100-40gb hardware.num_gpus=4")]  # tensor parallel: the all-reduces' terms too
SPECS += [("opt-66b", "a100-40gb hardware.num_gpus=4 hardware.allreduce_latency_s=0")]  # its bandwidth term alone


@pytest.mark.parametrize("model,hardware", SPECS)
def test_a_quiet_steps_time_is_the_bit_identical_float_step_time_gives(model, hardware):
    """The executor's quiet_step_s drops step_time's window and state terms (zeros for a
    full-attention model); each duration must still be the very float step_time returns, from
    the first step's weights-bound time to contexts past the compute-bound knee."""
    import random

    from kvbench.executors.cost_model import CostModelExecutor
    from kvbench.scenarios.build import load_specs

    with initialize_config_module("kvbench.conf", version_base="1.3"):
        overrides = [f"model={model}", *f"hardware={hardware}".split()]
        e = CostModelExecutor(*load_specs(compose("bench", overrides=overrides)))
    rng = random.Random(0)
    cases = [(1, 0), (256, 0)] + [(rng.randint(1, 1024), rng.randint(0, 10 ** rng.randint(1, 8))) for _ in range(2000)]
    assert not [(n, c) for n, c in cases if e.quiet_step_s(n, c, c).hex() != e.step_time(n, c, c).hex()]

    def memory_s(n, c):
        s = (e.weight_bytes + e.kv_bytes_per_token * (c + n)) / e.bytes_per_s
        return s + e.fixed_step_s + e.allreduce_s_per_token * n  # one GPU: + overhead + 0.0, the same float

    # steps on both sides of the roofline's knee
    assert {e.quiet_step_s(n, c, c) == memory_s(n, c) for n, c in cases} == {True, False}


def test_tensor_parallel_steps_pay_two_all_reduces_a_layer_by_hand():
    """OPT-66B on 4 x A100-40GB: a decode step of 32 tokens is the roofline of a quarter of the
    weights and KV per GPU, plus 64 layers x 2 all-reduces of 32 x 9216 fp16 values, each
    9 us + 2 x 3/4 x 589,824 bytes / 133 GB/s (conf/hardware/a100-40gb.yaml); on one GPU none."""
    from kvbench.executors.cost_model import CostModelExecutor
    from kvbench.scenarios.build import load_specs

    def executor(*overrides):
        with initialize_config_module("kvbench.conf", version_base="1.3"):
            return CostModelExecutor(*load_specs(compose("bench", overrides=["model=opt-66b", *overrides])))

    tp4, one = executor("hardware.num_gpus=4"), executor("hardware.num_gpus=1")
    message = 32 * 9216 * 2
    all_reduces = 2 * 64 * (9e-6 + 2 * 3 / 4 * message / 133e9)
    assert tp4.step_time(32, 32 * 1000, 32 * 1000) - all_reduces == pytest.approx(
        (tp4.weight_bytes + tp4.kv_bytes_per_token * 32 * 1001) / (4 * 1555e9 * 0.75) + 0.008, rel=1e-12
    )
    assert one.allreduce_s == one.allreduce_s_per_token == 0.0
    # more GPUs: the roofline terms shrink, the all-reduces' grow (a ring sends 2(g-1)/g of each)
    tp8 = executor("hardware.num_gpus=8")
    assert tp8.allreduce_s == tp4.allreduce_s and tp8.allreduce_s_per_token > tp4.allreduce_s_per_token
