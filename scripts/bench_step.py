"""The scheduler's bookkeeping, this tree against a reference commit, side by side in one run.

    python scripts/bench_step.py [--ref 45506d6] [--repeats 5] [--cases decode,simdecode,admit,sim|startup,main]
    python scripts/bench_step.py --ref REF --cases calsim --profile PROFILE.csv
    python scripts/bench_step.py --opcodes [--cases decode,simdecode,sim]

The reference is checked out as a git worktree (detached, in the system's temp folder) and
both trees are imported the same way, each in its own worker process, with this environment's
packages. Both are byte-compiled first (`python -m compileall`, as the README's install does):
where PYTHONDONTWRITEBYTECODE is set, a tree without bytecode would compile its sources in every
process, 0.12 s of a short run for this tree's, and the ratio would measure that, not the code.
Repeats are interleaved (reference then this tree, then this tree then reference, and so on),
so both see the same machine load; each line prints the medians, the min-max over repeats, the
ratio new / ref of the medians, and the median and range of the paired ratios (each repeat's
two runs, back to back, divided): on a shared host whose speed wanders by half between
minutes, a pair shares its moment's speed, where the two medians may not.
A whole-process case prints its CPU seconds (user + system) too: waiting for a core on a shared
host lengthens the wall time but not those.

`--opcodes` counts instead of timing: the Python bytecode instructions a decode step executes
(schedule() + the token append, the first step's admission left out), once per tree, and with
`sim` among the cases those of a simulated run's loop per step (`Engine.run` of 2,000 ShareGPT
requests, paged, 4 req/s: its admissions, preemptions and quiet steps as they come). The count
does not move with the host's speed, so it shows a change of a few per cent that timing on a
shared machine cannot; what it does not see is the cost of the C code an instruction calls.

Cases (--cases, comma-separated):
    decode   Scheduler.schedule() + the engine's token append, per step, N sequences decoding
             with staggered block boundaries (block 16), prefix caching off and on; each
             sampled token is appended to its sequence (serve's path)
    simdecode  the same steps as the simulator takes them: no token ids, and where the tree has
             it, lazy decode (the scheduler advances steady decodes in bulk)
    admit    admission + free of a 1000-token prompt whose blocks are cached, 4k and 64k blocks
    sim      the whole `bench` process as a user starts it (SIM_ARGS): 10,000 ShareGPT requests
             (paged, defaults, 4 req/s), and the start-up of a 10-request run
    startup  the 10-request run alone
    main     the README's main job as a whole process: `bench -m +allocator=contiguous,oracle,pow2,paged`
             (OPT-13B on A100-40GB, ShareGPT at 4 req/s for 900 s), its plots and report included;
             and the same sweep of the three Orca allocators alone (orca)
    calsim   the whole process of a calibrated simulation (CALIBRATED_ARGS, --profile: a
             profile.csv of model=small from bench scenario=profile): 10,000 ShareGPT-like
             requests at 4 req/s, and 10 requests (its start-up)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"kvbench": "harness", "kvbench.plugins": "plugins", "kvbench.kernels": "kernels", "kvbench.conf": "conf"}
DECODE_STEPS = 60
PROMPT = 100


def use_tree(tree: Path) -> None:
    """Import `kvbench` from `tree` (setuptools' package-dir mapping, rebuilt by hand); an
    editable install's finder would map names missing from `tree` onto this checkout."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
    for name, folder in PACKAGES.items():
        path = tree / folder
        spec = importlib.util.spec_from_file_location(
            name, path / "__init__.py", submodule_search_locations=[str(path)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def find(*names):
    """The first of `names` that imports (the package tree was reorganised since the reference)."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(names)


# --- the worker: runs one case in one tree ----------------------------------------------
def opcode_tracer():
    """A tracer for sys.settrace that counts the bytecode instructions of the functions called
    while it is set, and the count."""
    total = [0]

    def tracer(frame, event, arg):
        frame.f_trace_opcodes, frame.f_trace_lines = True, False
        if event == "opcode":
            total[0] += 1
        return tracer

    return tracer, total


def decoding_engine(
    num_seqs: int, prefix_caching: bool, simulated: bool = False, block_size: int = 16, steps: int = DECODE_STEPS
):
    """(scheduler, engine, step clocks) with `num_seqs` sequences past their prompts of 100..115
    tokens (they cross block boundaries on different steps), room for `steps` decode steps more;
    scripts/bench_nano.py times the same set-up."""
    scheduler_mod = find("kvbench.core.scheduler", "kvbench.scheduler")
    engine_mod = find("kvbench.core.engine", "kvbench.engine")
    seq_mod = find("kvbench.core.sequence", "kvbench.sequence")
    paged = importlib.import_module("kvbench.plugins.allocators.paged")
    slots = num_seqs * (PROMPT + 16 + 2 * steps + 32)
    max_model_len = max(4096, PROMPT + 16 + 10 * steps)
    allocator = paged.PagedAllocator(slots, max_model_len, block_size=block_size, prefix_caching=prefix_caching)
    scheduler = scheduler_mod.Scheduler(
        allocator, max_num_seqs=num_seqs, max_num_batched_tokens=max(8192, num_seqs * (PROMPT + 16))
    )
    engine = engine_mod.Engine(scheduler, executor=None, progress=False)
    scheduler.lazy = simulated  # a tree without lazy decode ignores it
    allocator.stand_in_tokens = simulated and prefix_caching  # as a simulated run's engine sets it (ignored before)
    clocks = getattr(scheduler, "step_clocks", [])  # the engine's step clock, one per schedule()
    for i in range(num_seqs):
        prompt = PROMPT + i % 16
        request = seq_mod.Request(i, 0.0, prompt, output_len=10 * steps)
        tokens = [(i * 7919 + t) % 50_000 for t in range(prompt)]
        scheduler.add(seq_mod.Sequence(i, request, prompt, token_ids=tokens))
    batch = scheduler.schedule(0.0)
    clocks.append(0.0)
    engine._advance(batch, None if simulated else [1] * len(batch.seqs), 0.0)
    assert len(scheduler.running) == num_seqs
    return scheduler, engine, clocks


def decode_case(num_seqs: int, prefix_caching: bool, simulated: bool = False, opcodes: bool = False) -> list[float]:
    steps = DECODE_STEPS
    tracer, counted = opcode_tracer()
    scheduler, engine, clocks = decoding_engine(num_seqs, prefix_caching, simulated)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        if opcodes:  # the calls below are traced, this loop is not
            sys.settrace(tracer)
        batch = scheduler.schedule(float(step))
        clocks.append(float(step))
        engine._advance(batch, None if simulated else [step % 50_000] * len(batch.seqs), float(step))
        sys.settrace(None)
        times.append(time.perf_counter() - start)
        assert len(batch) == num_seqs and batch.num_tokens == num_seqs and not batch.preempted
    return [counted[0] / steps] if opcodes else times


def admit_case(num_blocks: int) -> list[float]:
    seq_mod = find("kvbench.core.sequence", "kvbench.sequence")
    paged = importlib.import_module("kvbench.plugins.allocators.paged")
    allocator = paged.PagedAllocator(num_blocks * 16, 4096, block_size=16, prefix_caching=True)
    prompt = list(range(1000))
    request = seq_mod.Request(0, 0.0, len(prompt), output_len=100)
    holder = seq_mod.Sequence(0, request, len(prompt), token_ids=list(prompt))
    assert allocator.admit(holder) and allocator.grow(holder, len(prompt))
    times = []
    for seq_id in range(1, 201):
        seq = seq_mod.Sequence(seq_id, request, len(prompt), token_ids=list(prompt))
        start = time.perf_counter()
        assert allocator.admit(seq)
        allocator.free(seq)
        times.append(time.perf_counter() - start)
        assert seq.num_cached == 992
    return times


def simloop_case(num_requests: int) -> list[float]:
    """The bytecode instructions per step of a simulated run's loop (`Engine.run`): ShareGPT at
    4 req/s on paged, OPT-13B on A100-40GB, as the 10k case but shorter (tracing is ~50x slower)."""
    from hydra import compose, initialize_config_module

    engine_mod = find("kvbench.core.engine", "kvbench.engine")
    run_point = find("kvbench.scenarios.run", "kvbench.run").run_point
    overrides = [*SIM_WORKLOAD.split(), f"workload.num_requests={num_requests}", "workload.duration_s=null"]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=[*overrides, "progress=false"])
    tracer, counted = opcode_tracer()
    run = engine_mod.Engine.run

    def traced(self, requests):
        sys.settrace(tracer)
        try:
            return run(self, requests)
        finally:
            sys.settrace(None)

    engine_mod.Engine.run = traced
    with tempfile.TemporaryDirectory() as out:  # where a tree writes its per-request file
        os.chdir(out)
        (row,) = run_point(cfg)
    return [counted[0] / row["steps"]]


def worker(tree: Path, case: str) -> None:
    use_tree(tree)
    kind, *args = case.split(":")
    if kind in ("decode", "simdecode"):
        opcodes = args[2:] == ["opcodes"]
        times = decode_case(int(args[0]), args[1] == "on", simulated=kind == "simdecode", opcodes=opcodes)
    elif kind == "simloop":
        times = simloop_case(int(args[0]))
    else:
        times = admit_case(int(args[0]))
    print(json.dumps(statistics.median(times)))


SIM_WORKLOAD = "+allocator=paged workload=sharegpt workload.rate=4"  # the issue's 10k run, but its length
SIM_ARGS = {
    "10000": f"{SIM_WORKLOAD} workload.num_requests=10000",
    "10": "workload.num_requests=10",
}
CALIBRATED_ARGS = (
    "executor=calibrated executor.profile={profile} model=small engine.kv_cache_bytes=16777216 plots=false "
    "workload.num_requests={n}"
)
# the `bench` script's entry point: kvbench.launch where the tree has it (it starts the figure
# helper, which imports this checkout's kvbench: the helper only draws), else kvbench.cli
RUN_CLI = (
    "import sys; sys.path.insert(0, {here!r}); import bench_step; bench_step.use_tree(__import__('pathlib')"
    ".Path({tree!r})); sys.argv = ['bench'] + {args!r}; import importlib.util; "
    "entry = 'kvbench.launch' if importlib.util.find_spec('kvbench.launch') else 'kvbench.cli'; "
    "importlib.import_module(entry).main()"
)


# --- the driver ---------------------------------------------------------------------------
CASE_GROUPS = ("decode", "simdecode", "admit", "sim", "startup", "main", "calsim")
SWEEP_ARGS = {"main": "+allocator=contiguous,oracle,pow2,paged", "orca": "+allocator=contiguous,oracle,pow2"}


def run_case(tree: Path, case: str) -> tuple[float, float | None]:
    """(the case's figure, and for a whole-process case its CPU seconds, user + system: the
    host's waits for a core lengthen the wall time, not these)."""
    if case.startswith(("sim:", "main:")):
        with tempfile.TemporaryDirectory() as out:
            if case.startswith("main:"):
                args = ["-m", SWEEP_ARGS[case[5:]], "progress=false", f"hydra.sweep.dir={out}/sweep"]
            else:
                args = [*SIM_ARGS[case[4:]].split(), "workload.duration_s=null", "progress=false"]
                args.append(f"hydra.run.dir={out}")
            code = RUN_CLI.format(here=str(Path(__file__).parent), tree=str(tree), args=args)
            start, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            child([sys.executable, "-c", code], cwd=out)
            wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
            return wall, after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    return json.loads(child([sys.executable, __file__, "--worker", str(tree), case])), None


def child(command: list[str], cwd=None) -> str:
    """A case's process, its stdout; where it fails, this script ends on its last line and exit
    code (a bench run refusing its settings, e.g. a --profile that is no profile, exits 2)."""
    run = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if run.returncode:
        last = (run.stderr.strip().splitlines() or ["(no output)"])[-1].removeprefix("error: ")
        print(f"error: bench_step.py: a case failed: {last}", file=sys.stderr)
        sys.exit(run.returncode)
    return run.stdout


def reference_tree(rev: str) -> Path:
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True, text=True
    ).stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"kvbench-ref-{sha}"
    if tree.exists() and not (tree / "harness" / "__init__.py").is_file():  # a checkout cut short, or emptied
        shutil.rmtree(tree)
    if not tree.exists():
        # a checkout the temp folder's cleaning removed is still registered: git would refuse to add it again
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True, text=True)
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha],
            check=True,
            capture_output=True,
            text=True,
        )
    return tree


