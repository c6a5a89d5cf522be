"""The real engine produces, token for token, what each request produces on its own.

Every request is also generated independently (kvbench.model.reference: the whole sequence recomputed
for each token, no allocator, no batch); the engine must match it under every allocator, with
preemption by recompute and by swap, chunked prefill, prefix caching, parallel sampling and beam
search.
"""

from __future__ import annotations

import os
import re

import pytest
from hydra import compose, initialize_config_module

from kvbench.errors import UserError
from kvbench.scenarios.run import run_point

from helpers.engine import GREEDY, SAMPLED, alone, beams_alone, make_requests, outputs, run_engine

# (allocator, KV slots, block size, preemption, swap slots): ample pools for the reserving
# policies (they never preempt); a paged pool tight enough to preempt, in both modes.
POOLS = {
    "contiguous": ("contiguous", 96 * 12, 4, "recompute", 0),
    "oracle": ("oracle", 300, 4, "recompute", 0),
    "pow2": ("pow2", 600, 4, "recompute", 0),
    "paged": ("paged", 400, 4, "recompute", 0),
    "paged-recompute": ("paged", 96, 4, "recompute", 0),
    "paged-swap": ("paged", 96, 4, "swap", 400),
    "paged-block-1-swap": ("paged", 96, 1, "swap", 400),
    "paged-block-16": ("paged", 112, 16, "recompute", 0),
}


def run_pool(name, requests, **kwargs):
    allocator, slots, block_size, preemption, swap = POOLS[name]
    return run_engine(requests, allocator, slots, block_size, preemption, swap, **kwargs)


@pytest.mark.parametrize("pool", list(POOLS))
def test_greedy_generation_equals_independent_generation(pool):
    requests = make_requests(6)
    row, engine = run_pool(pool, requests)
    if pool.startswith("paged-") and "16" not in pool:
        assert row["preemptions"] > 0  # the tight pool really preempted
    if pool.endswith("swap"):
        assert row["swapped_blocks"] > 0 and row["recomputed_tokens"] == 0
    got = outputs(engine)
    for r in requests:
        assert got[r.request_id][0][1] == alone(r, GREEDY)


def test_sampled_tokens_do_not_depend_on_batch_or_preemption():
    requests = make_requests(6)
    row, engine = run_pool("paged-swap", requests, sampling=SAMPLED)
    assert row["preemptions"] > 0
    got = outputs(engine)
    for r in requests:
        assert got[r.request_id][0][1] == alone(r, SAMPLED)
    assert any(alone(r, SAMPLED) != alone(r, GREEDY) for r in requests)  # it really sampled


def test_chunked_prefill_with_prefix_caching_keeps_tokens():
    requests = make_requests(6, prefix=13)
    row, engine = run_engine(
        requests, num_slots=120, chunked_prefill=True, max_num_batched_tokens=16, prefix_caching=True
    )
    assert row["prefix_hit_rate"] > 0.2
    got = outputs(engine)
    for r in requests:
        assert got[r.request_id][0][1] == alone(r, GREEDY)


@pytest.mark.parametrize("pool", ["contiguous", "oracle", "pow2", "paged", "paged-recompute", "paged-swap"])
def test_parallel_samples_equal_independent_samples(pool):
    requests = make_requests(4, n=3)
    row, engine = run_pool(pool, requests, sampling=SAMPLED)
    got = outputs(engine)
    for r in requests:
        samples = sorted(got[r.request_id])
        assert [index for index, _, _ in samples] == [0, 1, 2]
        for index, tokens, _ in samples:
            assert tokens == alone(r, SAMPLED, index)


@pytest.mark.parametrize("pool", ["contiguous", "oracle", "pow2", "paged", "paged-recompute", "paged-swap"])
def test_beam_search_equals_independent_beam_search(pool):
    requests = make_requests(4, beam_width=3, output_len=8)
    row, engine = run_pool(pool, requests)
    if pool.startswith("paged-"):
        assert row["preemptions"] > 0
    got = outputs(engine)
    for r in requests:
        beams = sorted(tokens for _, tokens, _ in got[r.request_id])
        assert beams == beams_alone(tuple(r.prompt_tokens), r.output_len, 3)


