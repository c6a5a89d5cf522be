"""Result tables read and checked: a sweep's points, a run's metrics.csv or a summary.csv, as one
DataFrame, refused with one line where it cannot be what kvbench wrote (no point named, no
metric, a share above 1, a negative time, a point twice, a status other than ok or failed).
bench-report and bench-compare read their inputs through it, and a resumed sweep its finished
points."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import UserError
from kvbench.reporting.results import (
    IDENTITY,
    cell_text,
    collect,
    identity_text,
    read_csv,
)

# The columns a reader looks at first, in this order; every column is one click away.
KEY_METRICS = [
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "mean_batch_size",
    "kv_token_util",
    "kv_reserved_frac",
    "kv_internal_frag_frac",
    "kv_rounding_frac",
    "kv_external_frag_frac",
    "normalized_latency_s_per_tok",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "preemptions",
    "prefix_hit_rate",
    "cpu_overhead_frac",
    "latency_us_p50",
    "paging_overhead",
    "achieved_gbps",
    "roofline_frac",
    "max_abs_err_vs_eager",
]


# A point's status: it ran, or it failed (its reason beside it); a blank one ran
STATUSES = ("ok", "failed")


# No metric kvbench writes is negative; a share computed as 1 - the others may be by a rounding
NEGATIVE_SLACK = -1e-9


# Shares of a whole (docs/metrics.md): never above 1, by more than a rounding
SHARES = frozenset(
    {"kv_token_util", "kv_reserved_frac", "kv_internal_frag_frac", "kv_rounding_frac", "kv_external_frag_frac"}
    | {"prefix_hit_rate", "prefix_hit_rate_radix", "kv_blocks_saved_frac", "cpu_overhead_frac"}
)


# Columns that name a point; an input with none of them holds no results.
POINT_COLUMNS = [*IDENTITY, "block_size", "rate", "batch_spec"]


# the files a run or sweep writes beside its tables
NOT_TABLES = {
    ".yaml": "a run's config (YAML)",
    ".yml": "a run's config (YAML)",
    ".html": "a run's report (HTML)",
    ".jsonl": "a run's per-request log (JSON lines)",
    ".json": "a JSON file (a pytest-benchmark file is bench-compare's input)",
    ".png": "a run's plot",
    ".log": "a run's log",
    ".gz": "a run's profiler trace",
}


def load_rows(path: Path) -> pd.DataFrame:
    """A sweep's point rows (fresh from */metrics.csv), a run's metrics.csv, or a summary.csv."""
    return _load_rows(path)[0]


def _load_rows(path: Path) -> tuple[pd.DataFrame, list[Path]]:
    """load_rows' rows and the files they were read from."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() in NOT_TABLES:  # a run's other files, read as CSV: "line 2: 3 fields"
        raise UserError(
            f"{path} is {NOT_TABLES[path.suffix.lower()]}, not a result table: give a summary.csv or "
            f"metrics.csv, or the sweep or run folder"
        )
    if path.is_file():
        return read_csv(path), [path]
    if not path.is_dir():
        raise UserError(f"{path} {'is not a regular file or a directory' if path.exists() else 'does not exist'}")
    frame, read = collect(path), sorted(path.glob("*/metrics.csv"))
    for name in ("metrics.csv", "summary.csv"):
        if frame.empty and (path / name).is_file():
            frame, read = read_csv(path / name), [path / name]
    if frame.empty and read:  # a header and no row
        raise UserError(f"{read[0]} has no result rows")
    if frame.empty:
        raise UserError(f"{path} has no results (no */metrics.csv, metrics.csv or summary.csv in it)")
    return frame, read


