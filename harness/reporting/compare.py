"""`bench-compare BASELINE CURRENT`: match two sweeps point by point and fail on a regression.

Each side is a summary.csv, a sweep or run directory, or a pytest-benchmark JSON file. Points
are matched on the policy's identity columns (plus every swept parameter). Exact metrics
(simulated) fail beyond their tolerance; measured metrics (wall clock) fail only when a
significance test on the repeats' samples says they got worse by at least their minimum
relevant change. `bench-compare --against REF` measures both sides here first (kvbench.reporting.ab).
Exit 0 when nothing regressed, 1 when a metric regressed, a point failed or a baseline point
is missing, 2 on bad input.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import ArgumentParser, UserError, exit_interrupted, exit_with, guarded_stdout, reportable
from kvbench.reporting.inputs import (
    check_statuses,
    load_rows,
    metric_cell_checks,
    non_negative_metrics,
    refuse_nameless_rows,
)
from kvbench.reporting.policy import DEFAULT_POLICY, Policy, load_policy
from kvbench.reporting.results import ENVIRONMENT, cell_text, identity_text, path_given
from kvbench.reporting.significance import NO_CHANGE, NOT_MEANINGFUL, SMALL, judge
from kvbench.scenarios.repeats import SAMPLES, samples_of

BASE, CUR = "@baseline", "@current"
NAMES = ("baseline", "current")
# Environment columns that name the machine or the build: a change makes wall times incomparable.
MACHINE = ("cpu", "python", "torch", "device")
# pytest-benchmark's per-run statistics, as metrics: one run's median is one sample.
BENCHMARK_STATS = {"median_s": "median", "min_s": "min"}
# A benchmark's extra_info text naming the path its run took (a simulated run's steps and
# preemptions): where the two sides' differ, the simulated numbers moved (a cost-model constant,
# a scheduler policy) and the two runs did different work, so neither its time nor its work per
# step is compared; the simulate gate judges that move.
TRAJECTORY = "trajectory"


def benchmark_frame(path: Path) -> pd.DataFrame:
    """pytest-benchmark's JSON as rows: one per benchmark, times in seconds.

    A file the A/B runner merged holds each run's statistics under `runs`; a plain
    --benchmark-json file is one run, so one sample. `extra_info` entries (work counts per
    step) are columns too, so that a judged one given as text is refused as a metric cell is."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8-sig"))
        if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
            raise ValueError("no list of benchmarks at its top level")
        machine = data.get("machine_info") if isinstance(data.get("machine_info"), dict) else {}
        cpu = machine.get("cpu", {}).get("brand_raw", "") if isinstance(machine.get("cpu"), dict) else ""
        env = {"python": machine.get("python_version", ""), "cpu": cpu, "torch": machine.get("torch", "")}
        rows = []
        for bench in data["benchmarks"]:
            name = bench.get("fullname") if isinstance(bench, dict) else None
            if not isinstance(name, str) or not name:
                raise ValueError(f"a benchmark has no fullname (a non-empty text): {json.dumps(bench)[:60]}")
            stats = bench.get("runs") or [bench.get("stats")]
            if not all(isinstance(run, dict) and set(BENCHMARK_STATS.values()) <= set(run) for run in stats):
                raise ValueError(f"{name!r} has no stats with {' and '.join(BENCHMARK_STATS.values())}")
            if any(isinstance(run[s], bool) for run in stats for s in BENCHMARK_STATS.values()):  # true reads as 1 s
                raise ValueError(f"{name!r} has a time that is true or false, not a number of seconds")
            runs = pd.DataFrame(stats)[list(BENCHMARK_STATS.values())]
            runs = runs.apply(pd.to_numeric, errors="coerce").set_axis(list(BENCHMARK_STATS), axis=1)  # "abc": NaN
            if not (np.isfinite(runs.to_numpy()) & (runs.to_numpy() >= 0)).all():
                raise ValueError(f"{name!r} has a time that is not a number of seconds >= 0")
            # a number, or a text or null where one was meant (refused or missed as a metric cell would be)
            extra = bench.get("extra_info") if isinstance(bench.get("extra_info"), dict) else {}
            counts = {k: v for k, v in extra.items() if v is None or type(v) in (int, float, str)}
            judged = sorted((set(extra) - set(counts)) & non_negative_metrics())  # a list where a count goes
            if judged:
                given = json.dumps(extra[judged[0]])[:40]
                raise ValueError(f"{name}'s extra_info {judged[0]} is {given}, not a number")
            meta = {"status": "ok", SAMPLES: runs.to_dict("list"), **env}
            row = {"benchmark": name, **runs.median(), "runs": len(runs)}
            taken = sorted((set(row) | set(meta)) & set(counts))
            if taken:
                raise ValueError(f"{name}'s extra_info names {', '.join(taken)}, a column of its own")
            rows.append({**row, **counts, **meta})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:  # AttributeError: a list
        raise UserError(f"{path} is not a pytest-benchmark JSON file ({err})") from None
    return pd.DataFrame(rows)


