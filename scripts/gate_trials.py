"""How often the A/B gate cries wolf, and how often it sleeps: repeated `bench-compare --against`.

Each trial is one whole A/B (REF in a git worktree against this tree, `--repeats` runs a side,
interleaved). With --slowdown F the current side is made (1 + F) times slower without editing
it: the hot-path benchmarks read KVBENCH_TEST_SLOWDOWN themselves, and for a serve sweep
tests/slowdown_site/sitecustomize.py slows ModelExecutor.execute. A trial "reports a
regression" when bench-compare exits 1. Prints one line per trial and a tally; --out keeps them.

    python scripts/gate_trials.py --trials 10                      # hot paths, identical code
    python scripts/gate_trials.py --trials 10 --slowdown 0.25      # hot paths, 25 % slower
    python scripts/gate_trials.py --trials 10 --serve              # a small serve sweep
    python scripts/gate_trials.py --trials 10 --serve --slowdown 0.4
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from script_checks import run_main, writable_file

from kvbench.errors import ArgumentParser, UserError

ROOT = Path(__file__).resolve().parent.parent
SERVE = ["scenario=serve", "model=tiny", "workload=fixed", "scenario.num_requests=8", "+allocator=paged"]


def trial(ref: str, repeats: int, serve: bool, slowdown: float) -> dict:
    # this interpreter's, not whichever bench-compare is first on PATH (an unactivated venv has none)
    command = [sys.executable, "-m", "kvbench.reporting.compare", "--against", ref, "--repeats", str(repeats)]
    if slowdown:
        command += ["--current-env", f"KVBENCH_TEST_SLOWDOWN={slowdown}"]
        if serve:
            command += ["--current-env", "PYTHONPATH=tests/slowdown_site"]
    if serve:
        command += SERVE
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    text = result.stdout + result.stderr
    # what the verdict rests on: the confirmation round's regressions when there was one
    final = text.rsplit("\nconfirming ", 1)[-1]
    regressed = re.findall(r"^  (\S.*?): (\S+) .* the worse way", final, re.M)
    if result.returncode not in (0, 1):
        last = (text.strip().splitlines() or ["(no output)"])[-1].removeprefix("error: ")
        raise UserError(f"bench-compare failed (exit {result.returncode}): {last}")
    return {
        "kind": "serve" if serve else "hot paths",
        "slowdown": slowdown,
        "exit": result.returncode,
        "regressions": len(regressed),
        # flagged by the first round's test and measured again (bench-compare's confirmation)
        "remeasured": "confirming" in text,
        "regressed": "; ".join(f"{point} {metric}" for point, metric in regressed),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--ref", default="HEAD", help="the git ref measured as the baseline (default HEAD)")
    parser.add_argument("--repeats", type=int, default=5, help="runs a side in each A/B (default 5)")
    parser.add_argument("--serve", action="store_true", help="a small serve sweep instead of the hot paths")
    parser.add_argument("--slowdown", type=float, default=0.0, help="make the current side (1 + F) times slower")
    parser.add_argument("--out", help="append the trials to this CSV (new, or one this script wrote)")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error(f"--trials {args.trials}: give at least 1")
    if args.repeats < 2:
        parser.error(f"--repeats {args.repeats}: the significance test needs at least 2 runs a side")
    if not 0 <= args.slowdown < 100:  # nan fails both
        parser.error(f"--slowdown {args.slowdown}: give a fraction >= 0 (0.25: 1.25 times slower), below 100")
    if args.out is not None:  # "" too: an unset variable is refused, not taken for the current folder
        args.out = writable_file(args.out, "--out")
        appendable(args.out)
    rows = []
    for index in range(args.trials):
        try:
            row = trial(args.ref, args.repeats, args.serve, args.slowdown)
        except (UserError, KeyboardInterrupt):  # a failed trial, Ctrl-C or SIGTERM: the finished ones are kept
            save(rows, args.out)
            raise
        rows.append(row)
        verdict = "REGRESSION" if row["exit"] else "no regression"
        again = ", flagged first and measured again" if row["remeasured"] else ""
        print(
            f"trial {index + 1}/{args.trials}: {verdict} ({row['regressed'] or '-'}{again}), {row['seconds']} s",
            flush=True,
        )
    flagged = sum(r["exit"] == 1 for r in rows)
    remeasured = sum(r["remeasured"] for r in rows)
    seconds = pd.Series([r["seconds"] for r in rows])
    print(
        f"{rows[0]['kind']}, slowdown {args.slowdown:g}: {flagged}/{len(rows)} trials reported a regression "
        f"({remeasured} flagged by the first round and measured again); "
        f"an A/B took {seconds.median():.0f} s median ({seconds.min():.0f}-{seconds.max():.0f} s)"
    )
    save(rows, args.out)


COLUMNS = ["kind", "slowdown", "exit", "regressions", "remeasured", "regressed", "seconds"]


def appendable(out: Path) -> None:
    """Trials append to `out` only where it holds trials already: any other CSV would gain rows
    under a header that does not name their fields."""
    if not out.exists() or out.stat().st_size == 0:
        return
    try:
        header = out.read_text(encoding="utf-8").splitlines()[0].split(",")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"--out {out} cannot be read ({type(err).__name__}): give a new file or a trials CSV") from None
    if header != COLUMNS:
        raise UserError(f"--out {out} is not a trials CSV (its header is not {','.join(COLUMNS)}): give a new file")


def save(rows: list[dict], out: Path | None) -> None:
    if out and rows:
        fresh = not out.exists() or out.stat().st_size == 0  # an empty file gets the header too
        pd.DataFrame(rows, columns=COLUMNS).to_csv(out, mode="a", header=fresh, index=False)
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    run_main(main)
