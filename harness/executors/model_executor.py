"""ModelExecutor: runs each scheduled batch through the tiny model on the local device.

The KV cache is real and laid out by the allocator: per attention layer a K and a V tensor of
`[num_blocks, block_size, kv_heads, head_dim]`, addressed through block tables (paged) or slot
ranges (contiguous). Before each forward the executor replays, in order, the copies the
allocator logged while scheduling (copy-on-write, contiguous forks, swap out to and in from a
CPU pool of the same layout). Each step's host time is split into copy, prepare, forward and
sample, so a run can say where the time went; the forward's launch and device time are
measured apart (kvbench.executors.host_timing). The forward runs under the configured graph mode, and a
step splits into prepare -> launch -> collect so async scheduling can interleave two steps.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.arith import cdiv
from kvbench.core.scheduler import Batch
from kvbench.executors.base import StepResult
from kvbench.executors.host_timing import DeviceClock, overhead_columns
from kvbench.model.attention_op import ForwardContext, current_context, forward_context
from kvbench.model.decoder import TinyDecoder
from kvbench.model.sampling import SamplingParams, beam_select, sample
from kvbench.plugins.backends.base import AttentionMetadata
from kvbench.plugins.graphs.base import build as build_graph
from kvbench.plugins.graphs.base import padding_metadata
from kvbench.plugins.graphs.eager import EagerGraph

PHASES = ("copy", "prepare", "forward", "sample")


@dataclass
class PreparedStep:
    batch: Batch
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    last_rows: torch.Tensor
    sampled: list
    prepare_s: float


@dataclass
class LaunchedStep:
    step: PreparedStep
    logits: Any  # the logits tensor, or a future of (logits, seconds) from the worker thread
    copy_s: float
    issued: float  # perf_counter when the forward was issued


class ModelExecutor:
    simulated = False

    def __init__(
        self,
        model: TinyDecoder,
        allocator,
        backend,
        sampling: SamplingParams,
        swap_slots: int = 0,
        graph: tuple[type, dict] | None = None,
        async_scheduling: bool = False,
    ):
        self.model, self.allocator, self.backend, self.sampling = model, allocator, backend, sampling
        self.device, self.dtype = model.embed.weight.device, model.embed.weight.dtype
        self.block_size = bs = allocator.block_size
        spec = model.spec
        slot_shape = (spec.num_kv_heads, spec.head_dim)
        num_blocks = cdiv(allocator.num_slots, bs)
        on_device = dict(device=self.device, dtype=self.dtype)
        self.kv_caches = [
            (
                torch.zeros(num_blocks, bs, *slot_shape, **on_device),
                torch.zeros(num_blocks, bs, *slot_shape, **on_device),
            )
            for _ in model.attention_windows
        ]
        pinned = dict(dtype=self.dtype, pin_memory=self.device.type == "cuda")
        swap_blocks = cdiv(swap_slots, bs)
        self.swap_caches = (
            [
                (
                    torch.zeros(swap_blocks, bs, *slot_shape, **pinned),
                    torch.zeros(swap_blocks, bs, *slot_shape, **pinned),
                )
                for _ in model.attention_windows
            ]
            if swap_blocks
            else []
        )
        self._flat = [c.view(-1, *slot_shape) for pair in self.kv_caches for c in pair]
        self._swap_flat = [c.view(-1, *slot_shape) for pair in self.swap_caches for c in pair]
        self.paged = allocator.layout == "paged"
        self.times = {phase: [] for phase in PHASES}
        self.swap_s = 0.0  # measured time of swap copies (part of "copy")
        graph_cls, graph_options = graph or (EagerGraph, {})
        self.graph = build_graph(
            graph_cls, graph_options, model.forward, type(backend), self.device, spec.max_model_len
        )
        # On cpu an async step can only overlap the host's next step on another thread.
        self.clock = DeviceClock(self.device, threaded=async_scheduling)
        self.timer = time.perf_counter  # how phases are timed: the step's own clock (use_clock)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="kvbench-forward") if self.clock.threaded else None

    def use_clock(self, timer) -> None:
        """Time the phases, the launch and the device with `timer`, the clock that times the
        steps (serve's scenario.clock: wall, or the process's CPU time), so that they add up."""
        self.timer = self.clock.timer = timer

    # --- one step: prepare -> launch -> collect (async scheduling interleaves two steps) --
    @torch.inference_mode()
    def execute(self, batch: Batch) -> StepResult:
        return self.collect(self.launch(self.prepare(batch)))

    def prepare(self, batch: Batch) -> PreparedStep:
        start = self.timer()
        inputs = self._prepare(batch)
        return PreparedStep(batch, *inputs, prepare_s=self.timer() - start)

    def refresh_inputs(self, step: PreparedStep) -> None:
        """Re-read the step's token ids: under async scheduling the step before just sampled them."""
        ids = [
            token
            for seq, n in zip(step.batch.seqs, step.batch.num_new_tokens)
            for token in seq.token_ids[seq.num_computed - n : seq.num_computed]
        ]
        step.input_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)

    @torch.inference_mode()
    def launch(self, step: PreparedStep) -> LaunchedStep:
        """Replay the logged copies and issue the forward; do not wait for the device."""
        start = self.timer()
        self._copy(self.allocator.take_copies())
        copied = self.timer()
        context = ForwardContext(
            self.backend, step.meta, self.kv_caches, self.model.scale, self.model.attention_windows
        )
        self.clock.start()
        if self._worker is None:
            logits = self._logits(step, context)
        else:
            logits = self._worker.submit(self._timed_logits, step, context)
        self.clock.stop()
        return LaunchedStep(step, logits, copied - start, copied)

    def _logits(self, step: PreparedStep, context: ForwardContext) -> torch.Tensor:
        with forward_context(context):
            hidden = self._forward(step.input_ids, step.positions)
        return self.model.compute_logits(hidden[step.last_rows])

    def _timed_logits(self, step: PreparedStep, context: ForwardContext):
        with torch.inference_mode():  # inference mode is per thread
            start = self.timer()
            return self._logits(step, context), self.timer() - start

    @torch.inference_mode()
    def collect(self, launched: LaunchedStep) -> StepResult:
        """Wait for the forward, sample, and record the step's phases."""
        logits = launched.logits
        if self._worker is not None:
            logits, ran = logits.result()
            self.clock.ran(ran)
        self._sync()
        forwarded = self.timer()
        step = launched.step
        tokens = self._sample(step.batch, step.sampled, logits)
        end = self.timer()
        for phase, seconds in zip(
            PHASES, (launched.copy_s, step.prepare_s, forwarded - launched.issued, end - forwarded)
        ):
            self.times[phase].append(seconds)
        return StepResult(launched.copy_s + step.prepare_s + end - launched.issued, tokens)

    def capture_graphs(self, max_num_seqs: int, max_num_tokens: int) -> None:
        """Capture the graph mode's sizes for the scheduler's largest batches before the first step."""
        like = AttentionMetadata(
            query_start_loc=torch.zeros(1, dtype=torch.int32, device=self.device),
            seq_lens=torch.zeros(0, dtype=torch.int32, device=self.device),
            slot_mapping=torch.zeros(0, dtype=torch.int64, device=self.device),
            block_size=self.block_size,
            max_query_len=1,
            max_seq_len=1,
            block_tables=torch.zeros(0, 1, dtype=torch.int32, device=self.device) if self.paged else None,
            seq_starts=None if self.paged else torch.zeros(0, dtype=torch.int64, device=self.device),
        )
        context = ForwardContext(
            self.backend, padding_metadata(like, 0), self.kv_caches, self.model.scale, self.model.attention_windows
        )
        with torch.inference_mode():
            self.graph.prepare(max_num_seqs, max_num_tokens, context)

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The model's forward for one packed batch, run by the graph mode (captured or split)."""
        return self.graph(input_ids, positions, current_context())

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # --- copies the allocator logged ----------------------------------------------------
    def _copy(self, copies: list) -> None:
        """Replay (kind, src_slot, dst_slot, num_slots) copies in the order they were logged."""
        if not copies:
            return
        start = self.timer()
        for kind, src, dst, n in copies:
            if kind == "device":
                for cache in self._flat:
                    cache[dst : dst + n] = cache[src : src + n]
            elif kind == "out":
                for cache, host in zip(self._flat, self._swap_flat):
                    host[dst : dst + n].copy_(cache[src : src + n], non_blocking=True)
            else:
                for cache, host in zip(self._flat, self._swap_flat):
                    cache[dst : dst + n].copy_(host[src : src + n], non_blocking=True)
        self._sync()
        if any(kind != "device" for kind, *_ in copies):
            self.swap_s += self.timer() - start

    # --- inputs --------------------------------------------------------------------------
    def _prepare(self, batch: Batch):
        """Packed token ids and positions, the attention metadata, and the rows to sample from."""
        ids, positions, query_start, seq_lens, last_rows, sampled = [], [], [0], [], [], []
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            end = seq.num_computed
            ids += seq.token_ids[end - n : end]
            positions += range(end - n, end)
            query_start.append(query_start[-1] + n)
            seq_lens.append(end)
            if end == seq.num_tokens:  # the context is complete: this row yields a token
                last_rows.append(query_start[-1] - 1)
                sampled.append(i)
        to = dict(device=self.device)
        positions_t = torch.tensor(positions, dtype=torch.int64, **to)
        counts = torch.tensor(batch.num_new_tokens, **to)
        seq_of_token = torch.repeat_interleave(torch.arange(len(batch.seqs), **to), counts)
        bs = self.block_size
        block_tables = seq_starts = None
        if self.paged:
            tables = [self.allocator.block_table(seq) for seq in batch.seqs]
            width = max(len(t) for t in tables)
            block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, **to)
            slot_mapping = block_tables[seq_of_token, positions_t // bs].to(torch.int64) * bs + positions_t % bs
        else:
            seq_starts = torch.tensor([self.allocator.slot_start(seq) for seq in batch.seqs], dtype=torch.int64, **to)
            slot_mapping = seq_starts[seq_of_token] + positions_t
        meta_ints = dict(dtype=torch.int32, **to)
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(query_start, **meta_ints),
            seq_lens=torch.tensor(seq_lens, **meta_ints),
            slot_mapping=slot_mapping,
            block_size=bs,
            max_query_len=max(batch.num_new_tokens),
            max_seq_len=max(seq_lens),
            block_tables=block_tables,
            seq_starts=seq_starts,
        )
        return (
            torch.tensor(ids, dtype=torch.int64, **to),
            positions_t,
            meta,
            torch.tensor(last_rows, dtype=torch.int64, **to),
            sampled,
        )

    # --- sampling ------------------------------------------------------------------------
    def _sample(self, batch: Batch, sampled: list[int], logits: torch.Tensor) -> list:
        """Per batch row: a token id, or for a request that forks or steps its beams this step,
        the list the engine applies (tokens of the n samples / (beam row, token, logprob) picks);
        None for a prefill chunk and for beam rows other than the group's first."""
        tokens: list = [None] * len(batch.seqs)
        plain_rows, plain_keys, plain_at = [], [], []
        params = self.sampling
        r = 0
        while r < len(sampled):
            i = sampled[r]
            seq = batch.seqs[i]
            request = seq.request
            if request.beam_width > 1:
                beams = seq.group or [seq]
                rows = logits[r : r + len(beams)]
                tokens[i] = beam_select(rows, [b.cumulative_logprob for b in beams], request.beam_width)
                r += len(beams)
                continue
            if request.n > 1 and seq.group is None:  # the prompt is done: every sample draws its first token
                keys = [(request.request_id, k, seq.num_tokens) for k in range(request.n)]
                tokens[i] = sample(logits[r].expand(request.n, -1), params, keys)
            else:
                plain_rows.append(r)
                plain_keys.append((request.request_id, seq.sample_index, seq.num_tokens))
                plain_at.append(i)
            r += 1
        if plain_rows:
            for i, token in zip(plain_at, sample(logits[plain_rows], params, plain_keys)):
                tokens[i] = token
        return tokens

    # --- reporting -----------------------------------------------------------------------
    def time_split(self, schedule_s: list[float], step_wall_s: list[float] | None = None) -> dict:
        """Mean host seconds per step of each phase, and each phase's share of the step; the
        forward's launch and device seconds and cpu_overhead_frac over the steps' wall times
        (`step_wall_s`, default the phases' sum: right unless async scheduling overlapped them)."""
        steps = max(len(self.times["forward"]), 1)
        means = {"schedule": sum(schedule_s) / steps}
        means.update({phase: sum(v) / steps for phase, v in self.times.items()})
        total = sum(means.values()) or 1.0
        row = {f"{phase}_s": seconds for phase, seconds in means.items()}
        row.update({f"{phase}_frac": seconds / total for phase, seconds in means.items()})
        if step_wall_s is None:
            step_wall_s = [sum(parts) for parts in zip(schedule_s, *self.times.values())]
        row.update(overhead_columns(step_wall_s, self.clock), **self.graph.stats())
        return row