OVERRIDES_GO = "overrides go after --against REF, which runs them on both trees (bench-compare --help)"


def read_side(path) -> pd.DataFrame:
    p = path_given(path, "an input", "a summary.csv, a sweep directory or a benchmark JSON", OVERRIDES_GO)
    if not p.exists():
        raise UserError(f"{path} does not exist; give a summary.csv, a sweep directory or a benchmark JSON")
    frame = benchmark_frame(p) if p.suffix.lower() == ".json" else pd.DataFrame(load_rows(p))
    if frame.empty:
        raise UserError(f"{path} has no result rows")
    reserved = next((c for c in frame.columns if str(c).startswith("_")), None)
    if reserved is not None:  # the merge's own columns (_merge, _order) begin so
        raise UserError(
            f"{path} has a column {reserved!r}: no result column begins with _, which marks bench-compare's own"
        )
    check_statuses(frame, path)
    refuse_nameless_rows(frame, path)
    return frame


def _identity(policy: Policy, frames) -> list[str]:
    columns = set().union(*(f.columns for f in frames))
    named = [c for c in policy.identity if c in columns]  # a swept key the policy names counts once
    # a swept group.key whose key is a named column (workload.rate: rate) is matched by that
    # column, which every row holds resolved: a sweep that left the default unswept matches too.
    # report.* keys (the goodput SLOs) change how a result is scored, not what ran: no identity
    return named + sorted(
        c
        for c in columns
        if "." in c and c not in named and c.rsplit(".", 1)[-1] not in named and not c.startswith(REPORTING)
    )


# the command line's keys that score a point's result (goodput's SLOs) rather than shape its run
REPORTING = "report."
# the metric those keys score: compared only where both sides scored it alike
SCORED = "request_goodput"


def _scored_apart(point: pd.Series) -> list[str]:
    """The report.* settings (goodput's SLOs) a matched point's two sides scored it under that
    differ, as `key: baseline -> current`."""
    shown = lambda cell: "(unset)" if pd.isna(cell) or cell == "" else cell_text(cell)
    keys = sorted({c.removesuffix(BASE) for c in point.index if c.startswith(REPORTING) and c.endswith(BASE)})
    return [
        f"{key}: {shown(point[key + BASE])} -> {shown(point[key + CUR])}"
        for key in keys
        if shown(point[key + BASE]) != shown(point[key + CUR])
    ]


def _label(point: pd.Series, shown: list[str]) -> str:
    """`allocator=paged, workload.rate=4`; a column a side never set (its sweep left the
    config's default) reads `(unset)`."""
    return ", ".join(f"{c}={point[c] if point[c] != '' else '(unset)'}" for c in shown) or "(the only point)"


