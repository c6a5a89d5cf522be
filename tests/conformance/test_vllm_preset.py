"""The `vllm` preset and the watermark rule it turns on; none of this needs vLLM installed.

The lockstep comparison with vLLM itself is test_vllm_lockstep.py.
"""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module

from kvbench.core.scheduler import Scheduler
from kvbench.core.sequence import Request, Sequence
from kvbench.plugins.allocators.paged import PagedAllocator
from kvbench.scenarios.build import build_engine, load_specs


def composed(*overrides):
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        return compose("bench", overrides=list(overrides))


def test_the_preset_sets_vllm_defaults_and_the_paper_setting_stays_the_default():
    cfg = composed("+preset=vllm")
    assert dict(cfg.allocator) == {"name": "paged", "block_size": 16, "watermark": 0.0, "prefix_caching": True}
    assert (cfg.scheduler.max_num_seqs, cfg.scheduler.max_num_batched_tokens) == (256, 2048)
    assert cfg.scheduler.chunked_prefill is True and cfg.scheduler.watermark_when_idle is False
    assert cfg.engine.preemption == "recompute"
    model, _ = load_specs(cfg)
    engine = build_engine(cfg, model, 1000 * 16, lambda allocator: None)
    assert engine.allocator.watermark_blocks == 0 and engine.allocator.prefix_caching
    assert engine.scheduler.watermark_when_idle is False and engine.scheduler.chunked_prefill

    default = composed("+allocator=paged")
    assert default.allocator.watermark == 0.01 and default.scheduler.watermark_when_idle is True
    engine = build_engine(default, model, 1000 * 16, lambda allocator: None)
    assert engine.allocator.watermark_blocks == 10 and engine.scheduler.watermark_when_idle is True


def one_request(seq_id: int, prompt_len: int, output_len: int = 10) -> Sequence:
    return Sequence(seq_id, Request(seq_id, 0.0, prompt_len, output_len), prompt_len)


def test_an_idle_pool_admits_past_the_watermark_only_when_told_to():
    # 100 blocks, watermark 10 % = 10 blocks kept free; a 92-block prompt fits, but not with headroom
    for when_idle, admitted in ((True, []), (False, [0])):
        scheduler = Scheduler(
            PagedAllocator(100 * 16, 2048, 16, watermark=0.1),
            8,
            2048,
            chunked_prefill=True,
            watermark_when_idle=when_idle,
        )
        scheduler.add(one_request(0, 92 * 16))
        batch = scheduler.schedule()
        assert [s.seq_id for s in batch.seqs] == admitted
        assert scheduler.allocator.watermark_exempt is False  # never left set after a step


def test_with_a_request_running_the_watermark_still_applies():
    scheduler = Scheduler(
        PagedAllocator(100 * 16, 2048, 16, watermark=0.1), 8, 4096, chunked_prefill=True, watermark_when_idle=False
    )
    scheduler.add(one_request(0, 40 * 16))
    scheduler.add(one_request(1, 55 * 16))  # fits the 60 free blocks, not with 10 kept free
    scheduler.add(one_request(2, 5 * 16))
    batch = scheduler.schedule()
    # the first is admitted while the pool is idle; the second is held by the watermark and, FCFS,
    # the third waits behind it
    assert [s.seq_id for s in batch.seqs] == [0]
    assert scheduler.allocator.pool.num_free == 60


def bench(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "-m", "kvbench.cli", *args, "progress=false"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bench_runs_the_preset_and_an_unknown_preset_is_one_line_with_exit_code_2(tmp_path):
    result = bench(tmp_path, "+preset=vllm", "workload.num_requests=40", "workload.duration_s=null")
    assert result.returncode == 0, result.stderr
    (metrics,) = tmp_path.glob("results/runs/*/metrics.csv")
    (row,) = csv.DictReader(metrics.open())
    assert (row["allocator"], row["preset"], row["completed"]) == ("paged", "vllm", "40")

    result = bench(tmp_path, "+preset=sglang")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: unknown preset 'sglang'; known: vllm"]


@pytest.mark.parametrize(
    "hardware, seqs, tokens",
    [("a100-40gb", 256, 2048), ("a100-80gb", 256, 2048), ("h100-sxm", 1024, 8192), ("h200", 1024, 8192)],
)
def test_the_preset_gives_each_gpu_vllm_s_server_defaults_for_it(hardware, seqs, tokens):
    """vLLM 0.33 gives a GPU of 70 GiB or more that is not an A100 1,024 sequences and 8,192
    tokens a step (EngineArgs.get_batch_defaults, OpenAI server); the preset kept the smaller
    GPUs' 256 and 2,048 everywhere. An override after it still wins."""
    cfg = composed("+preset=vllm", f"hardware={hardware}")
    assert (cfg.scheduler.max_num_seqs, cfg.scheduler.max_num_batched_tokens) == (seqs, tokens)
    model, _ = load_specs(cfg)
    engine = build_engine(cfg, model, 1000 * 16, lambda allocator: None)
    assert (engine.scheduler.max_num_seqs, engine.scheduler.max_num_batched_tokens) == (seqs, tokens)
    cfg = composed("+preset=vllm", f"hardware={hardware}", "scheduler.max_num_batched_tokens=512")
    assert cfg.scheduler.max_num_batched_tokens == 512


def test_the_preset_s_defaults_follow_vllm_s_memory_tiers():
    from kvbench.conf import vllm_batch_default

    gib = 1 << 30
    gpus = [("l4", 24 * gib), ("x", 70 * gib - 1), ("x", 70 * gib), ("a100-80gb", 80 * gib), ("b200", 180 * gib)]
    gpus.append(("h100", "8.6e10"))  # a number given as text (${oc.env:...}), as the schema reads it
    tiers = [tuple(vllm_batch_default(key, *gpu) for key in ("max_num_seqs", "max_num_batched_tokens")) for gpu in gpus]
    assert tiers == [(256, 2048), (256, 2048), (1024, 8192), (256, 2048), (1024, 16384), (1024, 8192)]
