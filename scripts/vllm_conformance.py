"""Step-for-step conformance of kvbench's Scheduler + PagedAllocator with vLLM's own v1 scheduler.

Both sides get one request stream (kvbench's seeded workload generator, with token ids) and the
same fake model: a request whose prompt is done samples one token per step, the same token on
both sides (a function of request id and position). They are stepped in lockstep, vLLM's
`Scheduler.schedule()` / `update_from_output()` against kvbench's `Scheduler.schedule()` and the
engine's token bookkeeping, and after every step these decisions must be identical:

  - the scheduled requests and their token counts, in batch order;
  - the requests preempted in the step;
  - the free KV blocks after scheduling and again after the step's finished requests are freed;
  - the requests that finished.

On the first difference the run stops and reports the step, both batches and the rule that most
likely differs (the admission watermark, the token budget, max_num_seqs, preemption, prefix-cache
hits or block accounting). kvbench is configured through its config tree, by default with
`+preset=vllm`, so the check covers the preset; vLLM keeps its own defaults for everything the
case does not set (its watermark included). Both sides are timed per step (schedule + output
processing, not the fake model) and the ratio kvbench / vLLM is printed.

vLLM runs on the CPU, without a model: its config reads a small local OPT-125m-shaped
`config.json` (`skip_tokenizer_init`), the KV pool is given as a block count (vLLM's block 0 is
its reserved null block, so kvbench's pool has one block fewer) and nothing is downloaded. The
environment: scripts/vllm_env.sh. Only the vLLM version below is supported.

  python scripts/vllm_conformance.py                      # every case, +preset=vllm
  python scripts/vllm_conformance.py --case sharegpt --set allocator.watermark=0.01 \\
      --set scheduler.watermark_when_idle=true            # kvbench's own watermark: diverges
  python scripts/vllm_conformance.py --list

Bad input (unknown case or preset, another vLLM version, no vLLM) is one line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from kvbench.arith import cdiv
from kvbench.errors import ArgumentParser, UserError

SUPPORTED_VLLM = "0.33.0"

# OPT-125m's shape (12 layers, hidden 768 = 12 heads x 64, vocabulary 50,272, 2,048 positions):
# all vLLM's config needs; the scheduler never touches weights.
MODEL_CONFIG = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "hidden_size": 768,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "ffn_dim": 3072,
    "max_position_embeddings": 2048,
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
    "do_layer_norm_before": True,
    "torch_dtype": "float16",
    "activation_function": "relu",
    "bos_token_id": 2,
    "eos_token_id": 2,
    "pad_token_id": 1,
}
VOCAB = MODEL_CONFIG["vocab_size"]


@dataclass(frozen=True)
class Case:
    """One lockstep run. `num_blocks` is vLLM's block count (kvbench gets one fewer: vLLM's
    null block); `arrivals_per_step` None puts every request in the queue at step 1, else
    arrivals are Poisson with that mean per step."""

    name: str
    about: str
    workload: tuple = (("kind", "sharegpt"),)  # kvbench workload keys (kind, input_len, ...)
    num_requests: int = 300
    num_blocks: int = 2000
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    prefix_caching: bool = False
    prefix_len: int = 0
    num_prefixes: int = 1
    arrivals_per_step: float | None = None
    max_model_len: int = 2048
    seed: int = 0
    vllm_watermark: float | None = None  # None: vLLM's default; kvbench gets the same blocks kept
    overrides: tuple = ()  # kvbench config overrides the case needs (before --set)


CASES = {
    c.name: c
    for c in (
        Case("sharegpt", "300 ShareGPT-length requests at once, 2,000 blocks, 256 seqs, 2,048-token steps"),
        Case(
            "sharegpt-prefix",
            "the same with prefix caching (resumed requests hit their own blocks)",
            prefix_caching=True,
        ),
        Case(
            "system-prompts",
            "4 shared 400-token system prompts, prefix caching, ~1 arrival per 4 steps",
            prefix_caching=True,
            prefix_len=400,
            num_prefixes=4,
            arrivals_per_step=0.25,
        ),
        Case(
            "max-num-seqs",
            "max_num_seqs=24 binds long before memory does (6,000 blocks)",
            num_blocks=6000,
            max_num_seqs=24,
            arrivals_per_step=2.0,
        ),
        Case(
            "small-budget",
            "a 192-token step budget: prompts are chunked over many steps",
            max_num_batched_tokens=192,
            max_num_seqs=128,
            num_requests=200,
        ),
        Case("preemption", "heavy preemption: 400 blocks (6,400 tokens) for 300 requests", num_blocks=400),
        Case(
            "preemption-prefix",
            "heavy preemption with prefix caching: evictions and re-hits",
            num_blocks=400,
            prefix_caching=True,
        ),
        Case(
            "idle-watermark",
            "a 25 % watermark on both sides and ~1,600-token prompts that fit only an idle "
            "pool (121 blocks): the watermark is skipped when nothing runs",
            workload=(("kind", "uniform"), ("input_len", 1500), ("output_len", 100), ("range_ratio", 0.1)),
            num_requests=20,
            num_blocks=121,
            arrivals_per_step=0.02,
            vllm_watermark=0.25,
        ),
        Case(
            "repeated-blocks",
            "64-token prompts that repeat whole blocks, prefix caching, a 20-block pool: several "
            "blocks hold the same content, and a lookup takes the oldest once the first is evicted",
            workload=(("kind", "fixed"), ("input_len", 0), ("output_len", 30)),
            num_requests=60,
            num_blocks=20,
            prefix_caching=True,
            prefix_len=64,
            arrivals_per_step=0.3,
        ),
    )
}
# Settings each case gives both sides: a --set of one of them would change kvbench's side alone
CASE_KEYS = {
    "allocator.block_size": "block_size",
    "allocator.prefix_caching": "prefix_caching",
    "scheduler.max_num_seqs": "max_num_seqs",
    "scheduler.max_num_batched_tokens": "max_num_batched_tokens",
    "scheduler.chunked_prefill": "chunked prefill (on on both sides)",
    "engine.preemption": "preemption (vLLM's v1 scheduler recomputes)",
    "seed": "seed",
}


@dataclass
class StepView:
    """One side's decisions in one step."""

    scheduled: list  # [(request_id, num_tokens)] in batch order
    preempted: list  # sorted request ids
    free_after_schedule: int
    finished: list = field(default_factory=list)  # sorted request ids
    free_after_step: int = 0