def _no_match(base: pd.DataFrame, cur: pd.DataFrame, columns: list[str]) -> str:
    """Where two sides that share no point part: the identity columns whose values the two
    sides have none of in common, each side's values (a few) beside it."""

    def values(frame: pd.DataFrame, column: str) -> str:
        found = [v if v != "" else "(unset)" for v in dict.fromkeys(frame[column])]
        return ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")

    apart = [c for c in columns if not set(base[c]) & set(cur[c])]
    if not apart:
        return "each column has a value in both, but no combination of them is in both"
    shown = [f"{c} (baseline {values(base, c)}; current {values(cur, c)})" for c in apart[:3]]
    return "no value in common: " + ", ".join(shown) + (", ..." if len(apart) > 3 else "")


def _named(sources) -> tuple[str, str]:
    """The two sides as messages name them: `baseline (PATH)` where their paths are known."""
    return NAMES if sources is None else tuple(f"{name} ({path})" for name, path in zip(NAMES, sources))


def match(baseline: pd.DataFrame, current: pd.DataFrame, policy: Policy, sources: tuple | None = None):
    """Both sides merged on the identity columns, the baseline's points first, each side in its
    own order: (merged, identity, the identity columns that vary). `sources`, when given, are
    the sides' paths, for the messages."""
    columns = _identity(policy, (baseline, current))
    for name, frame in zip(_named(sources), (baseline, current)):
        if not any(c in frame for c in columns):
            raise UserError(
                f"the {name} has no identity column, so no point can be matched: looked for "
                f"{', '.join(policy.identity) or 'no column the policy names (identity: [])'} or a swept parameter "
                f"(a column with a dot, e.g. workload.rate); "
                f"its columns: {', '.join(map(str, frame.columns[:8]))}{', ...' if len(frame.columns) > 8 else ''}"
            )
    union = list(dict.fromkeys([*baseline.columns, *current.columns]))
    sides = []
    for name, path, frame in zip(NAMES, sources or ("", ""), (baseline, current)):
        frame = frame.reindex(columns=union)  # every column on both sides, so every one is suffixed
        frame[columns] = identity_text(frame, columns)
        twice = frame[frame.duplicated(columns, keep=False)]
        if not twice.empty:
            unnamed = not any(c in union for c in policy.identity)  # the policy's fault, not the data's
            hint = (
                f" (the policy's identity, [{', '.join(policy.identity)}], names no column of either side: list "
                f"the columns that tell points apart, e.g. scenario, allocator, workload)"
                if unnamed
                else ""
            )
            raise UserError(
                f"the {name} has two rows for the point {_label(twice.iloc[0], columns)}"
                f"{f' in {path}' if path else ''}; compare "
                f"one sweep at a time, or sweeps that differ in a recorded parameter{hint}"
            )
        sides.append(frame.assign(_order=range(len(frame))).copy())  # copy: one block a dtype, not a column
    base, cur = sides
    varying = [c for c in columns if pd.concat([base[c], cur[c]]).nunique() > 1]
    merged = base.merge(cur, on=columns, how="outer", suffixes=(BASE, CUR), indicator=True, sort=False)
    merged = merged.sort_values([f"_order{BASE}", f"_order{CUR}"], ignore_index=True)  # outer merges sort keys
    if not (merged["_merge"] == "both").any():
        raise UserError(
            f"no point of the current run matches the baseline on {', '.join(columns)}; "
            f"baseline has {_label(base.iloc[0], varying or columns)}, "
            f"current has {_label(cur.iloc[0], varying or columns)}; {_no_match(base, cur, columns)}"
        )
    return merged, columns, varying


def environment_changes(baseline: pd.DataFrame, current: pd.DataFrame, policy: Policy) -> list[str]:
    changes = []
    for column in policy.environment:
        before, after = (
            sorted(set(f[column].dropna().astype(str)) - {""}) if column in f else [] for f in (baseline, current)
        )
        if before and after and before != after:
            changes.append(f"{column} {'/'.join(before)} -> {'/'.join(after)}")
    return changes


