"""Turn sweep directories into summary.csv, the comparison plots and a self-contained HTML page.

`bench-report DIR... [--out OUT] [--baseline NAME]` writes into the first directory unless
`--out` says otherwise; a sweep's end (the SweepSummary callback) writes the same three things
into the sweep directory. The tables are read and checked by kvbench.reporting.inputs, the page
drawn by kvbench.reporting.page.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvbench.errors import ArgumentParser, UserError, exit_with, guarded_stdout, reportable
from kvbench.reporting.inputs import load_sweeps_and_sources, point_keys
from kvbench.reporting.page import render_html
from kvbench.reporting.results import (
    identity_text,
    in_paper_order,
    path_given,
    read_csv,
    write_atomic,
    write_csv,
)
from kvbench.reporting.winners import (
    verdict_settings,
)

# What bench-report writes into its output directory: none of them may be one of its inputs.
WRITTEN = ("summary.csv", "report.html")
# The plots a report may draw (plots.draw_all); one this report does not draw is an earlier one's
PLOTS = ("kv_breakdown.png", "throughput_latency.png", "latency_vs_rate.png", "latency_vs_context.png")


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
    frame, read = load_sweeps_and_sources(sweep_dirs)
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