@dataclass
class Divergence:
    step: int
    what: str
    reason: str
    kvbench: StepView
    vllm: StepView


@dataclass
class Report:
    case: str
    vllm_version: str
    overrides: list
    steps: int = 0  # steps compared and identical (the diverging one, if any, not counted)
    divergence: Divergence | None = None
    finished: int = 0
    preemptions: int = 0
    max_batch: int = 0  # most requests scheduled in one step
    idle_admissions: int = 0  # steps that admitted while nothing was running
    prefix_hit_tokens: int = 0  # first admissions' (vLLM's hits)
    preempted_hit_tokens: int = 0  # re-admitted victims' (vLLM's preempted_hits)
    kvbench_s: float = 0.0  # schedule + output processing, all steps
    vllm_s: float = 0.0

    @property
    def ratio(self) -> float:
        return self.kvbench_s / self.vllm_s if self.vllm_s else math.nan

    def summary(self) -> str:
        us = lambda s: 1e6 * s / max(self.steps, 1)
        head = (
            f"{self.case}: {self.steps} steps, {self.finished} finished, {self.preemptions} preemptions, "
            f"per step kvbench {us(self.kvbench_s):.0f} us / vLLM {us(self.vllm_s):.0f} us = {self.ratio:.3f}x"
        )
        if self.divergence is None:
            return head + " -- identical at every step"
        d = self.divergence
        return (
            f"{head} -- DIVERGED at step {d.step} ({d.what}): {d.reason}\n"
            f"  kvbench: {_show(d.kvbench)}\n  vLLM:    {_show(d.vllm)}"
        )


def _show(view: StepView, limit: int = 12) -> str:
    items = " ".join(f"{r}:{n}" for r, n in view.scheduled[:limit])
    more = f" ... (+{len(view.scheduled) - limit})" if len(view.scheduled) > limit else ""
    return (
        f"batch [{items}{more}] preempted {view.preempted} finished {view.finished} "
        f"free {view.free_after_schedule} -> {view.free_after_step}"
    )


def fake_token(request_id: int, position: int) -> int:
    """The token both sides 'sample' for a request at a position."""
    return (request_id * 7919 + position * 104729 + 17) % VOCAB


