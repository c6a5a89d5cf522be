"""kvbench's Scheduler + PagedAllocator under +preset=vllm make vLLM's decisions at every step.

Each case steps vLLM's own v1 Scheduler and kvbench in lockstep (scripts/vllm_conformance.py)
and requires identical scheduled requests and token counts in batch order, preemptions, finishes
and free blocks at every step, until every request has finished. The number of steps compared is
in each assertion message and in the test's `steps` property (pytest --junitxml, or -rA -s).

Without vLLM these tests skip with one line; with KVBENCH_REQUIRE_VLLM=1 (CI's conformance step,
run in the environment scripts/vllm_env.sh builds) a missing vLLM fails instead.
"""

from __future__ import annotations

import os

import pytest

try:
    import vllm
except ImportError as err:
    if os.environ.get("KVBENCH_REQUIRE_VLLM") == "1":
        raise RuntimeError(f"KVBENCH_REQUIRE_VLLM=1 but vllm is not importable: {err}") from None
    pytest.skip(
        f"vllm is not importable ({err}); scripts/vllm_env.sh builds an environment with it", allow_module_level=True
    )

import vllm_conformance as conformance
from vllm_conformance import CASES

from kvbench.errors import UserError

KVBENCH_WATERMARK = ["allocator.watermark=0.01", "scheduler.watermark_when_idle=true"]  # its defaults


def test_vllm_is_the_version_the_harness_was_written_for():
    assert vllm.__version__ == conformance.SUPPORTED_VLLM == "0.33.0"


@pytest.mark.parametrize("name", list(CASES))
def test_the_preset_makes_vllms_decisions_at_every_step(name, record_property):
    case = CASES[name]
    report = conformance.run_case(case)
    record_property("steps", report.steps)
    print(report.summary())
    assert report.divergence is None, report.summary()
    assert report.finished == case.num_requests, report.summary()
    assert report.steps > case.num_requests, report.summary()
    assert report.kvbench_s > 0 and report.vllm_s > 0  # timed; the ratio is reported, not asserted
    if name.startswith("preemption"):
        assert report.preemptions > case.num_requests // 2, report.summary()
    if case.prefix_caching:
        # a first admission's hit or a resumed request's (sharegpt-prefix has only those): the cache ran
        assert report.prefix_hit_tokens + report.preempted_hit_tokens > 0, report.summary()
    if name == "max-num-seqs":
        assert report.max_batch == case.max_num_seqs and report.preemptions == 0, report.summary()
    if name == "idle-watermark":
        assert report.idle_admissions == case.num_requests, report.summary()


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.prefix_caching])
def test_a_simulated_run_without_token_ids_makes_vllms_prefix_cache_decisions(name):
    """A simulated run has no token ids: its prompts have none without a shared prefix, and its
    cost model samples none. Its prefix cache found nothing then, not even a preempted request's
    own blocks, which vLLM's finds again (sharegpt-prefix diverged at step 23)."""
    case = CASES[name]
    report = conformance.run_case(case, simulated=True)
    assert report.divergence is None, report.summary()
    assert report.finished == case.num_requests, report.summary()
    if not case.prefix_len:  # no shared prompt: every hit is a resumed request's own blocks
        assert report.prefix_hit_tokens == 0 and report.preempted_hit_tokens > 0, report.summary()


def test_with_kvbenchs_own_watermark_the_first_divergence_is_reported_with_step_and_reason():
    report = conformance.run_case(CASES["sharegpt"], overrides=KVBENCH_WATERMARK)
    d = report.divergence
    assert d is not None and d.what == "scheduled"
    assert 1 < d.step < 100 and report.steps == d.step - 1
    assert "kvbench refuses it" in d.reason and "likely: the admission watermark" in d.reason
    assert "kvbench keeps 19 blocks free" in d.reason and "vLLM 0" in d.reason
    assert len(d.vllm.scheduled) == len(d.kvbench.scheduled) + 1  # vLLM admitted one more
    summary = report.summary()
    assert f"DIVERGED at step {d.step}" in summary and "kvbench: batch [" in summary and "vLLM:    batch [" in summary


def test_keeping_the_watermark_when_nothing_runs_diverges_at_the_first_admission():
    report = conformance.run_case(CASES["idle-watermark"], overrides=["scheduler.watermark_when_idle=true"])
    d = report.divergence
    assert d is not None and d.step == 1 and d.kvbench.scheduled == [] and len(d.vllm.scheduled) == 1
    assert "while nothing runs: vLLM skips it, kvbench keeps 30 blocks free" in d.reason


def test_a_case_whose_request_never_fits_either_side_is_one_line_naming_it():
    case = conformance.Case(
        "never",
        "",
        workload=(("kind", "fixed"), ("input_len", 2000), ("output_len", 40)),
        num_blocks=100,
        num_requests=2,
    )
    with pytest.raises(UserError, match="step 1 scheduled nothing on either side .* request 0 .* never fits"):
        conformance.run_case(case)


def test_settings_vllm_refuses_are_one_line_naming_its_reason():
    case = conformance.Case("budget", "", max_num_batched_tokens=8, num_requests=2)
    with pytest.raises(UserError, match=r"vLLM refuses the case's settings: max_num_batched_tokens \(8\) must be"):
        conformance.run_case(case)
