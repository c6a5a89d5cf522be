"""`bench-compare --against REF`: measure a git ref and this tree on this machine, interleaved.

Noise between machines (CPU model, load, frequency) dwarfs most code changes, so the baseline
of a wall-clock comparison is measured here, now: REF is checked out in a temporary git
worktree and run with this environment's packages (its kvbench put first on PYTHONPATH through
a folder of links laid out as its pyproject's package-dir says). Both sides run the same
benchmarks (this tree's; REF's own when REF's code cannot run them) `repeats` times each in
ABBA order, so drift in the machine's load falls on both; each run is one sample. What the
significance test flags is measured again in fresh runs (`confirm`) and fails only if seen twice.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import tomllib

import kvbench
from kvbench.errors import UserError
from kvbench.reporting.compare import benchmark_frame, compare
from kvbench.reporting.inputs import load_rows
from kvbench.reporting.policy import Policy
from kvbench.reporting.results import identity_text
from kvbench.reporting.significance import fewest_runs
from kvbench.scenarios.repeats import aggregate, interleaved_order

HOT_PATHS = ["tests/benchmarks"]
# REF's side runs `python -c BOOTSTRAP MODULE ARGS...`: this environment's editable install of
# kvbench adds an import finder that would fill any module REF lacks with this tree's, silently
# mixing the two. Only kvbench's goes: a plugin installed editable beside it stays importable.
BOOTSTRAP = (
    "import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path "
    "if not getattr(f, '__module__', '').startswith('__editable___kvbench_')]; "
    "module = sys.argv.pop(1); runpy.run_module(module, run_name='__main__', alter_sys=True)"
)
# A flagged regression's second round (confirm) takes this many times the first's runs a side.
CONFIRM_FACTOR = 2
# Rounds within one run are not independent samples; runs are. A short run leaves time for more.
BENCHMARK_MAX_TIME_S = "0.1"


def _git(tree: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, timeout=120)


def source_tree() -> Path:
    """The git work tree of the kvbench this environment imports."""
    result = _git(Path(kvbench.__file__).resolve().parent, "rev-parse", "--show-toplevel")
    if result.returncode != 0:
        raise UserError(
            f"--against needs kvbench installed from a git work tree; {Path(kvbench.__file__).parent} is not in one"
        )
    return Path(result.stdout.strip())


def resolve_ref(tree: Path, ref: str) -> str:
    result = _git(tree, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if result.returncode != 0 or not result.stdout.strip():
        raise UserError(f"--against {ref!r}: no such commit in {tree} (give a branch, tag or sha)")
    return result.stdout.strip()


def import_root(ref_tree: Path, overlay: Path) -> Path:
    """A folder that, first on PYTHONPATH, makes `import kvbench` load REF's code."""
    pyproject = ref_tree / "pyproject.toml"
    try:
        mapping = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        mapping = {}
    if "kvbench" not in mapping:
        if (ref_tree / "kvbench" / "__init__.py").is_file():
            return ref_tree
        raise UserError(f"cannot import REF's kvbench: {pyproject} maps no package-dir for it")
    for package in sorted(mapping, key=lambda name: name.count(".")):
        if package != "kvbench" and not package.startswith("kvbench."):
            continue
        link, source = overlay.joinpath(*package.split(".")), (ref_tree / mapping[package]).resolve()
        if link.exists() and link.resolve() == source:
            continue  # already reached through its parent's link
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source, target_is_directory=True)
    return overlay


class Side:
    """One tree's runs: how to launch it, where its runs went, how long they took."""

    def __init__(self, name: str, env: dict, cwd: Path, folder: Path, launcher: list[str]):
        self.name, self.env, self.cwd, self.folder, self.launcher = name, env, cwd, folder, launcher
        self.outputs: list[Path] = []  # this round's runs
        self.seconds: list[float] = []
        self.runs_done = 0  # in earlier rounds
        folder.mkdir(parents=True)

    def run(self, command: list[str]) -> subprocess.CompletedProcess:
        start = time.perf_counter()
        result = subprocess.run(command, cwd=self.cwd, env=self.env, capture_output=True, text=True)
        self.seconds.append(time.perf_counter() - start)
        return result


# a line that names the error: ImportError ..., ERROR: file or directory not found, pytest's `E ` lines
ERROR_LINE = re.compile(r"\w*Error\b|^error\b|^E ", re.IGNORECASE)