def _succeeded(merged: pd.DataFrame, side: str) -> pd.Series:
    """The rows whose `side` is a measured point: status ok, or no status recorded."""
    status = merged.get(f"status{side}")
    return pd.Series(True, index=merged.index) if status is None else status.fillna("ok").astype(str).eq("ok")


def _numbers(merged: pd.DataFrame, metric: str, side: str, name: str, measured: pd.Series, shown) -> pd.Series:
    """A side's metric column as numbers, a blank cell missing. A cell that is not a number is
    bad input, and so is an infinite one in a measured row: no throughput or latency is infinite."""
    cells = merged[f"{metric}{side}"]
    numbers, checks = metric_cell_checks(metric, cells, measured)
    for bad, why in checks:
        if bad.any():
            i = bad.idxmax()
            value = repr(cells[i]) if isinstance(cells[i], str) else str(cells[i])
            raise UserError(f"{metric} of {_label(merged.loc[i], shown)} in the {name} is {value}: {why}")
    return numbers


def _samples(merged: pd.DataFrame, side: str, name: str, shown, judged) -> pd.Series:
    """A side's samples column, each row's read (metric -> its runs' values; {} where the point
    ran once), before anything is printed. A judged metric's samples are checked as its cells
    are (metric_cell_checks), each run as a point that ran where it measured a value: a NaN or
    infinite sample is a run that measured nothing, which compare reports as such."""
    cells = merged.get(f"{SAMPLES}{side}", pd.Series(None, index=merged.index, dtype=object))
    read = {}
    for i, cell in cells.items():
        try:
            read[i] = samples_of(cell)
        except UserError as err:
            raise UserError(f"{_label(merged.loc[i], shown)} in the {name}: {err}") from None
        for metric in sorted(judged.keys() & read[i].keys()):
            runs = pd.Series(read[i][metric], dtype=float)
            for bad, why in metric_cell_checks(metric, runs, np.isfinite(runs))[1]:
                if bad.any():
                    raise UserError(
                        f"{metric}'s samples of {_label(merged.loc[i], shown)} in the {name} include "
                        f"{runs[bad].iloc[0]:g}: {why}"
                    )
    return pd.Series(read, index=merged.index, dtype=object)


# a simulated row's column that is no simulated number and that a policy may leave unnamed: the
# host's time (the code's commit is an environment column, results.ENVIRONMENT)
HOST_TIME = "schedule_us_per_step"


def _ungated_changes(point: pd.Series, rules: dict, skip) -> list[tuple[str, str]]:
    """(name, `name a -> b`) for each number the policy does not judge (nor `skip` names) that
    differs between the sides of a simulated point, whose numbers are exact for a seed; a number
    on one side only (blank, text or infinite on the other) is a change too."""
    changed = []
    for column in point.index:
        name = column.removesuffix(BASE)
        if name == column or name in rules or name in skip or name == HOST_TIME or name.startswith("_"):
            continue
        cells = point[column], point.get(name + CUR)
        if any(pd.api.types.is_bool(c) for c in cells):  # window_drained: a flag, not a 0 or a 1
            shown = [str(c).lower() if pd.api.types.is_bool(c) else "(blank)" if pd.isna(c) else str(c) for c in cells]
            if shown[0] != shown[1]:
                changed.append((name, f"{name} {shown[0]} -> {shown[1]}"))
            continue
        base, cur = pd.to_numeric(pd.Series(cells), errors="coerce")
        finite = math.isfinite(base), math.isfinite(cur)
        if all(finite) and base != cur:
            changed.append((name, f"{name} {base:.6g} -> {cur:.6g}"))
        elif any(finite) and not all(finite):
            shown = [
                f"{v:.6g}" if ok else ("(blank)" if pd.isna(c) else str(c))
                for v, ok, c in zip((base, cur), finite, cells)
            ]
            changed.append((name, f"{name} {shown[0]} -> {shown[1]}"))
    return changed


