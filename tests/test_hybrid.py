"""Hybrid models: full, window and linear-state layers in one pool of equal-byte pages."""

import dataclasses
import functools
import math
import types
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from kvbench import cli
from kvbench.core.engine import Engine
from kvbench.core.recorder import Recorder
from kvbench.core.scheduler import Batch, Scheduler
from kvbench.core.sequence import Request, Sequence
from kvbench.core.spec import Hardware, ModelSpec
from kvbench.errors import UserError
from kvbench.executors.cost_model import CostModelExecutor
from kvbench.executors.hybrid_executor import HybridModelExecutor
from kvbench.hookspecs import hookimpl
from kvbench.model.decoder import TinyDecoder
from kvbench.model.linear_state import delta_rule
from kvbench.model.reference import generate_alone
from kvbench.model.sampling import SamplingParams
from kvbench.plugins.allocators.hybrid import POLICIES, HybridAllocator
from kvbench.plugins.allocators.hybrid_attention import AttentionManager
from kvbench.plugins.allocators.hybrid_pages import group_layers, unify_pages
from kvbench.plugins.backends.eager import EagerBackend
from kvbench.registry import default_registry
from kvbench.scenarios.run import run_point

from helpers.cli import refused
from helpers.engine import SPEC

CONF = Path(__file__).resolve().parents[1] / "conf"
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, seed=3)


