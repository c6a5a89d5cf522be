"""scenario=profile: time the real executor on a grid of synthetic batches, fit a step-time model.

The grid has prefill-only steps (prompts x lengths), decode-only steps (batch x context) and
mixed steps (decodes beside one prompt). Each shape is warmed up, then timed `repeats` times in
interleaved rounds, exactly as the serve engine times a step (kvbench.scenarios.synthetic_steps).
profile.csv gets one row per shape: what it was measured on, the cost model's batch features
and the step-time statistics; profile_fit.json the fitted model (kvbench.executors.step_fit)
and its error on held-out shapes. executor=calibrated simulates with profile.csv.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path

import numpy as np
from omegaconf import DictConfig
from tqdm import tqdm

from kvbench.errors import UserError
from kvbench.executors.calibrated import device_name, fit_column, model_shape
from kvbench.executors.step_fit import FEATURES, fit, heldout_split
from kvbench.reporting.results import write_atomic, write_csv
from kvbench.scenarios.build import build_allocator, plugin_cfg
from kvbench.scenarios.serve import RealModel, real_model, step_clock
from kvbench.scenarios.serve import preflight as serve_preflight
from kvbench.scenarios.synthetic_steps import Shape, StepTimer

log = logging.getLogger("kvbench")


def out_dir(scenario: DictConfig) -> Path:
    """scenario.out_dir, else the Hydra run's directory, else the working directory."""
    if scenario.get("out_dir"):
        return Path(str(scenario.out_dir))
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path.cwd()