def test_prefix_caching_with_samples_beams_and_preemption_keeps_tokens():
    samples = make_requests(3, n=2, prefix=9, seed=1)
    row, engine = run_engine(
        samples, num_slots=100, preemption="swap", swap_slots=400, sampling=SAMPLED, prefix_caching=True
    )
    assert row["prefix_hit_rate"] > 0
    got = outputs(engine)
    for r in samples:
        for index, tokens, _ in got[r.request_id]:
            assert tokens == alone(r, SAMPLED, index)
    beams = make_requests(3, beam_width=2, prefix=9, seed=2, output_len=8)
    row, engine = run_engine(beams, num_slots=80, prefix_caching=True)
    assert row["prefix_hit_rate"] > 0 and row["preemptions"] > 0
    got = outputs(engine)
    for r in beams:
        assert sorted(t for _, t, _ in got[r.request_id]) == beams_alone(tuple(r.prompt_tokens), r.output_len, 2)


def test_group_admissions_undone_by_a_tight_pool_leave_no_uncomputed_block_to_hit(monkeypatch):
    """A preempted request's samples are admitted together; when the last one does not fit, the
    others are freed again before their step ran. Their blocks, named when grown, were still
    found by the next admission, which then skipped computing K/V nobody had written: 3 of 32
    samples came out wrong."""
    from kvbench.plugins.allocators.paged import PagedAllocator

    undone = []
    free_unrun = PagedAllocator.free_unrun
    monkeypatch.setattr(PagedAllocator, "free_unrun", lambda self, seqs: undone.append(1) or free_unrun(self, seqs))
    requests = make_requests(16, n=2, prefix=16, seed=2, output_len=30)
    row, engine = run_engine(requests, num_slots=300, block_size=8, sampling=SAMPLED, prefix_caching=True)
    assert row["preemptions"] > 0 and row["prefix_hit_rate"] > 0 and undone  # the undoing really happened
    got = outputs(engine)
    for r in requests:
        for index, tokens, _ in got[r.request_id]:
            assert tokens == alone(r, SAMPLED, index)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_recomputed_tokens_are_the_tokens_fed_again(prefix_caching, monkeypatch):
    """recomputed_tokens is what preemption cost in forward work: the tokens the model was fed
    beyond each request's prompt and output. With prefix caching a readmission finds its own
    blocks again, and those are not recomputed (46 were counted where 18 were fed again)."""
    from kvbench.executors.model_executor import ModelExecutor

    fed = []
    execute = ModelExecutor.execute
    counted = lambda self, batch: fed.append(batch.num_tokens) or execute(self, batch)  # noqa: E731
    monkeypatch.setattr(ModelExecutor, "execute", counted)
    requests = make_requests(6, output_len=12, seed=4)
    row, engine = run_engine(requests, num_slots=48, block_size=4, prefix_caching=prefix_caching)
    assert row["preemptions"] > 0
    needed = sum(r.prompt_len + r.output_len - 1 for r in requests)  # the last token is sampled, never fed
    assert sum(fed) - needed == row["recomputed_tokens"] > 0
    assert got_all(engine, requests)


def got_all(engine, requests) -> bool:
    got = outputs(engine)
    return all(got[r.request_id][0][1] == alone(r, GREEDY) for r in requests)


def test_serve_scenario_reports_the_host_time_split():
    overrides = [
        "scenario=serve",
        "model=tiny",
        "+allocator=paged",
        "workload=fixed",
        "workload.input_len=12",
        "workload.output_len=6",
        "scenario.num_requests=5",
        "progress=false",
    ]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=overrides)
    row = run_point(cfg)[0]
    assert row["completed"] == 5 and row["device"] == "cpu" and row["dtype"] == "fp32"
    phases = ("schedule", "copy", "prepare", "forward", "sample")
    assert all(row[f"{p}_s"] > 0 for p in ("schedule", "prepare", "forward", "sample"))
    assert sum(row[f"{p}_frac"] for p in phases) == pytest.approx(1.0)
    assert row["output_throughput"] == pytest.approx(5 * 6 / row["duration_s"])


