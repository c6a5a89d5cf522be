"""Bad input, hundreds of ways: each is refused with exit code 2, one stderr line naming the key or file, no traceback.

Most cases come from the schemas: for every field of every group (each option's model), values
of the wrong type, NaN / inf, below and above the range, and a misspelled key. They are parsed
by Hydra's own override parser and applied the way Hydra applies an override, on a config
composed once per group option, then checked and reported through kvbench's one error path.
The hand-written cases (compose errors, cross-field rules, memory estimates, trace / policy /
baseline files) run the commands' main functions in-process; test_cli.py proves the console
entry point with subprocesses.
"""

from __future__ import annotations

import functools
import typing
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import open_dict

from kvbench import cli, schema
from kvbench.errors import exit_with
from kvbench.reporting import compare, report
from kvbench.schema import groups
from kvbench.schema.docs import allows_inf, constraints, fields
from kvbench.schema.hydra_errors import hydra_line

from helpers.cli import in_process, refused

TRACE = "TRACE_CSV"  # replaced by a real trace file's path (fixture `files`)

# group option -> the overrides that choose it, and the model that checks it
OPTIONS = [
    ("", [], groups.Root),
    ("model", [], groups.Model),
    ("hardware", [], groups.Hardware),
    ("workload", [], groups.DatasetWorkload),
    ("workload", ["workload=alpaca"], groups.DatasetWorkload),
    ("workload", ["workload=fixed"], groups.FixedWorkload),
    ("workload", ["workload=uniform"], groups.UniformWorkload),
    ("workload", ["workload=trace", f"workload.path={TRACE}"], groups.TraceWorkload),
    ("scenario", ["scenario=serve", "model=tiny"], groups.Serve),
    ("scenario", ["scenario=kernel", "model=tiny"], groups.Kernel),
    ("allocator", ["+allocator=paged"], groups.PagedAllocator),
    ("allocator", ["+allocator=pow2"], groups.ReservingAllocator),
    ("allocator", ["+allocator=hybrid", "model=tiny-gemma3"], groups.HybridAllocator),
    ("graph", ["+graph=full"], groups.Graph),
]
CHOICE_KEYS = {"workload.kind", "scenario.name", "allocator.name", "backend.name", "graph.name"}


def _base_type(annotation):
    """(type, optional) with Annotated / Optional stripped."""
    optional = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin is typing.Union:
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            optional, annotation = True, args[0]
        else:
            return annotation, optional


def _bounds(field) -> dict:
    found = {}
    for meta in constraints(field):
        for name in ("gt", "ge", "lt", "le"):
            if getattr(meta, name, None) is not None:
                found[name] = getattr(meta, name)
    return found


def bad_values(field) -> list[str]:
    """Override values the field must refuse, as typed on a command line."""
    kind, optional = _base_type(field.annotation)
    if kind is bool:
        return ["maybe", "yes", "1", "0"] + ([] if optional else ["null"])
    if typing.get_origin(kind) is typing.Literal:
        return ["bogus", "3", "true"]
    if typing.get_origin(kind) is list:
        return ["fast", "[bogus]", "[-1]"] if field.annotation is not list else []
    if kind is str:
        return ["[1,2]"] + ([] if optional else ["null"])
    values = ["fast", "true", "nan", "-inf"]
    if not allows_inf(field):
        values.append("inf")
    bounds = _bounds(field)
    if "ge" in bounds:
        values.append(repr(bounds["ge"] - 1) if kind is int else repr(bounds["ge"] - max(1.0, abs(bounds["ge"]))))
    if "gt" in bounds:
        values.append(repr(bounds["gt"]) if bounds["gt"] != 0 else "0")
    if "le" in bounds:
        values.append(repr(bounds["le"] * 10 + 10))
    if "lt" in bounds:
        values.append(repr(bounds["lt"]))
    if kind is int:
        values.append("1.5")
    return values


def schema_cases():
    seen = set()
    for group, base, model in OPTIONS:
        keys = [key for key, _ in fields(group, model)]
        for key, field in fields(group, model):
            if key in CHOICE_KEYS or key == "workload.path":
                continue
            for value in bad_values(field):
                if (key, value, tuple(base)) not in seen:
                    seen.add((key, value, tuple(base)))
                    yield pytest.param(base, f"{key}={value}", key, id=f"{'+'.join(base) or 'default'}:{key}={value}")
            typo = key[:-1] if len(key.rsplit(".", 1)[-1]) > 3 else key + "x"
            if sum(other.startswith(typo) for other in keys) > 1:  # fig1 is as near fig12 as fig13
                typo = key + "x"
            yield pytest.param(base, f"+{typo}=1", key, id=f"{'+'.join(base) or 'default'}:+{typo}")


SCHEMA_CASES = list(schema_cases())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "trace.csv").write_text("input_len,output_len\n10,20\n30,40\n")
    return folder


@functools.cache
def composed(base: tuple):
    GlobalHydra.instance().clear()
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        return compose("bench", overrides=list(base))


def check_override(base: list[str], override: str) -> None:
    """Hydra parses the override and applies it as at compose time; the schema judges the result."""
    cfg = composed(tuple(base)).copy()
    with open_dict(cfg):
        ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides([override]), cfg)
    try:
        schema.validate(cfg)
    except Exception as err:
        exit_with(err)
    raise AssertionError(f"{override} was accepted")


def with_files(args, files) -> list[str]:
    return [a.replace(TRACE, str(files / "trace.csv")).replace("FILES", str(files)) for a in args]


@pytest.mark.parametrize("base, override, key", SCHEMA_CASES)
def test_a_schema_refuses_the_value_and_names_the_key(base, override, key, files):
    line = refused(lambda: check_override(with_files(base, files), with_files([override], files)[0]))
    assert line.startswith(f"error: {key}=") or f"did you mean {key}?" in line  # the key, then its value


# --- compose errors: Hydra's, in kvbench's words -------------------------------------------------

COMPOSE_CASES = [
    (["model=gpt-9"], "unknown model 'gpt-9'; known: gemma-3-like"),
    (["hardware=tpu"], "unknown hardware 'tpu'; known: a100-40gb"),
    (["workload=bogus"], "unknown workload 'bogus'"),
    (["scenario=bench"], "unknown scenario 'bench'"),
    (["+allocator=bogus"], "unknown allocator 'bogus'; known: contiguous"),
    (["+allocator=page"], "did you mean paged?"),
    (["+backend=triton"], "unknown backend 'triton'"),
    (["+graph=cuda"], "unknown graph 'cuda'"),
    (["workload.rat=4"], "workload.rat is not a key of workload; did you mean workload.rate?"),
    (["seeed=1"], "seeed is not a key of the config; did you mean seed?"),
    # a section's key without its section: the list of top-level keys did not say where it lives
    (["prefix_caching=maybe"], "prefix_caching is not a key of the config; did you mean allocator.prefix_caching?"),
    (["rate=2"], "did you mean scenario.rate or workload.rate?"),
    (["foo.bar=1"], "foo is not a key of the config (its keys: seed, "),
    (["worklod.rate=1"], "worklod is not a key of the config; did you mean workload?"),
    (["goodput.ttft_ms=-1"], "goodput is not a section of the config; did you mean report.goodput.ttft_ms?"),
    (["+goodput.ttft_ms=1"], "goodput is not a section of the config; did you mean report.goodput?"),
    (["scheduler.max_num_seq=4"], "did you mean scheduler.max_num_seqs?"),
    (["allocator.block_size=32"], "no allocator is chosen: add +allocator=NAME first"),
    (["allocator=paged"], "allocator has no default to change: add the group with a + (+allocator=paged)"),
    (["experiment=fig2"], "experiment has no default to change: add the group with a + (+experiment=fig2)"),
    (["workload.rate=range(1"], "cannot parse the override 'workload.rate=range(1'"),
    (["workload.rate=1,2"], "add -m to sweep over them"),
    (["+workload.rate=3"], "workload.rate is already in the config"),
    (["~workload.nope"], "workload.nope"),
    (["workload.rate=[1"], "cannot parse the override"),
    # the parser's words, not its grammar's token names (ID, ESC, WS, ...)
    (["+allocator=paged,"], "'+allocator=paged,': it ends where a value was expected; overrides are key=value"),
    (["workload.rate=1,,2"], "'workload.rate=1,,2': unexpected ','; overrides are"),
    (["workload.rate='abc"], "a quote left open, or a character the grammar does not allow"),
    (["workload.rate=${nope}"], "Interpolation key 'nope' not found"),
    (["workload.rate=${hardware.nope}"], "nope"),
    (  # it said "Interpolation key 'fig14_15.knobs.beams.n' not found"
        ["+experiment=fig14_15", "fig14_15.sharing=beams"],
        "workload.n reads fig14_15.knobs.beams.n, but fig14_15.knobs has no 'beams': its keys are parallel, beam",
    ),
    (["+experiment=fig12", "fig12.point=r11"], "but fig12.rates.sharegpt has no 'r11': its keys are r1, r2, r3"),
    (
        ["model.window=8"],
        "model.window is a model key that this model config does not set: add it with +model.window=8",
    ),
    # a key of other options of the group: which have it, not a + that the schema would refuse
    (
        ["workload.input_len=10"],
        "workload.input_len is not a key of the chosen workload; workload=fixed and workload=uniform have "
        "it: e.g. workload=fixed workload.input_len=10",
    ),
    (["workload=fixed", "workload.range_ratio=0.2"], "workload=uniform has it: e.g. workload=uniform workload."),
    (["workload.shuffle=true"], "workload=trace has it: e.g. workload=trace workload.shuffle=true"),
    (["scenario.num_requests=3"], "scenario=serve has it: e.g. scenario=serve scenario.num_requests=3"),
    (["executor.profile=p.csv"], "executor=calibrated has it: e.g. executor=calibrated executor.profile=p.csv"),
    # a rate in the wrong unit (TFLOP/s for FLOP/s) simulated steps of days and reported them
    (
        ["hardware.peak_flops=312"],
        "hardware.peak_flops=312 must be >= 1e+09 (dense peak at the model's dtype in FLOP/s, e.g. 312e12)",
    ),
    (["hardware.hbm_bytes_per_s=1.5"], "hardware.hbm_bytes_per_s=1.5 must be >= 1e+09 (device memory bandwidth in"),
    # a key inside a table only some options have (it said `not a key of scenario; did you mean
    # scenario.profiling.rep_ms?`, listing every scenario's keys)
    (
        ["scenario=profile", "scenario.profiling.repeats=2"],
        "scenario.profiling is not a key of the chosen scenario; scenario=validate has it: e.g. "
        "scenario=validate +scenario.profiling.repeats=2",
    ),
    (
        ["scenario=validate", "scenario.profiling.repeats=2"],
        "scenario.profiling.repeats is a scenario.profiling key that this config does not set: add it with "
        "+scenario.profiling.repeats=2",
    ),
    (
        ["scenario=validate", "scenario.profiling.repeatz=2"],
        "scenario.profiling.repeatz is not a key of scenario.profiling; did you mean scenario.profiling.repeats? "
        "(its keys: device,",
    ),
    # an experiment's settings: its own keys, or none (fig2's keys were `did you mean fig12?`)
    (["+experiment=fig2", "fig2.nope=1"], "fig2.nope: +experiment=fig2 has no settings of its own"),
    (
        ["+experiment=fig12", "fig12.nope=1"],
        "fig12.nope is not a key of +experiment=fig12's settings (its keys: point, rates, duration_s)",
    ),
    (["fig12.point=r2"], "fig12.point is a setting of +experiment=fig12: choose the experiment too"),
    # a plugin's key the chosen plugin lacks (it said no allocator was chosen)
    (
        ["+allocator=contiguous", "allocator.prefix_caching=true"],
        "allocator.prefix_caching is not a key of the chosen allocator; allocator=paged and allocator=hybrid "
        "have it: e.g. +allocator=paged allocator.prefix_caching=true",
    ),
    (["allocator.prefix_caching=true"], "no allocator is chosen: add +allocator=NAME first"),
    (
        ["fig12=5"],
        "fig12 is the table of +experiment=fig12's settings: choose the experiment",
    ),  # was: did you mean fig12?
]