def refuse_replacing(scenario: DictConfig, names: tuple[str, ...]) -> None:
    """A given scenario.out_dir that holds an earlier run's `names`: this run would replace them,
    and the earlier run's row would name (by sha256) a profile that is gone; or one this run
    cannot write."""
    if not scenario.get("out_dir"):
        return  # the run's own folder
    folder = Path(str(scenario.out_dir))
    held = [name for name in names if (folder / name).exists()]
    if held:
        raise UserError(
            f"scenario.out_dir={folder} holds an earlier run's {held[0]}, which this run would replace: give a "
            f"new folder (or scenario.out_dir=null, the run's own)"
        )
    # before measuring, not after: a profile measured for minutes is lost where it cannot be written
    # (asked without writing: --cfg job and a sweep's check run this too)
    existing = next((p for p in [folder, *folder.absolute().parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UserError(f"scenario.out_dir={folder} cannot be written: {existing} is a file, not a folder")
    if existing is None or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"scenario.out_dir={folder} cannot be written: permission denied; give a folder you can write")


def lengths(scenario: DictConfig, key: str, max_model_len: int) -> list[int]:
    """A grid list of token counts, `max` resolved; one outside 1..max_model_len is an error."""
    values = []
    for value in scenario[key]:
        length = max_model_len if str(value) == "max" else value
        if not isinstance(length, int) or isinstance(length, bool) or not 1 <= length <= max_model_len:
            raise UserError(
                f"scenario.{key} has {value!r}: each entry must be an integer in "
                f"1..{max_model_len} (model.max_model_len) or max"
            )
        values.append(length)
    return sorted(set(values))


def counts(scenario: DictConfig, key: str) -> list[int]:
    """A grid list of sequence counts, each >= 1."""
    values = list(scenario[key])
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise UserError(f"scenario.{key}={values}: each entry must be an integer >= 1")
    return sorted(set(values))


def grid(scenario: DictConfig, max_model_len: int, max_num_seqs: int, max_num_tokens: int) -> tuple[list, int]:
    """The shapes to time, and how many of the configured ones the scheduler's limits rule out."""
    tokens = lambda key: lengths(scenario, key, max_model_len)
    wanted = [
        Shape(prefill_seqs=p, prefill_len=n) for p in counts(scenario, "prefill_seqs") for n in tokens("prefill_len")
    ]
    wanted += [
        Shape(decode_seqs=b, decode_context=c)
        for b in counts(scenario, "decode_batch")
        for c in tokens("decode_context")
    ]
    wanted += [
        Shape(prefill_seqs=1, prefill_len=n, decode_seqs=b, decode_context=c)
        for b in counts(scenario, "mixed_batch")
        for n in tokens("mixed_prefill_len")
        for c in tokens("decode_context")
    ]
    shapes = [s for s in wanted if s.prefill_seqs + s.decode_seqs <= max_num_seqs and s.num_tokens <= max_num_tokens]
    return shapes, len(wanted) - len(shapes)


def measure(
    timer: StepTimer,
    shapes: list[Shape],
    warmup: int,
    repeats: int,
    progress: bool,
    burst: int = 1,
    between=None,
    statistic: str = "median",
) -> dict:
    """Shape -> its timed steps, over `warmup` untimed and `repeats` timed interleaved rounds.

    In each round a shape runs `burst` times back to back and the round keeps their mean, or
    their median (`statistic`): a served step follows steps much like it, and a pause of the host
    lands on one step of a burst rather than on the round's only one. The garbage collector is
    off while it measures, as it is while serve runs (scenarios/serve.py): a profile times the
    steps serve takes. `between(i)`, if given, is called before the i-th shape of the run (the
    validation probes the host's speed there)."""
    gc.collect()
    gc.disable()
    try:
        return _measure(timer, shapes, warmup, repeats, progress, burst, between, statistic)
    finally:
        gc.enable()


def _measure(timer, shapes, warmup, repeats, progress, burst, between, statistic) -> dict:
    timed: dict = {shape: [] for shape in shapes}
    rounds = [(r, shape) for r in range(warmup + repeats) for shape in shapes]
    bar = tqdm(rounds, desc="profile", unit="shape", disable=None if progress else True, mininterval=1.0, leave=False)
    for i, (r, shape) in enumerate(bar):
        if between is not None:
            between(i)
        if timed[shape] is None:
            continue
        steps = []
        for _ in range(burst):
            step = timer.time(shape)
            if step is None:  # the pool cannot hold it: dropped from every later round
                break
            steps.append(step)
        if not steps:
            timed[shape] = None
        elif r >= warmup and statistic == "mean":
            timed[shape].append(dataclasses.replace(steps[0], seconds=sum(s.seconds for s in steps) / len(steps)))
        elif r >= warmup:
            steps.sort(key=lambda s: s.seconds)
            timed[shape].append(steps[(len(steps) - 1) // 2])
    return {shape: steps for shape, steps in timed.items() if steps}


def validate(scenario: DictConfig) -> tuple[int, int, float]:
    warmup, repeats, heldout = int(scenario.warmup), int(scenario.repeats), float(scenario.heldout_frac)
    if repeats < 1:
        raise UserError(f"scenario.repeats={repeats} must be >= 1")
    if warmup < 0:
        raise UserError(f"scenario.warmup={warmup} must be >= 0")
    if not 0 <= heldout < 1:
        raise UserError(f"scenario.heldout_frac={heldout} must be in [0, 1)")
    return warmup, repeats, heldout


def step_timer(cfg: DictConfig, kv_cache_tokens: int | None = None) -> tuple[StepTimer, RealModel]:
    """A StepTimer, and the real model it runs: cfg.model built on scenario.device (threads
    pinned), a KV pool of `kv_cache_tokens` slots (default scenario.kv_cache_tokens), the
    scenario's clock."""
    scenario, sched = cfg.scenario, cfg.scheduler
    real = real_model(cfg)
    allocator = build_allocator(cfg, real.spec, int(kv_cache_tokens or scenario.kv_cache_tokens))
    timer = StepTimer(
        allocator,
        real.executor(allocator),
        int(sched.max_num_seqs),
        int(sched.max_num_batched_tokens),
        real.spec.vocab_size,
        int(cfg.seed),
        step_clock(scenario, real.device),
    )
    return timer, real


def too_few(count: int, shapes: list, ruled_out: int, scenario) -> None:
    """Refuse a grid of which `count` shapes (those it has, or those that ran) are too few to fit."""
    if count >= len(FEATURES) + 1:
        return
    unheld = len(shapes) - count
    why = [
        f"{ruled_out} {'exceeds' if ruled_out == 1 else 'exceed'} scheduler.max_num_seqs or max_num_batched_tokens"
        if ruled_out
        else "",
        f"{unheld} {'does' if unheld == 1 else 'do'} not fit the KV pool of scenario.kv_cache_tokens="
        f"{scenario.kv_cache_tokens}"
        if unheld
        else "",
    ]
    why = "; ".join(w for w in why if w)
    raise UserError(
        f"the step-time fit needs at least {len(FEATURES) + 1} measured shapes, and {count} of "
        f"the grid's {len(shapes) + ruled_out} {'ran' if unheld else 'can run'}{f' ({why})' if why else ''}; give "
        f"the grid more values (scenario.prefill_len, scenario.decode_batch, ...) or raise those limits"
    )


def refuse_a_missing_phase(shapes, ran: bool = False) -> None:
    """The fit times decode-only steps apart from those that carry a prompt: a grid whose limits
    or pool leave none of one kind would have that kind's steps timed from the other's fit."""
    phases = {shape.phase for shape in shapes}
    for kind, knobs in (("decode", "decode_batch, decode_context"), ("prefill", "prefill_seqs, prefill_len")):
        if not phases & ({"decode"} if kind == "decode" else {"prefill", "mixed"}):
            limits = (
                "the KV pool of scenario.kv_cache_tokens" if ran else "scheduler.max_num_seqs or max_num_batched_tokens"
            )
            grid = "scenario." + knobs.replace(", ", " x scenario.")
            raise UserError(
                f"the grid {'ran' if ran else 'keeps'} no {kind} step (each of {grid} exceeds {limits}): the fit would "
                f"time {kind} steps from the others'; give it values within those limits, or raise them"
            )


def profile_rows(cfg: DictConfig, progress: bool, between=None) -> tuple[list[dict], int]:
    """Measure the grid on the configured model and device; one row per shape it could hold."""
    scenario = cfg.scenario
    warmup, repeats, _ = validate(scenario)
    sched = cfg.scheduler
    max_model_len = int(cfg.model.max_model_len)
    shapes, ruled_out = grid(scenario, max_model_len, int(sched.max_num_seqs), int(sched.max_num_batched_tokens))
    timer, real = step_timer(cfg)
    spec, allocator = real.spec, timer.allocator
    burst = int(scenario.get("burst", 1))
    statistic = str(scenario.get("fit_to", "mean"))
    too_few(len(shapes), shapes, ruled_out, scenario)  # before minutes of measuring, where it can tell
    refuse_a_missing_phase(shapes)
    measured = measure(timer, shapes, warmup, repeats, progress, burst=burst, between=between, statistic=statistic)
    too_few(len(measured), shapes, ruled_out, scenario)
    refuse_a_missing_phase(measured, ran=True)
    identity = {
        "model": spec.name,
        "model_shape": model_shape(spec),
        "dtype": spec.dtype,
        "device": device_name(real.device),
        "backend": plugin_cfg(cfg, "backend")["name"],
        "graph": plugin_cfg(cfg, "graph")["name"],
        "allocator": allocator.name,
        "block_size": allocator.block_size,
        "cpu_threads": scenario.get("cpu_threads"),
        "clock": str(scenario.get("clock", "wall")),
        "fit_to": statistic,
    }
    rows = []
    for shape, steps in measured.items():
        seconds = np.array([s.seconds for s in steps])
        first = steps[0]
        rows.append(
            {
                **identity,
                "phase": shape.phase,
                "prefill_seqs": shape.prefill_seqs,
                "prefill_len": shape.prefill_len,
                "decode_seqs": shape.decode_seqs,
                "decode_context": shape.decode_context,
                **{f: getattr(first, f) for f in FEATURES},
                "repeats": len(seconds),
                "time_s_median": float(np.median(seconds)),
                "time_s_p10": float(np.percentile(seconds, 10)),
                "time_s_p90": float(np.percentile(seconds, 90)),
                "time_s_mean": float(seconds.mean()),
            }
        )
    return rows, ruled_out + len(shapes) - len(measured)


def preflight(cfg: DictConfig) -> tuple:
    """What a profile run refuses before it measures (scenarios.run.preflight): its settings and
    its grid (a length beyond the model's). Its folder is checked as the run starts: a resumed
    sweep's finished point holds its profile.csv, and is skipped, not refused. Returns
    validate()'s (warmup, repeats, heldout_frac)."""
    scenario, sched = cfg.scenario, cfg.scheduler
    settings = validate(scenario)
    grid(scenario, int(cfg.model.max_model_len), int(sched.max_num_seqs), int(sched.max_num_batched_tokens))
    serve_preflight(cfg)  # the real model is served's, its cores and threads pinned as a served run's
    return settings


def make_out_dir(scenario: DictConfig) -> Path:
    """The run's output folder, made before anything is measured: one that cannot be made
    (scenario.out_dir=/proc/x, where a check of its parent's permissions passes) fails now, not
    after minutes of measuring."""
    folder = out_dir(scenario)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"scenario.out_dir={folder} cannot be made ({err.strerror}); give a folder you can write"
        ) from None
    return folder


def run(cfg: DictConfig, between=None) -> list[dict]:
    scenario = cfg.scenario
    _, _, heldout_frac = preflight(cfg)
    refuse_replacing(scenario, ("profile.csv", "profile_fit.json"))
    make_out_dir(scenario)
    started, cpu_started = time.perf_counter(), time.process_time()
    rows, skipped = profile_rows(cfg, bool(cfg.progress), between)
    profile_s, profile_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    times = np.array([r[fit_column(r)] for r in rows])
    report = fit(rows, times, heldout_split(rows, heldout_frac, int(cfg.seed)))
    if heldout_frac and not report.num_heldout:
        log.warning(
            "scenario.heldout_frac=%g holds out no shape: %d measured leave too few to fit %d "
            "coefficients on the rest; the fit's error is in-sample (fit_median_err)",
            heldout_frac,
            len(rows),
            len(FEATURES) + 1,
        )
    held = set(report.held)
    for i, (row, predicted) in enumerate(zip(rows, report.model.predict_rows(rows))):
        row.update(predicted_s=float(predicted), heldout=i in held)
    folder = out_dir(scenario)
    path = folder / "profile.csv"
    write_csv(path, rows)
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    summary = {
        "profile": str(path),
        "profile_sha256": sha256,
        "profile_shapes": len(rows),
        "profile_shapes_skipped": skipped,
        "profile_s": profile_s,
        "profile_cpu_s": profile_cpu_s,
        "fit_form": report.model.form,
        "fit_heldout_median_err": report.heldout_median,
        "fit_heldout_max_err": report.heldout_max,
        "fit_heldout_shapes": report.num_heldout,
        "fit_median_err": report.fit_median,
        "fit_max_err": report.fit_max,
    }
    fit_doc = {**summary, "model": report.model.as_dict(), "heldout_median_err_by_form": report.scores}
    # strict JSON: a figure that does not exist (no shape held out) is null, not NaN or Infinity
    write_atomic(folder / "profile_fit.json", json.dumps(_no_nan(fit_doc), indent=2, allow_nan=False) + "\n")
    return [{**summary, "device": rows[0]["device"], "dtype": rows[0]["dtype"]}]


def _no_nan(value):
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value