def model(name: str, **changes) -> ModelSpec:
    spec = ModelSpec.from_cfg(OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{name}.yaml")))
    return dataclasses.replace(spec, **changes)


def hybrid(spec: ModelSpec, num_slots: int = 2000, block_size: int = 4, **options) -> HybridAllocator:
    return HybridAllocator(
        num_slots=num_slots, max_model_len=spec.max_model_len, block_size=block_size, model=spec, **options
    )


def new_seq(seq_id: int, prompt_len: int, output_len: int, n: int = 1) -> Sequence:
    return Sequence(seq_id, Request(seq_id, 0.0, prompt_len, output_len, n=n), prompt_len)


def step(allocator, seq: Sequence, num_tokens: int) -> bool:
    if not allocator.grow(seq, num_tokens):
        return False
    seq.num_computed += num_tokens
    return True


# --- page-size unification --------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt-oss-like", "gemma-3-like", "qwen3-next-like", "tiny-gemma3", "tiny-qwen3-next"])
@pytest.mark.parametrize("linear_as_full", [False, True])
def test_page_size_unification_gives_every_kind_pages_of_equal_bytes(name, linear_as_full):
    spec = model(name)
    pages = unify_pages(spec, 16, linear_as_full)
    per_layer = spec.kv_bytes_per_token_per_layer
    for kind, block_size in pages.block_sizes.items():
        assert sum(pages.groups[kind]) == spec.num_layers_of(kind)  # every layer in one group
        assert max(pages.groups[kind]) - min(pages.groups[kind]) <= 1  # strided: sizes differ by one at most
        for group, layers in enumerate(pages.groups[kind]):
            assert layers <= pages.group_size
            used = block_size * pages.group_token_bytes(kind, group)
            assert used + pages.page_padding(kind, group) == pages.page_bytes
            if linear_as_full:  # a kind-unaware pool: no padding layers, a block scaled to its page
                assert len(pages.groups[kind]) == 1 and 0 <= pages.page_padding(kind) < pages.token_bytes[kind]
            else:  # every group keeps the configured block (hits in steps of 16); padding layers fill it
                assert block_size == 16
                assert pages.page_padding(kind, group) == (pages.group_size - layers) * block_size * per_layer
    if pages.state_bytes:
        assert pages.pages_per_state == math.ceil(pages.state_bytes / pages.page_bytes)


@pytest.mark.parametrize(
    "counts, size", [([10, 52], 10), ([12, 12], 12), ([12, 13], 13), ([10, 15], 10), ([10, 14], 14), ([5], 5)]
)
def test_layers_are_grouped_by_the_fewest_layers_of_a_kind_unless_no_kind_has_half_as_many_again(counts, size):
    # vLLM's rule (v1 kv_cache_planning): the fewest, or the most where most < 1.5 x fewest (12 sw + 13 full)
    assert group_layers(counts) == size


def test_gemma_3_like_pages_hold_16_tokens_of_10_layers_in_one_full_and_six_window_groups():
    pages = unify_pages(model("gemma-3-like"), 16)
    per_layer = 2 * 16 * 128 * 2  # 8 KiB per token per layer in bf16
    assert pages.group_size == 10 and pages.page_bytes == 16 * 10 * per_layer  # 10 layers, 16 tokens = 1.25 MiB
    assert pages.block_sizes == {"full": 16, "window": 16}
    assert pages.groups == {"full": [10], "window": [9, 9, 9, 9, 8, 8]}  # 52 window layers, 8 padding
    assert pages.page_padding("window", 4) == 2 * 16 * per_layer


def test_qwen3_next_like_state_is_36_mib_or_96_pages_of_16_full_tokens():
    pages = unify_pages(model("qwen3-next-like"), 16)
    assert pages.state_bytes == 36 * 32 * 128 * 128 * 2  # 36 layers x 1 MiB
    assert pages.page_bytes == 16 * 12 * 2 * 2 * 256 * 2
    assert pages.pages_per_state == 96 and pages.page_padding("linear") == 0


# --- window layers ----------------------------------------------------------------------
@pytest.mark.parametrize("window,block_size", [(8, 4), (10, 4), (16, 16), (5, 2), (1, 4)])
def test_a_window_layer_holds_at_most_ceil_w_over_b_plus_one_blocks(window, block_size):
    spec = model("tiny-gpt-oss", window=window)
    allocator = hybrid(spec, block_size=block_size)
    manager = allocator.managers["window"]
    bound = math.ceil(window / block_size) + 1
    seq = new_seq(0, 30, 100)
    assert allocator.admit(seq) and step(allocator, seq, 30)
    held = []
    while seq.num_computed < seq.final_len:
        seq.num_tokens += 1
        assert step(allocator, seq, 1)
        held.append(manager.held_blocks(0))
    assert max(held) <= bound
    # A decode at position p reads the W positions p - W + 1 .. p: at most ceil((W - 1) / B) + 1 blocks.
    assert max(held) == math.ceil((window - 1) / block_size) + 1
    assert len(allocator.managers["full"].tables[0]) == math.ceil(seq.final_len / block_size)
    allocator.free(seq)
    assert all(p.num_free == p.num_blocks for p in allocator.pools)


def test_as_full_keeps_every_window_block_and_counts_tokens_beyond_the_window_as_internal():
    spec = model("tiny-gpt-oss")  # window 8
    allocator = hybrid(spec, policy="as_full")
    seq = new_seq(0, 40, 10)
    assert allocator.admit(seq) and step(allocator, seq, 40)
    assert allocator.managers["window"].held_blocks(0) == 10
    window = allocator.accounting().by_kind["window"]
    token_bytes = allocator.pages.token_bytes["window"]
    # the next query (position 40) reads itself and the 7 stored tokens before it: 33 are stale
    assert window.token == 7 * token_bytes and window.internal == 33 * token_bytes


# --- linear-state layers ----------------------------------------------------------------
def test_linear_state_memory_is_constant_in_sequence_length():
    spec = model("tiny-qwen3-next")
    shared, as_full = hybrid(spec), hybrid(spec, policy="as_full")
    per_state = shared.pages.pages_per_state
    seqs = [new_seq(0, 10, 500), new_seq(0, 10, 500)]
    for allocator, seq in zip((shared, as_full), seqs):
        assert allocator.admit(seq) and step(allocator, seq, 10)
    linear_pages, as_full_pages = [], []
    while seqs[0].num_computed < 400:
        for allocator, seq in zip((shared, as_full), seqs):
            seq.num_tokens += 1
            assert step(allocator, seq, 1)
        linear_pages.append(shared.managers["linear"].num_pages)
        as_full_pages.append(as_full.managers["linear"].num_pages)
    assert set(linear_pages) == {per_state}  # 3 layers x 4 x 16 x 16 fp32 = 12 pages of 1 KiB
    assert as_full_pages[-1] == math.ceil(400 / as_full.block_size_of("linear")) > 10 * as_full_pages[0]


def test_the_gated_delta_rule_gives_the_same_state_in_one_chunk_in_two_or_token_by_token():
    gen = torch.Generator().manual_seed(0)
    b, t, h, dk, dv = 3, 9, 2, 4, 5
    q, k = (torch.nn.functional.normalize(torch.randn(b, t, h, dk, generator=gen), dim=-1) for _ in "qk")
    v = torch.randn(b, t, h, dv, generator=gen)
    write, decay = torch.rand(b, t, h, generator=gen), torch.rand(b, t, h, generator=gen)
    empty = torch.zeros(b, h, dk, dv)
    whole_state, whole_out = delta_rule(empty, q, k, v, write, decay, torch.full((b,), t))
    state, outs = empty, []
    for lo, hi in ((0, 4), (4, 5), (5, 9)):
        parts = (x[:, lo:hi] for x in (q, k, v, write, decay))
        state, out = delta_rule(state, *parts, torch.full((b,), hi - lo))
        outs.append(out)
    torch.testing.assert_close(state, whole_state)
    torch.testing.assert_close(torch.cat(outs, dim=1), whole_out)
    # a ragged batch: sequence 1 runs 4 tokens, its padded steps leave its state alone
    ragged_state, _ = delta_rule(empty, q, k, v, write, decay, torch.tensor([t, 4, t]))
    short_state, _ = delta_rule(empty, q[:, :4], k[:, :4], v[:, :4], write[:, :4], decay[:, :4], torch.full((b,), 4))
    torch.testing.assert_close(ragged_state[1], short_state[1])


def test_forking_a_request_with_linear_layers_copies_its_reserved_spare_state():
    spec = model("tiny-qwen3-next")
    allocator = hybrid(spec)
    allocator.record_copies = True
    parent = new_seq(0, 9, 5, n=3)
    assert allocator.admit(parent) and step(allocator, parent, 9)
    linear = allocator.managers["linear"]
    assert linear.num_pages == 3 * allocator.pages.pages_per_state  # own state + 2 spares
    child = Sequence(1, parent.request, parent.num_tokens, parent=parent)
    allocator.fork(parent, child)
    copies = allocator.take_copies()
    assert [src for _, src, _, _ in copies] == linear.states[0]
    assert [dst for _, _, dst, _ in copies] == linear.states[1]
    assert linear.num_pages == 3 * allocator.pages.pages_per_state  # a spare became the child's
    assert allocator.block_table(child) == allocator.block_table(parent)  # attention is shared
    # the state's pages, copied on the device, in slots of the model's KV a token
    copied = len(copies) * allocator.pages.page_bytes / spec.kv_bytes_per_token
    assert allocator.copied_slots == pytest.approx(copied) and copied > 0


@pytest.mark.parametrize("name", ["tiny-qwen3-next", "tiny-gemma3"])
def test_a_sample_whose_first_token_is_its_last_is_forked_without_a_copy(name):
    """One output token: the samples take it from the prompt's step and end with it, running no
    step that reads a copied state; the linear layers copied the parent's state anyway, and
    copied_bytes counted it."""
    allocator = hybrid(model(name))
    allocator.record_copies = True
    parent = new_seq(0, 9, 1, n=3)
    assert allocator.admit(parent) and step(allocator, parent, 9)
    children = [Sequence(i, parent.request, parent.num_tokens, parent=parent) for i in (1, 2)]
    for child in children:
        allocator.fork(parent, child)
        assert allocator.block_table(child) == allocator.block_table(parent)
    assert allocator.take_copies() == [] and allocator.copied_slots == 0 and allocator.num_copies == 0
    for seq in (parent, *children):
        allocator.free(seq)
    assert allocator.accounting().held == 0  # the spare states set aside for them are given back


def test_spare_linear_states_set_aside_for_a_requests_samples_are_reserved_until_forked():
    """A request of n=3 takes its 2 children's linear states at admission; until a fork starts
    one they hold no token: counted as token state they would hide as reserved bytes of 0."""
    allocator = hybrid(model("tiny-qwen3-next"))
    state = 3 * 4 * 16 * 16 * 4  # 3 linear layers x 4 heads x 16 head_dim x 16 state dim x fp32: 12 KiB
    assert allocator.pages.state_bytes == state == 12 * allocator.pages.page_bytes  # 12 pages, no rounding
    parent = new_seq(0, 9, 5, n=3)
    assert allocator.admit(parent)
    linear = allocator.accounting().by_kind["linear"]
    assert (linear.token, linear.reserved, linear.rounding) == (0, 3 * state, 0)  # nothing computed yet
    assert step(allocator, parent, 9)
    linear = allocator.accounting().by_kind["linear"]
    assert (linear.token, linear.reserved) == (state, 2 * state)  # the parent's state; 2 spares
    child = Sequence(1, parent.request, parent.num_tokens, parent=parent)
    allocator.fork(parent, child)
    linear = allocator.accounting().by_kind["linear"]
    assert (linear.token, linear.reserved) == (2 * state, state)  # a spare became the child's copy
    recount(allocator)


# --- accounting -------------------------------------------------------------------------
def recount(allocator) -> None:
    """Rebuild every manager's counters from its tables and compare; check each view adds up."""
    pools_used = Counter()
    for m in (m for managers in allocator.groups.values() for m in managers):  # every group's
        if isinstance(m, AttentionManager):
            live = [p for sid, table in m.tables.items() for p in table[m.first_live[sid] :]]
            assert -1 not in live
            for page, holders in Counter(live).items():
                assert m.pool.ref_count[page] == holders
            unique = set(live)
            assert m.num_pages == len(unique)
            assert m.filled == sum(m.pool.fill[p] for p in unique)
            assert m.stale == sum(m.page_stale[p] for p in unique)
            passed = {}  # a page is stale as far as its least advanced holder has passed it
            for sid, table in m.tables.items():
                for index in range(m.first_live[sid], len(table)):
                    own = min(m.block_size, max(0, m.stale_end[sid] - index * m.block_size))
                    passed[table[index]] = min(passed.get(table[index], own), own)
            assert all(m.page_stale[p] == passed[p] for p in unique)
            assert m.num_named == len(live)  # a shared page once per table
            pages = len(unique)
        else:
            pages = sum(len(p) for p in m.states.values()) + sum(len(p) for s in m.spares.values() for p in s)
            assert m.num_pages == m.num_named == pages
        pools_used[id(m.pool)] += pages
    for pool in allocator.pools:
        assert pool.num_free + pools_used[id(pool)] == pool.num_blocks
    acc = allocator.accounting()
    for view in [acc, *acc.by_kind.values()]:
        parts = (view.token, view.reserved, view.internal, view.rounding, view.free)
        assert all(p >= 0 for p in parts), parts
        assert sum(parts) == view.num_slots
        assert abs(sum(view.fractions()) - 1.0) < 1e-12
    assert acc.token == sum(v.token for v in acc.by_kind.values())
    assert acc.named == sum(v.named for v in acc.by_kind.values()) >= acc.held
    assert acc.internal == sum(v.internal for v in acc.by_kind.values())
    assert acc.rounding == sum(v.rounding for v in acc.by_kind.values())


def operations(kinds: list[str], min_size: int, max_size: int):
    """Lists of (operation, a pick among the sequences, a size), the operations drawn from `kinds`
    (repeated to weigh them)."""
    return st.lists(
        st.tuples(st.sampled_from(kinds), st.integers(0, 10_000), st.integers(1, 12)),
        min_size=min_size,
        max_size=max_size,
    )


OPS = operations(["admit", "grow", "grow", "grow", "grow", "fork", "free"], 1, 70)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["tiny-gpt-oss", "tiny-gemma3", "tiny-qwen3-next"]),
    policy=st.sampled_from(POLICIES),
    block_size=st.sampled_from([1, 2, 4]),
    num_slots=st.integers(40, 400),
    ops=OPS,
)
def test_accounting_sums_to_one_per_kind_and_in_total_under_random_operations(name, policy, block_size, num_slots, ops):
    allocator = hybrid(model(name), num_slots=num_slots, block_size=block_size, policy=policy)
    allocator.record_copies = True
    running, next_id = [], 0
    for op, pick, size in ops:
        if op == "admit":
            seq = new_seq(next_id, 1 + pick % 30, 1 + size, n=1 + pick % 3)
            next_id += 1
            if allocator.admit(seq):
                running.append(seq)
        elif op == "grow" and running:
            seq = running[pick % len(running)]
            if seq.num_computed == seq.num_tokens < seq.final_len:
                seq.num_tokens += 1  # the previous step sampled a token
            n = min(size, seq.num_tokens - seq.num_computed)
            if n:
                step(allocator, seq, n)
        elif op == "fork" and running:
            parent = running[pick % len(running)]
            spare = allocator.linear is None or allocator.linear.spares[parent.seq_id]
            if spare and parent.num_computed:
                child = Sequence(next_id, parent.request, parent.num_tokens, parent=parent)
                next_id += 1
                allocator.fork(parent, child)
                assert child.num_computed == parent.num_computed
                running.append(child)
        elif op == "free" and running:
            allocator.free(running.pop(pick % len(running)))
        allocator.take_copies()
        recount(allocator)
    for seq in running:
        allocator.free(seq)
    recount(allocator)
    assert allocator.accounting().free == allocator.accounting().num_slots