def _listed(names, most: int = 8) -> str:
    names = [str(n) for n in names]
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def check_results(frame: pd.DataFrame, path) -> None:
    """Refuse a table that holds no result rows: none at all, none of the columns that name a
    point, neither a status nor a metric, or a row twice (a table concatenated onto itself)."""
    if frame.empty:
        raise UserError(f"{path} has no result rows (only a header: {_listed(frame.columns)})")
    if not any(c in frame for c in POINT_COLUMNS) and not any("." in str(c) for c in frame.columns):
        raise UserError(
            f"{path} holds no results: none of its columns ({_listed(frame.columns)}) names a point; "
            f"looked for {', '.join(POINT_COLUMNS)} or a swept group.key"
        )
    if "status" not in frame and not any(m in frame for m in KEY_METRICS):
        raise UserError(
            f"{path} holds no results: it has neither a status column nor a result metric "
            f"({_listed(KEY_METRICS, 3)}: docs/metrics.md); its columns: {_listed(frame.columns)}"
        )
    check_statuses(frame, path)
    ran = frame["status"].fillna("ok").astype(str).eq("ok") if "status" in frame else True
    refuse_nameless_rows(frame, path)
    for column in [c for c in frame.columns if c in KEY_METRICS or c in non_negative_metrics()]:
        cells = frame[column]
        numbers, checks = metric_cell_checks(column, cells, ran)
        for bad, why in (
            *checks,
            # the verdict's ratios divide by it: a request takes time, so a point that ran has one > 0
            ((numbers == 0) & ran & (column == "normalized_latency_s_per_tok"), f"{column} of a point that ran is > 0"),
        ):
            if bad.any():
                cell = cells[bad].iloc[0]
                value = repr(cell) if isinstance(cell, str) else cell_text(cell)
                file, row = row_source(frame, path, int(bad.to_numpy().argmax()))
                raise UserError(f"{file}: {column} is {value} in row {row}; {why}")
    refuse_repeated_points(frame, path)


def metric_cell_checks(column: str, cells: pd.Series, ran) -> tuple[pd.Series, list]:
    """A metric column as numbers (a blank cell missing), and what its cells must pass, as (the
    rows that fail, why): a number or blank; not infinite, nor negative, where the point ran.
    bench-report and bench-compare check their inputs' cells alike. A share (SHARES) is at most 1."""
    numbers = pd.to_numeric(cells, errors="coerce")
    blank = cells.isna() | cells.astype(str).str.strip().eq("")
    checks = [
        (numbers.isna() & ~blank, "not a number; a metric cell holds a number, or is blank where the point has none"),
        (np.isinf(numbers) & ran, "a point that ran has no infinite metric (a blank cell: one it has none of)"),
        ((numbers < NEGATIVE_SLACK) & ran, f"{column} is never negative"),
    ]
    if column in SHARES:
        checks.append(((numbers > 1 - NEGATIVE_SLACK) & ran, f"{column} is a share of a whole, at most 1"))
    return numbers, checks


@functools.lru_cache(maxsize=1)
def non_negative_metrics() -> frozenset:
    """Every metric bench-compare's packaged policy knows: none of them is ever negative."""
    from kvbench.reporting.policy import load_policy

    policy = load_policy()
    return frozenset(policy.rules) | frozenset(m for rules in policy.scenario_rules.values() for m in rules)


def refuse_nameless_rows(frame: pd.DataFrame, path) -> None:
    """A point's row that says neither its status nor, for a serving row that ran, its allocator:
    a sweep folder's metrics.csv that bench did not write (merged, it would be a point of blank
    identity), or a row plotted under no name and compared as a point missing and a new one."""
    if "point" in frame and Path(path).is_dir():  # every point bench writes says whether it ran
        statusless = frame["status"].isna() if "status" in frame else pd.Series(True, index=frame.index)
        if statusless.any():
            file, row = row_source(frame, path, int(statusless.to_numpy().argmax()))
            raise UserError(
                f"{file}: row {row} has no status ({' or '.join(STATUSES)}): not a point's result as bench writes it"
            )
    _refuse_allocatorless_rows(frame, path)


def _refuse_allocatorless_rows(frame: pd.DataFrame, path) -> None:
    """A serving row that ran names its allocator: without one, it is no system's point (a report
    would plot it under no name, a comparison would see a point missing and a new one)."""
    if "kv_token_util" not in frame:  # a serving row; a failed point may not have got as far as its allocator
        return
    ran = frame["status"].fillna("ok").astype(str).eq("ok") if "status" in frame else True
    allocator = frame.get("allocator", pd.Series(None, index=frame.index, dtype=object))
    nameless = frame["kv_token_util"].notna() & ran & (allocator.isna() | allocator.astype(str).str.strip().eq(""))
    if nameless.any():
        file, row = row_source(frame, path, int(nameless.to_numpy().argmax()))
        raise UserError(f"{file}: row {row} has serving metrics but no allocator: each row names the one it ran")


def check_statuses(frame: pd.DataFrame, path) -> None:
    if "status" in frame:
        other = frame["status"].dropna().astype(str)
        other = other[~other.isin(STATUSES)]
        if not other.empty:
            file, row = row_source(frame, path, frame.index.get_loc(other.index[0]))
            raise UserError(
                f"{file}: status is {other.iloc[0]!r} in row {row}; a point's status is "
                f"{' or '.join(STATUSES)} (docs/metrics.md)"
            )