def _first_error(result: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    errors = [line for line in lines if not line.startswith(("=", "_")) and ERROR_LINE.search(line)]  # no banners
    return (errors or lines or [f"exit code {result.returncode}, no output"])[0][:200]


def _benchmark_run(side: Side, targets: list[str], index: int) -> None:
    output = side.folder / f"run{index}.json"
    command = [
        *side.launcher,
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        # the benchmarks use neither hypothesis's nor hydra's pytest plugin: 2.7 s less a run
        "-p",
        "no:hypothesispytest",
        "-p",
        "no:hydra_pytest",
        *targets,
        "--benchmark-only",
        f"--benchmark-json={output}",
        f"--benchmark-max-time={BENCHMARK_MAX_TIME_S}",
    ]
    result = side.run(command)
    if result.returncode != 0:
        # A benchmark checks what it timed after timing it, and pytest-benchmark writes the time
        # of one whose check then failed: its time would be judged as if the code were right
        # (a block table returning another sequence's blocks read 0.82x, "better"). The CI's
        # suite skips the benchmarks (--benchmark-skip), so this is where their checks run.
        failed = [line for line in result.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
        raise RuntimeError(
            f"{failed[0][:200]}{f' (and {len(failed) - 1} more)' if len(failed) > 1 else ''}"
            if failed
            else _first_error(result)
        )
    side.outputs.append(output)


def merge_benchmark_runs(paths: list[Path], merged: Path) -> Path:
    """One pytest-benchmark JSON whose every benchmark keeps each run's statistics under `runs`."""
    runs = [json.loads(p.read_text()) for p in paths]
    data = runs[0]
    by_name = [{b["fullname"]: b["stats"] for b in run["benchmarks"]} for run in runs]
    for bench in data["benchmarks"]:
        bench["runs"] = [stats[bench["fullname"]] for stats in by_name if bench["fullname"] in stats]
    merged.write_text(json.dumps(data))
    return merged


def _bench_run(side: Side, overrides: list[str], index: int) -> None:
    sweep = side.folder / f"run{index}"
    command = [*side.launcher, "kvbench.cli", "-m", *overrides, f"hydra.sweep.dir={sweep}", "progress=false"]
    result = side.run(command)
    if result.returncode != 0 and not list(sweep.glob("*/metrics.csv")):
        raise RuntimeError(_first_error(result))
    side.outputs.append(sweep)


def merge_bench_runs(sweeps: list[Path]) -> pd.DataFrame:
    """Each point's runs as one row: medians, and every run's value as samples."""
    runs = [sorted(load_rows(s).to_dict("records"), key=lambda r: str(r.get("point"))) for s in sweeps]
    rows = aggregate(runs)
    for row, *each in zip(rows, *runs):
        failed = [r for r in each if r.get("status") != "ok"]
        if failed:
            row.update(status=failed[0].get("status"), reason=failed[0].get("reason", ""))
    return pd.DataFrame(rows)


def measure(
    sides: dict, bench_overrides: list[str], targets: list[str], repeats: int, ref, ref_tree, out, keep, round_name=""
):
    """`repeats` runs a side, interleaved: each side's runs merged into one frame and kept in
    `keep` as `<side><round_name>.json` (benchmarks) or `.csv` (a sweep). None: a side failed."""
    for side in sides.values():
        side.outputs = []
    for index, name in interleaved_order(list(sides), repeats):
        side = sides[name]
        index += side.runs_done
        try:
            if bench_overrides:
                _bench_run(side, bench_overrides, index)
            else:
                _benchmark_run(side, targets, index)
        except RuntimeError as err:
            if name == "current" or side.cwd == ref_tree or bench_overrides:
                print(f"error: the {name} side failed in run {index + 1}: {err}", file=out)
                return None
            print(f"note: {ref} cannot run this tree's benchmarks ({err}); using its own", file=out)
            side.cwd = ref_tree
            try:
                _benchmark_run(side, targets, index)
            except RuntimeError as again:
                print(f"error: the {name} side failed in run {index + 1}, its own benchmarks too: {again}", file=out)
                return None
        print(f"  run {len(side.outputs)}/{repeats} {name}: {side.seconds[-1]:.1f} s", file=out)
    frames = {}
    for name, side in sides.items():
        side.runs_done += len(side.outputs)
        if bench_overrides:
            frames[name] = merge_bench_runs(side.outputs)
            frames[name].to_csv(keep / f"{name}{round_name}.csv", index=False)
        else:
            frames[name] = benchmark_frame(merge_benchmark_runs(side.outputs, keep / f"{name}{round_name}.json"))
    return frames


def check_out_dir(out_dir: Path) -> None:
    """--out: a folder to keep each side's results in, refused where it is a file or holds an
    earlier A/B's results, which this one would replace."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file: give a folder to keep each side's results in")
    earlier = sorted(out_dir.glob("baseline*.csv")) + sorted(out_dir.glob("baseline*.json")) if out_dir.is_dir() else []
    if earlier:
        raise UserError(
            f"--out {out_dir} holds an earlier A/B's {earlier[0].name}, which this one would replace: give a new or "
            f"empty folder"
        )


def _select(frame: pd.DataFrame, points: list[dict]) -> pd.DataFrame:
    """The rows of `frame` that are one of `points` (identity values as compare matched them)."""
    columns = list(points[0])
    keys = identity_text(frame.reindex(columns=columns), columns).apply(tuple, axis=1)
    return frame[keys.isin({tuple(point[c] for c in columns) for point in points})]


def confirm(sides, bench_overrides, suspects, repeats, ref, ref_tree, policy, keep, out) -> int:
    """Measure the points a significance test flagged again, in fresh interleaved runs, and judge
    those alone: a regression stands only if it is seen twice.

    A shared host's slow spells last about as long as one A/B; one that falls on one side's runs
    can look significant (identical code was once flagged +40 % at p = 0.03). A fresh sample
    minutes later rarely repeats that, while a real slowdown shows up again. Only measured
    metrics are confirmed: an exact metric, a failed point or a changed work count fails at once.
    The second round takes twice the runs (CONFIRM_FACTOR): asking for two significant rounds
    instead of one costs power, and the flagged benchmarks alone are quick to run again."""
    repeats *= CONFIRM_FACTOR
    names = sorted({str(point.get("benchmark") or point) for point in suspects})
    print(
        f"\nconfirming {len(suspects)} flagged point(s) with {repeats} fresh runs a side"
        f"{'' if bench_overrides else ' of those benchmarks alone'}: {', '.join(names)}",
        file=out,
    )
    targets = [] if bench_overrides else [str(point["benchmark"]) for point in suspects]
    frames = measure(sides, bench_overrides, targets, repeats, ref, ref_tree, out, keep, "-confirm")
    if frames is None:
        return 1
    code = compare(*(_select(frames[n], suspects) for n in ("baseline", "current")), policy, out=out)
    print(
        "the regression was confirmed by the fresh runs"
        if code
        else "not confirmed: the fresh runs found no significant regression, so the first round's was noise",
        file=out,
    )
    return code


MOST_REPEATS = 100


def refuse_bench_overrides(tree: Path, overrides: list[str], extra: dict) -> None:
    """The sweep's first point checked as `bench --cfg job` checks a config, before REF's
    worktree is made and minutes are spent (a bad override failed every run, exit 1)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        first = [
            f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override() else o.input_line
            for o in parsed
        ]
    except Exception:  # noqa: BLE001 (a sweep it cannot expand here, glob(): each run says what is wrong)
        return
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}, **extra}
    checked = subprocess.run(
        [sys.executable, "-m", "kvbench.cli", "--cfg", "job", *first], cwd=tree, env=env, capture_output=True, text=True
    )
    if checked.returncode != 0:
        said = (checked.stderr.strip().splitlines() or ["no message"])[-1].removeprefix("error: ")
        said = said.removesuffix(" (the config printed above is one a run refuses)")
        raise UserError(f"the bench overrides {' '.join(overrides)} would not run: {said}")