@pytest.mark.parametrize("args, message", COMPOSE_CASES, ids=[" ".join(a) for a, _ in COMPOSE_CASES])
def test_a_compose_error_is_one_line(args, message):
    def run():
        try:
            schema.validate(compose_fresh(args))
        except Exception as err:
            line = hydra_line(err)
            exit_with(Exception(line) if line else err)

    assert message in refused(run)


def compose_fresh(args):
    GlobalHydra.instance().clear()
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        return compose("bench", overrides=args)


# --- rules across fields, memory estimates, batch specs, traces (schema over a composed config) ---

CROSS_CASES = [
    (["workload.n=2", "workload.beam_width=2"], "n and beam_width cannot both be > 1"),
    (["workload.num_requests=null", "workload.duration_s=null"], "set num_requests or duration_s: one of them"),
    (["workload.rate=inf"], "rate=inf sends every request at t=0, so duration_s cannot bound them: set num_requests"),
    (["model.num_kv_heads=3"], "model.num_heads=40 must be a multiple of num_kv_heads=3"),
    (["+model.layer_pattern=[window,full]"], "model.window=0 must be > 0 for window layers"),
    (["+model.layer_pattern=[linear,full]"], "model.linear_state_dim=0 must be > 0 for linear layers"),
    (["+model.num_active_params=1e12"], "num_active_params=1e+12 must be <= num_params"),
    (["workload.prefix_len=2048"], "workload.prefix_len=2048 must be shorter than max_model_len=2048"),
    (["scenario=serve"], "scenario=serve with model=opt-13b would allocate about"),
    (["scenario=serve", "model=tiny", "engine.kv_cache_bytes=1e15"], "KV cache 1e+06 GB"),
    (["scenario=serve", "model=tiny", "scenario.kv_cache_tokens=1e10", "model.num_layers=64"], "would allocate"),
    (["scenario=kernel", "model=tiny", "batch=100000000d1k"], "scenario=kernel with model=tiny would allocate"),
    # a traceback from torch after 23 s: the eager reference's scores of one 100,000-token prompt
    (["scenario=kernel", "model=tiny", "batch=2p100000"], "(queries 0.102 GB, eager attention scores 480 GB)"),
    # it drew 10^8 requests (2.4 GB and growing): its estimate counted the workload's 4 req/s x 900 s
    (["scenario=serve", "model=tiny", "scenario.num_requests=100000000"], "would allocate about"),
    (["scenario=kernel", "model=llama-3-70b", "batch=1000000d8k"], "would allocate"),
    (["workload.num_requests=100000000"], "would allocate"),
    # a MemoryError traceback building the swap pool's free list: 10^15 bytes of blocks of one token
    (
        ["engine.preemption=swap", "engine.swap_space_bytes=1e15", "+allocator=paged", "allocator.block_size=1"],
        "(swap pool bookkeeping 78.1 GB)",
    ),
    # it ran: 13 parameters left the whole GPU to the KV pool (47,184 slots, not 15,808), 1.40 req/s, not 0.48
    # it said "allocator.block_size=16 must be a whole number"
    (["+allocator=paged", "allocator.block_size=16.0000000001"], "allocator.block_size=16.0000000001 must be a whole"),
    (["model.num_params=13"], "model.num_params=13 is below a tenth of the 4.45e+09 parameters its embeddings"),
    # a pool thousands of times the simulated GPU's memory ran, and its numbers meant nothing
    (["engine.kv_cache_bytes=1e14"], "engine.kv_cache_bytes=1e+14 is more than hardware=a100-40gb holds beside"),
    # the scenarios that build a real model: the host would run out of memory part-way
    (["scenario=profile"], "scenario=profile with model=opt-13b would allocate about"),
    (["scenario=profile", "model=llama-3-8b", "scenario.kv_cache_tokens=16"], "weights (fp32) 35.3 GB"),
    (["scenario=validate"], "scenario=validate with model=opt-13b would allocate about"),
    # what the real model or the kernel could not build: tracebacks part-way into the run
    (["scenario=serve", "model=tiny", "model.head_dim=15"], "model.head_dim=15 must be even for scenario=serve"),
    (
        [
            "scenario=serve",
            "model=tiny",
            "+model.layer_pattern=[linear]",
            "+model.linear_state_dim=16",
            "+allocator=hybrid",
        ],
        "model.layer_pattern=[linear] gives the model's 2 layer(s) no attention layer",
    ),
    # simulated: a ZeroDivisionError in the memory check (a pool of 0 bytes a token)
    (["+allocator=hybrid", "model=tiny-qwen3-next", "model.layer_pattern=[linear]"], "no attention layer"),
    # [linear,linear,linear,full] over 3 layers has no full one: a ZeroDivisionError in serve's pool
    (["scenario=serve", "model=tiny-qwen3-next", "model.num_layers=3"], "gives the model's 3 layer(s) no attention"),
    (["scenario=kernel", "model=tiny-gemma3", "+allocator=hybrid"], "allocator=hybrid keeps a pool per layer kind"),
    # it hung (capture_sizes=[1000000]) or padded every step of 4 tokens to 8192
    (["scenario=serve", "model=tiny", "+graph=piecewise", "graph.capture_sizes=[8192]"], "must stay <= scheduler.max"),
    # validate's changes to its serve and profile runs, checked as those scenarios check them
    (
        ["scenario=validate", "model=tiny", "+scenario.serve.bogus=1"],
        "scenario.serve.bogus is not a key of scenario.serve",
    ),
    (["scenario=validate", "model=tiny", "+scenario.serve.dtype=fp64"], "scenario.serve.dtype=fp64 must be 'auto'"),
    (["scenario=validate", "model=tiny", "+scenario.profiling.repeats=0"], "scenario.profiling.repeats=0 must be >= 1"),
    (["scenario=validate", "model=tiny", "scenario.serve.clock=bogus"], "scenario.serve.clock=bogus must be 'wall' or"),
    (["batch=0d1k"], "batch=0d1k"),
    (["batch=4x1k"], "bad part '4x1k'"),
    (["batch=4d1k:w0"], "bad window"),
    (["batch=4d1k:"], "bad window"),
    (["batch=4d1k++2p512"], "bad part ''"),
    (["batch=-1d1k"], "bad part '-1d1k'"),
    (["+allocator=paged", "allocator.name=nope"], "allocator.name=nope: unknown allocator 'nope'"),
    (["+backend=eager", "backend.name=nope"], "backend.name=nope: unknown backend"),
    (["scenario.name=bogus"], "scenario.name=bogus must be one of simulate, serve, kernel"),
    (["workload.kind=bogus"], "workload.kind=bogus must be one of"),
    (["workload.kind=fixed"], "workload.input_len is required"),
    (["+graph=full", "graph.capture_sizes=[4,2]"], "increasing order"),
    (["+graph=full", "graph.capture_sizes=[]"], "increasing order"),
    (["+graph=eager", "+graph.capture_sizes=[0]"], "graph.capture_sizes=0 must be >= 1"),
    (["+allocator=hybrid", "allocator.policy=mixed"], "allocator.policy=mixed must be"),
    (["workload=trace"], "workload.path=???: is required"),
    (["workload=trace", "workload.path=FILES/missing.csv"], "missing.csv does not exist"),
    (["workload=trace", "workload.path=FILES"], "is a directory, not a CSV file"),
    (["workload=trace", "workload.path=FILES/binary.csv/"], "binary.csv/ names a file as a folder"),
    (["workload=trace", "workload.path=/dev/null"], "/dev/null is not a regular file"),
    (["workload=trace", "workload.path=FILES/binary.csv"], "binary.csv is not UTF-8 text"),
]


@pytest.mark.parametrize("args, message", CROSS_CASES, ids=[" ".join(a) for a, _ in CROSS_CASES])
def test_a_rule_across_fields_or_files_is_one_line(args, message, files):
    (files / "binary.csv").write_bytes(b"\xff\xfe\x00garbage")
    (files / "blanks.csv").write_text("garbage,,,\n")

    def run():
        try:
            schema.validate(compose_fresh(with_files(args, files)))
        except Exception as err:
            exit_with(err)
        raise AssertionError(f"{args} accepted")

    assert message in refused(run)


# --- the bench command in-process: errors found while running (traces, the KV pool, the batch) ----