def row_source(frame: pd.DataFrame, path, index: int) -> tuple[str, int]:
    """(the file, the row in it) that the frame's row `index` was read from: in a sweep folder,
    its point's metrics.csv (collect's `point` column), which is where a user mends it."""
    points = frame["point"].astype(str).to_numpy() if "point" in frame else None
    source = Path(path) / points[index] / "metrics.csv" if points is not None else None
    if source is not None and source.is_file():  # not a folder of a summary.csv alone
        return str(source), int(index - (points == points[index]).argmax() + 1)
    return str(path), index + 1


def point_keys(frame: pd.DataFrame) -> list[str]:
    """The columns that name a point: its identity, block size, rate, batch and swept keys."""
    return [c for c in ["sweep", *POINT_COLUMNS] if c in frame] + [c for c in frame.columns if "." in str(c)]


def refuse_repeated_points(frame: pd.DataFrame, path) -> None:
    """Two rows of one point (a table appended to itself, a point rerun into a second folder):
    every plot, ratio and winner would take one of them at random."""
    keys = point_keys(frame) or list(frame.columns)
    # A sweep's folders are named by each point's overrides: two of them are two points, set apart
    # by a key no column holds (repeats, a group choice such as executor, a failed point's identity)
    if "point" in frame and frame["point"].astype(str).str.contains("=").all():
        keys = [*keys, "point"]
    if "metric" in frame:  # scenario=validate: a row a metric, each point's rows alike but for it
        keys = [*keys, "metric"]
    texts = identity_text(frame, keys)
    again = texts.duplicated()
    if again.any():
        second = int(again.to_numpy().argmax())
        first = int(texts.eq(texts.iloc[second]).all(axis=1).to_numpy().argmax())
        where = (
            f"its folders {frame['point'].iloc[first]} and {frame['point'].iloc[second]}"
            if "point" in frame
            else f"its rows {first + 1} and {second + 1}"
        )
        named = point_keys(frame)
        label = ", ".join(f"{k}={v}" for k, v in texts.iloc[second].items() if v and k in named)
        raise UserError(
            f"{path} holds two rows of one point ({label or 'the only point'}; {where}): give each point once"
        )


def load_sweeps(sweep_dirs: list[Path]) -> pd.DataFrame:
    """Every point of every directory; with several, a `sweep` column names each one's points."""
    return load_sweeps_and_sources(sweep_dirs)[0]


def load_sweeps_and_sources(sweep_dirs: list[Path]) -> tuple[pd.DataFrame, dict]:
    """load_sweeps' rows, and each file they were read from (resolved) -> the input it came with.
    An input given twice, or two inputs that hold the same file, are refused: their points would
    count twice."""
    loaded, read = [], {}
    for path in sweep_dirs:
        frame, files = _load_rows(path)
        check_results(frame, path)
        for file in map(Path.resolve, files):
            other = read.get(file)
            if other is path:  # two of its point folders are one (a link)
                raise UserError(f"{path} holds {file} twice (a point folder linked to another): give each point once")
            if other is not None:
                raise UserError(
                    f"{path} is given twice (as {other} and {path}): give each input once"
                    if other.resolve() == path.resolve()
                    else f"{other} and {path} both hold {file}: give each input once"
                )
            read[file] = path
        loaded.append(frame)
    folders = {p.resolve(): p for p in sweep_dirs if p.is_dir()}
    for path in sweep_dirs:
        if path.is_file() and path.resolve().parent in folders:
            raise UserError(
                f"{path} is {folders[path.resolve().parent]}'s own table: its points would count twice; "
                f"give the folder or the file"
            )
    if len(sweep_dirs) == 1:
        return loaded[0], read
    # `.` is named by its folder, and so is a summary.csv given as a file
    names = [(d.resolve().parent if d.is_file() else d.resolve()).name or str(d) for d in sweep_dirs]
    if len(set(names)) < len(names):  # results/a/sweep and results/b/sweep
        names = [str(d) for d in sweep_dirs]
    # an input that is itself a report of several sweeps keeps them apart: NAME:its sweep
    frames = [
        frame.assign(sweep=n + ":" + frame["sweep"].astype(str)) if "sweep" in frame else frame.assign(sweep=n)
        for frame, n in zip(loaded, names)
    ]
    return pd.concat(frames, ignore_index=True), read