def _check_judged(measured: pd.DataFrame, baseline: pd.DataFrame, current: pd.DataFrame, policy: Policy, names) -> None:
    """Refuse a comparison that would judge nothing: no metric of the policy in both inputs.
    Only where a matched point ran on both sides: a point that failed is judged by its status."""
    if measured.empty:
        return
    scenarios = measured["scenario"].astype(str).unique() if "scenario" in measured else [""]
    metrics = list(dict.fromkeys(m for s in scenarios for m in policy.rules_for(s)))
    if not any(m in baseline.columns and m in current.columns for m in metrics):
        raise UserError(
            f"no metric of the policy is in both the {names[0]} and the {names[1]}, so nothing would be judged; "
            + (f"the policy has {', '.join(metrics)}" if metrics else "the policy has no metrics (metrics: {})")
        )
    columns = [f"{m}{side}" for m in metrics for side in (BASE, CUR) if f"{m}{side}" in measured]
    baseline_values = [c for c in columns if c.endswith(BASE)]
    if measured[columns].notna().any().any() and not measured[baseline_values].notna().any().any():
        raise UserError(
            f"the {names[0]} has no value of any metric of the policy in a point that ran in both: every current "
            f"value would be new, and nothing would be judged"
        )
    if not measured[columns].notna().any().any() and SAMPLES + BASE not in measured:
        shared = [m for m in metrics if m in baseline.columns and m in current.columns]
        raise UserError(
            f"no matched point has a value of any metric of the policy ({', '.join(shared[:4])}"
            f"{', ...' if len(shared) > 4 else ''}) in the {names[0]} or the {names[1]}: every cell is blank, "
            f"so nothing would be judged"
        )