FAST = ["progress=false", "hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]
RUN_CASES = [
    # 3 GPUs split opt-13b's 40 heads unevenly, and 100,000 (the schema's most) took 19 GB to simulate
    (["hardware.num_gpus=3"], "hardware.num_gpus=3 is a tensor-parallel degree, and it does not divide model=opt-13b"),
    # it suggested 16, a divisor of the 64 heads that the 8 K/V heads then refused
    (
        ["model=llama-3-70b", "hardware=h100-sxm", "hardware.num_gpus=3"],
        "64 attention heads among its GPUs; give one that does: 1, 2, 4, 8",
    ),
    (
        ["hardware.num_gpus=100000"],
        "divide model=opt-13b's 40 attention heads among its GPUs; give one that does: 1, 2",
    ),
    # 16 GPUs divide llama-3-70b's 64 heads, not its 8 K/V heads: vLLM copies each onto two GPUs
    (
        ["model=llama-3-70b", "hardware=h100-sxm", "hardware.num_gpus=16"],
        "does not divide model=llama-3-70b's 8 K/V heads among its GPUs (more GPUs than K/V heads would copy "
        "each one: not modelled); give one that does: 1, 2, 4, 8",
    ),
    # a traceback: AttributeError ('str' object has no attribute 'get'), TypeError (unhashable type: 'list')
    (["report=5"], "report=5 must be a section: set its keys, report.KEY=VALUE"),
    # wrote the run's files into the current folder; a multi-line warning, then the run
    (["hydra.run.dir="], "hydra.run.dir is empty: give a folder"),
    (["hydra.searchpath=[file:///nonexistent]"], "hydra.searchpath names file:///nonexistent, which is no folder"),
    (["hydra.searchpath=[pkg://no_such_pkg.conf]"], "but no installed package has no_such_pkg.conf"),
    # refused after 11 s of measuring, the profile lost
    (
        ["scenario=profile", "model=tiny", "scenario.out_dir=FILES/empty.csv"],
        "empty.csv cannot be written: ",
    ),
    # two lines: Hydra's "Error executing job with overrides: [...]", then one naming no key
    (["seed=${nope}"], "seed=${nope}: Interpolation key 'nope' not found"),
    (["seed=${seed}"], "seed=${seed}: Recursive interpolation detected"),
    # gemma-3-like's window layers ran in a row that said opt-13b
    (["model=[gemma-3-like,opt-13b]"], "model=[gemma-3-like,opt-13b] lists several options of the model group"),
    (["workload.kind=[1]"], "workload.kind=[1] must be one of sharegpt, alpaca"),
    (["executor.name={a:1}"], 'executor.name={"a": 1} must be one of roofline, calibrated'),
    (["workload=trace", "workload.path=FILES/empty.csv"], "empty.csv: header must have input_len,output_len"),
    (["workload=trace", "workload.path=FILES/header.csv"], "header.csv has no rows"),
    (["workload=trace", "workload.path=FILES/words.csv"], "words.csv line 2"),
    (["workload=trace", "workload.path=FILES/negative.csv"], "negative.csv line 2: lengths must be >= 1"),
    (["workload=trace", "workload.path=FILES/nan.csv"], "nan.csv line 2"),
    (["workload=trace", "workload.path=FILES/long.csv"], "more than max_model_len=2048"),
    (["workload=fixed", "workload.input_len=2000", "workload.output_len=100"], "more than max_model_len=2048"),
    # it ran, with duration_s=inf and a request throughput of 0
    (["workload=trace", "workload.path=FILES/far.csv"], "its arrival times span 1e+300 s, more than 1e+09 s"),
    (
        ["workload=trace", "workload.path="],
        "workload.path=: is required: workload.path=FILE.csv",
    ),  # it said "is a directory"
    # one of two columns for a length was read, silently
    (["workload=trace", "workload.path=FILES/twice.csv"], "the header has input_len twice, two columns for input_len"),
    (["workload=trace", "workload.path=FILES/alias.csv"], "the header has input_len and prompt_len"),
    (["workload=trace", "workload.path=FILES/wide.csv"], "wide.csv line 2: field larger than field limit"),
    # no Poisson arrival within duration_s: an IndexError
    (["workload=trace", "workload.path=FILES/three.csv", "workload.duration_s=0.0001"], "the workload has no requests"),
    (  # it said max_model_len=8
        ["workload=trace", "workload.path=FILES/three.csv", "workload.prefix_len=2040"],
        "every row has more than max_model_len=2048 less workload.prefix_len=2040: 8 tokens",
    ),
    (["+allocator=contiguous", "engine.kv_cache_bytes=1e8", "workload.num_requests=5"], "smaller than one request"),
    (["scheduler.max_num_batched_tokens=10", "workload.num_requests=5"], "exceeds scheduler.max_num_batched_tokens=10"),
    (["profile=true", "workload.num_requests=5"], "profile=true traces torch operators"),
    (["+backend=flashinfer", "workload.num_requests=5"], "executor=roofline does not model backend=flashinfer"),
    (["+graph=full", "+backend=triton_paged"], "does not model backend=triton_paged or graph=full"),
    (["engine.async_scheduling=true"], "engine.async_scheduling=true is measured by scenario=serve"),
    (["report.paper=fig2"], "report.paper=fig2 compares a sweep with the paper when the sweep ends"),
    # "run +experiment=fig2 (the paper's sweep), or add -m", to one who had
    (["+experiment=fig2", "hydra.mode=RUN", "hydra.run.dir=FILES/r"], "and this is one run: drop hydra.mode=RUN"),
    (["batch=4d1k"], "batch is read by scenario=kernel only; scenario=simulate would ignore it"),
    (["scenario=serve", "model=tiny", "executor=calibrated"], "executor is read by scenario=simulate only"),
    (["scenario=kernel", "model=tiny", "workload.rate=9"], "workload.rate is read by scenario=simulate or serve"),
    (["scenario=kernel", "model=tiny", "+graph=full"], "graph=full wraps the model's forward (scenario=serve, "),
    (["scenario=profile", "model=tiny", "hardware=h200"], "hardware is read by scenario=simulate or serve or kernel"),
    (["scenario=kernel", "model=tiny", "scheduler.max_num_seqs=4"], "scheduler.max_num_seqs is read by scenario="),
    (["scenario=kernel", "model=tiny", "engine.preemption=swap"], "scenario=kernel would ignore it"),
    (["scenario=profile", "model=tiny", "measure.warmup_frac=0.5"], "scenario=profile would ignore it"),
    (["scenario=kernel", "model=tiny", "report.goodput.ttft_ms=100"], "report.goodput.ttft_ms is read by scenario="),
    (
        ["workload=trace", "workload.path=FILES/timed.csv", "workload.rate=9"],
        "workload.rate is not read: the trace",
    ),
    (  # serve's rate replaced the workload's, but a timed trace's requests arrived at its times
        ["scenario=serve", "model=tiny", "workload=trace", "workload.path=FILES/timed.csv", "scenario.rate=5"],
        "scenario.rate is not read: the trace",
    ),
    (["workload=trace", "workload.path=FILES/timed.csv", "workload.num_requests=10"], "has only 2 rows that fit"),
    (["workload.rate=inf", "workload.num_requests=5", "workload.burstiness=0.5"], "workload.burstiness is not read"),
    (["workload.path=FILES/timed.csv"], "is read by workload=trace only; workload=sharegpt would ignore it"),
    (["+workload.shuffle=true"], "workload.shuffle=true is read by workload=trace only"),
    (["+workload.input_len=10"], "not a key of workload=sharegpt; workload=fixed and workload=uniform have it"),
    (["+fig12.point=r2"], "fig12.point is a setting of +experiment=fig12, which this run does not choose"),
    (["+allocator=contiguous", "+allocator.prefix_caching=true"], "not a key of allocator=contiguous; allocator=paged"),
    # pydantic's words were "a valid dictionary or instance of Sampling", "a valid list"
    (
        ["scenario=serve", "model=tiny", "scenario.sampling=nope"],
        "scenario.sampling=nope must be a section: set its keys, scenario.sampling.KEY=VALUE (its keys: "
        "temperature, top_p)",
    ),
    (
        ["scenario=serve", "model=tiny", "scenario.cpu_affinity=99"],
        "scenario.cpu_affinity=99 must be a list: write [a,b]",
    ),
    # its fit had only prefill steps, and decode steps were timed from them, without a word
    (["scenario=profile", "model=tiny", "scenario.decode_batch=[]"], "scenario.decode_batch=[] must list at least 1"),
    (["report.goodput=5"], "report.goodput=5 must be a section: set its keys, report.goodput.KEY=VALUE"),
    (["model.name=-5"], "model.name=-5 must be text (a name)"),
    (  # it recomputed, and the row said swap
        ["+allocator=contiguous", "engine.preemption=swap", "workload.num_requests=5"],
        "engine.preemption=swap: contiguous cannot swap a request out, so its preemptions would recompute; "
        "allocators that swap: paged",
    ),
    (["workload.n=4", "scheduler.max_num_seqs=2", "workload.num_requests=5"], "scheduler.max_num_seqs=2"),
    (
        ["-m", "workload.rate=fast,2", "workload.num_requests=5", "hydra.sweep.dir=FILES/sweep-a"],
        "point workload.rate=fast,workload.num_requests=5,progress=False would fail: workload.rate=fast must be a "
        "number; no point has run",
    ),
    (
        ["-m", "workload.rate=-1,0", "workload.num_requests=5", "hydra.sweep.dir=FILES/sweep-b"],
        "point workload.rate=-1,workload.num_requests=5,progress=False would fail: workload.rate=-1 must be > 0",
    ),
    (  # valid configs that each fail as they run: recorded, then said
        ["-m", "scheduler.max_num_batched_tokens=8,9", "workload.num_requests=5", "hydra.sweep.dir=FILES/sweep-f"],
        "every point of the sweep failed; the first",
    ),
    (["hydra.run.dir=FILES/trace.csv/run"], "trace.csv"),
    (["hydra.run.dir=/proc/kvbench-run"], "/proc/kvbench-run"),
    (["--cfg", "bogus"], "bench: argument --cfg/-c: invalid choice: 'bogus'"),
    (["--bogus-flag"], "bench: unrecognized arguments: --bogus-flag"),
    (["hydra/launcher=submitit_slurm"], "unknown hydra/launcher 'submitit_slurm'"),
    # Hydra's own settings were blamed on kvbench's config ("hydra is not a key of the config")
    (["hydra.launcher.n_jobs=2"], "hydra.launcher.n_jobs is not a setting of Hydra's config"),
    (["hydra.run.foo=1"], "bench --cfg hydra -p hydra.run lists those it has"),
    (["~model"], "model is required: choose one with model=NAME"),
    # these ended in a traceback: a KeyError where the run read the key, Hydra's ValueError
    (["~workload.rate"], "~workload.rate deletes a key every run reads: set it instead (workload.rate=VALUE)"),
    (["~measure"], "~measure deletes a section every run reads: set its keys instead (measure.KEY=VALUE)"),
    (["=5"], "an override has no key (=VALUE): write KEY=VALUE"),
    # it said "allocator.watermark is not a key of allocator=contiguous", a key the preset set
    (["+preset=vllm", "+allocator=contiguous"], "+preset=vllm configures vLLM's paged allocator"),
    # settings that the run recorded as its columns but never read
    (["+model.window=128", "workload.num_requests=5"], "model.window is read by window layers only, and model=opt-13b"),
    (["+model.linear_state_dim=16"], "model.linear_state_dim is read by linear layers only"),
    (
        ["model=gemma-3-like", "hardware=h200", "model.window=100000000"],
        "model.window=100000000 must be <= max_model_len",
    ),
    (["repeats=3", "workload.num_requests=5"], "repeats is read by scenario=serve or kernel only"),
    (["report.baseline=paged", "workload.num_requests=5"], "report.baseline=paged is read when a sweep ends"),
    (["report.slo_s_per_token=0.2"], "report.slo_s_per_token=0.2 is read when a sweep ends"),
    # a third look: recorded as columns of runs that did not read them
    (
        ["scenario=validate", "model=tiny", "scenario.serve.rate=50"],
        "scenario.serve.rate would serve another workload than the one simulated",
    ),
    (["scenario=validate", "model=tiny", "scenario.serve.num_requests=2"], "scenario.serve.num_requests would serve"),
    (  # a key of a section validate's changes leave unset: its own keys, and how to add it
        ["scenario=validate", "model=tiny", "scenario.serve.sampling.temperature=1"],
        "scenario.serve.sampling.temperature is a scenario.serve.sampling key that this config does not set: "
        "add it with +scenario.serve.sampling.temperature=1",
    ),
    (
        ["scenario=validate", "model=tiny", "+scenario.serve.sampling.bogus=1"],
        "scenario.serve.sampling.bogus is not a key of scenario.serve.sampling (its keys: temperature, top_p)",
    ),
    (
        ["scenario=validate", "model=tiny", "+scenario.serve.kv_cache_tokens=1"],
        "scenario.serve.kv_cache_tokens is not read: validate sizes both sides' pool by scenario.kv_cache_tokens",
    ),
    (
        ["scenario=validate", "model=tiny", "+scenario.serve.swap_space_tokens=5"],
        "scenario.serve.swap_space_tokens is read only with engine.preemption=swap",
    ),
    (
        ["scenario=serve", "model=tiny", "engine.kv_cache_bytes=1e6", "scenario.kv_cache_tokens=100"],
        "scenario.kv_cache_tokens is not read: engine.kv_cache_bytes=1e+06 sizes the pool, and wins",
    ),
    (
        ["scenario=validate", "model=tiny", "engine.kv_cache_bytes=1e4"],
        "scenario=validate would ignore it: it sizes both sides' pool by scenario.kv_cache_tokens: set that",
    ),
    (["scenario=profile", "model=tiny", "engine.kv_cache_bytes=1e4"], "scenario=profile would ignore it: drop it"),
    (["scenario=profile", "model=tiny", "engine.async_scheduling=true"], "scenario=profile would ignore it"),
    (
        ["scenario=serve", "model=tiny", "model.dtype=bf16"],
        "model.dtype is read by scenario=simulate or kernel only; scenario=serve would ignore it: its real model "
        "runs in scenario.dtype: set that",
    ),
    (
        ["scenario=serve", "model=tiny", "workload.beam_width=4", "scenario.sampling.temperature=5"],
        "scenario.sampling.temperature is not read with workload.beam_width=4",
    ),
    (
        ["scenario=serve", "model=tiny", "scenario.sampling.top_p=0.1"],
        "scenario.sampling.top_p is read only with scenario.sampling.temperature > 0",
    ),
    (
        ["scenario=kernel", "model=tiny", "scenario.device=cpu", "scenario.rep_ms=500"],
        "scenario.rep_ms is read on cuda only (do_bench, the GPU's roofline); this kernel runs on cpu",
    ),
    (["scenario=kernel", "model=tiny", "scenario.device=cpu", "hardware=h200"], "hardware is read on cuda only"),
    (
        ["executor=calibrated", "executor.profile=FILES/trace.csv", "hardware.step_overhead_s=1"],
        "hardware.step_overhead_s is read by executor=roofline only",
    ),
    (
        ["engine.kv_cache_bytes=1.5e10", "hardware.gpu_memory_utilization=0.3"],
        "hardware.gpu_memory_utilization is not read: it sizes the simulated KV pool from the GPU's memory, and "
        "this run's pool is engine.kv_cache_bytes=1.5e+10",
    ),
    (["hardware.pcie_bytes_per_s=1e6"], "hardware.pcie_bytes_per_s times swaps, read only with engine.preemption=swap"),
    (
        ["scenario=validate", "model=tiny", "scenario.profile=FILES/trace.csv", "+scenario.profiling.repeats=3"],
        "scenario.profiling.repeats is not read: scenario.profile=",
    ),
    (
        ["scenario=validate", "model=tiny", "engine.async_scheduling=true"],
        "scenario.serve.clock=cpu (validate's default) needs scenario.serve.device=cpu",
    ),
    # its profile was taken on the wall clock, and predicted serve steps timed on the CPU clock
    (
        ["scenario=validate", "model=tiny", "scenario.profiling.clock=wall"],
        "scenario.profiling.clock=wall but scenario.serve.clock=cpu: the profile taken would time",
    ),
    # the command line: a key given twice kept the last list, a dict set a group's keys unrecorded
    (
        ["-m", "seed=0,1", "seed=2,3", "hydra.sweep.dir=FILES/sweep-x2"],
        "seed is given twice (seed=0,1 and seed=2,3); the last would replace the first",
    ),
    (
        ["-m", "seed=0,1", "hydra.sweep.subdir=grp/s${seed}", "hydra.sweep.dir=FILES/sweep-x3"],
        "hydra.sweep.subdir gives a point the folder 'grp/s0', not a folder directly in the sweep's",
    ),
    (["model={num_layers:20}"], "model={num_layers:20} sets keys of the model group through a dict"),
    # "gives a point the folder '.'", and "keep the default subdir", the one in use
    (
        ["-m", "seed=0,1", "plots=true,false", "hydra.sweep.dir=FILES/sweep-x6"],
        "the sweep varies plots, which changes how a point runs, not what it measures",
    ),
    (["seed=1", "--hydra-help"], "--hydra-help shows Hydra's own flags and takes no overrides"),
    (["model=/etc/passwd"], "model=/etc/passwd names a file, but a model is chosen by the name of one of its"),
    (
        ["-m", "model=llama-3-8b,{num_layers:20}", "hydra.sweep.dir=FILES/sweep-x5"],
        "model=llama-3-8b,{num_layers:20} sets keys of the model group through a dict",
    ),
    (["hardware=NULL"], "hardware=NULL chooses no option of the hardware group"),
    (  # it said "the sweep runs one point twice": the preset had made every system paged
        ["+experiment=fig2", "+preset=vllm", "hydra.sweep.dir=FILES/sweep-x7"],
        "+preset=vllm configures vLLM's paged allocator (conf/preset/vllm.yaml), not allocator=contiguous",
    ),
    (["--help", "-m", "+allocator=paged,oracle"], "--help shows one config and its fields"),
    (["-m", "+allocator=paged,null", "hydra.sweep.dir=FILES/sweep-x6"], "choose one with +allocator=NAME"),
    (
        ["scenario=validate", "model=tiny", "scenario.serve={rate:2}"],
        "scenario.serve.rate would serve another workload than the one simulated",
    ),
    (["hardware=null"], "hardware=null chooses no option of the hardware group: choose one with hardware=NAME"),
    (["~engine.kv_cache_bytes"], "~engine.kv_cache_bytes deletes a key every run reads"),
    (["-p", "workload", "workload.num_requests=5"], "-p/--package selects the part of the config --cfg prints"),
    (["--cfg", "job", "-p", "nope"], "-p nope names no part of the config"),
    (  # every step ran eager, and the row said graph=full
        ["scenario=serve", "model=tiny-gemma3", "+allocator=hybrid", "+backend=triton_paged", "+graph=full"],
        "graph=full captures one attention metadata for every layer; allocator=hybrid gives each layer kind its own",
    ),
    (["=alpaca"], "an override has no key (=VALUE): write KEY=VALUE"),  # was "+=alpaca"
    (["-m", "seed=range(0,3,0)", "hydra.sweep.dir=FILES/sweep-c"], "range(start, stop, step) needs a step other"),
    (["-m", "workload.rate=range(1,1)", "hydra.sweep.dir=FILES/sweep-d"], "workload.rate=range(1,1) gives no value"),
    (["-m", "+allocator=glob(zz*)", "hydra.sweep.dir=FILES/sweep-g"], "the sweep has no points: a value list"),
    # a request whose sequences cannot decode in one step's budget ran until no sequence could run
    (
        [
            "workload.n=4",
            "scheduler.max_num_batched_tokens=3",
            "scheduler.chunked_prefill=true",
            "workload.num_requests=5",
        ],
        "a request of 4 sequences (workload.n / workload.beam_width) decodes 4 tokens a step",
    ),
    # it said the 15,808-slot pool was smaller than a 1,984-slot request
    (["+allocator=paged", "allocator.watermark=0.95", "workload.num_requests=5"], "keeps 15008 of them free"),
    # serve's pool is scenario.kv_cache_tokens: it said "0 token slots ... give more memory (hardware.*"
    (
        ["scenario=serve", "model=tiny", "scenario.num_requests=2", "scenario.kv_cache_tokens=8"],
        "369-token request; raise scenario.kv_cache_tokens (now 8, which rounds down to 0 whole 16-token blocks)",
    ),
    (  # a hybrid pool rounds to pages of a block of a layer group, not to blocks of every layer
        ["scenario=serve", "model=tiny-gemma3", "+allocator=hybrid", "scenario.kv_cache_tokens=203"],
        "raise scenario.kv_cache_tokens (now 203, which rounds down to 76 whole pages (202 token slots))",
    ),
    # after the whole profile: "... give more memory (hardware.*, engine.kv_cache_bytes)", which validate refuses
    (
        ["scenario=validate", "model=tiny", "workload.num_requests=8", "scenario.kv_cache_tokens=100"],
        "is smaller than one request: paged needs 480 slots for a 479-token request; raise scenario.kv_cache_tokens",
    ),
    # the good trace's point ran first; the malformed one failed only as its turn came
    (
        ["-m", "workload=trace", "workload.path=FILES/three.csv,FILES/words.csv", "hydra.sweep.dir=FILES/q2"],
        "would fail: trace ",
    ),
    # each ran every point (fig12: 64), then found nothing to compare
    (
        ["+experiment=fig12", "workload.rate=1", "hydra.sweep.dir=FILES/q3"],
        "rates from fig12.rates, not workload.rate=1",
    ),
    (
        ["+experiment=fig13", "workload.rate=5", "hydra.sweep.dir=FILES/q4"],
        # was "sweeps workload.rate over several values", which fig13 does not
        "rates from fig13.rates, not workload.rate=5: give fig13.rates.sharegpt=2 (a trace's: +fig13.rates.trace=",
    ),
    # the parallel point ran, then foo's failed: no launch resolves an interpolation to a missing key
    (
        ["-m", "+experiment=fig14_15", "fig14_15.sharing=parallel,foo", "hydra.sweep.dir=FILES/q5"],
        "would fail: workload.n reads fig14_15.knobs.foo.n, but fig14_15.knobs has no 'foo'",
    ),
    (["-m", "workload.rate=1,2", "workload.duration_s=${nosuch.key}", "hydra.sweep.dir=FILES/q6"], "'nosuch.key' not"),
    # the whole grid was measured first (9.7 s), then the folder could not be made
    (["scenario=profile", "model=tiny", "scenario.out_dir=/proc/nope"], "scenario.out_dir=/proc/nope cannot be made"),
    # it said "known groups: seed, batch, progress, ...", the config's keys
    (["--config-name", "foo"], "cannot find the config foo: bench has one, bench (--config-name bench, the default)"),
    # it blamed hydra.sweep.subdir '.', which nobody gave
    (["-m", "hydra.sweep.dir=FILES/q9"], "-m sweeps the values given as lists (-m +allocator=paged,contiguous"),
    # its 24 points ran, and the summary gained a fig13.foo column
    (
        ["+experiment=fig13", "+fig13.foo=1", "hydra.sweep.dir=FILES/q8"],
        "fig13.foo is not a key of +experiment=fig13 (its keys: rates, duration_s)",
    ),
    # each point ran as its turn came, and was recorded failed, where a single run refused it at once
    (
        ["-m", "workload=trace", "workload.path=FILES/timed.csv", "workload.rate=inf,2", "hydra.sweep.dir=FILES/q7"],
        "would fail: workload.rate is not read: the trace",
    ),
    (["~workload"], "workload is required"),
    (["workload.num_requests=20", "~workload"], "workload.num_requests=20 sets a key of workload, which ~workload"),
    (["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=x"], "hydra.launcher.n_jobs=x"),
    (
        ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=1000", "hydra.sweep.dir=FILES/sweep-x4"],
        "hydra.launcher.n_jobs=1000 asks for more processes than this machine's",
    ),
    # these ran: serve recorded workload.rate=2 with every request at t=0; a rate of 1e-300 req/s
    # gave duration_s=inf and latencies of 0; 4096 threads on 2 cores ran on past a minute
    (["scenario=serve", "model=tiny", "workload.rate=2"], "workload.rate is not read: scenario=serve replaces it"),
    # these ran: serve's 64 requests at 2 req/s over 32 s, recorded as workload.duration_s=2; a
    # simulated 100 requests over 45 s, recorded as workload.duration_s=10
    (
        ["scenario=serve", "model=tiny", "workload.duration_s=2", "scenario.rate=2"],
        "workload.duration_s is not read: scenario.num_requests=64 bounds the run, and takes precedence",
    ),
    (
        ["workload.num_requests=100", "workload.duration_s=10"],
        "workload.duration_s is not read: workload.num_requests=100 bounds the run",
    ),
    (
        ["scenario=serve", "model=tiny", "workload.burstiness=0.5"],
        "workload.burstiness is not read: scenario.rate=inf",
    ),
    (["workload.rate=1e-300", "workload.num_requests=5"], "spreads 5 requests over 2"),
    # joblib refused these once the sweep launched (a traceback); its timeout ended the sweep with no summary
    (
        ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0", "hydra.sweep.dir=FILES/sweep-f"],
        "n_jobs=0 runs nothing",
    ),
    (
        ["-m", "hydra/launcher=joblib", "hydra.launcher.timeout=5", "hydra.sweep.dir=FILES/sweep-g"],
        "would stop the whole sweep and leave no summary",
    ),
    # Hydra's joblib launcher runs loky whatever is given: `sequential` ran serve points side by side
    (
        ["-m", "hydra/launcher=joblib", "hydra.launcher.backend=sequential", "hydra.sweep.dir=FILES/sweep-gb"],
        "hydra.launcher.backend=sequential is not used: Hydra's joblib launcher always runs joblib's loky",
    ),
    # it said "graph.capture_sizes is not a key of graph (its keys: name, capture_sizes)"
    (
        ["+graph=eager", "graph.capture_sizes=[1]"],
        "graph.capture_sizes is a graph key that the chosen graph's config does not set: add it with "
        "+graph.capture_sizes=[1]",
    ),
    (["seed=4294967295"], "seed=4294967295 must be <= 4294967294"),  # it said <= 4.295e+09
    # two spellings of one seed ran twice and left two rows of one identity
    (
        ["-m", "seed=1000,1e3", "workload.num_requests=5", "hydra.sweep.dir=FILES/sweep-e"],
        "the sweep runs one point twice: seed=1000 and seed=1000.0 are the same setting",
    ),
    (
        ["scenario=serve", "model=tiny", "scenario.num_requests=2", "scenario.cpu_threads=4096"],
        "scenario.cpu_threads=4096 is more than the",
    ),
    # recorded in the row, and the run was the default's to the last bit
    (["workload.num_prefixes=5"], "workload.num_prefixes is not read: workload.prefix_len=0"),
    (["model.hidden_size=1"], "model.hidden_size is not read by the roofline (executor=roofline)"),
    # a linear layer's state for every page of the pool (5 MB of tokens took 1.4 GB): it ran out of memory instead
    (
        ["scenario=serve", "+allocator=hybrid", "model=tiny-qwen3-next", "model.linear_state_dim=64"]
        + ["allocator.block_size=1", "scenario.kv_cache_tokens=2000000"],
        "would allocate about 98.8 GB (KV cache 98.8 GB)",
    ),
    # it said "raise hardware.num_gpus": the first degree that fits and divides the heads is named
    (["model=opt-66b"], "leave no KV memory on 1 x a100-40gb at utilization 0.9; choose hardware.num_gpus=4"),
    # 4 GPUs would not divide its 2 K/V heads, and 2 do not hold its weights
    (
        ["model=qwen3-next-like", "+allocator=hybrid", "hardware=a100-80gb", "hardware.num_gpus=2"],
        "leave no KV memory on 2 x a100-80gb at utilization 0.9; choose a GPU with more memory",
    ),
    # recorded in a served row, and unread there: serve times real steps
    (
        ["scenario=serve", "model=tiny", "hardware.step_overhead_s=5"],
        "hardware.step_overhead_s is read by the roofline",
    ),
    (["scenario=serve", "model=tiny", "hardware.num_gpus=3"], "does not divide model=tiny's 4 attention heads"),
    # every policy pools full-attention layers alike: the run was shared's to the last bit
    (
        ["+allocator=hybrid", "allocator.policy=as_full"],
        "allocator.policy is not read: model=opt-13b has full-attention",
    ),
    # the linear entry past the one layer was dropped unread, and linear_state_dim with it
    (
        ["+model.layer_pattern=[full,linear]", "+model.linear_state_dim=8", "+allocator=hybrid", "model.num_layers=1"],
        "layer_pattern has 2 entries for 1 layer(s)",
    ),
    # one GPU: no all-reduce to time, and the column would describe a run it did not shape
    (["hardware.allreduce_latency_s=2e-5"], "hardware.allreduce_latency_s times the tensor-parallel all-reduces"),
    # Hydra's hint said "use 'override allocator: contiguous'", a defaults-list line
    (["+experiment=fig19", "+allocator=contiguous"], "write allocator=contiguous (without +) to choose another"),
    # refused once all 12 points had run (900 s of arrivals each by default)
    (["+experiment=fig2", "workload=alpaca", "hydra.sweep.dir=FILES/sweep-j"], "this sweep would run workload=alpaca"),
    (
        ["+experiment=fig13", "model=llama-3-8b", "hydra.sweep.dir=FILES/sweep-k"],
        "this sweep would run model=llama-3-8b",
    ),
    (["-m", "+allocator=paged,paged", "hydra.sweep.dir=FILES/sweep-l"], "a value is listed twice"),
    # the paged point ran, then the contiguous one failed the same way: "every point of the sweep failed"
    (
        ["-m", "scenario=serve", "model=tiny", "+graph=full", "+allocator=paged,contiguous", "hydra.sweep.dir=FILES/q"],
        "would fail: graph=full cannot run backend eager",
    ),
    (["+preset=vllm", "+allocator=paged"], "+allocator=... after +preset=vllm replaces the settings"),
    # it said "request 0 has 8 prompt + 1648 output tokens ...; shorten it": a redraw's leftover
    (["model.max_model_len=2", "workload.num_requests=4"], "workload=sharegpt: too few of its length pairs fit"),
    (  # a RuntimeError: paged could not place sequence 0 (512 tokens) in 1536 slots
        ["scenario=kernel", "model=tiny", "batch=1d512", "+allocator=paged", "allocator.watermark=0.7"],
        "allocator.watermark is read by scenario=simulate or serve or profile or validate only; scenario=kernel",
    ),
    (["+model.rope_theta=5"], "model.rope_theta is not read by the roofline"),
    (["engine.swap_space_bytes=1"], "engine.swap_space_bytes is read only with engine.preemption=swap"),
    (
        ["scenario=serve", "model=tiny", "scenario.swap_space_tokens=100"],
        "scenario.swap_space_tokens is read only with engine.preemption=swap",
    ),
    (  # the row said swap_space_bytes=0 beside 60 swapped blocks: serve's pool is scenario.swap_space_tokens
        ["scenario=serve", "model=tiny", "engine.preemption=swap", "engine.swap_space_bytes=0"],
        "engine.swap_space_bytes is not read by scenario=serve",
    ),
    # one default point of each experiment ran, and neither's comparison
    (
        ["-m", "+experiment=fig2,fig13", "hydra.sweep.dir=FILES/sweep-h"],
        "+experiment is swept (fig13, fig2): each experiment is a sweep of its own",
    ),
    # the second point overwrote the first: "1 point(s)", exit 0
    (
        ["-m", "+allocator=contiguous,paged", "hydra.sweep.subdir=same", "hydra.sweep.dir=FILES/sweep-i"],
        "hydra.sweep.subdir gives the points +allocator=contiguous and +allocator=paged one folder, 'same'",
    ),
    # OmegaConf's AssertionError ("Unexpected type for root: NoneType") and an AttributeError, as tracebacks
    (["-m", "+hydra.sweeper.params.seed='0,1'"], "hydra.sweeper.params is empty (null) unless an experiment"),
    (["-m", "hydra.sweeper.params={seed:'0,1'}"], "give the sweep on the command line instead, e.g. bench -m"),
    # 20 points ran (1,800 s of arrivals each), then "no successful point ... is one the paper measured"
    (["+experiment=fig12", "+allocator=paged", "hydra.sweep.dir=FILES/sweep-m"], "fig12's ratios compare paged with"),
    (["+experiment=fig12", "workload=alpaca", "hydra.sweep.dir=FILES/sweep-n"], "fig12's ratios are ShareGPT's"),
    # glob() made the check before the sweep fail (a Hydra warning), and fig12.point=r3 ran
    (
        ["+experiment=fig12", "+allocator=glob(p*)", "fig12.point=r3", "hydra.sweep.dir=FILES/sweep-o"],
        "fig12.point=r3 fixes it to one",
    ),
    # "report.ttftz is not a key of report": the middle of a nested dict was dropped
    (["report={goodput:{ttftz:1}}"], "report.goodput.ttftz is not a key of report.goodput; did you mean report"),
    # "(its keys: )": an experiment's table has no schema of its own
    (["+experiment=fig12", "fig12.rates.sharegptz=1"], "(--cfg job -p fig12 beside the same overrides prints"),
    # "scenario.profiling is not a key of the chosen scenario; scenario=validate has it", under validate
    (
        ["scenario=validate", "scenario.profiling={steps:3}"],
        "scenario.profiling.steps is not a key of scenario.profiling",
    ),
    (
        ["scenario=validate", "scenario.profiling={repeats:3}"],
        "scenario.profiling.repeats is a scenario.profiling key that this config does not set: add it with +",
    ),
    # ran, handing each arrival time another row's lengths: a trace that never happened
    (
        ["workload=trace", "workload.path=FILES/timed.csv", "workload.shuffle=true"],
        "workload.shuffle=true would give the arrival times of trace",
    ),
    # "the file is empty"
    (["workload=trace", "workload.path=FILES/blank.csv"], "blank.csv: line 1 is blank; the first line is the header"),
    # Hydra's "Could not delete 'allocator'. No match in the defaults list"
    (["~allocator"], "~allocator removes a group's choice, but this config chooses no allocator"),
    # "unrecognized arguments: workload.rate=x": an override after a flag
    (["workload.num_requests=5", "--cfg", "job", "workload.rate=x"], "workload.rate=x must be a number"),
    # ran, and the rows named no model
    (["model.name=''"], "model.name= must not be empty"),
    (["hardware.name=' '"], "must not be empty: it names the rows"),
    # an UnpicklingError traceback
    (["--experimental-rerun", "FILES/junk.pickle"], "junk.pickle: not a config Hydra pickled (UnpicklingError)"),
    # "the KV pool (44310 token slots) is smaller than one request: hybrid needs 1355 slots"
    (
        ["model=gemma-3-like", "hardware=h100-sxm", "+allocator=hybrid", "allocator.watermark=0.99"],
        "slots), though the KV pool has 44317: its headroom (allocator.watermark) keeps it out; lower the",
    ),
    # "use +allocator=hybrid", which the preset then refuses
    (
        ["+preset=vllm", "model=gpt-oss-like", "hardware=h100-sxm"],
        "run this model without the preset, with +allocator=hybrid",
    ),
    # ran, recorded prefix_caching=true and hit nothing: linear layers keep no per-block state
    (
        [
            "model=qwen3-next-like",
            "hardware=h200",
            "hardware.num_gpus=2",
            "+allocator=hybrid",
            "allocator.prefix_caching=true",
        ],
        "allocator.prefix_caching=true cannot apply to qwen3-next-like",
    ),
    # "cannot use the overrides: File ... does not exist!"
    (["--experimental-rerun", "FILES/none.pickle"], "none.pickle: no such file; give a run's .hydra/config.pickle"),
    # replaced an earlier run's metrics.csv and requests.jsonl
    (["hydra.run.dir=FILES/done"], "done holds an earlier run's metrics.csv, which this run would replace"),
    # a sweep into a run's folder, a run into a sweep's: their rows went unread beside the other's
    (["-m", "seed=0,1", "hydra.sweep.dir=FILES/done"], "done holds a single run's metrics.csv"),
    # an experiment sweeps by its own hydra.mode: Hydra's reading of it hid the line behind another
    (["+experiment=fig13", "hydra.sweep.dir=FILES/done"], "done holds a single run's metrics.csv"),
    (["hydra.run.dir=FILES/swept"], "swept holds a sweep's points: a run's result would go unread"),
    # replaced an earlier validation's table, and the profile its rows name by sha256
    (
        ["scenario=validate", "model=tiny", "scenario.out_dir=FILES/validated"],
        "validated holds an earlier run's validation.csv, which this run would replace",
    ),
    # a number beyond a float's range, read as inf: every request at t=0, without a word
    (["workload.rate=1e400"], "workload.rate=1e400 holds a number beyond a float's range (about 1.8e308)"),
    (["scenario=profile", "model=tiny", "scenario.out_dir="], "scenario.out_dir is empty: give a folder, or null"),
    (["-m", "workload.rate=1,-1e999"], "workload.rate=1,-1e999 holds a number beyond a float's range"),
    (["-m", "workload.rate=range(1,1e999)"], "workload.rate=range(1,1e999): a range() sweep needs finite start"),
    # Hydra reads 1_0 as 10: 1,000 req/s ran 900,765 requests for a mistyped 1_000 (a path's 1_0 is a name)
    (["workload.num_requests=1_0"], "workload.num_requests=1_0: 1_0 reads as 10 (an underscore between digits"),
    (["-m", "seed=range(0,1_0)", "hydra.sweep.dir=FILES/s_1_0"], "seed=range(0,1_0): 1_0 reads as 10"),
]


@pytest.mark.parametrize("args, message", RUN_CASES, ids=[" ".join(a) for a, _ in RUN_CASES])
def test_bench_refuses_with_one_line(args, message, files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (files / "empty.csv").write_text("")
    (files / "header.csv").write_text("input_len,output_len\n")
    (files / "words.csv").write_text("input_len,output_len\nten,twenty\n")
    (files / "negative.csv").write_text("input_len,output_len\n-3,20\n")
    (files / "nan.csv").write_text("input_len,output_len,arrival_s\n3,20,nan\n")
    (files / "long.csv").write_text("input_len,output_len\n3000,20\n")
    (files / "three.csv").write_text("input_len,output_len\n10,20\n30,40\n50,60\n")
    (files / "far.csv").write_text("input_len,output_len,arrival_s\n10,20,1\n10,20,1e300\n")
    (files / "twice.csv").write_text("input_len,output_len,input_len\n10,20,30\n")
    (files / "alias.csv").write_text("input_len,prompt_len,output_len\n10,20,30\n")
    (files / "wide.csv").write_text("input_len,output_len\n10," + "2" * 200_000 + "\n")
    (files / "timed.csv").write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n10,20,0.0\n30,40,0.5\n")
    (files / "blank.csv").write_text("\ninput_len,output_len\n10,5\n")
    (files / "junk.pickle").write_text("not a pickle")
    (files / "done").mkdir(exist_ok=True)
    (files / "done" / "metrics.csv").write_text("allocator,status\npaged,ok\n")
    (files / "swept" / "seed=0").mkdir(parents=True, exist_ok=True)
    (files / "swept" / "seed=0" / "metrics.csv").write_text("allocator,status\npaged,ok\n")
    (files / "validated").mkdir(exist_ok=True)
    (files / "validated" / "validation.csv").write_text("rate,status\n1,ok\n")
    assert message in refused(lambda: cli.main([*with_files(args, files), *FAST]))
    assert (files / "done" / "metrics.csv").read_text() == "allocator,status\npaged,ok\n"
    assert sorted(p.name for p in (files / "done").iterdir()) == ["metrics.csv"]  # no multirun.yaml, no .hydra
    assert (files / "validated" / "validation.csv").read_text() == "rate,status\n1,ok\n"


def test_a_rerun_of_a_pickled_run_replaces_its_own_results(tmp_path, monkeypatch):
    """Hydra's --experimental-rerun runs a run's pickled config again in that run's folder, and
    replaces its metrics.csv: the check that refuses a new run there must not refuse it."""
    monkeypatch.chdir(tmp_path)
    pickled = "+hydra.callbacks.save_job_info._target_=hydra.experimental.callbacks.PickleJobInfoCallback"
    run = ["workload.num_requests=5", "plots=false", "progress=false", f"hydra.run.dir={tmp_path / 'run'}", pickled]
    assert in_process(lambda: cli.main(run)).returncode == 0
    metrics = tmp_path / "run" / "metrics.csv"
    metrics.write_text("allocator,status\nstale,ok\n")
    rerun = in_process(lambda: cli.main(["--experimental-rerun", str(tmp_path / "run" / ".hydra" / "config.pickle")]))
    assert rerun.returncode == 0, rerun.stderr
    assert "stale" not in metrics.read_text() and "Successful requests:" in rerun.stdout


@pytest.mark.parametrize(
    "args",
    [  # each was refused as bad input, and is not
        # an idle pool admits without the watermark (vLLM's scheduler): a request that fits it runs
        ["+allocator=paged", "allocator.watermark=0.95", "scheduler.watermark_when_idle=false"],
        # whole numbers written as floats: the schema took them, and the run crashed on the float
        ["+allocator=pow2", "model.max_model_len=2.048e3"],
        ["+allocator=contiguous", "model.num_layers=4e1"],
        ["+allocator=paged", "allocator.block_size=1.6e1"],
        ["+allocator=pow2", "model.max_model_len='2048'"],  # a number quoted as text
        ["scenario=serve", "model=tiny", "+allocator=paged", "scenario.num_requests=2", "model.head_dim=1.6e1"],
    ],
)
def test_bench_runs_what_it_once_refused(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    size = [] if "scenario=serve" in args else ["workload.num_requests=10"]
    result = in_process(lambda: cli.main([*args, *size, "plots=false", *FAST]))
    assert result.returncode == 0, result.stderr
    assert "Successful requests:" in result.stdout


def test_whole_numbers_given_as_floats_are_written_back_as_the_ints_the_schema_took():
    overrides = ["+allocator=paged", "allocator.block_size=1.6e1", "scheduler.max_num_seqs=6.4e1"]
    overrides += ["model.max_model_len=2.048e3", "+graph=piecewise", "graph.capture_sizes=[1.0,2.0]", "seed=1e3"]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=overrides)
    schema.settle_whole_numbers(cfg, schema.validate(cfg))
    settled = [cfg.allocator.block_size, cfg.scheduler.max_num_seqs, cfg.model.max_model_len, cfg.seed]
    assert settled == [16, 64, 2048, 1000] and all(type(v) is int for v in settled)
    assert list(cfg.graph.capture_sizes) == [1, 2] and all(type(v) is int for v in cfg.graph.capture_sizes)
    assert type(cfg.workload.rate) is float  # a float field keeps its float


def test_an_override_before_info_is_no_value_of_it_and_info_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "metrics.csv").write_text("allocator,status\npaged,ok\n")
    for args in (["seed=1", "--info"], ["--info", "config", "hydra.run.dir=done"]):
        result = in_process(lambda: cli.main(args))  # noqa: B023 (called at once)
        assert result.returncode == 0 and "Config search path" in result.stdout, result.stderr


def test_a_relative_trace_path_is_read_from_the_launch_folder_under_job_chdir(files, tmp_path, monkeypatch):
    """hydra.job.chdir=true runs in the run's folder; workload.path=t.csv is the launch folder's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("input_len,output_len,arrival_s\n10,5,0\n20,5,1\n")
    args = ["hydra.job.chdir=true", "workload=trace", "workload.path=t.csv", "plots=false", "hydra.run.dir=run"]
    result = in_process(lambda: cli.main([*args, *FAST[:1]]))
    assert result.returncode == 0, result.stderr
    assert "Successful requests:                                   2" in result.stdout
    assert (tmp_path / "run" / "metrics.csv").is_file() and Path.cwd() == tmp_path


# --- bench-compare and bench-report: arguments, baselines, policies ------------------------------

GOOD = "scenario,allocator,model,seed,status,throughput_req_s\nsimulate,paged,opt-13b,0,ok,1.5\n"
POLICIES = {  # file -> (its text, what the error line says)
    "syntax.yaml": ("metrics: [unclosed\n", "syntax.yaml is not valid YAML"),
    "list.yaml": ("- 1\n- 2\n", "list.yaml needs a 'metrics:' mapping"),
    "nometrics.yaml": ("identity: [scenario]\n", "nometrics.yaml needs a 'metrics:' mapping"),
    "unknown.yaml": ("metrics:\n  speed: {better: higher, tolerance: 0.1}\n", "unknown metric 'speed'"),
    "better.yaml": ("metrics:\n  completed: {better: sideways, tolerance: 0}\n", "metrics.completed.better=sideways"),
    "negative.yaml": ("metrics:\n  completed: {better: higher, tolerance: -1}\n", "metrics.completed.tolerance=-1"),
    "nan.yaml": ("metrics:\n  completed: {better: higher, tolerance: .nan}\n", "metrics.completed.tolerance=nan"),
    "inf.yaml": ("metrics:\n  completed: {better: higher, tolerance: .inf}\n", "metrics.completed.tolerance=inf"),
    "word.yaml": ("metrics:\n  completed: {better: higher, tolerance: lots}\n", "metrics.completed.tolerance=lots"),
    "abs.yaml": ("metrics:\n  completed: {better: higher, tolerance: 0, abs_tolerance: -2}\n", "abs_tolerance=-2"),
    "absword.yaml": ("metrics:\n  completed: {better: higher, tolerance: 0, abs_tolerance: x}\n", "abs_tolerance=x"),
    "scalar.yaml": ("metrics:\n  completed: 3\n", "metrics.completed=3"),
    "identity.yaml": ("identity: 3\nmetrics:\n  completed: {better: higher, tolerance: 0}\n", "identity=3"),
    "scenarios.yaml": ("scenarios: 3\nmetrics:\n  completed: {better: higher, tolerance: 0}\n", "scenarios=3"),
    "typo.yaml": (
        "metrics:\n  completed: {better: higher, tolerence: 0}\n",
        "did you mean metrics.completed.tolerance?",
    ),
    "toplevel.yaml": ("metric:\n  completed: {better: higher}\nmetrics: {}\n", "did you mean metrics?"),
}
COMPARE_CASES = [
    ([], "give BASELINE and CURRENT (got 0 input(s)), or --against REF"),
    # made REF's worktree, then every run failed: exit 1, the error on stdout
    (["--against", "HEAD", "model=nope"], "the bench overrides model=nope would not run: unknown model 'nope'"),
    (["--against", "HEAD", "--repeats", "100000"], "--repeats 100000 must be at most 100"),
    (["one.csv"], "give BASELINE and CURRENT (got 1 input(s)), or --against REF"),
    (["FILES/good.csv", "FILES/good.csv", "--bogus"], "unrecognized arguments: --bogus"),
    (["FILES/missing.csv", "FILES/good.csv"], "missing.csv does not exist"),
    (["FILES/good.csv", "FILES/missing.csv"], "missing.csv does not exist"),
    (["/dev/null", "FILES/good.csv"], "/dev/null is not a regular file"),
    (["FILES/emptydir", "FILES/good.csv"], "emptydir has no results"),
    (["FILES/binary.csv", "FILES/good.csv"], "binary.csv is not a readable CSV file"),
    (["FILES/header.csv", "FILES/good.csv"], "header.csv has no"),
    (["FILES/bad.json", "FILES/good.csv"], "bad.json is not a pytest-benchmark JSON file"),
    (["FILES/list.json", "FILES/good.csv"], "list.json is not a pytest-benchmark JSON file"),
    (["FILES/nobench.json", "FILES/good.csv"], "nobench.json is not a pytest-benchmark JSON file"),
    (["FILES/nostats.json", "FILES/good.csv"], "nostats.json is not a pytest-benchmark JSON file"),
    (["FILES/good.csv", "FILES/other.csv"], "no point of the current run matches the baseline"),
    (["FILES/rated.csv", "FILES/good.csv"], "baseline has workload.rate=4, current has workload.rate=(unset)"),
    (["FILES/good.csv", "FILES/good.json"], "good.json is a pytest-benchmark JSON file and"),
    (["FILES/twice.csv", "FILES/good.csv"], "the baseline has two rows for the point"),
    (["FILES/good.csv", "workload.rate=4"], "workload.rate=4 is not a file or folder: KEY=VALUE overrides are"),
    (["FILES/good.csv", "FILES/good.csv", "--policy", "FILES/missing.yaml"], "missing.yaml does not exist"),
    (["FILES/good.csv", "FILES/good.csv", "--policy", "FILES"], "is not a regular file"),
    (["FILES/good.csv", "FILES/good.csv", "--policy", "/dev/null"], "/dev/null is not a regular file"),
    (["FILES/good.csv", "FILES/good.csv", "--policy", "FILES/binary.csv"], "binary.csv"),
    *[
        (["FILES/good.csv", "FILES/good.csv", "--policy", f"FILES/{name}"], message)
        for name, (_, message) in POLICIES.items()
    ],
]
REPORT_CASES = [
    ([], "bench-report: the following arguments are required: dirs"),
    (["FILES/missing"], "missing does not exist"),
    (["FILES/good.csv", "report.baseline=paged"], "here give options: --baseline NAME"),
    (["/dev/null", "--out", "FILES/out-a"], "/dev/null is not a regular file"),
    (["FILES/emptydir"], "emptydir has no results"),
    (["FILES/good.csv"], "good.csv is a file: give --out DIR"),
    (["FILES/binary.csv", "--out", "FILES/out-b"], "binary.csv is not a readable CSV file"),
    (["FILES/badsweep"], "badsweep/p1/metrics.csv is not a readable CSV file"),
    (["FILES/good.csv", "--out", "FILES/good.csv"], "good.csv: a file is where a directory should be"),
    (["FILES/good.csv", "--out", "/proc/kvbench-report"], "/proc/kvbench-report"),
    (["FILES/good.csv", "--bogus"], "unrecognized arguments: --bogus"),
    # read as CSV: "line 2: 1 fields, but its header has 1"
    (["FILES/multirun.yaml", "--out", "FILES/out-y"], "multirun.yaml is a run's config (YAML), not a result table"),
    (["FILES/nobench.json", "--out", "FILES/out-j"], "nobench.json is a JSON file (a pytest-benchmark"),
    (["FILES/blanks.csv", "--out", "FILES/out-c"], "blanks.csv: its header has 3 blank column names"),
]


@pytest.fixture(scope="module")
def result_files(files):
    (files / "good.csv").write_text(GOOD)
    (files / "multirun.yaml").write_text("hydra:\n  mode: MULTIRUN\n")
    (files / "other.csv").write_text(GOOD.replace("opt-13b", "llama-3-8b"))
    (files / "rated.csv").write_text(GOOD.replace("\n", ",workload.rate\n", 1).replace(",1.5\n", ",1.5,4\n"))
    (files / "far.csv").write_text("input_len,output_len,arrival_s\n10,20,1\n10,20,1e300\n")
    (files / "twice.csv").write_text(GOOD + GOOD.splitlines()[1] + "\n")
    (files / "header.csv").write_text(GOOD.splitlines()[0] + "\n")
    (files / "binary.csv").write_bytes(b"\xff\xfe\x00garbage")
    (files / "blanks.csv").write_text("garbage,,,\n")
    (files / "bad.json").write_text("{not json")
    (files / "list.json").write_text("[1, 2]")
    (files / "nobench.json").write_text('{"machine_info": {}}')
    (files / "nostats.json").write_text('{"benchmarks": [{"fullname": "x"}]}')
    (files / "good.json").write_text('{"benchmarks": [{"fullname": "x", "stats": {"median": 1.0, "min": 1.0}}]}')
    (files / "emptydir").mkdir(exist_ok=True)
    (files / "badsweep" / "p1").mkdir(parents=True, exist_ok=True)
    (files / "badsweep" / "p1" / "metrics.csv").write_bytes(b"\xff\xfe\x00")
    for name, (text, _) in POLICIES.items():
        (files / name).write_text(text)
    return files


@pytest.mark.parametrize("args, message", COMPARE_CASES, ids=[" ".join(a) for a, _ in COMPARE_CASES])
def test_bench_compare_refuses_with_one_line_and_exit_2_not_1(args, message, result_files):
    assert message in refused(lambda: compare.main(with_files(args, result_files)))


@pytest.mark.parametrize("args, message", REPORT_CASES, ids=[" ".join(a) for a, _ in REPORT_CASES])
def test_bench_report_refuses_with_one_line(args, message, result_files):
    assert message in refused(lambda: report.main(with_files(args, result_files)))


def test_there_are_at_least_250_bad_inputs():
    total = (
        len(SCHEMA_CASES)
        + len(COMPOSE_CASES)
        + len(CROSS_CASES)
        + len(RUN_CASES)
        + len(COMPARE_CASES)
        + len(REPORT_CASES)
    )
    assert total >= 250, total


def test_every_numeric_field_is_tried_with_nan_and_inf():
    tried = {(c.values[2], c.values[1].split("=", 1)[1]) for c in SCHEMA_CASES}
    for group, _, model in OPTIONS:
        for key, field in fields(group, model):
            if _base_type(field.annotation)[0] in (int, float) and key not in CHOICE_KEYS:
                assert (key, "nan") in tried and (key, "-inf") in tried, key
                if not allows_inf(field):
                    assert (key, "inf") in tried, key


def test_a_key_only_some_options_have_is_set_by_each_of_their_configs():
    """What the compose error's advice rests on: where Hydra finds no such key to change, the
    chosen option lacks it (hydra_errors._unknown_key names the options that have it), because
    every option's config sets each key its schema has and other options lack."""
    from importlib import resources

    import yaml

    from kvbench.schema import OPTION_GROUPS

    for group, (_, options) in OPTION_GROUPS.items():
        shared = set.intersection(*(set(model.model_fields) for model in options.values()))
        for name, model in options.items():
            config = yaml.safe_load(resources.files("kvbench.conf").joinpath(group, f"{name}.yaml").read_text())
            unset = sorted(set(model.model_fields) - shared - set(config))
            assert unset == [], f"conf/{group}/{name}.yaml does not set {unset}"


def test_the_experiments_with_a_settings_table_are_the_ones_root_names():
    """validate() refuses an experiment's table without its experiment from Root's `dict | None`
    fields, which spares every run reading conf/experiment; they must be the YAMLs' own tables."""
    assert set(schema.EXPERIMENT_SECTIONS) == {name for name, keys in schema.experiments().items() if keys}


@pytest.mark.parametrize(
    "args, message",
    [
        (["workload.rate=-1"], "workload.rate=-1 must be > 0"),
        (["scenario=kernel", "workload.num_requests=5"], "scenario=kernel would ignore it: drop it"),
        (["+allocator=paged", "allocator.block_size=300"], "allocator.block_size=300 must be <= 256"),
        # each passed --cfg job, and a sweep ran its other points first: refused only as the plugins met
        (["scenario=serve", "model=tiny", "+graph=full"], "graph=full cannot run backend eager"),
        (
            ["scenario=serve", "model=tiny-gemma3", "+allocator=hybrid", "+backend=triton_paged", "+graph=full"],
            "graph=full captures one attention metadata for every layer; allocator=hybrid",
        ),
        (
            ["scenario=serve", "model=tiny-qwen3-next", "+allocator=hybrid", "allocator.policy=as_full"],
            "allocator.policy=as_full sizes linear layers as attention",
        ),
        (
            ["scenario=serve", "model=tiny", "engine.async_scheduling=true", "+preset=vllm"],
            "engine.async_scheduling=true cannot run with allocator.prefix_caching=true",
        ),
        (["+preset=vllm", "scenario=kernel", "model=tiny", "batch=2d64"], "preset is read by scenario=simulate or"),
        # printed as fine, refused by the scenario as it started (and a sweep's every point failed so)
        (["scenario=profile", "model=tiny", "scenario.prefill_len=[1000]"], "each entry must be an integer in 1..512"),
        (["scenario=serve", "model=tiny", "scenario.cpu_affinity=[0,9999]"], "may run on cores 0"),
        (["scenario=profile", "model=tiny", "scenario.cpu_affinity=[]"], "scenario.cpu_affinity=[] names no core"),
        (["scenario=serve", "model=tiny", "scenario.cpu_threads=4096"], "scenario.cpu_threads=4096 is more than the"),
        (["scenario=kernel", "model=tiny", "batch=2p100000"], "eager attention scores 480 GB"),
        (["engine.async_scheduling=true"], "engine.async_scheduling=true is measured by scenario=serve"),
        (["executor=calibrated", "executor.profile=abc"], "executor.profile='abc': no such file"),
        (["scenario=validate", "model=tiny", "scenario.profile=abc"], "scenario.profile='abc': no such file"),
        # an experiment's setup, refused as its sweep starts
        (["+experiment=fig2", "workload.rate=5"], "fig2: the paper's numbers are opt-13b on a100-40gb's"),
        (["+experiment=fig18", "allocator.block_size=32"], "allocator.block_size=32 fixes it to one"),
    ],
)
def test_cfg_job_prints_the_config_then_refuses_one_a_run_would_refuse(args, message):
    result = in_process(lambda: cli.main(["--cfg", "job", *args]))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "scenario:" in result.stdout and "workload:" in result.stdout  # printed first, as asked
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and message in line
    assert line.endswith("(the config printed above is one a run refuses)")


@pytest.mark.parametrize(
    "args, shown",
    [
        (["+allocator=paged", "workload.rate=2"], "rate: 2"),
        (["+experiment=fig2"], "fig2"),
        (["scenario=validate", "model=tiny", "scenario.out_dir=run-1e999"], "run-1e999"),  # a name, not a number
        (["scenario=serve", "model=tiny", "scenario.cpu_affinity=[0]", "scenario.cpu_threads=1"], "cpu_threads: 1"),
        # refused as "workload.rate=inf sends every request at t=0", the workload's rate, which serve replaces
        (
            ["scenario=serve", "model=tiny", "workload=fixed", "workload.num_requests=null", "workload.duration_s=1"]
            + ["scenario.rate=2", "scenario.num_requests=null"],
            "duration_s: 1",
        ),
    ],
)
def test_cfg_job_of_a_config_a_run_accepts_ends_as_usual(args, shown):
    result = in_process(lambda: cli.main(["--cfg", "job", *args]))
    assert result.returncode == 0 and result.stderr == ""
    assert shown in result.stdout


def test_a_serve_run_whose_largest_step_would_not_fit_is_refused_before_it_starts(monkeypatch):
    """15.4 GB of weights passed the check on a 24 GB host, then a prompt's step (512 tokens x 3 x
    1e7 fp32 MLP values) took the rest and the host's OOM killer ended it: no line said why."""
    from hydra import compose, initialize_config_module

    from kvbench import schema
    from kvbench.errors import UserError
    from kvbench.schema import memory

    monkeypatch.setattr(memory, "available_bytes", lambda: 24 * 10**9)
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=["scenario=serve", "model=tiny", "model.intermediate_size=1e7"])
    with pytest.raises(
        UserError, match=r"would allocate about 76.8 GB \(weights \(fp32\) 15.4 GB, a step's activations 61.4"
    ):
        schema.validate(cfg)


