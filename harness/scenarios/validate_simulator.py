"""scenario=validate: the calibrated simulator against the real engine on the same workload.

One point: profile the real executor (or take scenario.profile), then run the same workload and
seed `runs` times through scenario=serve (measured) and `runs` times through scenario=simulate
with executor=calibrated, in one process, serve and simulate alternating. The arrival rate is
`load` times the request rate the calibrated simulator saturates at, so both sides see the same
steady state below saturation. Writes validation.csv and validation.md (per metric: every run,
the measured run-to-run spread and the simulator's relative error), step_time.png (each
measured step against the calibrated model's prediction for the very same batch) and steps.csv
(those steps: batch features, measured and predicted time).
"""

from __future__ import annotations

import dataclasses
import math
from importlib import resources

import numpy as np
from omegaconf import DictConfig, OmegaConf

from kvbench.errors import UserError
from kvbench.executors.calibrated import load_profile
from kvbench.reporting.results import write_atomic, write_csv
from kvbench.scenarios import repeats
from kvbench.scenarios.build import load_specs, plugin_cfg, resolve_device
from kvbench.scenarios.profile import make_out_dir, refuse_replacing, step_timer
from kvbench.scenarios.profile import run as run_profile
from kvbench.scenarios.serve import serve
from kvbench.scenarios.simulate import make_executor, simulate
from kvbench.scenarios.synthetic_steps import Shape

# The serving metrics compared: label -> result column. Renaming a result column is one edit here.
METRICS = {
    "throughput (req/s)": "request_throughput",
    "throughput (tok/s)": "output_throughput",
    "mean batch": "mean_batch_size",
    "TTFT p50": "median_ttft_ms",
    "TTFT p99": "p99_ttft_ms",
    "TPOT p50": "median_tpot_ms",
    "TPOT p99": "p99_tpot_ms",
    "normalized latency": "normalized_latency_s_per_tok",
    "preemptions": "preemptions",
}
REQUEST_RATE = METRICS["throughput (req/s)"]


def scenario_cfg(cfg: DictConfig, name: str, changes: DictConfig | None) -> DictConfig:
    """`cfg` with its scenario replaced by conf/scenario/NAME.yaml and `changes` merged in."""
    text = (resources.files("kvbench.conf") / "scenario" / f"{name}.yaml").read_text()
    scenario = OmegaConf.merge(OmegaConf.create(text), changes or {})
    derived = OmegaConf.to_container(cfg, resolve=True)
    derived["scenario"] = OmegaConf.to_container(scenario, resolve=True)
    return OmegaConf.create(derived)


class FeatureLog:
    """Wraps a real executor and keeps each step's batch features, to predict the same steps."""

    def __init__(self, inner):
        self.inner = inner
        self.features: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def execute(self, batch):
        self.features.append((batch.num_tokens, batch.num_seqs, batch.context_tokens, batch.attention_pairs))
        return self.inner.execute(batch)


class HostReplay:
    """Wraps a simulated engine's executor: each step's predicted time is scaled by `ratios` at
    the serve run's step that started last at or before the same clock time (`starts`).
    The simulation then meets the host's slow and fast periods when the measured run met them:
    a diagnostic of how much of the error is the host's varying speed, not a prediction."""

    simulated = True
    needs_sequences = False

    def __init__(self, engine, starts: np.ndarray, ratios: np.ndarray):
        self.inner, self.starts, self.ratios, self.now = engine.executor, starts, ratios, 0.0
        schedule = engine.scheduler.schedule

        def schedule_at(now: float = 0.0):
            self.now = now
            return schedule(now)

        engine.scheduler.schedule, engine.executor = schedule_at, self

    def execute(self, batch):
        step = self.inner.execute(batch)
        at = max(int(np.searchsorted(self.starts, self.now, side="right")) - 1, 0)
        return dataclasses.replace(step, duration_s=step.duration_s * float(self.ratios[at]))