def snapshot(allocator) -> tuple:
    """Every table, counter and pool list of `allocator`: what a decision could depend on."""
    managers = [m for group in allocator.groups.values() for m in group]
    pools = [(p.ref_count, p.fill, list(p.free), list(p.evictable), p.cached, p.copies) for p in allocator.pools]
    return [vars(m) | {"pool": None, "log_copy": None} for m in managers], pools, allocator.accounting()


DECODES = operations(["admit", "admit", "fork", "free"] + ["grow"] * 16, 20, 200)  # mostly steps, token by token


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["tiny-gpt-oss", "tiny-gemma3", "gemma-3-like"]),
    policy=st.sampled_from(["shared", "as_full"]),
    block_size=st.sampled_from([2, 4, 16]),
    num_slots=st.integers(100, 600),
    prefix_caching=st.booleans(),
    ops=DECODES,
)
def test_a_decode_step_the_short_way_decides_and_counts_as_the_long_way(
    name, policy, block_size, num_slots, prefix_caching, ops
):
    spec = model(name, window=7) if name == "gemma-3-like" else model(name)  # a window the steps cross
    short, long = (
        hybrid(spec, num_slots=num_slots, block_size=block_size, policy=policy, prefix_caching=prefix_caching)
        for _ in range(2)
    )
    long.grow = long._grow  # every step through the general path
    running = {short: [], long: []}
    for i, (op, pick, size) in enumerate(ops):
        for allocator, seqs in running.items():
            if op == "admit":  # prompts of one shared start, so that prefix hits and shared pages happen
                prompt = [7] * (pick % 9) + [pick % 5] * (1 + pick % 20)
                request = Request(i, 0.0, len(prompt), 1 + size, n=1 + pick % 2)
                seq = Sequence(i, request, len(prompt), token_ids=list(prompt))
                if allocator.admit(seq):
                    seqs.append(seq)
            elif op == "grow" and seqs:
                seq = seqs[pick % len(seqs)]
                if seq.num_computed == seq.num_tokens < seq.final_len:
                    seq.num_tokens += 1  # the previous step sampled a token
                    seq.token_ids.append(pick % 3)
                n = min(1 if size < 10 else size, seq.num_tokens - seq.num_computed)  # mostly decode steps
                if n and allocator.grow(seq, n):
                    seq.num_computed += n
            elif op == "fork" and seqs and seqs[pick % len(seqs)].num_computed:
                parent = seqs[pick % len(seqs)]
                child = Sequence(1000 + i, parent.request, parent.num_tokens, parent=parent)
                child.token_ids = list(parent.token_ids)
                allocator.fork(parent, child)
                seqs.append(child)
            elif op == "free" and seqs:
                allocator.free(seqs.pop(pick % len(seqs)))
        assert [s.num_computed for s in running[short]] == [s.num_computed for s in running[long]]
        assert snapshot(short) == snapshot(long)
    recount(short)


