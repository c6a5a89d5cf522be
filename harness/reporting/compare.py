"""`bench-compare BASELINE CURRENT`: match two sweeps point by point and fail on a regression.

Each side is a summary.csv, a sweep or run directory, or a pytest-benchmark JSON file. Points
are matched on the policy's identity columns (plus every swept parameter); each metric of the
policy has a better direction and a tolerance the worse way. Exit 0 when nothing regressed,
1 when a metric regressed, a point failed or a baseline point is missing, 2 on bad input.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Optional

import yaml

from kvbench.errors import ArgumentParser, UserError, exit_with, reportable
from kvbench.reporting.report import load_rows
from kvbench.schema.policy import check_policy

DEFAULT_POLICY = "compare_policy.yaml"


@dataclass(frozen=True)
class Rule:
    """How one metric is judged: `tolerance` is relative to the baseline; None = report only."""

    better: str
    tolerance: Optional[float]
    abs_tolerance: float = 0.0

    def verdict(self, base: float, cur: float) -> str:
        if math.isnan(base) and math.isnan(cur):
            return "same"
        if math.isnan(cur):
            return "REGRESSED" if self.tolerance is not None else "worse"
        if math.isnan(base):
            return "new"
        worse_by = cur - base if self.better == "lower" else base - cur
        if worse_by == 0:
            return "same"
        if worse_by < 0:
            return "better"
        if self.tolerance is not None and worse_by > self.tolerance * abs(base) + self.abs_tolerance:
            return "REGRESSED"
        return "worse"


@dataclass
class Policy:
    identity: list
    environment: list
    rules: dict  # metric -> Rule
    scenario_rules: dict  # scenario -> {metric -> Rule}, replacing `rules` for that scenario's rows

    def rules_for(self, scenario: str) -> dict:
        return {**self.rules, **self.scenario_rules.get(scenario, {})}


def _read_yaml(source) -> dict:
    try:
        data = yaml.safe_load(source.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise UserError(f"policy {source} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise UserError(f"policy {source} needs a 'metrics:' mapping of metric -> {{better, tolerance}}")
    check_policy(data, source)
    return data


def _rules(metrics: dict, known: dict) -> dict:
    rules = {}
    for metric, spec in (metrics or {}).items():
        if metric not in known:
            raise UserError(f"policy names unknown metric {metric!r}; known: {', '.join(known)}")
        spec = spec or {}
        if spec.get("better") not in ("higher", "lower"):
            raise UserError(f"policy metric {metric!r}: better must be 'higher' or 'lower', not {spec.get('better')!r}")
        tolerance = spec.get("tolerance")
        if tolerance is not None and (not isinstance(tolerance, (int, float)) or tolerance < 0):
            raise UserError(f"policy metric {metric!r}: tolerance must be a number >= 0 or null, not {tolerance!r}")
        rules[metric] = Rule(spec["better"], None if tolerance is None else float(tolerance),
                             float(spec.get("abs_tolerance", 0.0)))
    return rules


def load_policy(path: Optional[Path] = None) -> Policy:
    """The packaged policy, or a user's; a user's may name only metrics kvbench knows."""
    packaged = _read_yaml(resources.files("kvbench.conf") / DEFAULT_POLICY)
    if path is not None and not Path(path).is_file():
        raise UserError(f"policy {path} {'is not a regular file' if Path(path).exists() else 'does not exist'}")
    data = _read_yaml(Path(path)) if path is not None else packaged
    known = packaged["metrics"]
    scenarios = data.get("scenarios") or {}
    return Policy(list(data.get("identity", packaged["identity"])),
                  list(data.get("environment", packaged["environment"])), _rules(data["metrics"], known),
                  {name: _rules(metrics, known) for name, metrics in scenarios.items()})


def benchmark_rows(path: Path) -> list[dict]:
    """pytest-benchmark's JSON (--benchmark-json) as rows: one per benchmark, times in seconds."""
    try:
        data = json.loads(Path(path).read_text())
        machine = data.get("machine_info", {})
        env = {"python": machine.get("python_version", ""), "cpu": machine.get("cpu", {}).get("brand_raw", "")}
        return [{"benchmark": b["fullname"], "median_s": b["stats"]["median"], "min_s": b["stats"]["min"],
                 "rounds": b["stats"]["rounds"], "status": "ok", **env} for b in data["benchmarks"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise UserError(f"{path} is not a pytest-benchmark JSON file ({err})") from None


def read_side(path: str) -> list[dict]:
    p = Path(path)
    if not p.exists():
        raise UserError(f"{path} does not exist; give a summary.csv, a sweep directory or a benchmark JSON")
    rows = benchmark_rows(p) if p.suffix == ".json" else load_rows(p)
    if not rows:
        raise UserError(f"{path} has no result rows")
    return rows


def identity_columns(policy: Policy, baseline: list[dict], current: list[dict]) -> list[str]:
    columns = {c for rows in (baseline, current) for row in rows for c in row}
    swept = sorted(c for c in columns if "." in c)
    return [c for c in policy.identity if c in columns] + swept


def by_point(rows: list[dict], columns: list[str], side: str) -> dict[tuple, dict]:
    points = {}
    for row in rows:
        key = tuple(str(row.get(c, "")) for c in columns)
        if key in points:
            raise UserError(f"the {side} has two rows for the point {_label(key, columns, [])}; "
                            f"compare one sweep at a time, or sweeps that differ in a recorded parameter")
        points[key] = row
    return points


def _num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _label(key: tuple, columns: list[str], varying: list[str]) -> str:
    shown = varying or columns
    return ", ".join(f"{c}={v}" for c, v in zip(columns, key) if c in shown) or "(the only point)"


def compare(baseline: list[dict], current: list[dict], policy: Policy, allow_missing: bool = False,
            out=sys.stdout) -> int:
    """Print the comparison; return the exit code (0 fine, 1 regressed)."""
    columns = identity_columns(policy, baseline, current)
    base, cur = by_point(baseline, columns, "baseline"), by_point(current, columns, "current")
    matched = [k for k in base if k in cur]
    varying = [c for i, c in enumerate(columns) if len({k[i] for k in list(base) + list(cur)}) > 1]
    if not matched:
        raise UserError(f"no point of the current run matches the baseline on {', '.join(columns)}; "
                        f"baseline has {_label(next(iter(base)), columns, varying)}, "
                        f"current has {_label(next(iter(cur)), columns, varying)}")
    problems = []
    for column in policy.environment:
        before = sorted({r.get(column, "") for r in baseline} - {""})
        after = sorted({r.get(column, "") for r in current} - {""})
        if before and after and before != after:
            print(f"environment changed: {column} {'/'.join(before)} -> {'/'.join(after)}", file=out)
    for key in base:
        if key not in cur:
            print(f"missing in current: {_label(key, columns, varying)}", file=out)
            if not allow_missing:
                problems.append(f"missing point {_label(key, columns, varying)}")
    for key in cur:
        if key not in base:
            print(f"new in current (no baseline): {_label(key, columns, varying)}", file=out)
    header = f"  {'metric':<30} {'baseline':>14} {'current':>14} {'ratio':>8}  status"
    for key in matched:
        b, c = base[key], cur[key]
        label = _label(key, columns, varying)
        print(f"\n{label}", file=out)
        if c.get("status", "ok") != "ok" and b.get("status", "ok") == "ok":
            print(f"  status: {c.get('status')} ({c.get('reason', '')})  REGRESSED", file=out)
            problems.append(f"{label}: point {c.get('status')}")
            continue
        print(header, file=out)
        for metric, rule in policy.rules_for(c.get("scenario", "")).items():
            if metric not in b and metric not in c:
                continue
            bv, cv = _num(b.get(metric)), _num(c.get(metric))
            verdict = rule.verdict(bv, cv)
            ratio = cv / bv if bv else (1.0 if cv == bv else math.inf)
            print(f"  {metric:<30} {bv:>14.6g} {cv:>14.6g} {ratio:>8.4f}  {verdict}", file=out)
            if verdict == "REGRESSED":
                problems.append(f"{label}: {metric} {bv:.6g} -> {cv:.6g} (better: {rule.better}, "
                                f"tolerance {rule.tolerance:g})")
    print(file=out)
    if problems:
        print(f"REGRESSION: {len(problems)} problem(s) over {len(matched)} matched point(s):", file=out)
        for line in problems:
            print(f"  {line}", file=out)
        return 1
    print(f"OK: {len(matched)} point(s) match the baseline within tolerance", file=out)
    return 0


def main(argv: Optional[list[str]] = None) -> None:
    parser = ArgumentParser(
        prog="bench-compare", description="Compare a run against a baseline; exit 1 on a regression.")
    parser.add_argument("baseline", help="summary.csv, sweep directory or pytest-benchmark JSON")
    parser.add_argument("current", help="the same kind of input, from the run under test")
    parser.add_argument("--policy", type=Path, help=f"YAML policy (default: kvbench.conf/{DEFAULT_POLICY})")
    parser.add_argument("--allow-missing", action="store_true",
                        help="baseline points absent from the current run are reported, not failed")
    args = parser.parse_args(argv)
    try:
        policy = load_policy(args.policy)
        code = compare(read_side(args.baseline), read_side(args.current), policy, args.allow_missing)
    except Exception as err:  # bad input: one line, exit 2 (exit 1 means a regression)
        if not reportable(err):
            raise
        exit_with(err)
    sys.exit(code)


if __name__ == "__main__":
    main()