def test_check_tokens_compares_every_sequence_with_one_request_generation(monkeypatch):
    overrides = ["scenario=serve", "model=tiny", "+allocator=paged", "workload=fixed", "workload.input_len=12"]
    overrides += [
        "workload.output_len=6",
        "workload.n=2",
        "scenario.num_requests=3",
        "scenario.sampling.temperature=0.8",
    ]
    overrides += ["scenario.check_tokens=true", "progress=false"]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=overrides)
    row = run_point(cfg)[0]
    assert row["completed"] == 3 and row["tokens_checked"] == 6
    from kvbench.model import reference

    generate = reference.generate_alone  # a reference that differs at one sample's 4th token
    monkeypatch.setattr(
        reference,
        "generate_alone",
        lambda *a: (t := generate(*a)) and (t[:3] + [t[3] + 1] + t[4:] if a[4] == 2 and a[5] == 1 else t),
    )
    with pytest.raises(
        UserError, match=r"1 of 6 sequences' tokens differ .* \(first: request 2 sample 1, from its out"
    ):
        run_point(cfg)


def test_check_tokens_refuses_bf16_under_triton_s_interpreter(monkeypatch):
    """The interpreter rounds a bf16 store toward zero (torch: to nearest): 2 of 6 sequences
    differed, and the error blamed the engine."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    overrides = ["scenario=serve", "model=tiny", "+backend=triton_paged", "scenario.dtype=bf16"]
    overrides += ["scenario.check_tokens=true", "scenario.num_requests=2", "progress=false"]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=overrides)
    with pytest.raises(UserError, match="rounds a bf16 store toward zero where torch rounds to nearest"):
        run_point(cfg)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pinning to cores needs Linux's sched_setaffinity")
def test_cpu_affinity_pins_exactly_the_listed_cores_or_refuses(monkeypatch):
    # [0, 99] ran pinned to core 0 and recorded [0, 99]; [] and [99] gave a bare errno
    from kvbench.scenarios import serve as serving

    before = os.sched_getaffinity(0)
    first = min(serving.START_CORES)
    missing = max(serving.START_CORES) + 1
    try:
        for cores, message in (
            ([], "names no core: list some of"),
            ([missing], f"this process may run on cores {serving._ranges(sorted(serving.START_CORES))[0]}"),
            ([first, missing], f"only, not [{missing}]"),
        ):
            with pytest.raises(UserError, match=re.escape(message)):
                serving.pin_cores(cores)
            assert os.sched_getaffinity(0) == before  # a refused set changes nothing
        serving.pin_cores([first])
        assert os.sched_getaffinity(0) == {first}
    finally:
        os.sched_setaffinity(0, before)
    assert serving._ranges([0, 1, 2, 5, 7, 8]) == ["0-2", "5", "7-8"]


def test_warm_up_takes_the_run_s_own_pool_where_an_allocator_cannot_work_in_a_small_one(monkeypatch):
    """The README's plugin keeps `spare_blocks` in reserve: with 64 of them the warm-up's fixed
    512-slot pool had none left, and the run ended in a traceback before its first step."""
    from types import SimpleNamespace

    from kvbench.scenarios import serve

    tried = []

    def build(cfg, spec, pool):
        tried.append(pool)
        if pool < 2048:  # what the reserve leaves of a small pool: nothing
            raise RuntimeError("zeros: Dimension size must be non-negative")
        return SimpleNamespace(pool=pool)

    monkeypatch.setattr(serve, "build_allocator", build)
    monkeypatch.setattr(serve, "StepTimer", lambda *a: SimpleNamespace(time=lambda shape: None))
    real = SimpleNamespace(spec=SimpleNamespace(max_model_len=2048, vocab_size=100), executor=lambda allocator: None)
    serve.warm_up(SimpleNamespace(seed=0), real, 1, num_slots=4096)
    assert tried == [512, 4096]
    tried.clear()
    with pytest.raises(RuntimeError):  # the run's own pool fails too: the run would, so it says so
        serve.warm_up(SimpleNamespace(seed=0), real, 1, num_slots=1024)
    assert tried == [512, 1024]