class OneLineErrors(argparse.ArgumentParser):
    """kvbench.errors.ArgumentParser's one-line usage errors; that class cannot be imported here,
    since a worker imports kvbench from the tree it measures (use_tree), not from this checkout."""

    def error(self, message: str):
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    parser = OneLineErrors(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="45506d6", help="the commit to compare with (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved runs a side (default: %(default)s)")
    parser.add_argument(
        "--cases",
        default="decode,simdecode,admit,sim",
        help="comma-separated: decode, simdecode, admit, sim, startup, main, calsim (default: %(default)s)",
    )
    parser.add_argument(
        "--opcodes", action="store_true", help="decode cases: count bytecode instructions per step, not time"
    )
    parser.add_argument("--profile", type=Path, help="calsim: the profile.csv of model=small to simulate with")
    parser.add_argument("--worker", nargs=2, metavar=("TREE", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(Path(args.worker[0]), args.worker[1])
    groups = args.cases.split(",")
    unknown = sorted(set(groups) - set(CASE_GROUPS))
    if unknown:
        parser.error(f"--cases: unknown {', '.join(unknown)}; the cases are {', '.join(CASE_GROUPS)}")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    cases = []
    for kind in ("decode", "simdecode"):
        if kind in groups:
            cases += [f"{kind}:{n}:{p}" for p in ("off", "on") for n in (64, 256, 1024)]
    if "admit" in groups:
        cases += ["admit:4096", "admit:65536"]
    if "sim" in groups:
        cases += ["sim:10000", "sim:10"]
    elif "startup" in groups:
        cases += ["sim:10"]
    if "main" in groups:
        cases += ["main:main", "main:orca"]
    if "calsim" in groups:
        if args.profile is None:
            parser.error("--cases calsim needs --profile PROFILE.csv (bench scenario=profile model=small)")
        if not args.profile.is_file():
            parser.error(
                f"--profile {args.profile} is not a file: give a profile.csv (bench scenario=profile model=small)"
            )
        for n in ("10000", "10"):
            SIM_ARGS[f"cal{n}"] = CALIBRATED_ARGS.format(profile=args.profile.resolve(), n=n)
            cases.append(f"sim:cal{n}")
    try:
        trees = {"ref": reference_tree(args.ref), "new": ROOT}
    except subprocess.CalledProcessError as err:
        parser.error(f"--ref {args.ref}: not a commit of this repository ({(err.stderr or '').strip()})")
    for tree in trees.values():  # as the README's install does: no run compiles its sources again
        folders = [str(tree / folder) for folder in PACKAGES.values() if (tree / folder).is_dir()]
        subprocess.run([sys.executable, "-m", "compileall", "-q", *folders], check=True, capture_output=True)
    if args.opcodes:
        counted = [c for c in cases if c.startswith(("decode:", "simdecode:"))]
        return print_opcodes(trees, args.ref, counted + (["simloop:2000"] if "sim" in groups else []))
    print(f"ref = {args.ref} ({trees['ref']}), new = {ROOT}; {args.repeats} interleaved repeats")
    print(
        f"{'case':<18} {'ref median':>11} {'(min-max)':>19} {'new median':>11} {'(min-max)':>19} {'new/ref':>8}"
        f" {'paired':>7} {'(min-max)':>13}"
    )
    for case in cases:
        seen = {"ref": [], "new": []}
        for repeat in range(args.repeats):
            # ref, new, then new, ref: a host that drifts slower or faster favours neither side
            for side in ("ref", "new") if repeat % 2 == 0 else ("new", "ref"):
                seen[side].append(run_case(trees[side], case))
        whole_process = case.startswith(("sim:", "main:"))
        unit, scale = ("s", 1.0) if whole_process else ("us", 1e6)
        print_line(case, *([figure * scale for figure, _ in seen[side]] for side in ("ref", "new")), unit)
        if whole_process:
            print_line("  (CPU seconds)", *([cpu for _, cpu in seen[side]] for side in ("ref", "new")), "s")


def print_line(name: str, ref: list[float], new: list[float], unit: str) -> None:
    """One case: each side's median and min-max, the ratio of the medians, and the median and
    min-max of the paired ratios (each repeat's new over its ref, run back to back: on a host
    whose speed wanders between repeats, a pair shares its moment's speed)."""
    cells = [f"{statistics.median(v):>9.1f}{unit:<2} ({min(v):>8.1f}-{max(v):<8.1f})" for v in (ref, new)]
    ratio = statistics.median(new) / statistics.median(ref)
    pairs = [n / r for n, r in zip(new, ref)]
    paired = f"{statistics.median(pairs):>6.2f}x ({min(pairs):.2f}-{max(pairs):.2f})"
    print(f"{name:<18} {cells[0]} {cells[1]} {ratio:>7.2f}x {paired}", flush=True)


def print_opcodes(trees: dict, ref: str, cases: list[str]) -> None:
    print(f"ref = {ref} ({trees['ref']}), new = {ROOT}; bytecode instructions per step")
    print(f"{'case':<18} {'ref':>10} {'new':>10} {'new/seq':>8} {'new/ref':>8}")
    for case in cases:
        suffix = "" if case.startswith("simloop:") else ":opcodes"
        ref, new = (run_case(tree, case + suffix)[0] for tree in trees.values())
        per_seq = "" if suffix == "" else f"{new / int(case.split(':')[1]):.1f}"
        print(f"{case:<18} {ref:>10.0f} {new:>10.0f} {per_seq:>8} {new / ref:>7.2f}x", flush=True)


if __name__ == "__main__":
    main()