# --- vLLM -----------------------------------------------------------------------------------
def import_vllm():
    """vLLM's modules, checked to be the supported version; UserError when absent or another."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm
    except ImportError as err:
        raise UserError(f"vllm is not importable ({err}); build its environment with scripts/vllm_env.sh") from None
    version = getattr(vllm, "__version__", "unknown")
    if version != SUPPORTED_VLLM:
        raise UserError(
            f"vllm {version} is not supported: this harness is written for vllm {SUPPORTED_VLLM} "
            f"(scripts/vllm_env.sh installs it)"
        )
    return vllm


class VllmSide:
    """vLLM's v1 Scheduler (synchronous) over one full-attention KV group of `num_blocks` blocks."""

    def __init__(self, case: Case, model_dir: str):
        import_vllm()
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager

        self._Request, self._SamplingParams, self._Output = Request, SamplingParams, ModelRunnerOutput
        model = ModelConfig(
            model=model_dir, skip_tokenizer_init=True, max_model_len=case.max_model_len, dtype="float16"
        )
        watermark = {} if case.vllm_watermark is None else {"watermark": case.vllm_watermark}
        try:
            sched = SchedulerConfig(
                max_num_seqs=case.max_num_seqs,
                max_num_batched_tokens=case.max_num_batched_tokens,
                max_model_len=case.max_model_len,
                is_encoder_decoder=False,
                enable_chunked_prefill=True,
                async_scheduling=False,
                **watermark,
            )
            cache = CacheConfig(block_size=case.block_size, enable_prefix_caching=case.prefix_caching)
        except ValueError as err:  # pydantic's ValidationError is one: e.g. fewer batched tokens than seqs
            errors = err.errors() if hasattr(err, "errors") else [{"msg": str(err)}]
            why = "; ".join(str(e.get("msg", "")).removeprefix("Value error, ") for e in errors) or str(err)
            raise UserError(f"{case.name}: vLLM refuses the case's settings: {why}") from None
        cache.num_gpu_blocks = case.num_blocks
        config = VllmConfig(model_config=model, cache_config=cache, scheduler_config=sched)
        spec = FullAttentionSpec(
            block_size=case.block_size,
            num_kv_heads=MODEL_CONFIG["num_attention_heads"],
            head_size=64,
            dtype=torch.float16,
        )
        kv = KVCacheConfig(
            num_blocks=case.num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["decoder"], spec)]
        )
        self.hasher = None
        if case.prefix_caching:
            hash_fn = get_hash_fn_by_name(cache.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self.hasher = get_request_block_hasher(case.block_size, hash_fn, config.num_hash_lookahead_tokens)
        self.scheduler = Scheduler(
            config, kv, StructuredOutputManager(config), block_size=case.block_size, log_stats=False
        )
        self.pool = self.scheduler.kv_cache_manager.block_pool
        self.watermark_blocks = self.scheduler.kv_cache_manager.watermark_blocks
        self.watermark = config.scheduler_config.watermark

    def add(self, request_id: int, prompt: list, output_len: int, step: int) -> None:
        params = self._SamplingParams(max_tokens=output_len, ignore_eos=True)
        self.scheduler.add_request(
            self._Request(str(request_id), prompt, params, None, arrival_time=float(step), block_hasher=self.hasher)
        )

    def has_work(self) -> bool:
        return self.scheduler.get_num_unfinished_requests() > 0

    def num_running(self) -> int:
        return len(self.scheduler.running)

    def free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def schedule(self):
        return self.scheduler.schedule()

    def view(self, out) -> StepView:
        return StepView(
            [(int(r), n) for r, n in out.num_scheduled_tokens.items()],
            sorted(int(r) for r in out.preempted_req_ids),
            self.free_blocks(),
        )

    def model_output(self, out):
        """One sampled token for each scheduled request whose prompt is done, none for a chunk."""
        requests = self.scheduler.requests
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = requests[rid]
            sampled.append([fake_token(int(rid), req.num_tokens)] if req.num_computed_tokens >= req.num_tokens else [])
        return self._Output(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled)

    def update(self, out, model_output):
        return self.scheduler.update_from_output(out, model_output)

    @staticmethod
    def finished(engine_outputs) -> list:
        return sorted(
            int(o.request_id)
            for outputs in engine_outputs.values()
            for o in outputs.outputs
            if o.finish_reason is not None
        )


# --- kvbench --------------------------------------------------------------------------------
def kvbench_config(case: Case, preset: str | None, overrides: list):
    """kvbench's composed config for a case: the preset, the case's pool and budgets, overrides."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from kvbench import schema
    from kvbench.cli import refuse_deleted_keys
    from kvbench.schema.hydra_errors import hydra_line

    if preset is not None and preset not in presets():
        raise UserError(f"unknown preset {preset!r}; known: {', '.join(presets())}")
    base = [f"+preset={preset}"] if preset else ["+allocator=paged"]
    base += [
        f"allocator.block_size={case.block_size}",
        f"allocator.prefix_caching={str(case.prefix_caching).lower()}",
        f"scheduler.max_num_seqs={case.max_num_seqs}",
        f"scheduler.max_num_batched_tokens={case.max_num_batched_tokens}",
        f"seed={case.seed}",
        "progress=false",
    ]
    if preset is None:
        base.append("scheduler.chunked_prefill=true")
    if case.vllm_watermark is not None:
        base.append(f"allocator.watermark={kvbench_watermark(case)!r}")
    for override in overrides:
        key = str(override).split("=", 1)[0].lstrip("+~")
        if key in CASE_KEYS:
            raise UserError(
                f"--set {override}: the case sets {CASE_KEYS[key]} for both sides, and an override would change "
                f"kvbench's alone; define a Case with it (scripts/vllm_conformance.py CASES) instead"
            )
    refuse_deleted_keys(list(overrides))  # `~engine`: as bench refuses it
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("kvbench.conf", version_base="1.3"):
            cfg = compose("bench", overrides=base + list(case.overrides) + list(overrides))
        schema.settle_whole_numbers(cfg, schema.validate(cfg))  # a --set is checked as bench checks it
        return cfg
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(hydra_line(err) or f"bad override: {str(err).strip().splitlines()[0]}") from None
    finally:
        GlobalHydra.instance().clear()


def kvbench_watermark(case: Case) -> float:
    """kvbench's allocator.watermark that keeps as many blocks free as vLLM's `vllm_watermark`:
    vLLM takes its fraction of `num_blocks`, null block included (int(w * N)), kvbench of the
    N - 1 blocks it is given."""
    kept, usable = int(case.vllm_watermark * case.num_blocks), case.num_blocks - 1
    if kept >= usable:
        raise UserError(
            f"{case.name}: vllm_watermark={case.vllm_watermark} keeps {kept} of {case.num_blocks} blocks free, "
            f"every block kvbench's pool has ({usable}): give a watermark that leaves blocks to admit into"
        )
    fraction = kept / usable
    while int(fraction * usable) < kept:  # a float a hair under kept / usable
        fraction = math.nextafter(fraction, 1.0)
    return fraction


def presets() -> list[str]:
    """The options of kvbench's preset config group (conf/preset/*.yaml), sorted."""
    from importlib.resources import files

    return sorted(
        f.name.removesuffix(".yaml")
        for f in files("kvbench.conf").joinpath("preset").iterdir()
        if f.name.endswith(".yaml")
    )


class KvbenchSide:
    """kvbench's Engine (Scheduler + PagedAllocator) built from the config tree, stepped by hand."""

    def __init__(self, case: Case, cfg, simulated: bool = False):
        """`simulated`: kvbench is fed as a simulated run feeds it, with no token ids (a prompt has
        them only where the case shares a prefix, as workload.prefix_len gives them; the model
        samples none), so its prefix cache names blocks by stand-ins (sequence.stand_in_ids)."""
        from kvbench.scenarios.build import build_engine, load_specs

        model, _ = load_specs(cfg)
        model = replace(model, max_model_len=case.max_model_len) if model.max_model_len != case.max_model_len else model
        self.engine = build_engine(cfg, model, (case.num_blocks - 1) * case.block_size, lambda allocator: None)
        self.scheduler, self.allocator = self.engine.scheduler, self.engine.allocator
        if self.allocator.name != "paged":
            raise UserError(f"the conformance harness compares the paged allocator, not {self.allocator.name}")
        self.watermark_blocks = self.allocator.watermark_blocks
        self.seqs = {}
        self.case, self.simulated = case, simulated
        self.allocator.stand_in_tokens = simulated

    def add(self, request) -> None:
        if self.simulated and not self.case.prefix_len:
            request = replace(request, prompt_tokens=None)
        seq = self.engine.new_sequence(request)
        self.seqs[request.request_id] = seq
        self.scheduler.add(seq)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def num_running(self) -> int:
        return len(self.scheduler.running)

    def free_blocks(self) -> int:
        return self.allocator.pool.num_free

    def blocks_to_admit(self, seq) -> int:
        """Free blocks the admission of `seq` takes now: its whole sequence, less prefix-cache hits
        that are in use (a hit on a free cached block still takes that block off the free queue)."""
        alloc = self.allocator
        need = cdiv(seq.num_tokens, alloc.block_size)
        if alloc.prefix_caching and seq.num_computed == 0:
            hits, _ = alloc._cached_prefix(seq)
            return alloc.pool.admission_need(need, hits)
        return need

    def schedule(self):
        return self.scheduler.schedule()

    def view(self, batch) -> StepView:
        return StepView(
            [(s.request.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)],
            sorted(s.request.request_id for s in batch.preempted),
            self.free_blocks(),
        )

    def model_output(self, batch) -> list | None:
        if self.simulated:  # a cost model times a step and samples nothing
            return None
        return [
            fake_token(s.request.request_id, s.num_tokens) if s.num_computed >= s.num_tokens else None
            for s in batch.seqs
        ]

    def update(self, batch, tokens) -> None:
        self.engine._advance(batch, tokens, 0.0)  # the engine's own bookkeeping: append, finish, free

    @staticmethod
    def finished(batch) -> list:
        from kvbench.core.sequence import SeqStatus

        return sorted(s.request.request_id for s in batch.seqs if s.status is SeqStatus.FINISHED)


# --- the lockstep ---------------------------------------------------------------------------
def requests_for(case: Case):
    """kvbench Requests with token ids, and the step each one arrives at (1-based)."""
    from kvbench.core.workload import generate

    rate = case.arrivals_per_step if case.arrivals_per_step else math.inf
    requests = generate(
        {
            **dict(case.workload),
            "rate": rate,
            "num_requests": case.num_requests,
            "duration_s": None,
            "prefix_len": case.prefix_len,
            "num_prefixes": case.num_prefixes,
        },
        case.seed,
        case.max_model_len,
        with_tokens=True,
        vocab_size=VOCAB,
    )
    return [(r, 1 + int(r.arrival_s)) for r in requests]


def likely_rule(
    what: str, kv: StepView, vl: StepView, before: dict, kvside: KvbenchSide, vside: VllmSide, case: Case
) -> str:
    """A one-line guess at the rule that differs, from the first differing decision."""
    if what == "scheduled":
        for i, (a, b) in enumerate(zip(kv.scheduled, vl.scheduled)):  # noqa: B007 (i is read after the loop)
            if a != b:
                break
        else:
            i = min(len(kv.scheduled), len(vl.scheduled))
        a = kv.scheduled[i] if i < len(kv.scheduled) else None
        b = vl.scheduled[i] if i < len(vl.scheduled) else None
        if a and b and a[0] == b[0]:
            rule = "prefix-cache hit length" if case.prefix_caching else "chunk size / token budget"
            return f"request {a[0]} gets {a[1]} tokens in kvbench, {b[1]} in vLLM (likely: {rule})"
        rid, side, other, view = (a[0], "kvbench", "vLLM", vl) if a else (b[0], "vLLM", "kvbench", kv)
        seq = kvside.seqs.get(rid)
        need = kvside.blocks_to_admit(seq) if seq is not None else -1
        refuser = vside if other == "vLLM" else kvside
        running = before["vllm_running" if other == "vLLM" else "kvbench_running"]
        free = view.free_after_schedule  # the refusing side stopped admitting with this many free
        n_sched = len(view.scheduled)
        if n_sched and sum(n for _, n in view.scheduled) >= case.max_num_batched_tokens:
            return f"{side} schedules request {rid}, {other} has no token budget left (likely: the token budget)"
        if len([r for r, _ in view.scheduled]) >= case.max_num_seqs or refuser.num_running() >= case.max_num_seqs:
            return f"{side} schedules request {rid}, {other} is at max_num_seqs={case.max_num_seqs}"
        wk, wv = kvside.watermark_blocks, vside.watermark_blocks
        idle_k = "kept" if kvside.scheduler.watermark_when_idle else "skipped"
        rule = (
            f"the admission watermark: kvbench keeps {wk} blocks free (allocator.watermark, {idle_k} when "
            f"nothing runs), vLLM {wv} (watermark={vside.watermark}, skipped when nothing runs)"
        )
        if running == 0 and kvside.scheduler.watermark_when_idle and wk:
            rule = (
                f"the admission watermark while nothing runs: vLLM skips it, kvbench keeps {wk} blocks free "
                f"(scheduler.watermark_when_idle=true)"
            )
        kept = wv if other == "vLLM" else wk
        if 0 <= need <= free < need + kept:
            return (
                f"{side} admits request {rid} ({need} new blocks for its {seq.num_tokens} tokens), {other} "
                f"refuses it with {free} blocks free and {running} requests running before the step "
                f"(likely: {rule})"
            )
        return (
            f"{side} admits request {rid} ({need} new blocks by kvbench's count), {other} refuses it with "
            f"{free} blocks free (likely: free-block accounting or prefix-cache hits; {rule})"
        )
    if what == "preempted":
        return (
            f"kvbench preempts {kv.preempted}, vLLM {vl.preempted} (likely: preemption order or the free "
            f"blocks before the step: kvbench {before['kvbench_free']}, vLLM {before['vllm_free']})"
        )
    if what == "free_after_schedule":
        rule = "prefix-cache hits or eviction order" if case.prefix_caching else "block accounting"
        return (
            f"the same batch leaves {kv.free_after_schedule} blocks free in kvbench, {vl.free_after_schedule} "
            f"in vLLM (likely: {rule})"
        )
    if what == "finished":
        return f"kvbench finishes {kv.finished}, vLLM {vl.finished} (likely: the stop rule)"
    return (
        f"after freeing finished requests kvbench has {kv.free_after_step} blocks free, vLLM "
        f"{vl.free_after_step} (likely: blocks kept by a finished request, or prefix-cache eviction)"
    )


def run_case(
    case: Case,
    preset: str | None = "vllm",
    overrides: list = (),
    max_steps: int | None = None,
    model_dir: str | None = None,
    simulated: bool = False,
) -> Report:
    """`simulated`: kvbench's side is fed as a simulated run is (KvbenchSide); vLLM's is not."""
    vllm = import_vllm()
    cfg = kvbench_config(case, preset, overrides)
    with tempfile.TemporaryDirectory(prefix="kvbench-vllm-model-") as tmp:
        if model_dir is None:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(MODEL_CONFIG, f)
        vside = VllmSide(case, model_dir or tmp)
    kvside = KvbenchSide(case, cfg, simulated)
    report = Report(case.name, vllm.__version__, ([f"+preset={preset}"] if preset else []) + list(overrides))
    stream = requests_for(case)
    next_arrival, step, clock = 0, 0, 0  # step: schedule() calls; clock: arrival time in steps
    perf = time.perf_counter
    while next_arrival < len(stream) or vside.has_work() or kvside.has_work():
        step += 1
        clock += 1
        if not vside.has_work() and not kvside.has_work():
            clock = max(clock, stream[next_arrival][1])  # both idle: the next arrival comes at once
        while next_arrival < len(stream) and stream[next_arrival][1] <= clock:
            request, _ = stream[next_arrival]
            prompt = [int(t) for t in request.prompt_tokens]
            vside.add(request.request_id, prompt, request.output_len, clock)
            kvside.add(request)
            next_arrival += 1
        before = {
            "kvbench_free": kvside.free_blocks(),
            "vllm_free": vside.free_blocks(),
            "kvbench_running": kvside.num_running(),
            "vllm_running": vside.num_running(),
        }
        t0 = perf()
        batch = kvside.schedule()
        t1 = perf()
        out = vside.schedule()
        t2 = perf()
        kv, vl = kvside.view(batch), vside.view(out)
        tokens, model_output = kvside.model_output(batch), vside.model_output(out)
        t3 = perf()
        kvside.update(batch, tokens)
        t4 = perf()
        engine_outputs = vside.update(out, model_output)
        t5 = perf()
        kv.finished, vl.finished = kvside.finished(batch), vside.finished(engine_outputs)
        kv.free_after_step, vl.free_after_step = kvside.free_blocks(), vside.free_blocks()
        report.kvbench_s += (t1 - t0) + (t4 - t3)
        report.vllm_s += (t2 - t1) + (t5 - t4)
        for what in ("scheduled", "preempted", "free_after_schedule", "finished", "free_after_step"):
            if getattr(kv, what) != getattr(vl, what):
                reason = likely_rule(what, kv, vl, before, kvside, vside, case)
                report.divergence = Divergence(step, what, reason, kv, vl)
                return _finish(report, kvside)
        report.steps += 1
        report.finished += len(kv.finished)
        report.preemptions += len(kv.preempted)
        report.max_batch = max(report.max_batch, len(kv.scheduled))
        report.idle_admissions += before["kvbench_running"] == 0  # this step admitted into an idle pool
        if not kv.scheduled:  # both sides alike (else they diverged above): no request can ever run
            waiting = kvside.scheduler.waiting[0] if kvside.scheduler.waiting else None  # the one blocked
            what = f"request {waiting.request.request_id} ({waiting.num_tokens} tokens)" if waiting else "a request"
            raise UserError(
                f"{case.name}: step {step} scheduled nothing on either side with work left: {what} never fits "
                f"the {case.num_blocks}-block pool (both sides agree); give the case more blocks or shorter requests"
            )
        if max_steps is not None and step >= max_steps:
            break
    return _finish(report, kvside)


def _finish(report: Report, kvside: KvbenchSide) -> Report:
    report.prefix_hit_tokens = kvside.allocator.prefix_hit_tokens
    report.preempted_hit_tokens = kvside.allocator.preempted_hit_tokens
    return report


def main(argv: list | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", help="a case name (repeatable; default: all)")
    parser.add_argument(
        "--preset",
        default="vllm",
        help="kvbench preset to check (default vllm; 'none': "
        "kvbench's own defaults, with chunked prefill on and the case's pool and budgets)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a kvbench config override on top of the preset (repeatable)",
    )
    parser.add_argument(
        "--simulated",
        action="store_true",
        help="feed kvbench as a simulated run does: no token ids (its prefix cache names blocks by stand-ins)",
    )
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--json", metavar="FILE", help="write the reports as JSON")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    try:
        if args.list:
            for case in CASES.values():
                print(f"{case.name:18} {case.about}")
            return 0
        names = args.case or list(CASES)
        unknown = [n for n in names if n not in CASES]
        if unknown:
            raise UserError(f"unknown case {unknown[0]!r}; known: {', '.join(CASES)}")
        if args.json is not None:  # before the cases, not after them
            json_file = Path(args.json)
            if not args.json.strip() or json_file.is_dir() or not json_file.parent.is_dir():
                raise UserError(f"--json {args.json}: give a file name in an existing folder")
        if args.max_steps is not None and args.max_steps < 1:
            raise UserError(f"--max-steps {args.max_steps}: give a number of steps >= 1 (or leave it out: to the end)")
        preset = None if args.preset == "none" else args.preset
        if preset is not None:
            if preset not in presets():
                raise UserError(f"unknown preset {preset!r}; known: {', '.join(presets())}, none")
        for name in names:  # kvbench's side of every case first: a bad --set is refused before vLLM loads
            KvbenchSide(CASES[name], kvbench_config(CASES[name], preset, args.set))
        vllm = import_vllm()
        print(
            f"vllm {vllm.__version__} (supported: {SUPPORTED_VLLM}); kvbench "
            f"{'+preset=' + preset if preset else 'defaults'} {' '.join(args.set)}".rstrip(),
            flush=True,
        )
        reports = []
        for name in names:
            report = run_case(CASES[name], preset, args.set, args.max_steps, simulated=args.simulated)
            reports.append(report)
            print(report.summary(), flush=True)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    total_k, total_v = sum(r.kvbench_s for r in reports), sum(r.vllm_s for r in reports)
    steps = sum(r.steps for r in reports)
    print(
        f"all: {steps} steps compared, {sum(r.divergence is None for r in reports)}/{len(reports)} cases "
        f"identical; per step kvbench {1e6 * total_k / max(steps, 1):.0f} us, vLLM "
        f"{1e6 * total_v / max(steps, 1):.0f} us, ratio {total_k / total_v if total_v else math.nan:.3f}x"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**asdict(r), "ratio": r.ratio} for r in reports], f, indent=1, default=str)
    return 0 if all(r.divergence is None for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