def run_ab(
    ref: str,
    repeats: int,
    what: list[str],
    policy: Policy,
    out_dir: Path | None = None,
    current_env: tuple = (),
    allow_missing: bool = False,
    out=None,
) -> int:
    out = sys.stdout if out is None else out
    if repeats < 2:
        raise UserError(
            f"--repeats {repeats}: the significance test needs at least 2 runs a side "
            f"(5 or more to detect a change on a noisy host)"
        )
    if repeats > MOST_REPEATS:  # each run a side is a whole process: 100,000 of them is days
        raise UserError(f"--repeats {repeats} must be at most {MOST_REPEATS} (5 to 20 tell a change on a noisy host)")
    if out_dir is not None:
        check_out_dir(Path(out_dir))
    bench_overrides = [w for w in what if "=" in w and not w.startswith("-")]
    given = [w for w in what if w not in bench_overrides]
    paths = [w for w in given if not w.startswith("-")]
    if bench_overrides and paths:  # a bench sweep runs; the pytest paths would be dropped without a word
        raise UserError(
            f"--against measures a bench sweep (KEY=VALUE overrides) or pytest benchmarks (paths), not both: "
            f"{paths[0]} beside {bench_overrides[0]}; give one kind"
        )
    targets = given or HOT_PATHS
    tree = source_tree()
    for target in targets:
        path = target.split("::")[0]
        inside = (tree / path).resolve().is_relative_to(tree.resolve())  # both trees run their own copy of it
        if not target.startswith("-") and (not inside or not (tree / path).exists()):
            raise UserError(
                f"{target}: no such test file or folder in {tree} (pytest runs there); give pytest paths "
                f"relative to it (tests/benchmarks), or bench overrides (KEY=VALUE)"
            )
        if not target.startswith("-") and (tree / path).is_file() and (tree / path).suffix != ".py":
            raise UserError(f"{target} is not a test file (a .py file or a folder of them): e.g. tests/benchmarks")
    extra = {}
    for item in current_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--current-env {item!r}: give KEY=VALUE")
        extra[key] = value
    sha = resolve_ref(tree, ref)
    if bench_overrides:
        refuse_bench_overrides(tree, bench_overrides, extra)
    if repeats < fewest_runs(policy.test):  # exact metrics (work counts) are still judged
        print(
            f"note: with {repeats} runs a side, {policy.test.method} at alpha={policy.test.alpha:g} cannot flag a "
            f"measured metric whose runs all differ ({fewest_runs(policy.test)} or more can); exact metrics are "
            f"judged as ever",
            file=out,
        )
    work = Path(tempfile.mkdtemp(prefix="kvbench-ab-"))
    ref_tree = work / "ref"
    added = _git(tree, "worktree", "add", "--detach", "--quiet", str(ref_tree), sha)
    if added.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise UserError(
            f"cannot create a git worktree of {ref} at {ref_tree}: "
            f"{(added.stderr.strip().splitlines() or ['no message'])[-1]}"
        )
    started = time.perf_counter()
    previous = _on_terminate(_terminated)
    try:
        # each side is its own pytest session: a parent's pytest-xdist worker variables would make
        # pytest-benchmark believe it runs under xdist and refuse to measure
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        base_env = {**clean, "PYTHONHASHSEED": "0"}
        root = import_root(ref_tree, work / "imports")
        base_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
        sides = {
            "baseline": Side(
                f"{ref} ({sha[:12]})", base_env, tree, work / "baseline", [sys.executable, "-c", BOOTSTRAP]
            ),
            "current": Side(
                "this tree",
                {**clean, "PYTHONHASHSEED": "0", **extra},
                tree,
                work / "current",
                [sys.executable, "-m"],
            ),
        }
        what = "bench " + " ".join(bench_overrides) if bench_overrides else " ".join(targets)
        print(
            f"A/B: {sides['baseline'].name} vs {tree} ({what}), {repeats} runs a side, interleaved",
            file=out,
        )
        keep = Path(out_dir) if out_dir else work
        keep.mkdir(parents=True, exist_ok=True)
        frames = measure(sides, bench_overrides, targets, repeats, ref, ref_tree, out, keep)
        if frames is None:
            return 1
        flagged: list = []
        code = compare(frames["baseline"], frames["current"], policy, allow_missing, out=out, flagged=flagged)
        suspects = list({str(point): point for point, measured in flagged if measured}.values())
        if code and suspects and all(measured for _, measured in flagged):
            code = confirm(sides, bench_overrides, suspects, repeats, ref, ref_tree, policy, keep, out)
        elif code and suspects:  # an exact metric failed: that needs no second look, so none is taken
            print(
                f"note: the {len(suspects)} measured point(s) flagged above were not measured again (an exact "
                f"metric failed, which fails the A/B by itself); they are first-round flags, unconfirmed",
                file=out,
            )
        total = time.perf_counter() - started
        print(
            f"A/B against {ref} ({sha[:12]}): {total:.0f} s for {sides['current'].runs_done} runs a side "
            f"(baseline {sum(sides['baseline'].seconds):.0f} s, current {sum(sides['current'].seconds):.0f} s)"
            + (f"; results in {keep}" if out_dir else ""),
            file=out,
        )
        return code
    finally:
        _on_terminate(None if previous is None else signal.SIG_IGN)  # a second SIGTERM must not stop the cleanup
        _git(tree, "worktree", "remove", "--force", str(ref_tree))
        shutil.rmtree(work, ignore_errors=True)
        _on_terminate(previous)


def _terminated(signum, frame) -> None:
    """SIGTERM (a CI job's time limit) while measuring: leave through run_ab's `finally`, which
    removes REF's worktree, and exit as a terminated process does (128 + 15)."""
    print("terminated: nothing was compared", file=sys.stderr, flush=True)
    raise SystemExit(128 + signal.SIGTERM)


def _on_terminate(handler):
    """Set SIGTERM's handler; return the one it replaces (None off the main thread, which cannot;
    the default where the one before was not set from Python)."""
    if handler is None or threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.signal(signal.SIGTERM, handler)
    return signal.SIG_DFL if previous is None else previous