def compare(
    baseline,
    current,
    policy: Policy,
    allow_missing: bool = False,
    out=None,
    flagged: list | None = None,
    sources: tuple | None = None,
) -> int:
    """Print the comparison; return the exit code (0 fine, 1 regressed). `sources`, when given,
    names the two inputs (their paths) in the messages of bad input.

    `flagged`, when given, receives one entry per problem: the point's identity (a dict of the
    identity columns) and whether the problem is a measured metric's regression (a significance
    test's verdict, which `bench-compare --against` confirms with fresh runs) or anything else
    (an exact metric, a failed or missing point), which no rerun can change."""
    out = sys.stdout if out is None else out
    baseline, current = pd.DataFrame(baseline), pd.DataFrame(current)
    names = _named(sources)
    merged, columns, varying = match(baseline, current, policy, sources)
    shown = varying or columns
    judged = dict.fromkeys(m for s in [None, *policy.scenario_rules] for m in policy.rules_for(s))
    ran = {side: _succeeded(merged, side) for side in (BASE, CUR)}
    for metric in judged:
        for side, name in zip((BASE, CUR), names):
            if f"{metric}{side}" in merged:
                merged[f"{metric}{side}"] = _numbers(merged, metric, side, name, ran[side], shown)
    samples = {side: _samples(merged, side, name, shown, judged) for side, name in zip((BASE, CUR), names)}
    both = merged["_merge"] == "both"
    matched = merged[both]
    _check_judged(merged[both & ran[BASE] & ran[CUR]], baseline, current, policy, names)
    if both.any() and not (both & (ran[BASE] | ran[CUR])).any():  # a failure in both is no regression
        failed = matched.iloc[0]
        raise UserError(
            f"no matched point ran in both the {names[0]} and the {names[1]}, so nothing would be compared: "
            f"every one failed in both (e.g. {_label(failed, shown)}: {failed.get(f'reason{CUR}', '')})"
        )
    problems, tally = [], {NO_CHANGE: 0, SMALL: 0, NOT_MEANINGFUL: 0, "tested": 0}

    def problem(text: str, point: pd.Series, measured: bool = False) -> None:
        problems.append(text)
        if flagged is not None:
            flagged.append(({c: point[c] for c in columns}, measured))

    changes = environment_changes(baseline, current, policy)
    machine_changes = [c for c in changes if c.split()[0] in MACHINE]
    for change in changes:
        print(f"environment changed: {change}", file=out)
    if machine_changes:
        print(
            f"!! DIFFERENT MACHINE OR BUILD: {'; '.join(machine_changes)}. Wall times from different "
            f"machines are not comparable; measure both here: bench-compare --against REF",
            file=out,
        )
    for _, point in merged[merged["_merge"] == "left_only"].iterrows():
        print(f"missing in current: {_label(point, shown)}", file=out)
        if not allow_missing:
            problem(f"missing point {_label(point, shown)}", point)
    for _, point in merged[merged["_merge"] == "right_only"].iterrows():
        print(f"new in current (no baseline): {_label(point, shown)}", file=out)
    header = f"  {'metric':<30} {'baseline':>12} {'current':>12} {'ratio':>8}  status"
    unmeasured = apart = 0  # matched points that failed on both sides; that took other paths
    unjudged: list[str] = []  # gated metrics a matched point has no baseline value of
    ungated: set[str] = set()  # simulated numbers the policy does not judge that changed
    for i, point in matched.iterrows():
        label = _label(point, shown)
        print(f"\n{label}", file=out)
        if not ran[CUR][i] and not ran[BASE][i]:  # no regression, no measure
            print(f"  failed in both ({point.get(f'reason{CUR}', '')}): not compared", file=out)
            unmeasured += 1
            continue
        paths = point.get(f"{TRAJECTORY}{BASE}"), point.get(f"{TRAJECTORY}{CUR}")
        if all(isinstance(p, str) and p for p in paths) and paths[0] != paths[1]:
            print(
                f"  not compared: its run took another path ({paths[0]} -> {paths[1]}), so it did other work; "
                f"the simulated numbers moved (the simulate gate judges that)",
                file=out,
            )
            apart += 1
            continue
        if not ran[CUR][i]:
            status = point[f"status{CUR}"]
            print(f"  status: {status} ({point.get(f'reason{CUR}', '')})  REGRESSED", file=out)
            problem(f"{label}: point {status}", point)
            continue
        print(header, file=out)
        base_samples, cur_samples = samples[BASE][i], samples[CUR][i]
        scenario = str(point.get("scenario", ""))
        scored_apart = _scored_apart(point)
        for metric, rule in policy.rules_for(scenario).items():
            bv, cv = (float(point.get(f"{metric}{side}", float("nan"))) for side in (BASE, CUR))
            if metric == SCORED and scored_apart:
                print(
                    f"  {metric:<30} {bv:>12.6g} {cv:>12.6g} {'':>8}  not compared: scored under other SLOs "
                    f"({'; '.join(scored_apart)})",
                    file=out,
                )
                continue
            if pd.isna(bv) and pd.isna(cv) and metric not in base_samples:
                continue
            ratio = cv / bv if bv else (1.0 if cv == bv else float("inf"))
            lost = sum(not math.isfinite(x) for x in cur_samples.get(metric, [cv]))
            if rule.measured and lost and all(math.isfinite(x) for x in base_samples.get(metric, [bv])):
                # a repeat that measured nothing is no sample to test: the value went missing
                count = len(cur_samples.get(metric, [cv]))
                problem(f"{label}: {metric} has no value in {lost} of the current's {count} run(s)", point)
                print(
                    f"  {metric:<30} {bv:>12.6g} {cv:>12.6g} {'':>8}  REGRESSED ({lost} of {count} missing)", file=out
                )
                continue
            if rule.measured:
                sides = base_samples.get(metric, [bv]), cur_samples.get(metric, [cv])
                if not any(math.isfinite(x) for side in sides for x in side):  # roofline_frac on a CPU: undefined
                    print(f"  {metric:<30} {bv:>12.6g} {cv:>12.6g} {'':>8}  not measured on either side", file=out)
                    continue
                result = judge(*sides, rule, policy.test)
                verdict, detail, best = result.verdict, f" ({result.detail})", ""
                if math.isfinite(result.base) and math.isfinite(result.current):  # the values judged
                    bv, cv = result.base, result.current
                    ratio = cv / bv if bv else ratio
                    # the values shown are each side's best run where a side ran more than once
                    if rule.effect == "best" and max(map(len, sides)) > 1:
                        best, detail = "best runs ", f" (best runs, {result.detail})"
                tally[verdict] = tally.get(verdict, 0) + 1
                tally["tested"] += verdict != NOT_MEANINGFUL
                if verdict == "REGRESSED":
                    problem(
                        f"{label}: {metric} {best}{bv:.6g} -> {cv:.6g}, {result.change:+.1%} the worse way "
                        f"(min_effect {rule.min_effect:.0%}; {result.detail})",
                        point,
                        measured=True,
                    )
            else:
                verdict, detail = rule.verdict(bv, cv), ""
                if rule.tolerance is None and verdict in ("better", "worse"):  # a direction, not a judgement
                    detail = " (reported, not gated)"
                if rule.tolerance is not None and verdict == "new":  # a blank baseline cell gates nothing
                    unjudged.append(metric)
                    detail = " (no baseline value: not judged)"
                if verdict == "REGRESSED":
                    change = f"{cv / bv - 1:+.3%}, " if bv and math.isfinite(cv) else ""
                    problem(
                        f"{label}: {metric} {bv:.6g} -> {cv:.6g} ({change}better: {rule.better}, "
                        f"tolerance {rule.tolerance:g})",
                        point,
                    )
            shown_ratio = f"{ratio:>8.4f}" if abs(ratio) < 1e6 else f"{ratio:>8.3g}"  # not 300 digits
            print(f"  {metric:<30} {bv:>12.6g} {cv:>12.6g} {shown_ratio}  {verdict}{detail}", file=out)
        if scenario == "simulate":  # exact numbers: any that moved is news, judged or not
            skip = {
                *columns,
                *policy.environment,
                *ENVIRONMENT,
                *(c.removesuffix(BASE) for c in point.index if c.startswith(REPORTING)),
            }
            changed = _ungated_changes(point, policy.rules_for(scenario), skip)
            if changed:
                print(f"  not judged by the policy, changed: {', '.join(text for _, text in changed)}", file=out)
                ungated.update(name for name, _ in changed)
    print(file=out)
    if tally["tested"] or tally[NOT_MEANINGFUL]:
        print(
            f"measured metrics: {tally['tested']} tested, {tally.get('REGRESSED', 0)} regressed, "
            f"{tally.get('better', 0)} better, {tally[SMALL]} significant but below min_effect, "
            f"{tally[NO_CHANGE]} {NO_CHANGE}; {tally[NOT_MEANINGFUL]} {NOT_MEANINGFUL} "
            f"(too few samples on a side for the test)",
            file=out,
        )
    if machine_changes:
        print(f"!! compared across machines or builds: {'; '.join(machine_changes)}", file=out)
    if problems:
        print(f"REGRESSION: {len(problems)} problem(s) over {len(matched)} matched point(s):", file=out)
        for line in problems:
            print(f"  {line}", file=out)
        return 1
    measured = ""
    if tally["tested"]:
        measured = (
            f"; measured metrics: {NO_CHANGE}"
            if tally[NO_CHANGE] == tally["tested"]
            else "; no measured metric got significantly worse by its min_effect"
        )
    if tally[NOT_MEANINGFUL]:
        measured += f"; {tally[NOT_MEANINGFUL]} measured metric(s) not tested (too few samples)"
    skipped = f" ({unmeasured} failed in both, not compared)" if unmeasured else ""
    first = lambda names: f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"  # noqa: E731
    if unjudged:
        skipped += (
            f"; {len(unjudged)} gated value(s) not judged, their baseline cell blank "
            f"({first(list(dict.fromkeys(unjudged)))})"
        )
    if ungated:
        skipped += (
            f"; {len(ungated)} column(s) the policy does not judge changed ({first(sorted(ungated))}: "
            f"see 'not judged by the policy')"
        )
    if apart:
        skipped += (
            f" ({apart} took another path, not compared: once this change has landed, "
            f".ci/run --update-baseline makes REF take it too)"
        )
    print(
        f"OK: {len(matched) - unmeasured - apart} point(s) match the baseline within tolerance{measured}{skipped}",
        file=out,
    )
    return 0