def replay_series(log, predicted: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(start time, measured / predicted) of every step a serve run timed, the ratio a rolling
    median over `window` steps: the host's speed over time, not each step's own time (replayed
    step for step, the simulation would retrace the measured run exactly, its decisions being
    the same)."""
    from scipy.ndimage import median_filter

    measured = np.asarray(log.recorder.step_dt)
    speed = median_filter(measured / predicted, size=window, mode="nearest")
    # end - duration can round an ulp above the clock the step started at: 1 ns earlier is still
    # after the step before it ended (steps are microseconds at the least)
    return step_starts(log) - 1e-9, speed


def step_starts(log) -> np.ndarray:
    """The serve clock at which each step a serve run timed started."""
    return np.asarray(log.recorder.step_end) - np.asarray(log.recorder.step_dt)


def relative_error(simulated: float, measured: float) -> float:
    if measured == 0:
        return 0.0 if simulated == 0 else math.inf
    return (simulated - measured) / measured


def spread(values: list[float]) -> float:
    """(max - min) / mean of the measured runs: how far two identical runs disagree; NaN for
    one run, which says nothing of it (scenario.runs=1)."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return math.nan
    return (max(values) - min(values)) / mean if mean else 0.0


def _percent(share: float, one: str = "one run") -> str:
    return f"n/a ({one})" if math.isnan(share) else f"{100 * share:.1f}%"


PROFILE_PROBE_EVERY = 10  # profile shapes between two host-speed readings


class ModelProbe:
    """The host's speed as the model meets it: one decode step of 4 sequences at context 256
    (or max_model_len), timed like a profile shape on a model and KV pool of its own, so the
    served engine's pool is never touched. Read while profiling and between serve steps, its
    range is how much the host itself sped up or slowed down, which no step-time model fitted
    at one moment can follow. A fixed piece of arithmetic was not enough: this host's slow
    periods slow the model's many small per-sequence operations more than a matrix product."""

    def __init__(self, profile_cfg: DictConfig, max_model_len: int):
        self.shape = Shape(decode_seqs=4, decode_context=min(256, max_model_len))
        # room for 4 sequences whatever the allocator reserves (contiguous: max_model_len each)
        self.timer, _ = step_timer(profile_cfg, kv_cache_tokens=4 * max_model_len + 64)
        for _ in range(3):  # warm-up: the first steps of a fresh model are slower
            self.read(1)

    def read(self, repeats: int = 15) -> float:
        """The median time of `repeats` steps, on the profile's clock."""
        times = []
        for _ in range(repeats):
            step = self.timer.time(self.shape)
            if step is None:
                raise UserError(
                    f"the host-speed probe's step ({self.shape.decode_seqs} sequences at context "
                    f"{self.shape.decode_context}) does not fit scheduler.max_num_seqs / "
                    f"max_num_batched_tokens; raise them to at least {self.shape.decode_seqs}"
                )
            times.append(step.seconds)
        return float(np.median(times))


# Simulations beside the plain one, each a diagnostic: result column -> its header in validation.md
VARIANTS = {
    "rel_error_at_host_speed": "error at the host's measured speed",
    "rel_error_host_probed": "error at the host's probed speed over time",
    "rel_error_host_replayed": "error with the host's speed over time replayed",
}


def table(measured: list[dict], simulated: list[dict], variants: dict[str, list[dict]] | None = None) -> list[dict]:
    """One row per metric: every run, the measured spread, the simulator's error against the
    measured mean, and each variant's (VARIANTS) the same way."""
    rows = []
    for label, column in METRICS.items():
        real = [float(r[column]) for r in measured]
        sim = [float(r[column]) for r in simulated]
        rows.append(
            {
                "metric": label,
                "column": column,
                **{f"measured_{i + 1}": v for i, v in enumerate(real)},
                **{f"simulated_{i + 1}": v for i, v in enumerate(sim)},
                "measured_spread": spread(real),
                "simulated_spread": spread(sim),
                "rel_error": relative_error(float(np.mean(sim)), float(np.mean(real))),
                **{
                    name: relative_error(float(np.mean([float(r[column]) for r in runs])), float(np.mean(real)))
                    for name, runs in (variants or {}).items()
                },
            }
        )
    return rows


def markdown(rows: list[dict], head: str) -> str:
    variants = [name for name in VARIANTS if name in rows[0]]
    lines = [
        head,
        "",
        "| metric | measured (runs) | simulated | measured run-to-run spread | simulator error |"
        + "".join(f" {VARIANTS[name]} |" for name in variants),
        "|---|---|---|---|---|" + "---|" * len(variants),
    ]
    for row in rows:
        real = " / ".join(f"{row[k]:.4g}" for k in row if k.startswith("measured_") and k[9:].isdigit())
        lines.append(
            f"| {row['metric']} | {real} | {row['simulated_1']:.4g} | {_percent(row['measured_spread'])} "
            f"| {100 * row['rel_error']:+.1f}% |" + "".join(f" {100 * row[name]:+.1f}% |" for name in variants)
        )
    return "\n".join(lines) + "\n"


def step_plot(measured_s: list, predicted_s: np.ndarray, sim_engine, path) -> float:
    """Measured vs predicted time of the same steps, and the simulated run's own steps; returns
    the median per-step relative error."""
    from kvbench.reporting.figures import save_figure, subplots

    measured = np.asarray(measured_s)
    fig, (over_run, scatter) = subplots(1, 2, figsize=(12, 4.2))
    import pandas as pd

    # a centred 15-step mean over the steps there are (a convolution's zero padding halved the ends)
    smooth = lambda a: pd.Series(a).rolling(15, center=True, min_periods=1).mean().to_numpy()
    over_run.plot(smooth(measured) * 1e3, label="measured (serve)", lw=1.2)
    over_run.plot(smooth(predicted_s) * 1e3, label="calibrated model, same batches", lw=1.2)
    over_run.plot(
        smooth(np.asarray(sim_engine.recorder.step_dt)) * 1e3, label="simulated run's steps", lw=1.0, alpha=0.7
    )
    over_run.set(xlabel="step", ylabel="step time, ms (15-step mean)", title="per-step time over the run")
    over_run.legend()
    scatter.scatter(measured * 1e3, predicted_s * 1e3, s=4, alpha=0.4)
    top = float(max(measured.max(), predicted_s.max())) * 1e3
    scatter.plot([0, top], [0, top], color="black", lw=0.8)
    scatter.set(xlabel="measured step, ms", ylabel="predicted step, ms", title="each measured step")
    save_figure(fig, path)
    return float(np.median(np.abs(predicted_s - measured) / measured))


def write_steps(path, log, predicted_s: np.ndarray) -> None:
    """steps.csv: every step of the first serve run, its batch features, measured and predicted time."""
    import pandas as pd

    frame = pd.DataFrame(log.features, columns=["num_tokens", "num_seqs", "context_tokens", "attention_pairs"])
    frame.insert(0, "start_s", step_starts(log))
    write_csv(path, frame.assign(measured_s=log.recorder.step_dt, predicted_s=predicted_s))


def step_bias(features: list[tuple], measured_s: list, predicted_s: np.ndarray) -> dict:
    """Median signed relative error (predicted - measured) / measured of the same steps, over all
    steps and apart for decode-only steps and steps that carry a prompt: which way the model
    leans, and where; and the error of the steps' total time, which a queue follows. Below
    saturation a lean of a few percent moves the queue by several times that (docs/simulator.md)."""
    measured = np.asarray(measured_s)
    signed = (predicted_s - measured) / measured
    decode = np.array([tokens == seqs for tokens, seqs, *_ in features], dtype=bool)
    parts = {"all": signed, "decode-only": signed[decode], "with a prompt": signed[~decode]}
    bias = {f"{name} ({len(values)} steps)": float(np.median(values)) for name, values in parts.items() if len(values)}
    # what a queue adds up: the steps' total, slow steps weighed by their length
    bias["total time (sum predicted / sum measured - 1)"] = float(predicted_s.sum() / measured.sum() - 1)
    return bias


def check(scenario: DictConfig) -> tuple[int, float | None]:
    runs, load = int(scenario.runs), scenario.get("load")
    if runs < 1:
        raise UserError(f"scenario.runs={runs} must be >= 1")
    if load is not None and not 0 < float(load):
        raise UserError(f"scenario.load={load} must be > 0 (or null to keep workload.rate)")
    return runs, None if load is None else float(load)


def check_serve_clock(cfg: DictConfig) -> None:
    """The serve runs' clock (scenario.serve.clock, cpu unless changed), checked before a profile
    is taken (minutes on a larger model), in validate's own keys."""
    serve = scenario_cfg(cfg, "serve", cfg.scenario.get("serve")).scenario
    profiling = (cfg.scenario.get("profiling") or {}).get("clock")
    clock = str(serve.get("clock", "wall"))
    if not cfg.scenario.get("profile") and profiling is not None and str(profiling) != clock:
        raise UserError(  # a given profile's clock is checked against its rows (run)
            f"scenario.profiling.clock={profiling} but scenario.serve.clock={clock}: the profile taken would time "
            f"steps on another clock than the serve runs it predicts (a wall-clock step holds other processes' "
            f"time too); set both alike"
        )
    if clock != "cpu":
        return
    asynchronous = bool(cfg.engine.get("async_scheduling"))
    if resolve_device(str(serve.device)).type != "cpu" or serve.get("cpu_threads") != 1 or asynchronous:
        raise UserError(
            f"scenario.serve.clock=cpu (validate's default) needs scenario.serve.device=cpu, scenario.serve.cpu_threads"
            f"=1 and engine.async_scheduling=false (now {serve.device}, {serve.get('cpu_threads')}, "
            f"{str(asynchronous).lower()}): only then is the process's CPU time a step's; set "
            f"scenario.serve.clock=wall (and scenario.profiling.clock=wall), or those"
        )


def refuse_a_pool_too_small(cfg: DictConfig, model, hardware) -> None:
    """Before the profile is taken: a pool of scenario.kv_cache_tokens that can never admit the
    workload's longest request (as the engine checks each run), with the setting that sizes it."""
    from kvbench.core import workload
    from kvbench.scenarios.build import build_engine, kv_slots

    tokens = int(cfg.scenario.kv_cache_tokens)
    # an engine built to be asked, never run: it keeps no per-request file
    sized = OmegaConf.merge(
        cfg, {"engine": {"kv_cache_bytes": tokens * model.kv_bytes_per_token}, "measure": {"save_requests": False}}
    )
    spec = OmegaConf.to_container(sized.workload, resolve=True)
    requests = workload.generate(spec, int(cfg.seed), model.max_model_len, vocab_size=model.vocab_size)
    engine = build_engine(sized, model, kv_slots(sized, model, hardware), lambda allocator: None)
    engine.more_memory = f"raise scenario.kv_cache_tokens (now {tokens})"
    engine.check_fits(requests)


def validated_dtype(cfg: DictConfig) -> str:
    """The dtype the measured side runs in, which the profile is timed in and the simulated side
    sizes its pool with: scenario.serve.dtype and scenario.profiling.dtype, resolved (auto: fp32
    on a CPU), must agree."""
    from kvbench.scenarios.serve import resolve_dtype

    served, profiled = (
        scenario_cfg(cfg, name, cfg.scenario.get(key)).scenario
        for name, key in (("serve", "serve"), ("profile", "profiling"))
    )
    dtypes = [resolve_dtype(str(s.get("dtype", "auto")), resolve_device(str(s.device))) for s in (served, profiled)]
    if dtypes[0] != dtypes[1]:
        raise UserError(
            f"scenario.serve.dtype resolves to {dtypes[0]} and scenario.profiling.dtype to {dtypes[1]}: the profile "
            f"must time the dtype the serve runs run in; set both"
        )
    return dtypes[0]


def preflight(cfg: DictConfig) -> tuple:
    """What a run refuses before it measures anything (scenarios.run.preflight): its settings, its
    folder, a pool too small for the workload, a given profile that is missing or malformed.
    Returns check()'s (runs, load)."""
    scenario = cfg.scenario
    checked = check(scenario)
    check_serve_clock(cfg)
    refuse_replacing(scenario, ("validation.csv", "profile.csv"))
    model, hardware = load_specs(cfg)
    dtype = validated_dtype(cfg)
    refuse_a_pool_too_small(cfg, dataclasses.replace(model, dtype=dtype), hardware)
    if scenario.get("profile"):
        given = load_profile(str(scenario.profile), key="scenario.profile")
        if given.identity["dtype"] != dtype:  # else every simulated run would refuse it, after the first served one
            raise UserError(
                f"scenario.profile={scenario.profile} was measured in dtype={given.identity['dtype']}, but the serve "
                f"runs run in {dtype} (scenario.serve.dtype): profile in {dtype}, or set scenario.serve.dtype"
            )
    return checked


def run(cfg: DictConfig) -> list[dict]:
    scenario = cfg.scenario
    runs, load = preflight(cfg)
    folder = make_out_dir(scenario)
    model, hardware = load_specs(cfg)
    dtype = validated_dtype(cfg)
    model = dataclasses.replace(model, dtype=dtype)  # both sides' pool in the served dtype's bytes
    changes = {**OmegaConf.to_container(scenario.profiling, resolve=True), "out_dir": str(folder)}
    profile_cfg = scenario_cfg(cfg, "profile", OmegaConf.create(changes))
    host = ModelProbe(profile_cfg, model.max_model_len)
    probe = host.read
    quick = lambda: host.read(3)  # taken between steps, often
    every = int(scenario.get("probe_every", 200))
    window = int(scenario.get("replay_window", 101))
    probes: dict[str, list[float]] = {}  # phase -> the host's speed, on the serve runs' clock, while it ran
    profile = scenario.get("profile")
    if not profile:
        readings = probes["profile"] = [probe()]
        between = lambda i: readings.append(quick()) if i and i % PROFILE_PROBE_EVERY == 0 else None
        profile = run_profile(profile_cfg, between=between)[0]["profile"]
        readings.append(probe())
    kv_bytes = int(scenario.kv_cache_tokens) * model.kv_bytes_per_token
    base = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    base.engine.kv_cache_bytes = kv_bytes
    base.model.dtype = dtype  # the simulated side's: the profile's and the pool's
    # requests.jsonl is the measured runs' (requests.K.jsonl for run K of several); the simulations write none
    sim_cfg = OmegaConf.merge(base, {"executor": None, "measure": {"save_requests": False}})
    sim_cfg.executor = {"name": "calibrated", "profile": str(profile), "device": "local"}
    if scenario.get("profile"):  # a profile given: checked before the serve runs, not after the first
        given = load_profile(str(profile), key="scenario.profile")
        clocks = {row.get("clock") for row in given.rows} - {None, ""}
        serve_clock = str((scenario.get("serve") or {}).get("clock", "wall"))
        if clocks and clocks != {serve_clock}:  # a step on the wall clock holds other processes' time too
            raise UserError(
                f"scenario.profile={profile} was measured with clock={'/'.join(sorted(clocks))}, but the serve runs "
                f"time their steps with clock={serve_clock}: profile with scenario.profiling.clock={serve_clock}, "
                f"or set scenario.serve.clock to match"
            )
        make_executor(sim_cfg, model, hardware)
    if load is not None:  # below the rate the simulated server saturates at, so both reach steady state
        saturated, _ = simulate(OmegaConf.merge(sim_cfg, {"workload": {"rate": float("inf")}, "progress": False}))
        rate = load * float(saturated[REQUEST_RATE])
        base = OmegaConf.merge(base, {"workload": {"rate": rate}})
        sim_cfg = OmegaConf.merge(sim_cfg, {"workload": {"rate": rate}})
    serve_cfg = scenario_cfg(base, "serve", scenario.serve)
    measured, simulated, scaled, probed, logs, engines = [], [], [], [], [], []
    profiled_at = float(np.mean(probes["profile"])) if "profile" in probes else None
    for i in range(runs):
        readings = probes[f"serve {i + 1}"] = [probe()]
        read_at = [0.0]  # the serve clock of each reading: the run starts at 0
        on_probe = lambda at, readings=readings, read_at=read_at: (readings.append(quick()), read_at.append(at))
        prepare = lambda engine, on_probe=on_probe: logs.append(wrap(engine, every, on_probe))
        token = repeats.repeat.set(i + 1) if runs > 1 else None
        try:
            row, _ = serve(serve_cfg, prepare=prepare)
        finally:
            if token is not None:
                repeats.repeat.reset(token)
        readings.append(probe())
        measured.append(row)
        sim_row, sim_engine = simulate(sim_cfg)
        simulated.append(sim_row)
        engines.append(sim_engine)
        if profiled_at:  # the same simulation with every step scaled by how fast the host ran this serve run
            speed = np.mean(readings) / profiled_at
            scaled.append(simulate(OmegaConf.merge(sim_cfg, {"executor": {"time_scale": float(speed)}}))[0])
            # and by the probe's reading of the moment (each holds until the next): no model in it
            starts, ratios = np.asarray(read_at), np.asarray(readings[: len(read_at)]) / profiled_at
            replay = lambda engine, starts=starts, ratios=ratios: HostReplay(engine, starts, ratios)
            probed.append(simulate(sim_cfg, prepare=replay)[0])
    predict = engines[0].executor.predict
    # the calibrated model's time for every step each serve run timed: computed once, read by
    # the replay, the step plot, steps.csv and the bias
    predicted_by_run = [np.array([predict(*f) for f in log.features]) for log in logs]
    replayed = []  # each serve run's own slowdowns, replayed into a simulation of it
    for log, predicted in zip(logs, predicted_by_run):
        starts, ratios = replay_series(log, predicted, window)
        replay = lambda engine, starts=starts, ratios=ratios: HostReplay(engine, starts, ratios)
        replayed.append(simulate(sim_cfg, prepare=replay)[0])
    variants = {"rel_error_host_replayed": replayed}
    if scaled:
        variants = {"rel_error_at_host_speed": scaled, "rel_error_host_probed": probed, **variants}
    rows = table(measured, simulated, variants)
    predicted = predicted_by_run[0]
    step_err = step_plot(logs[0].recorder.step_dt, predicted, engines[0], folder / "step_time.png")
    write_steps(folder / "steps.csv", logs[0], predicted)
    bias = step_bias(logs[0].features, logs[0].recorder.step_dt, predicted)
    rate = float(base.workload.rate)
    every_reading = [v for readings in probes.values() for v in readings]
    # as a calibrated run's console says it (reporting.console.layout_note, a layer above this one)
    profiled, kept = simulated[0].get("executor_profile_layout"), simulated[0].get("kv_layout")
    layouts = (
        f"; NOTE the profile's steps were timed with the {profiled} KV layout and the served allocator keeps the "
        f"{kept} one (a paged gather is not a contiguous read): profile with this allocator to validate its own"
        if profiled and kept and profiled != kept
        else ""
    )
    head = (
        f"Calibrated simulator vs serve: model {model.name}, allocator {plugin_cfg(cfg, 'allocator')['name']}, "
        f"{simulated[0]['completed']} {base.workload.kind} requests at {rate:.3g} req/s, seed {cfg.seed}, "
        f"serve clock {measured[0]['clock']}; profile {profile} "
        f"(sha256 {simulated[0]['executor_profile_sha256'][:12]}); "
        f"median per-step error on run 1's batches {100 * step_err:.1f}%, signed "
        + ", ".join(f"{name} {100 * value:+.1f}%" for name, value in bias.items())
        + ". Host speed probe (a decode step of 4 sequences on a model of its own, ms on that clock; "
        "median [min-max] of the readings "
        "taken while each phase ran): "
        + ", ".join(
            f"{name} {1e3 * np.median(v):.2f} [{1e3 * min(v):.2f}-{1e3 * max(v):.2f}] ({len(v)})"
            for name, v in probes.items()
        )
        + f"; the host's drift (max - min) / mean over all readings: {_percent(spread(every_reading), 'one reading')}"
        + layouts
    )
    write_csv(folder / "validation.csv", rows)
    write_atomic(folder / "validation.md", markdown(rows, head))
    common = {
        "rate": rate,
        "profile": str(profile),
        "executor_profile_sha256": simulated[0]["executor_profile_sha256"],
        "executor_profile_layout": profiled or "",
        "kv_layout": kept or "",
        "step_err_median": step_err,
        **{f"step_bias_{name.split(' (')[0].replace(' ', '_').replace('-', '_')}": v for name, v in bias.items()},
        "clock": measured[0]["clock"],
        "host_drift": spread(every_reading),
        "host_probe_ms": " ".join(f"{1e3 * np.median(v):.3f}" for v in probes.values()),  # each phase's median
    }
    return [{**common, **row} for row in rows]


def wrap(engine, probe_every: int | None = None, on_probe=None) -> FeatureLog:
    """Put a FeatureLog around the engine's executor, and read the measured steps from its
    recorder; call `on_probe(clock)` after every `probe_every` steps, once the step has been timed."""
    log = FeatureLog(engine.executor)
    if on_probe is not None:
        recorder, on_step = engine.recorder, engine.recorder.on_step

        def on_step_then_probe(*args):
            on_step(*args)
            if len(recorder.step_dt) % probe_every == 0:
                on_probe(recorder.step_end[-1])

        recorder.on_step = on_step_then_probe
    engine.executor = log
    log.recorder = engine.recorder
    return log