# --- the cost model ---------------------------------------------------------------------
def test_window_layers_read_at_most_their_window_and_linear_layers_their_state():
    hw = Hardware("h", hbm_bytes_per_s=1e12, peak_flops=1e20, memory_bytes=1e12)
    gemma, qwen = model("gemma-3-like"), model("qwen3-next-like")
    per_layer = gemma.kv_bytes_per_token_per_layer
    seq = new_seq(0, 5000, 10)
    seq.num_computed = 5000
    batch = Batch(seqs=[seq], num_new_tokens=[1], num_tokens=1, context_tokens=5000, attention_pairs=5000)
    kv = 10 * per_layer * 5001 + 52 * per_layer * (1024 + 1)
    assert CostModelExecutor(gemma, hw).execute(batch).duration_s == pytest.approx((gemma.weight_bytes + kv) / 1e12)
    kv = 12 * qwen.kv_bytes_per_token_per_layer * 5001 + 2 * 36 * qwen.linear_state_bytes_per_layer
    assert CostModelExecutor(qwen, hw).execute(batch).duration_s == pytest.approx((qwen.weight_bytes + kv) / 1e12)


def test_a_compute_bound_prefill_of_linear_layers_pays_their_state_update_flops():
    """A linear layer updates its state for every token (a rank-1 delta rule, ~6 FLOPs a value):
    a compute-bound prefill of qwen3-next-like that counts only the weights' and the full
    layers' attention FLOPs runs 1.8 % fast."""
    qwen = model("qwen3-next-like")
    hw = Hardware("h", hbm_bytes_per_s=1e20, peak_flops=1e15, memory_bytes=1e12)  # memory ~0: compute binds
    seq = new_seq(0, 1000, 10)
    pairs = 1000 * 1001 // 2  # a causal 1,000-token prefill
    batch = Batch(seqs=[seq], num_new_tokens=[1000], num_tokens=1000, context_tokens=1000, attention_pairs=pairs)
    state = 6 * qwen.num_layers_of("linear") * qwen.num_heads * qwen.head_dim * qwen.linear_state_dim
    assert state == 6 * 36 * 16 * 256 * 128 == 113_246_208  # a token's state update, all 36 linear layers
    weights = 2 * 3e9  # 2 x 3B active parameters a token
    attention = 4 * 12 * 16 * 256  # a (query, key) pair: 4 x 12 full layers x 16 heads x 256 head_dim
    flops = (weights + state) * 1000 + attention * pairs  # 6.0e12 + 1.13e11 + 9.8e10
    assert CostModelExecutor(qwen, hw).execute(batch).duration_s == pytest.approx(flops / 1e15)


# --- serving: hybrid generation equals independent generation ---------------------------
def serve_model(name: str) -> ModelSpec:
    """The tiny config at test size: its layer pattern and window, narrower layers."""
    return model(
        name,
        hidden_size=32,
        head_dim=8,
        intermediate_size=64,
        vocab_size=128,
        max_model_len=96,
        linear_state_dim=8 if name == "tiny-qwen3-next" else 0,
    )


@functools.cache
def tiny_decoder(name: str) -> TinyDecoder:
    torch.set_num_threads(1)
    return TinyDecoder(serve_model(name), seed=0).eval()