@pytest.mark.parametrize("preemption, swap_pool", [("recompute", False), ("swap", True)])
def test_a_serve_run_counts_a_swap_pool_only_where_it_swaps(monkeypatch, preemption, swap_pool):
    """A served run that recomputes builds no swap pool, but its estimate counted one (17.2 GB of a
    head_dim=65536 model's 27.4), refusing a run that fit, with no setting to get past it."""
    from hydra import compose, initialize_config_module

    from kvbench import schema
    from kvbench.errors import UserError
    from kvbench.schema import memory

    monkeypatch.setattr(memory, "available_bytes", lambda: 24 * 10**9)
    overrides = ["scenario=serve", "model=tiny", "model.head_dim=65536", f"engine.preemption={preemption}"]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=[*overrides, "workload=fixed", "workload.num_requests=2"])
    if not swap_pool:
        schema.validate(cfg)  # 10.2 GB: weights, a step's activations and the KV cache
        return
    with pytest.raises(UserError, match=r"KV cache 8.59 GB, swap pool 17.2 GB\)"):
        schema.validate(cfg)


@pytest.mark.parametrize("given, recorded", [([], "inf"), (["scenario.rate=2"], 2.0), (["scenario.rate=null"], 4.0)])
def test_a_failed_served_point_records_the_rate_a_served_run_records(given, recorded):
    """A failed serve point recorded the workload's 4 req/s where its sibling that ran recorded
    serve's inf: a rerun that fixed it matched no point of the first sweep."""
    from kvbench.cli import failed_rows

    assert failed_rows(compose_fresh(["scenario=serve", "model=tiny", *given]))[0]["rate"] == recorded


