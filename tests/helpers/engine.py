"""The tiny model served through the real engine, and each request generated on its own to compare.

`run_engine` serves requests through any allocator with the eager backend and checks the KV
accounting at every step; `alone` and `beams_alone` are the independent one-request generations
(kvbench.model.reference) the engine's tokens must equal. Both are cached: the tiny model is
built once, and a request's reference tokens are computed once however many tests ask.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from kvbench.core.engine import Engine
from kvbench.core.recorder import Recorder
from kvbench.core.scheduler import Scheduler
from kvbench.core.sequence import Request
from kvbench.core.spec import ModelSpec
from kvbench.executors.model_executor import ModelExecutor
from kvbench.model.decoder import TinyDecoder
from kvbench.model.reference import beam_search_alone, generate_alone
from kvbench.model.sampling import SamplingParams
from kvbench.plugins.backends.eager import EagerBackend
from kvbench.registry import default_registry

# GQA, and a sliding-window layer beside a full one, so generation exercises both.
SPEC = ModelSpec(
    name="test-tiny",
    num_layers=2,
    hidden_size=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    num_params=1e4,
    max_model_len=96,
    dtype="fp32",
    vocab_size=128,
    intermediate_size=64,
    layer_pattern=("window", "full"),
    window=6,
)
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, seed=3)


@functools.lru_cache(maxsize=1)
def tiny_model() -> TinyDecoder:
    torch.set_num_threads(1)  # the model's ops are tiny; extra threads only contend
    return TinyDecoder(SPEC, seed=0).eval()


def make_requests(
    count: int, output_len: int = 10, n: int = 1, beam_width: int = 1, seed: int = 0, prefix: int = 0
) -> list[Request]:
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, SPEC.vocab_size, prefix)
    requests = []
    for i, length in enumerate(rng.integers(3, 20, count)):
        prompt = np.concatenate([shared, rng.integers(0, SPEC.vocab_size, int(length))])
        requests.append(Request(i, 0.0, len(prompt), output_len, prompt, n, beam_width, 0 if prefix else -1))
    return requests


def run_engine(
    requests,
    allocator="paged",
    num_slots=400,
    block_size=4,
    preemption="recompute",
    swap_slots=0,
    sampling=GREEDY,
    chunked_prefill=False,
    max_num_batched_tokens=512,
    max_num_seqs=64,
    on_step=None,
    **options,
):
    """Serve `requests` through the real engine; returns (result row, engine).

    Every step checks the KV accounting: no part negative, none beyond the pool."""
    cls = default_registry().get("allocator", allocator)
    pool = cls(num_slots=num_slots, max_model_len=SPEC.max_model_len, block_size=block_size, **options)
    if swap_slots:
        pool.enable_swap(swap_slots)
    pool.record_copies = True
    executor = ModelExecutor(tiny_model(), pool, EagerBackend(), sampling, swap_slots=swap_slots)
    execute = executor.execute

    def checked(batch):
        acc = pool.accounting()
        assert min(acc.token, acc.reserved, acc.internal, acc.free) >= 0, acc
        if on_step:
            on_step(batch, pool)
        return execute(batch)

    executor.execute = checked
    scheduler = Scheduler(pool, max_num_seqs, max_num_batched_tokens, chunked_prefill, preemption)
    engine = Engine(scheduler, executor, Recorder(keep_sequences=True), progress=False)
    row = engine.run(requests)
    assert pool.accounting().free == pool.num_slots  # everything given back
    return row, engine


def outputs(engine) -> dict:
    """request id -> [(sample index, generated tokens, cumulative logprob)] of its sequences."""
    out: dict = {}
    for seq in engine.recorder.finished:
        out.setdefault(seq.request.request_id, []).append(
            (seq.sample_index, seq.token_ids[seq.request.prompt_len :], seq.cumulative_logprob)
        )
    return out


def alone(request: Request, sampling: SamplingParams, sample_index: int = 0) -> list[int]:
    return _alone(request.request_id, tuple(request.prompt_tokens), request.output_len, sampling, sample_index)


@functools.cache
def _alone(request_id, prompt, output_len, sampling, sample_index):
    return generate_alone(tiny_model(), prompt, output_len, sampling, request_id, sample_index)


@functools.cache
def beams_alone(prompt: tuple, output_len: int, width: int) -> list:
    return sorted(tokens for tokens, _ in beam_search_alone(tiny_model(), prompt, output_len, width))
