"""Graph modes: full and piecewise produce eager's outputs, pad without touching real rows, split
the model at attention into (attention layers + 1) pieces, and say when a step ran eager.

The tiny model decodes greedily over a paged cache whose blocks are shuffled; block 0 belongs
to no sequence, so a padded row that wrote K/V (to slot 0 of block 0) would show. Without a
GPU the same capture, padding and split machinery runs with the Triton interpreter.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from kvbench import cli
from kvbench.arith import cdiv
from kvbench.core.spec import ModelSpec
from kvbench.errors import UserError
from kvbench.model.attention_op import ForwardContext
from kvbench.model.decoder import TinyDecoder
from kvbench.plugins.backends.base import AttentionMetadata
from kvbench.plugins.backends.eager import EagerBackend
from kvbench.plugins.backends.triton_paged import TritonPagedBackend
from kvbench.plugins.graphs.base import DEFAULT_CAPTURE_SIZES, Capture, check_capture_sizes
from kvbench.registry import default_registry

from helpers.cli import refused

# without a GPU, conftest has put the Triton kernels under the interpreter
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BLOCK_SIZE = 4
TINY = OmegaConf.to_container(
    OmegaConf.load(os.path.join(os.path.dirname(__file__), "..", "conf", "model", "tiny.yaml"))
)


def tiny_spec(num_layers: int = 2) -> ModelSpec:
    return ModelSpec.from_cfg({**TINY, "num_layers": num_layers})


class Decoding:
    """Sequences prefilled in one step, then decoded greedily one token per step.

    `active[i]` lists the sequences of decode step i, so a batch can shrink and be padded into
    a capture that held more rows the step before.
    """

    def __init__(self, graph: str, backend, prompt_lens=(5, 3, 9, 6), num_layers: int = 2, capture_sizes=(1, 2, 4)):
        spec = tiny_spec(num_layers)
        self.spec = spec
        self.model = TinyDecoder(spec, seed=0).to(DEVICE)
        gen = torch.Generator().manual_seed(0)
        blocks_per_seq = cdiv(spec.max_model_len, BLOCK_SIZE) // 8
        physical = (1 + torch.randperm(blocks_per_seq * len(prompt_lens), generator=gen)).tolist()
        self.tables = [physical[i * blocks_per_seq : (i + 1) * blocks_per_seq] for i in range(len(prompt_lens))]
        num_blocks = 1 + len(physical)
        shape = (num_blocks, BLOCK_SIZE, spec.num_kv_heads, spec.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, device=DEVICE), torch.zeros(shape, device=DEVICE)) for _ in range(num_layers)
        ]
        self.tokens = [torch.randint(0, spec.vocab_size, (n,), generator=gen).tolist() for n in prompt_lens]
        self.backend = backend
        cls = default_registry().get("graph", graph)
        self.graph = cls(self.model.forward, DEVICE, max_seq_len=spec.max_model_len, capture_sizes=list(capture_sizes))

    def context(self, seqs: list[int], query_lens: list[int]) -> tuple:
        ids, positions, slots, query_start = [], [], [], [0]
        for seq, n in zip(seqs, query_lens):
            length = len(self.tokens[seq])
            for pos in range(length - n, length):
                ids.append(self.tokens[seq][pos])
                positions.append(pos)
                slots.append(self.tables[seq][pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            query_start.append(query_start[-1] + n)
        lens = [len(self.tokens[s]) for s in seqs]
        width = cdiv(max(lens), BLOCK_SIZE)
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=DEVICE),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEVICE),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
            block_size=BLOCK_SIZE,
            max_query_len=max(query_lens),
            max_seq_len=max(lens),
            block_tables=torch.tensor([self.tables[s][:width] for s in seqs], dtype=torch.int32, device=DEVICE),
        )
        ctx = ForwardContext(self.backend, meta, self.kv_caches, self.model.scale, self.model.attention_windows)
        to = dict(dtype=torch.long, device=DEVICE)
        return torch.tensor(ids, **to), torch.tensor(positions, **to), ctx

    @torch.inference_mode()
    def step(self, seqs: list[int], query_lens: list[int]) -> torch.Tensor:
        input_ids, positions, ctx = self.context(seqs, query_lens)
        hidden = self.graph(input_ids, positions, ctx).clone()
        last_rows = torch.tensor(query_lens, device=DEVICE).cumsum(0) - 1
        for seq, token in zip(seqs, self.model.compute_logits(hidden[last_rows]).argmax(-1).tolist()):
            self.tokens[seq].append(token)
        return hidden

    def run(self, active: list[list[int]]) -> list[torch.Tensor]:
        everyone = list(range(len(self.tokens)))
        hidden = [self.step(everyone, [len(t) for t in self.tokens])]
        return hidden + [self.step(seqs, [1] * len(seqs)) for seqs in active]


def triton_backend():
    reason = TritonPagedBackend.unsupported_reason(DEVICE, torch.float32, "paged", 0)
    if reason:
        pytest.skip(reason)
    return TritonPagedBackend()


SHRINKING = [[0, 1, 2, 3], [0, 2, 3], [2]]  # 4 rows, then 3 padded to 4 over a stale row, then 1


def assert_same_run(graph: Decoding, eager: Decoding, outputs, expected) -> None:
    for out, ref in zip(outputs, expected):
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    assert graph.tokens == eager.tokens
    for (k, v), (k_ref, v_ref) in zip(graph.kv_caches, eager.kv_caches):
        torch.testing.assert_close(k, k_ref, rtol=0, atol=1e-5)
        torch.testing.assert_close(v, v_ref, rtol=0, atol=1e-5)
        assert not k[0].any() and not v[0].any()  # block 0: where a padded row would have written


def test_full_graph_matches_eager_and_padding_never_changes_a_real_row():
    backend = triton_backend()
    eager, full = Decoding("eager", backend), Decoding("full", backend)
    expected = eager.run(SHRINKING)
    outputs = full.run(SHRINKING)
    assert_same_run(full, eager, outputs, expected)
    stats = full.graph.stats()
    # Decode batches 4, 3 and 1 need the captures of sizes 4 and 1; the prefill ran eager.
    assert stats["graph_captured_sizes"] == 2
    assert stats["graph_replays"] == 3
    assert stats["graph_eager_steps"] == 1 and "prefill" in stats["graph_eager_reason"]


def test_full_graph_pads_a_batch_into_static_buffers_with_padding_rows():
    backend = triton_backend()
    full = Decoding("full", backend)
    full.run([[0, 1, 2, 3], [0, 2, 3]])
    static = full.graph.static
    # The last step (3 rows) ran at capture size 4: row 3 is padding however full it was before.
    assert static.slot_mapping[3].item() == -1 and static.seq_lens[3].item() == 0
    assert static.input_ids[3].item() == 0 and not static.block_tables[3].any()


def test_batch_above_largest_capture_size_falls_back_to_eager_and_says_so():
    backend = triton_backend()
    eager = Decoding("eager", backend)
    full = Decoding("full", backend, capture_sizes=(1, 2))
    active = [[0, 1, 2], [0, 1]]
    assert_same_run(full, eager, full.run(active), eager.run(active))
    stats = full.graph.stats()
    assert stats["graph_eager_steps"] == 2  # the prefill and the 3-row decode
    assert "1 x step's tokens > largest capture size 2: ran eager" in stats["graph_eager_reason"]
    assert stats["graph_replays"] == 1 and stats["graph_captured_sizes"] == 1


@pytest.mark.parametrize("num_layers", [2, 3])
def test_piecewise_splits_at_attention_into_layers_plus_one_pieces(num_layers):
    piecewise = Decoding("piecewise", EagerBackend(), num_layers=num_layers, capture_sizes=(32,))
    piecewise.run([])
    stats = piecewise.graph.stats()
    assert stats["graph_pieces"] == num_layers + 1


def test_piecewise_matches_eager_on_prefill_and_shrinking_decodes():
    eager, piecewise = (
        Decoding("eager", EagerBackend()),
        Decoding("piecewise", EagerBackend(), capture_sizes=(1, 2, 4, 8, 32)),
    )
    assert_same_run(piecewise, eager, piecewise.run(SHRINKING), eager.run(SHRINKING))
    stats = piecewise.graph.stats()
    # prefill 23 tokens -> 32; decodes 4 -> 4, 3 -> 4, 1 -> 1: every step ran captured pieces
    assert stats["graph_replays"] == 4 and stats["graph_eager_steps"] == 0
    assert stats["graph_captured_sizes"] == 3


def test_piecewise_oversize_batch_runs_pieces_uncaptured_and_says_so():
    eager, piecewise = Decoding("eager", EagerBackend()), Decoding("piecewise", EagerBackend())
    active = [[0, 1, 2, 3]]
    assert_same_run(piecewise, eager, piecewise.run(active), eager.run(active))
    stats = piecewise.graph.stats()
    assert stats["graph_eager_steps"] == 1  # the 23-token prefill exceeds capture size 4
    assert "step's tokens > largest capture size 4: pieces ran uncaptured" in stats["graph_eager_reason"]


def test_prepare_captures_every_size_up_front_from_padding_rows():
    backend = triton_backend()
    full = Decoding("full", backend)
    _, _, ctx = full.context([0], [len(full.tokens[0])])
    with torch.inference_mode():
        full.graph.prepare(3, 100, ctx)
    assert sorted(full.graph.captures) == [1, 2, 4]
    assert full.graph.stats()["graph_replays"] == 0
    for k, v in full.kv_caches:  # all-padding batches wrote no K/V at all
        assert not k.any() and not v.any()


def test_full_graph_refuses_a_backend_it_cannot_capture_with_the_reason():
    full = default_registry().get("graph", "full")
    reason = full.unsupported_reason(EagerBackend, DEVICE)
    assert "cuda_graph_capturable" in reason and "piecewise" in reason
    assert full.unsupported_reason(TritonPagedBackend, DEVICE) is None
    piecewise = default_registry().get("graph", "piecewise")
    assert piecewise.unsupported_reason(EagerBackend, DEVICE) is None


@pytest.mark.parametrize("sizes", [[], [0, 1], [4, 2], [1, 1], [1, 2.5], [-8]])
def test_capture_sizes_must_be_positive_and_increasing(sizes):
    with pytest.raises(UserError, match="positive integers in increasing order"):
        check_capture_sizes(sizes)


def test_default_capture_sizes_are_vllms():
    assert check_capture_sizes(None) == DEFAULT_CAPTURE_SIZES
    assert DEFAULT_CAPTURE_SIZES[:5] == (1, 2, 4, 8, 16) and DEFAULT_CAPTURE_SIZES[-1] == 256
    assert len(DEFAULT_CAPTURE_SIZES) == 3 + 32


def test_capture_replays_on_new_inputs_through_its_static_buffer():
    static = torch.zeros(3)
    capture = Capture(lambda x: x * 2, (static,))
    assert torch.equal(capture.replay(torch.tensor([1.0, 2.0, 3.0])), torch.tensor([2.0, 4.0, 6.0]))
    assert torch.equal(static, torch.tensor([1.0, 2.0, 3.0]))  # the input was copied in


def test_padded_size_is_the_next_capture_size():
    graph = default_registry().get("graph", "full")(lambda i, p: i, DEVICE, 64, capture_sizes=[1, 2, 4, 8])
    assert [graph.padded_size(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]


def test_graph_mode_rejects_unknown_options():
    with pytest.raises(UserError, match="no option"):
        default_registry().get("graph", "piecewise")(lambda i, p: i, DEVICE, 64, capture_size=[1])


def test_full_graph_runs_eager_for_per_layer_metadata():
    backend = triton_backend()
    full = Decoding("full", backend)
    full.run([])
    input_ids, positions, ctx = full.context([0, 1], [1, 1])
    ctx = replace(ctx, layer_meta=[ctx.meta, ctx.meta])
    with torch.inference_mode():
        full.graph(input_ids, positions, ctx)
    assert "per-layer attention metadata" in full.graph.stats()["graph_eager_reason"]


SERVE = [
    "scenario=serve",
    "model=tiny",
    "workload=fixed",
    "workload.num_requests=2",
    "progress=false",
    "hydra/job_logging=none",
    "hydra/hydra_logging=none",
]


def test_cli_full_graph_with_a_backend_it_cannot_capture_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = refused(lambda: cli.main([*SERVE, "+backend=eager", "+graph=full"]))
    assert "graph=full cannot run backend eager" in line and "cuda_graph_capturable" in line


def test_cli_capture_sizes_not_increasing_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = refused(lambda: cli.main([*SERVE, "+backend=eager", "+graph=piecewise", "graph.capture_sizes=[8,4]"]))
    assert "[8, 4]" in line


def test_a_served_piecewise_run_compiles_before_its_first_measured_step():
    """serve's warm-up built a graph mode of its own after the measured one, whose creation
    reset torch.compile: the measured forward compiled inside its first step (time to first
    token 0.35 s, not 0.005 s, on the tiny model). Now every compile is done before the run."""
    from hydra import compose, initialize_config_module

    from kvbench.scenarios.serve import serve

    overrides = ["scenario=serve", "model=tiny", "+graph=piecewise", "workload=fixed", "workload.input_len=16"]
    overrides += ["workload.output_len=4", "scenario.num_requests=4", "progress=false", "plots=false"]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=overrides)
    before = []
    row, _ = serve(cfg, prepare=lambda engine: before.append(engine.executor.graph.stats()["graph_compiles"]))
    assert before[0] >= 1 and row["graph_compiles"] == before[0]  # none during the measured steps