@guarded_stdout()  # a console closed early costs the console only
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(
        prog="bench-compare",
        description="Compare a run against a baseline; exit 1 on a regression.",
        epilog="With --against REF the inputs are what to run on both trees: nothing (the hot-path "
        "benchmarks, tests/benchmarks), pytest paths, or bench overrides (scenario=serve ...). A measured "
        "metric flagged there is measured again, in twice --repeats fresh runs a side, and fails only if "
        "the fresh runs show the regression too. Exit codes: 0 nothing regressed; 1 a metric regressed, a "
        "point failed or a baseline point is missing; 2 bad input; 130 interrupted.",
    )
    parser.add_argument(
        "inputs",
        nargs="*",
        help="BASELINE CURRENT: summary.csv, sweep directory or "
        "pytest-benchmark JSON each; with --against, what to run",
    )
    parser.add_argument("--policy", help=f"YAML policy (default: kvbench.conf/{DEFAULT_POLICY})")
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="baseline points absent from the current run are reported, not failed",
    )
    parser.add_argument(
        "--against", metavar="REF", help="measure REF (a git ref) and this tree here, interleaved, and compare them"
    )
    parser.add_argument("--repeats", type=int, help="with --against: runs per side (default 5)")
    parser.add_argument("--out", help="with --against: keep each side's results in this directory (a new one)")
    parser.add_argument(
        "--current-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --against: set an environment variable for this tree's runs only",
    )
    args = parser.parse_args(argv)
    try:
        given = {
            "--repeats": args.repeats is not None,
            "--out": args.out is not None,
            "--current-env": args.current_env,
        }
        ab_only = [flag for flag, value in given.items() if value]
        if args.against is None and ab_only:  # nothing would read them: refused rather than ignored
            raise UserError(
                f"{' and '.join(ab_only)} {'applies' if len(ab_only) == 1 else 'apply'} only with --against REF; "
                f"BASELINE CURRENT are compared as they are"
            )
        policy = load_policy(None if args.policy is None else path_given(args.policy, "--policy", "a policy YAML file"))
        if args.against is not None:
            from kvbench.reporting.ab import run_ab

            if args.out is not None:  # an empty one is the current folder to Path: refused, not taken
                args.out = path_given(args.out, "--out", "a folder to keep each side's results in")

            code = run_ab(
                args.against,
                5 if args.repeats is None else args.repeats,
                args.inputs,
                policy,
                out_dir=args.out,
                current_env=args.current_env,
                allow_missing=args.allow_missing,
            )
        elif len(args.inputs) != 2:
            raise UserError(f"give BASELINE and CURRENT (got {len(args.inputs)} input(s)), or --against REF")
        else:
            base, cur = args.inputs
            sides = read_side(base), read_side(cur)  # each checked on its own first
            benchmarks = ["benchmark" in side for side in sides]  # benchmark_frame's rows
            if benchmarks[0] != benchmarks[1]:
                bench_file, results = (base, cur) if benchmarks[0] else (cur, base)
                raise UserError(
                    f"{bench_file} is a pytest-benchmark JSON file and {results} holds run results: "
                    f"compare two of one kind"
                )
            code = compare(*sides, policy, args.allow_missing, sources=(base, cur))
    except KeyboardInterrupt:  # --against measures for minutes
        exit_interrupted("nothing was compared")
    except Exception as err:  # bad input: one line, exit 2 (exit 1 means a regression)
        if not reportable(err):
            raise
        exit_with(err)
    sys.exit(code)


if __name__ == "__main__":
    main()
