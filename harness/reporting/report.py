"""Turn sweep directories into summary.csv, the comparison plots and a self-contained HTML page.

`bench-report DIR... [--out OUT] [--baseline NAME]` writes into the first directory unless
`--out` says otherwise; a sweep's end (the SweepSummary callback) writes the same three things
into the sweep directory. The page opens with its verdict: each system's capacity at the latency
target and its ratio to the baseline allocator's, the winner at each swept setting and its
margin over the baseline, and why each failed point failed.
"""

from __future__ import annotations

import base64
import functools
import html
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import ArgumentParser, UserError, exit_with, guarded_stdout, reportable
from kvbench.reporting.capacity import capacity_note
from kvbench.reporting.console import drained_note
from kvbench.reporting.figures import context_title
from kvbench.reporting.results import (
    ENVIRONMENT,
    IDENTITY,
    cell_text,
    collect,
    identity_text,
    in_paper_order,
    ok_rows,
    path_given,
    point_labels,
    read_csv,
    varying_keys,
    write_atomic,
    write_csv,
)
from kvbench.reporting.winners import (
    DEFAULT_BASELINE,
    DEFAULT_SLO,
    METRIC,
    capacity,
    ranked,
    times,
    verdict_settings,
    winners,
)
from kvbench.scenarios.repeats import MEASURED

# A baseline whose requests wait on average more than this share of the span they arrived over
# for their first token, and at least SATURATED_WAIT_S, has a queue that grew through the run:
# its latency grows with the run's length. (A server that keeps up starts a request within a
# step or a few; completing less than the offered rate is no sign of it: a short run's drain
# after its last arrival does that too. Below these bounds the note says nothing, a queue that
# grew slowly included.)
SATURATED_WAIT = 0.1
SATURATED_WAIT_S = 1.0

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
# What bench-report writes into its output directory: none of them may be one of its inputs.
WRITTEN = ("summary.csv", "report.html")
# The plots a report may draw (plots.draw_all); one this report does not draw is an earlier one's
PLOTS = ("kv_breakdown.png", "throughput_latency.png", "latency_vs_rate.png", "latency_vs_context.png")


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
    return _load_sweeps(sweep_dirs)[0]


def _load_sweeps(sweep_dirs: list[Path]) -> tuple[pd.DataFrame, dict]:
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


def summarize(
    sweep_dirs, out_dir: Path | None = None, baseline: str | None = None, slo: float | None = None, plots: bool = True
) -> list[Path]:
    """Write summary.csv, every plot the rows support (unless `plots` is False) and report.html;
    return the paths. `baseline` (an allocator) and `slo` (s/token) default to the first sweep's
    report.baseline and report.slo_s_per_token."""
    return _summarize(sweep_dirs, out_dir, baseline, slo, plots)[0]