@pytest.mark.parametrize(
    "args",
    [
        # a real model counts its own weights: tiny's num_params is nominal, whatever its vocabulary
        ["scenario=serve", "model=tiny", "model.vocab_size=32000"],
        # no eager attention runs: neither the reference (check_error=false) nor the timed backend
        ["scenario=kernel", "model=llama-3-8b", "batch=1p16k", "scenario.check_error=false", "+backend=triton_paged"],
    ],
)
def test_what_a_bound_would_refuse_wrongly_is_accepted(args):
    schema.validate(compose_fresh(args))


def test_a_resumed_profile_sweep_s_finished_point_is_not_refused_before_it_is_skipped(tmp_path):
    """The sweep's check refused a point whose folder held its own finished profile.csv, so a
    resumed profile sweep could not start; the run refuses replacing it as it starts."""
    from kvbench import errors as kvbench_errors
    from kvbench.scenarios import profile
    from kvbench.scenarios.run import preflight

    (tmp_path / "profile.csv").write_text("done\n")
    cfg = compose_fresh(["scenario=profile", "model=tiny", f"scenario.out_dir={tmp_path}"])
    preflight(cfg)
    with pytest.raises(kvbench_errors.UserError, match="holds an earlier run.s profile.csv"):
        profile.refuse_replacing(cfg.scenario, ("profile.csv", "profile_fit.json"))


def test_a_search_path_package_whose_own_import_fails_says_so(tmp_path, monkeypatch):
    """A plugin package installed but missing a dependency of its own was told "no installed
    package has my_package.conf: install the package", which it was."""
    package = tmp_path / "site" / "broken_plugin"
    (package / "conf").mkdir(parents=True)
    (package / "__init__.py").write_text("import a_dependency_not_installed\n")
    (package / "conf" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    line = refused(lambda: cli.main(["hydra.searchpath=[pkg://broken_plugin.conf]", "--cfg", "job"]))
    assert line.startswith("error: a package of hydra.searchpath, broken_plugin, cannot be imported (ModuleNotFound")
    line = refused(lambda: cli.main(["hydra.searchpath=[pkg://not_installed_anywhere.conf]", "--cfg", "job"]))
    assert "no installed package has not_installed_anywhere.conf: install the package" in line