@functools.cache
def alone(name: str, request_id: int, prompt: tuple, output_len: int, sample_index: int) -> list:
    return generate_alone(tiny_decoder(name), prompt, output_len, SAMPLED, request_id, sample_index)


def serve(name: str, requests: list, num_slots: int, **options):
    spec = serve_model(name)
    allocator = hybrid(spec, num_slots=num_slots, **options)
    allocator.record_copies = True
    executor = HybridModelExecutor(tiny_decoder(name), allocator, EagerBackend(), SAMPLED)
    held = []
    execute = executor.execute

    def watched(batch):
        if "window" in allocator.managers:
            held.extend(allocator.managers["window"].held_blocks(s.seq_id) for s in batch.seqs)
        recount(allocator)
        return execute(batch)

    executor.execute = watched
    engine = Engine(
        Scheduler(allocator, 16, 12, chunked_prefill=True), executor, Recorder(keep_sequences=True), progress=False
    )
    row = engine.run(requests)
    assert allocator.accounting().free == allocator.accounting().num_slots
    return row, engine, held


def prompts(count: int, prefix: int = 0, n: int = 1, output_len: int = 8) -> list:
    rng = np.random.default_rng(1)
    shared = list(rng.integers(0, 128, prefix))
    return [
        Request(
            i, 0.0, prefix + int(length), output_len, np.array(shared + list(rng.integers(0, 128, int(length)))), n=n
        )
        for i, length in enumerate(rng.integers(12, 30, count))
    ]


@pytest.mark.parametrize(
    "name,policy,num_slots,prefix,n,output_len",
    [
        ("tiny-gpt-oss", "shared", 44, 0, 1, 30),  # tight: preempts
        ("tiny-gemma3", "static", 600, 0, 1, 8),
        ("tiny-gemma3", "shared", 600, 20, 1, 8),  # prefix hits across kinds
        ("tiny-gpt-oss", "as_full", 600, 0, 1, 8),
        ("tiny-qwen3-next", "shared", 150, 0, 2, 8),  # forked samples copy their state; preempts
    ],
)
def test_hybrid_generation_equals_independent_generation(name, policy, num_slots, prefix, n, output_len):
    requests = prompts(4, prefix, n, output_len)
    row, engine, held = serve(name, requests, num_slots, policy=policy, prefix_caching=bool(prefix))
    assert row["completed"] == len(requests)
    for seq in engine.recorder.finished:
        r = seq.request
        want = alone(name, r.request_id, tuple(int(t) for t in r.prompt_tokens), r.output_len, seq.sample_index)
        assert seq.token_ids[r.prompt_len :] == want, (r.request_id, seq.sample_index)
    spec = serve_model(name)
    if policy in ("shared", "static") and held:  # between steps, after decodes: the window bound
        assert min(held) <= math.ceil(spec.window / 4) + 1 < max(held)
    if prefix:
        assert row["prefix_hit_rate"] > 0.3
    if num_slots < 200:
        assert row["preemptions"] > 0
    assert row["copies"] >= len(requests) * (n - 1)  # one state copy per forked sample


# --- the simulator: one shared pool admits more than either naive choice ------------------
def test_in_simulation_hybrid_admits_more_concurrent_requests_than_paged_as_full_or_static():
    rows = {}
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        for policy in POLICIES:
            cfg = compose(
                "bench",
                overrides=[
                    "model=gemma-3-like",
                    "hardware=h200",
                    "engine.kv_cache_bytes=12e9",
                    "+allocator=hybrid",
                    f"allocator.policy={policy}",
                    "workload=fixed",
                    "workload.input_len=8192",
                    "workload.output_len=256",
                    "workload.rate=inf",
                    "workload.num_requests=24",
                    "scheduler.chunked_prefill=true",
                    "scheduler.max_num_batched_tokens=2048",
                    "progress=false",
                ],
            )
            rows[policy] = run_point(cfg)[0]
    # 12 GB = 1760 pages of 6.5 MiB. As full, an 8k request is 8.4k x 62 layers x 8 KiB = 4 GiB:
    # 2 at once; the full layers' static share (10/62 = 1.9 GB) holds 2 x 0.64 GiB. Shared: 102
    # full pages + 65 window pages each, and a new one is admitted while its prompt's 99 full
    # pages and the window's 193 (its window plus a 2048-token chunk) are free: 9 at once.
    assert rows["as_full"]["max_batch_size"] == rows["static"]["max_batch_size"] == 2
    assert rows["shared"]["max_batch_size"] == 9
    assert rows["shared"]["kv_token_util"] > 0.8 > 0.4 > rows["as_full"]["kv_token_util"]
    assert rows["as_full"]["kv_internal_frag_frac_window"] > 0.5  # tokens beyond the window
    for row in rows.values():
        assert row["completed"] == 24
        for kind in ("full", "window"):
            parts = [
                row[f"kv_{p}_{kind}"]
                for p in ("token_util", "reserved_frac", "internal_frag_frac", "rounding_frac", "external_frag_frac")
            ]
            assert min(parts) >= 0 and sum(parts) == pytest.approx(1.0)