def _summarize(sweep_dirs, out_dir, baseline, slo, plots) -> tuple[list[Path], pd.DataFrame, str | None, float]:
    """summarize's files, and what they were made from: the rows (the paper's order), the
    baseline and the latency target."""
    sweep_dirs = [Path(d) for d in ([sweep_dirs] if isinstance(sweep_dirs, (str, Path)) else sweep_dirs)]
    frame, read = _load_sweeps(sweep_dirs)
    frame = in_paper_order(frame)
    chosen, asked, slo = verdict_settings(frame, sweep_dirs[0], baseline, slo)
    out_dir = Path(out_dir or sweep_dirs[0])
    summary = out_dir / "summary.csv"
    for file, source in read.items():
        if file.parent == out_dir.resolve() and (file.name in WRITTEN or file.suffix == ".png"):
            if len(sweep_dirs) == 1 and file.name == "summary.csv":  # it holds these very rows: kept as it is
                continue
            raise UserError(
                f"{file.name} in {out_dir} is an input ({source}'s points), which the report would replace: "
                f"give --out DIR to write it elsewhere"
            )
    inputs = {d.resolve() for d in sweep_dirs}
    if out_dir.resolve() not in inputs and any(out_dir.glob("*/metrics.csv")):
        raise UserError(
            f"--out {out_dir} holds another sweep's points (*/metrics.csv): its summary.csv and report "
            f"would describe other points; give a new or empty folder"
        )
    if out_dir.resolve() not in inputs and summary.is_file() and _points_of(summary) != _points_of(frame):
        raise UserError(
            f"--out {out_dir} holds a summary.csv of other points, which the report would replace: give a new "
            f"or empty folder"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if summary.resolve() not in read:
        write_csv(summary, frame)
        written.append(summary)
    drawn = []
    if plots:
        from kvbench.reporting.plots import draw_all  # matplotlib takes a second; bench-compare needs none

        drawn = draw_all(frame, out_dir, slo)
        for stale in set(PLOTS) - {path.name for path in drawn}:  # an earlier report's, of other points
            (out_dir / stale).unlink(missing_ok=True)
    page = out_dir / "report.html"
    notes = [note for note in map(missing_points, sweep_dirs) if note] + mixed_scenarios(frame)
    write_atomic(page, render_html(frame, drawn, sweep_dirs, chosen, asked, slo, notes))
    return [*written, *drawn, page], frame, chosen, slo


def listed_points(sweep_dir: Path) -> int | None:
    """How many points a sweep folder's multirun.yaml lists (its sweeper's params, the command
    line's overrides winning, as Hydra's basic sweeper combines them); None where that cannot be
    told (no multirun.yaml, a glob() sweep, another sweeper)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    try:
        hydra_cfg = OmegaConf.load(Path(sweep_dir) / "multirun.yaml").hydra
        if "basic_sweeper" not in str(hydra_cfg.sweeper.get("_target_", "")):
            return None
        task = [str(o) for o in hydra_cfg.overrides.task]
        given = {o.split("=", 1)[0] for o in task}
        params = [f"{k}={v}" for k, v in (hydra_cfg.sweeper.params or {}).items() if k not in given]
        count = 1
        for override in OverridesParser.create().parse_overrides([*params, *task]):
            if override.is_sweep_override():
                count *= len(list(override.sweep_string_iterator()))
        return count
    except Exception:  # noqa: BLE001 (a file of another version or a sweep it cannot count: say nothing)
        return None


def mixed_scenarios(frame: pd.DataFrame) -> list[str]:
    """A line where kernel points (one attention call timed) sit beside runs that served a
    workload: the two share no metric, so each table column and plot holds one kind only."""
    scenarios = set(frame["scenario"].dropna().astype(str)) if "scenario" in frame else set()
    if "kernel" not in scenarios or not scenarios - {"kernel"}:
        return []
    return [
        f"These inputs mix kernel points (one attention call timed: latency, bandwidth) with "
        f"{', '.join(sorted(scenarios - {'kernel'}))} runs (a workload served): they share no metric, so the "
        f"verdict and the throughput plots are the runs' alone and the latency-against-context plot the kernels'."
    ]


def missing_points(sweep_dir: Path) -> str | None:
    """A line for a sweep folder whose multirun.yaml lists more points than hold a result (an
    interrupted sweep's): which, and how to finish it. None where nothing is missing."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return None
    listed, found = listed_points(sweep_dir), len(list(sweep_dir.glob("*/metrics.csv")))
    if listed is None or found >= listed:
        return None
    return (
        f"{sweep_dir}'s sweep lists {listed} points and {found} {'has' if found == 1 else 'have'} a result: the others "
        f"were interrupted or "
        f"never ran, and this report leaves them out (the sweep's command with hydra.sweep.dir={sweep_dir} "
        f"runs only them)"
    )


def _points_of(table: pd.DataFrame | Path) -> set | None:
    """The points a table (or a summary.csv) holds, as text; None for a file that holds none."""
    try:
        frame = read_csv(table) if isinstance(table, Path) else table
    except UserError:
        return None
    keys = [k for k in point_keys(frame) if k != "sweep"]
    return set(identity_text(frame, keys).itertuples(index=False))


def end_of_sweep(sweep_dir: Path, plots: bool) -> dict:
    """What a sweep leaves when it ends (callbacks.SweepSummary): summary.csv, its plots (unless
    `plots` is False) and report.html written (`written`); the console table (`table`); its
    number of rows (`rows`) and its failed points as [point, reason], in the order the points
    ran (`failed`). Plain values, as the helper sends them back (kvbench.launch)."""
    from kvbench.reporting.console import sweep_table

    written, rows, baseline, slo = _summarize(sweep_dir, None, None, None, plots)
    failed = rows[rows["status"] == "failed"].sort_index() if "status" in rows else rows.iloc[:0]
    return {
        "written": [str(path) for path in written],
        "table": sweep_table(rows, slo, baseline),
        "rows": len(rows),
        "failed": [[str(row.point), str(row.reason)] for row in failed.itertuples()],
    }


def _cell(value) -> str:
    if isinstance(value, (float, np.floating)) and np.isfinite(value) and value != int(value):
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return cell_text(value)


def _reason(value) -> str:
    text = cell_text(value).strip()
    return text.splitlines()[0] if text else "no reason recorded"


def _table(frame: pd.DataFrame, columns: list[str], failed: pd.Series | None = None) -> str:
    """A pandas Styler table in a box that scrolls sideways; `failed` rows get class `failed`.
    Headers break after underscores, so long metric names do not widen their columns."""
    styler = frame[columns].rename(columns=lambda c: html.escape(c).replace("_", "_<wbr>")).style
    styler.hide(axis="index").format(_cell, na_rep="", escape="html")
    if "reason" in columns:  # prose: read from the left, its header over it, wrapped
        at = columns.index("reason")
        styler.set_table_styles([{"selector": f"th.col{at},td.col{at}", "props": "text-align:left"}])
    if failed is not None:
        classes = pd.DataFrame("", index=frame.index, columns=styler.columns)
        classes[failed.to_numpy()] = "failed"
        styler.set_td_classes(classes)
    return f"<div class='scroll'>{styler.to_html()}</div>"


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(path.name)}</figcaption></figure>"
    )


STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1340px;padding:0 1em;color:#212529}
.scroll{max-width:100%;overflow-x:auto;border:1px solid #dee2e6;margin:1em 0}
table{border-collapse:separate;border-spacing:0;font-size:13px}
th,td{border-bottom:1px solid #dee2e6;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f1f3f5;white-space:normal;vertical-align:bottom;min-width:4em}
th:first-child,td:first-child{position:sticky;left:0;z-index:1;text-align:left;background:#fff;
border-right:1px solid #ced4da}th:first-child{background:#f1f3f5}
td.failed{background:#fff5f5;color:#c92a2a}td.failed:last-child{white-space:normal;min-width:24em;text-align:left}
img{max-width:100%}figure{margin:1.5em 0}.verdict{font-size:15px}.verdict li{margin:.2em 0}
.note{background:#fff9db;border-left:4px solid #f08c00;padding:.5em 1em}"""


def _capacity(frame: pd.DataFrame, baseline: str | None, slo: float) -> list[str]:
    if METRIC not in frame or frame[METRIC].isna().all():  # a kernel's or profile's sweep: no latency target
        return []
    found, unplaced = capacity(frame, slo, baseline)
    target = f"capacity at {slo:g} s/token (report.slo_s_per_token)"
    if found.empty and len(unplaced) == 1:
        return [f"<p>No {target}: {html.escape(unplaced[0])}.</p>"]
    against = f"; ratios against <b>{html.escape(baseline)}</b>" if "ratio_to_baseline" in found else ""
    parts = [
        f"<p>Capacity = the highest request rate a system serves within {slo:g} s/token of normalized "
        f"latency, interpolated in log latency between the two swept rates that bracket it (a finer sweep "
        f"there pins it down){against}.</p><ul>"
    ]
    for row in found.itertuples():
        ratio = getattr(row, "ratio_to_baseline", float("nan"))
        of = f", {times(ratio)}× {html.escape(baseline)}'s" if ratio == ratio else ""
        parts.append(
            f"<li><b>{html.escape(', '.join(filter(None, [row.setting, row.allocator])))}</b>: "
            f"{row.capacity_req_s:.3g} req/s{of} <small>(between the swept {row.between_req_s} req/s"
            f"{html.escape(capacity_note(row))})</small></li>"
        )
    parts += [f"<li>no {target}: {html.escape(line)}</li>" for line in unplaced]
    return parts + ["</ul>"]


def _single_measurements(frame: pd.DataFrame) -> list[str]:
    """A note where the winners come from wall-clock points measured once each: a margin of a
    few tens of percent is then within what the host's load alone moves."""
    points = ranked(frame)
    measured = points[points["scenario"].astype(str).isin(MEASURED)] if "scenario" in points else points.iloc[0:0]
    repeats = pd.to_numeric(measured.get("repeats", pd.Series(1, index=measured.index)), errors="coerce")
    once = repeats.fillna(1) <= 1
    if not once.any():
        return []
    return [
        f"<p class='note'>{len(measured)} point(s) here are wall-clock measurements (scenario="
        f"{html.escape(', '.join(measured['scenario'].astype(str).unique()))}), "
        f"{'each' if once.all() else 'some'} run once: on a busy or shared host the same "
        f"code moves by tens of percent from run to run, so a margin of that size is not a finding. "
        f"repeats=5 gives each point's median and spread, and bench-compare tests a difference.</p>"
    ]


def _best_settings(frame: pd.DataFrame) -> list[str]:
    """A sweep of one system over its own settings (`allocator.block_size=8,16,32`): at each
    rate, the setting of lowest normalized latency and how much higher the highest is."""
    ok = ranked(frame)
    keys = [k for k in varying_keys(frame) if k not in ("allocator", "rate")]
    if not keys:
        return []
    items = []
    for rate, rows in ok.groupby("rate", sort=True) if "rate" in ok else [(None, ok)]:
        if len(rows) < 2:
            continue
        names = point_labels(rows, keys)
        low, high = rows[METRIC].idxmin(), rows[METRIC].idxmax()
        at = "" if rate is None or ok.get("rate", pd.Series()).nunique() < 2 else f"rate={rate:g}: "
        items.append(
            f"<li>{at}<b>{html.escape(names[low])}</b> ({rows[METRIC][low]:.4g} s/token), "
            f"{times(rows[METRIC][high] / rows[METRIC][low])}× lower normalized latency than "
            f"{html.escape(names[high])}</li>"
        )
    return items


def _verdict(frame: pd.DataFrame, baseline: str | None, asked: str, slo: float) -> list[str]:
    parts = ["<h2>Verdict</h2><div class='verdict'>", *_capacity(frame, baseline, slo)]
    found = winners(frame, baseline)
    if found.empty:
        parts.append("<p>No point measured normalized latency, so there is no winner to name.</p>")
    elif baseline is None:
        only = html.escape(", ".join(found["winner"].unique()))
        best = _best_settings(frame)
        said = "; its settings by normalized latency:" if best else ": nothing to compare."
        parts.append(f"<p>One system only ({only}){said}</p>")
        if best:
            parts += ["<ul>", *best, "</ul>"]
    else:
        note = "" if baseline == asked else f" (report.baseline={html.escape(asked)} is not in the sweep)"
        parts.append(
            f"<p>Winner = lowest normalized latency (s/token) at each setting; ratios against "
            f"<b>{html.escape(baseline)}</b>{note}.</p><ul>"
        )
        for row in found.itertuples():
            name = html.escape(row.baseline or baseline)
            if not row.baseline:  # a sweep of one system, among others
                margin = "the only system of its sweep"
            elif row.baseline_state != "ok":
                margin = f"{name} {'has no successful point' if row.baseline_state == 'failed' else 'did not run'} here"
            elif row.baseline in row.winner.split(" = "):
                margin = f"the baseline, {name}, {'wins' if row.winner == row.baseline else 'shares the win'} here"
            else:
                margin = f"{times(row.latency_vs_baseline)}× lower normalized latency than {name}"
                if row.throughput_vs_baseline == row.throughput_vs_baseline:  # a blank cell: no ratio to give
                    margin += f", {times(row.throughput_vs_baseline)}× its request throughput"
                if row.baseline != baseline:
                    margin += f" ({html.escape(baseline)} is not in this sweep)"
                span, wait = row.arrival_span_s, row.baseline_wait_s
                if span == 0 and wait == wait:  # rate=inf: every request arrived at once
                    margin += (
                        f" (every request arrived at once: the waits of {name}'s, {wait:.3g} s on average for a first "
                        f"token, and so this ratio, grow with their number)"
                    )
                elif 0 < span < math.inf and wait > max(SATURATED_WAIT * span, SATURATED_WAIT_S):
                    seconds = lambda s: f"{s:,.0f}" if s >= 100 else f"{s:.3g}"  # 2,311 s, not 2.31e+03
                    margin += (
                        f" ({name}'s requests waited {seconds(wait)} s on average for a first token, {wait / span:.0%} "
                        f"of the {seconds(span)} s they arrived over: its queue grew through the run, so its latency, "
                        f"and this ratio, grow with the run's length)"
                    )
            parts.append(
                f"<li><b>{html.escape(row.setting)}</b>: <b>{html.escape(row.winner)}</b> "
                f"({getattr(row, METRIC):.4g} s/token); {margin}</li>"
            )
        parts.append("</ul>")
        parts += _single_measurements(frame)
    failed = frame[frame["status"].fillna("ok") != "ok"] if "status" in frame else frame.iloc[0:0]
    if len(failed):
        names = point_labels(frame).loc[failed.index]
        parts.append(f"<p>{len(failed)} point(s) failed:</p><ul>")
        parts += [
            f"<li><b>{html.escape(names[i])}</b>: {html.escape(_reason(failed.get('reason', {}).get(i)))}</li>"
            for i in failed.index
        ]
        parts.append("</ul>")
    return parts + ["</div>"]


def render_html(
    frame: pd.DataFrame,
    plots: list[Path],
    sources: list[Path],
    baseline: str | None = None,
    asked: str = DEFAULT_BASELINE,
    slo: float = DEFAULT_SLO,
    notes: list[str] | None = None,
) -> str:
    ok = ok_rows(frame)
    status = frame["status"].fillna("ok") if "status" in frame else pd.Series("ok", index=frame.index)
    folder = "directory" if "directory" not in frame else "point folder"  # a column of the input's own
    named = frame.rename(columns={"point": folder}).assign(
        point=point_labels(frame, varying_keys(frame) if len(frame) > 1 else []),
        reason=frame["reason"].map(_reason).where(status != "ok", "") if "reason" in frame else "",
    )
    metrics = [m for m in KEY_METRICS if m in ok and ok[m].notna().any()]
    failed = status != "ok"
    columns = ["point", *(["status"] if failed.any() else []), *metrics, *(["reason"] if failed.any() else [])]
    env = [c for c in ENVIRONMENT if c in frame and frame[c].notna().any()]
    title = context_title(frame)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>kvbench report: {html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>kvbench report: {html.escape(title)}</h1>",
        f"<p>{len(frame)} point(s) from {', '.join(html.escape(str(s)) for s in sources)}; "
        f"generated {time.strftime('%Y-%m-%d %H:%M:%S')}. Data: <a href='summary.csv'>summary.csv</a>; "
        f"column definitions: docs/metrics.md.</p>",
        *(f"<p class='note'>{html.escape(note)}</p>" for note in [*(notes or []), drained_note(frame)] if note),
        *_verdict(frame, baseline, asked, slo),
        *([paper_section(sources[0])] if len(sources) == 1 and Path(sources[0]).is_dir() else []),
        "<h2>Results</h2>",
        _table(named, columns, failed),
        "<h2>Plots</h2>",
        *(_image(p) for p in plots),
    ]
    if not plots:  # a heading over nothing read as a page that failed to load its images
        parts.append("<p>No point ran, so there is nothing to plot.</p>" if ok.empty else "<p>No plots drawn.</p>")
    if env:
        merged = "sweep" in frame and frame["sweep"].nunique() > 1  # which sweep ran where, and on what code
        shown = ["sweep", *env] if merged else env
        parts += ["<h2>Environment</h2>", _table(frame[shown].drop_duplicates(), shown)]
        if "git_sha" in frame and frame["git_sha"].dropna().nunique() > 1:
            parts.append(
                "<p class='note'>These points ran different code (git_sha): a difference between them may be "
                "the code's, not the settings'.</p>"
            )
    every = list(dict.fromkeys(["point", *named.columns]))
    parts += ["<details><summary>Every column</summary>", _table(named, every, failed), "</details>", "</body></html>"]
    return "\n".join(parts)


# an experiment's figure beside its paper_comparison.csv (kvbench.reporting.paper_plots)
PAPER_FIGURES = ("fig2_breakdown.png", "fig12_latency.png", "fig14_15_sharing.png")
PAPER_HEADING = "<h2>Against the paper</h2>"


def paper_section(folder: Path) -> str:
    """An experiment sweep's comparison with the paper, where its folder holds one
    (paper_comparison.csv and the figure it drew): the table and the figure; "" where none."""
    table = Path(folder) / "paper_comparison.csv"
    if not table.is_file():
        return ""
    try:
        frame = read_csv(table)
    except UserError:  # a comparison file cut short: the report goes on without it
        return ""
    figures = [Path(folder) / name for name in PAPER_FIGURES if (Path(folder) / name).is_file()]
    note = "<p>kvbench's numbers beside the paper's (paper_comparison.md; docs/paper.md says how each is taken).</p>"
    return "\n".join([PAPER_HEADING, note, _table(frame, list(frame.columns)), *map(_image, figures)])


def add_paper_section(folder: Path) -> None:
    """Put the paper comparison an experiment wrote after its report into that report.html
    (replacing an earlier one), above its results."""
    page = Path(folder) / "report.html"
    section = paper_section(folder)
    if not page.is_file() or not section:
        return
    text = page.read_text(encoding="utf-8")
    if PAPER_HEADING in text:  # an earlier comparison's, up to the results
        start = text.index(PAPER_HEADING)
        text = text[:start] + text[text.index("<h2>Results</h2>", start) :]
    at = text.index("<h2>Results</h2>")
    write_atomic(page, text[:at] + section + "\n" + text[at:])


REPORT_OPTIONS = "give options: --baseline NAME, --slo S_PER_TOKEN, --out DIR (bench-report --help)"


@guarded_stdout()  # a console closed early costs the console only
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(
        prog="bench-report", description="Turn sweep directories into summary.csv, plots and report.html."
    )
    parser.add_argument("dirs", nargs="+", help="sweep or run directories (or summary.csv files)")
    parser.add_argument("--out", help="where to write (default: the first directory)")
    parser.add_argument(
        "--baseline",
        help="the allocator the verdict's ratios are taken against "
        "(default: the first sweep's report.baseline, else contiguous)",
    )
    parser.add_argument(
        "--slo",
        type=float,
        help="the normalized latency target (s/token) of each system's capacity "
        "(default: the first sweep's report.slo_s_per_token, else 0.5)",
    )
    args = parser.parse_args(argv)
    try:
        args.dirs = [
            path_given(d, "an input", "a sweep or run folder or a summary.csv", REPORT_OPTIONS) for d in args.dirs
        ]
        args.out = None if args.out is None else path_given(args.out, "--out", "a folder to write into")
        if args.out is None and args.dirs[0].is_file():
            raise UserError(f"{args.dirs[0]} is a file: give --out DIR to say where the report goes")
        if args.baseline is not None and not args.baseline.strip():
            raise UserError("--baseline is empty: name an allocator of the sweep (e.g. --baseline contiguous)")
        from kvbench.schema.groups import SLO_MAX_S

        if args.slo is not None and not 0 < args.slo <= SLO_MAX_S:  # as report.slo_s_per_token is bounded
            raise UserError(f"--slo {args.slo:g} must be a number > 0 and <= {SLO_MAX_S:g} (seconds per output token)")
        for path in summarize(args.dirs, args.out, args.baseline, args.slo):
            print(f"wrote {path}")
        for note in filter(None, map(missing_points, args.dirs)):
            print(f"note: {note}")
        if args.out is None and len(args.dirs) > 1:
            print(
                f"{args.dirs[0]} now holds the comparison of all {len(args.dirs)} inputs (its points are "
                f"untouched): `bench-report {args.dirs[0]}` writes its own report again, --out DIR puts "
                f"a comparison elsewhere"
            )
    except Exception as err:  # bad input or an unwritable --out: one line, exit 2
        if not reportable(err):
            raise
        exit_with(err)


if __name__ == "__main__":
    main()