# --- bad input --------------------------------------------------------------------------
FAST = ["progress=false", "workload.num_requests=3", "hydra/job_logging=none", "hydra/hydra_logging=none"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["model=gemma-3-like", "model.window=0", "+allocator=hybrid"], "model.window=0 must be > 0"),
        (["model=gemma-3-like", "model.window=-5", "+allocator=hybrid"], "model.window=-5 must be >= 0"),
        (
            ["model=gpt-oss-like", "model.layer_pattern=[full,banded]", "+allocator=hybrid"],
            "model.layer_pattern=banded must be 'full', 'window' or 'linear'",
        ),
        (
            ["model=qwen3-next-like", "hardware=h200", "hardware.num_gpus=2", "+allocator=contiguous"],
            "allocator contiguous cannot hold the linear layers of model qwen3-next-like",
        ),
        (["model=gemma-3-like", "hardware=h200"], "allocator paged cannot hold the window layers"),
        # the way out each scenario takes (the kernel scenario pointed at hybrid, which it refuses;
        # serve pointed at as_full, which it refuses for linear layers)
        (
            ["scenario=serve", "model=tiny-qwen3-next", "+allocator=paged"],
            "use +allocator=hybrid (policy shared or static: as_full has no state slots for linear layers)",
        ),
        (
            ["model=gpt-oss-like", "hardware=h200", "+allocator=hybrid", "allocator.policy=split"],
            "allocator.policy=split must be 'shared', 'static' or 'as_full'",
        ),
        (
            ["scenario=serve", "model=tiny-qwen3-next", "+allocator=hybrid", "+graph=piecewise"],
            "a model with linear layers serves with graph=eager",
        ),
        (
            ["scenario=serve", "model=tiny-gpt-oss", "+allocator=hybrid", "engine.async_scheduling=true"],
            "allocator hybrid serves with engine.async_scheduling=false",
        ),
        (
            ["scenario=serve", "model=tiny-qwen3-next", "+allocator=hybrid", "allocator.policy=as_full"],
            "policy=as_full sizes linear layers as attention",
        ),
        (  # a window layer holds every token a prefill step writes: 500 at once never fit 264 slots
            [
                "model=tiny-gemma3",
                "+allocator=hybrid",
                "workload=fixed",
                "workload.input_len=500",
                "workload.output_len=1",
                "workload.num_requests=1",
                "engine.kv_cache_bytes=409600",
            ],
            "prefilled 177 tokens a step it fits (scheduler.chunked_prefill=true scheduler.max_num_batched_tokens=177)",
        ),
    ],
)
def test_bad_hybrid_input_is_one_line_with_exit_code_2(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert message in refused(lambda: cli.main([*args, *FAST]))


def test_the_kernel_scenario_on_a_window_model_names_a_way_it_takes(tmp_path, monkeypatch):
    # it said `use +allocator=hybrid`, which the kernel scenario refuses
    monkeypatch.chdir(tmp_path)
    line = refused(lambda: cli.main(["scenario=kernel", "model=tiny-gemma3", "+allocator=paged", *FAST[2:]]))
    assert (
        "scenario=kernel times one full-attention layer on one block table: choose a model whose layers are all" in line
    )
    assert "+allocator=hybrid (" not in line


class NoWindowBackend(EagerBackend):
    name = "no_window"

    @classmethod
    def unsupported_reason(cls, device, dtype, layout, window):
        return "it has no sliding-window attention" if window else None


def test_a_backend_without_window_support_cannot_serve_a_window_model():
    module = types.ModuleType("no_window_backend")
    module.kvbench_backends = hookimpl(lambda: [NoWindowBackend])
    registry = default_registry()
    registry.register(module)
    try:
        with initialize_config_module("kvbench.conf", version_base="1.3"):
            cfg = compose(
                "bench",
                overrides=[
                    "scenario=serve",
                    "model=tiny-gemma3",
                    "+allocator=hybrid",
                    "+backend=eager",
                    "backend.name=no_window",
                    "progress=false",
                ],
            )
        with pytest.raises(UserError, match="backend no_window cannot run here: it has no sliding-window"):
            run_point(cfg)
    finally:
        registry.unregister(module)


# --- one block pool: admission counts prefix hits as the paged allocator does ---------------
@pytest.mark.parametrize("first_still_running", [True, False])
def test_hybrid_admits_a_cached_prompt_exactly_when_paged_does(first_still_running):
    """A 40-token prompt is cached (its holder running, or finished); then prompts that start
    with it ask for room in a 16-block pool. A hit on a held block costs nothing, one on a freed
    block revives it: both allocators admit the same prompts."""
    from kvbench.plugins.allocators.paged import PagedAllocator

    spec = model("tiny")
    outcomes = []
    for extra in range(0, 40):
        paged = PagedAllocator(64, spec.max_model_len, block_size=4, watermark=0.0, prefix_caching=True)
        pool = hybrid(spec, num_slots=64, block_size=4, watermark=0.0, prefix_caching=True)
        assert pool.num_pages == paged.num_blocks == 16
        admitted = []
        for allocator in (paged, pool):
            first = Sequence(0, Request(0, 0.0, 40, 4), 40, token_ids=list(range(40)))
            assert step(allocator, first, 40) if allocator.admit(first) else False
            if not first_still_running:
                allocator.free(first)
            prompt = list(range(40)) + [1000 + i for i in range(extra)]
            admitted.append(
                allocator.admit(Sequence(1, Request(1, 0.0, len(prompt), 4), len(prompt), token_ids=prompt))
            )
        assert admitted[0] == admitted[1], f"a {40 + extra}-token prompt: paged {admitted[0]}, hybrid {admitted[1]}"
        outcomes.append(admitted[0])
    # held hits cost no free block, revived ones do: either way prompts of up to the pool's
    # 64 tokens fit (counting every prompt block would refuse all of them beside a running holder)
    assert outcomes == [extra <= 24 for extra in range(40)]


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-gpt-oss"])
def test_a_refused_head_hashes_its_prompt_once_in_every_group(name, monkeypatch):
    """Every group's chain of the whole prompt was hashed again at every refused try (13 % of an
    overloaded cached run); a later try still finds what was cached since."""
    from kvbench.plugins.allocators.hybrid_attention import AttentionManager

    chained = []
    real = AttentionManager.chain
    monkeypatch.setattr(AttentionManager, "chain", lambda m, *a: chained.append(m) or real(m, *a))
    pool = hybrid(model(name), num_slots=64, block_size=4, watermark=0.0, prefix_caching=True)
    first = Sequence(0, Request(0, 0.0, 40, 4), 40, token_ids=list(range(40)))
    assert pool.admit(first) and step(pool, first, 40)
    waiting = Sequence(1, Request(1, 0.0, 60, 4), 60, token_ids=list(range(100, 160)))
    chained.clear()
    for _ in range(4):
        assert not pool.admit(waiting)
    assert len(chained) == len(pool.attention) and pool._waiting_chains[0] == 1
    pool.free(first)
    assert pool.admit(waiting) and pool._waiting_chains == (-1, {})


def compose_point(overrides: list[str]):
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        return compose("bench", overrides=[*overrides, "progress=false", "plots=false"])


def test_a_long_prompt_a_window_layer_cannot_hold_in_one_step_runs_in_the_chunks_the_error_names():
    """The check before the run sized a window layer at its steady window, so a 500-token prompt
    passed it and then died mid-run: 'no sequence can run'. The largest chunk it names runs."""
    at = ["model=tiny-gemma3", "+allocator=hybrid", "workload=fixed", "workload.input_len=500"]
    at += ["workload.output_len=1", "workload.num_requests=1", "engine.kv_cache_bytes=409600"]
    at += ["scheduler.chunked_prefill=true"]
    (row,) = run_point(compose_point([*at, "scheduler.max_num_batched_tokens=177"]))
    assert row["completed"] == 1
    with pytest.raises(UserError, match="needs 272 slots for a 501-token request in one 178-token step"):
        run_point(compose_point([*at, "scheduler.max_num_batched_tokens=178"]))


def test_beams_of_a_model_with_linear_layers_reserve_their_states_at_admission():
    """Forking a beam took a linear state with no room asked for (spares were reserved for
    workload.n only): KeyError from an empty pool, in a pool that admitted the request."""
    (row,) = run_point(
        compose_point(
            [
                "model=tiny-qwen3-next",
                "+allocator=hybrid",
                "workload=fixed",
                "workload.input_len=40",
                "workload.output_len=30",
                "workload.beam_width=2",
                "workload.num_requests=8",
                "engine.kv_cache_bytes=100000",
            ]
        )
    )
    assert row["completed"] == 8 and row["total_output_tokens"] == 8 * 2 * 30  # both beams
    spec = model("tiny-qwen3-next")
    allocator = hybrid(spec)
    root = Sequence(0, Request(0, 0.0, 9, 5, beam_width=3), 9)
    assert allocator.admit(root)
    assert allocator.managers["linear"].num_pages == 3 * allocator.pages.pages_per_state  # own + 2 beams'


def test_a_prefix_hit_on_pages_a_live_holder_has_passed_counts_them_as_token_state_again():
    """A (200 tokens) has moved its window past blocks that B (101 tokens, a prefix hit) still
    reads: they were stale for both, so B's 31 window tokens read as internal fragmentation."""
    spec = dataclasses.replace(SPEC, max_model_len=512, layer_pattern=("window",), window=32)
    allocator = hybrid(spec, num_slots=4096, block_size=4, watermark=0.0, prefix_caching=True)
    tokens = [t % 50 for t in range(200)]
    a = Sequence(0, Request(0, 0.0, 200, 10, tokens), 200, token_ids=list(tokens))
    b = Sequence(1, Request(1, 0.0, 101, 10, tokens[:101]), 101, token_ids=list(tokens[:101]))
    assert allocator.admit(a) and step(allocator, a, 200)
    token_bytes = allocator.pages.token_bytes["window"]
    assert allocator.accounting().token == 31 * token_bytes  # A's next query reads 31 stored tokens
    assert allocator.admit(b) and b.num_computed == 100  # a hit on blocks A still holds
    assert step(allocator, b, 1)
    assert allocator.accounting().token == (31 + 31) * token_bytes
    recount(allocator)
    allocator.free(a)  # A's pages B does not hold go; B's window stays token state
    assert allocator.accounting().token == 31 * token_bytes
    recount(allocator)


@pytest.mark.parametrize("pattern", [("full",), ("window", "full")])
def test_pages_an_undone_admission_named_are_not_found_by_the_next(pattern):
    """free_unrun: an admission undone before its step ran named pages nobody computed; every
    kind takes them out of its cache (a finished sequence's, freed, stay findable)."""
    spec = dataclasses.replace(SPEC, max_model_len=512, layer_pattern=pattern, window=32)
    allocator = hybrid(spec, num_slots=4096, block_size=4, watermark=0.0, prefix_caching=True)
    tokens = [t % 50 for t in range(101)]

    def seq(seq_id):
        return Sequence(seq_id, Request(seq_id, 0.0, 101, 10, tokens), 101, token_ids=list(tokens))

    undone = seq(0)
    assert allocator.admit(undone) and allocator.grow(undone, 101)  # named, never computed
    allocator.free_unrun([undone])
    assert all(not m.pool.cached for m in allocator.attention)
    again = seq(1)
    assert allocator.admit(again) and again.num_computed == 0
    assert step(allocator, again, 101)
    allocator.free(again)
    third = seq(2)
    assert allocator.admit(third) and third.num_computed == 100
    recount(allocator)


def test_a_prefix_hit_comes_in_whole_blocks_whatever_the_kinds_layer_counts():
    """gemma-3-like, 10 full and 52 window layers. With a page a block of each kind's layers (full
    blocks scaled to 83 tokens) a hit came in steps of lcm(83, 16) = 1,328 tokens: a 200-token
    shared prefix hit nothing. Grouped as vLLM groups layers, every group's block is 16 tokens:
    the hit is the prefix's 12 whole blocks, in every group, and the pages are shared."""
    spec = model("gemma-3-like", window=64)
    allocator = hybrid(spec, num_slots=20_000, block_size=16, watermark=0.0, prefix_caching=True)
    assert len(allocator.attention) == 7  # one full group, six window groups
    prefix = [t % 97 for t in range(200)]

    def seq(seq_id):
        tokens = prefix + [1000 + seq_id] * 20
        return Sequence(seq_id, Request(seq_id, 0.0, 220, 10, tokens), 220, token_ids=list(tokens))

    first = seq(0)
    assert allocator.admit(first) and step(allocator, first, 220)
    second = seq(1)
    assert allocator.admit(second)
    assert second.num_computed == second.num_cached == 192  # 12 blocks of 16
    full, *windows = allocator.attention
    assert full.tables[1][:12] == full.tables[0][:12]  # the full group holds the whole prefix, shared
    for group in windows:  # a window group holds what its next query reads: 63 tokens before 192
        assert group.tables[1][-4:] == group.tables[0][8:12] and -1 not in group.tables[1][-4:]
    recount(allocator)


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-gpt-oss", "tiny-qwen3-next"])
def test_the_served_attention_caches_take_what_the_pool_does(name):
    """Each layer had a cache of every page: grouped pages are a block of one group, so the caches
    took (attention layers / group size) times the pool (tiny-gemma3: 6x). Layers at one place of
    their groups share a cache, as vLLM lays them: the caches are the pool's pages, no more."""
    spec = serve_model(name)
    allocator = hybrid(spec, num_slots=2000)
    executor = HybridModelExecutor(tiny_decoder(name), allocator, EagerBackend(), SAMPLED)
    caches = sum(c.numel() * c.element_size() for pair in executor._caches for c in pair)
    assert len(executor._caches) == allocator.pages.group_size  # one K/V pair a place, every group's
    assert caches == allocator.num_pages * allocator.pages.page_bytes  # the pool, in the pool's dtype


def test_as_full_is_a_kind_unaware_pool_and_pays_no_padding_layers():
    """as_full, PagedAttention unaware of layer kinds (vLLM with its hybrid manager off), keeps
    one table for every layer: grouped as the hybrid pool is, gemma-3-like's 8 padding layers made
    a 1,024-token sequence take 1,157 slots; one group a kind, block scaled to the page, 1,034."""
    spec = model("gemma-3-like")
    as_full = HybridAllocator(100_000, 4096, 16, model=spec, policy="as_full")
    shared = HybridAllocator(100_000, 4096, 16, model=spec, policy="shared")
    assert as_full.pages.groups == {"full": [10], "window": [52]}
    assert as_full.footprint(1024) == 1034 < shared.footprint(1024) == 1157  # 1,024 + 8/60 of 1,024 + rounding


def test_a_window_of_one_token_hits_only_what_is_cached():
    """A window-1 layer reads no earlier block, so every prompt 'hit' all but its last token on an
    empty pool (prefix_hit_rate 0.976 where nothing was cached). A hit needs its last block cached."""
    spec = model("tiny-gemma3", layer_pattern=("window",), num_layers=4, window=1)
    allocator = hybrid(spec, num_slots=4000, block_size=4, watermark=0.0, prefix_caching=True)
    tokens = list(range(100, 141))

    def seq(seq_id):
        return Sequence(seq_id, Request(seq_id, 0.0, 41, 5, tokens), 41, token_ids=list(tokens))

    first = seq(0)
    assert allocator.admit(first) and first.num_computed == first.num_cached == 0  # nothing cached yet
    assert step(allocator, first, 41)
    second = seq(1)
    assert allocator.admit(second) and second.num_cached == 40  # the first's blocks, named as it ran
    recount(allocator)


def test_a_group_a_preemption_brings_back_whole_is_sized_at_its_one_step_prefill():
    """A request of 3 samples comes back from a preemption whole, each sequence prefilled in one
    step (not in the budget's chunks), which a window layer holds entire: the check sized it at
    3 x 93 slots, passed, and the run stopped mid-way: 'no sequence can run'."""
    at = ["model=tiny-gemma3", "+allocator=hybrid", "workload=fixed", "workload.input_len=200"]
    at += ["workload.output_len=50", "workload.n=3", "workload.num_requests=6", "workload.rate=inf"]
    at += ["scheduler.chunked_prefill=true", "scheduler.max_num_batched_tokens=16"]
    with pytest.raises(UserError, match=r"cannot hold the 3 sequences of one request \(256 slots each with hybrid"):
        run_point(compose_point([*at, "engine.kv_cache_bytes=1100000"]))
    (row,) = run_point(compose_point([*at, "engine.kv_cache_bytes=1200000"]))
    assert row["completed"] == 6


def test_without_chunked_prefill_a_recompute_longer_than_the_budget_is_sized_whole():
    """Without chunking, a preempted 500-token sequence is recomputed in one step, alone; the
    check sized its window layers at the 120-token budget's step, and the run stopped mid-way."""
    at = ["model=tiny-gemma3", "+allocator=hybrid", "workload=fixed", "workload.input_len=100"]
    at += ["workload.output_len=400", "workload.num_requests=6", "workload.rate=inf"]
    at += ["scheduler.chunked_prefill=false", "scheduler.max_num_batched_tokens=120", "engine.kv_cache_bytes=400000"]
    with pytest.raises(UserError, match="needs 512 slots for a 500-token request in one 499-token step"):
        run_point(compose_point(at))


@pytest.mark.parametrize(
    "name, num_slots, num_pages, floors",
    [
        ("tiny-qwen3-next", 1000, 250, [62, 187]),  # 1,000 x 256 B / 1 KiB pages; 1/4 and 3/4 of 250, floored
        ("tiny-gemma3", 1001, 1501, [250, 1250]),  # 1,001 x 1,536 B / 1 KiB; 1/6 and 5/6 of 1,501
        ("gemma-3-like", 1001, 1551, [250, 1300]),  # 1,001 x 496 KiB / 320 KiB; 10/62 and 52/62 of 1,551
    ],
)
def test_a_static_partition_hands_out_every_page(name, num_slots, num_pages, floors):
    """Split in proportion to layer counts, the floors left up to a page a kind in no pool,
    which kv_capacity_tokens still counted (tiny-qwen3-next: 249 of 250 pages)."""
    spec = model(name)
    allocator = hybrid(spec, num_slots=num_slots, policy="static")
    kinds = [k for k in ("full", "window", "linear") if spec.num_layers_of(k)]
    assert allocator.num_pages == num_pages
    assert [num_pages * spec.num_layers_of(k) // spec.num_layers for k in kinds] == floors  # a page left over
    assert sum(pool.num_blocks for pool in allocator.pools) == allocator.num_pages
