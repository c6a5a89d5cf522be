"""Turn sweep directories into summary.csv, the comparison plots and a self-contained HTML page.

`bench-report DIR... [--out OUT]` writes into the first directory unless `--out` says otherwise;
a sweep's end (the SweepSummary callback) writes the same three things into the sweep directory.
"""

from __future__ import annotations

import base64
import html
import math
import time
from pathlib import Path
from typing import Optional

from kvbench.errors import ArgumentParser, UserError, exit_with, reportable
from kvbench.reporting.results import ENVIRONMENT, collect, read_csv, write_atomic, write_csv

# The columns a reader looks at first, in this order; the full table is one click away.
KEY_METRICS = [
    "throughput_req_s", "throughput_tok_s", "mean_batch_size", "kv_token_util", "kv_reserved_frac",
    "kv_internal_frag_frac", "kv_external_frag_frac", "normalized_latency_s_per_tok", "ttft_p50_s",
    "tpot_p50_s", "preemptions", "prefix_hit_rate", "cpu_overhead_frac",
    "latency_us_p50", "achieved_gbps", "roofline_frac", "max_abs_err_vs_eager",
]


def load_rows(path: Path) -> list[dict]:
    """A sweep's point rows (fresh from */metrics.csv), a run's metrics.csv, or a summary.csv."""
    path = Path(path)
    if path.is_file():
        try:
            return read_csv(path)
        except (UnicodeDecodeError, ValueError) as err:  # csv.Error is a ValueError too
            raise UserError(f"{path} is not a readable CSV file ({type(err).__name__})") from None
    if not path.is_dir():
        raise UserError(f"{path} {'is not a regular file or a directory' if path.exists() else 'does not exist'}")
    try:
        rows = collect(path)
    except (UnicodeDecodeError, ValueError) as err:
        raise UserError(f"{path}: a */metrics.csv in it is not a readable CSV file ({type(err).__name__})") from None
    for name in ("metrics.csv", "summary.csv"):
        if not rows and (path / name).is_file():
            rows = read_csv(path / name)
    if not rows:
        raise UserError(f"{path} has no results (no */metrics.csv, metrics.csv or summary.csv in it)")
    return rows


def summarize(sweep_dirs, out_dir: Optional[Path] = None) -> list[Path]:
    """Write summary.csv, every plot the rows support and report.html; return the paths."""
    sweep_dirs = [Path(d) for d in ([sweep_dirs] if isinstance(sweep_dirs, (str, Path)) else sweep_dirs)]
    rows = []
    for sweep_dir in sweep_dirs:
        for row in load_rows(sweep_dir):
            rows.append({"sweep": sweep_dir.name, **row} if len(sweep_dirs) > 1 else row)
    from kvbench.reporting.plots import draw_all  # matplotlib takes a second to load; bench-compare needs none of it

    out_dir = Path(out_dir or sweep_dirs[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "summary.csv"
    write_csv(summary, rows)
    plots = draw_all(rows, out_dir)
    page = out_dir / "report.html"
    write_atomic(page, render_html(rows, plots, sweep_dirs))
    return [summary, *plots, page]


def _cell(value) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return html.escape(str(value))
    if math.isfinite(number) and number == int(number) and abs(number) < 1e6:
        return html.escape(str(value))
    return f"{number:.4g}"


def _table(rows: list[dict], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(path.name)}</figcaption></figure>")


STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#212529}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
th,td{border:1px solid #dee2e6;padding:3px 8px;text-align:right;white-space:nowrap}th{background:#f1f3f5}
td:first-child,th:first-child{text-align:left}img{max-width:100%}figure{margin:1.5em 0}
.failed td{background:#fff5f5}"""


def render_html(rows: list[dict], plots: list[Path], sources: list[Path]) -> str:
    from kvbench.reporting.plots import label, varying_keys

    ok = [r for r in rows if r.get("status", "ok") == "ok"]
    failed = [r for r in rows if r.get("status", "ok") != "ok"]
    names = varying_keys(ok) if len(ok) > 1 else []
    point = ["sweep"] if len(sources) > 1 else []
    named = [{**r, "point": label(r, names)} for r in ok]
    metrics = [m for m in KEY_METRICS if any(r.get(m, "") != "" for r in ok)]
    env = [c for c in ENVIRONMENT if any(r.get(c) for r in rows)]
    env_rows = [dict(zip(env, values)) for values in sorted({tuple(r.get(c, "") for c in env) for r in rows})]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>kvbench report</title>",
        f"<style>{STYLE}</style></head><body><h1>kvbench report</h1>",
        f"<p>{len(rows)} point(s) from {', '.join(html.escape(str(s)) for s in sources)}; "
        f"generated {time.strftime('%Y-%m-%d %H:%M:%S')}. Data: <a href='summary.csv'>summary.csv</a>.</p>",
        "<h2>Results</h2>", _table(named, point + ["point"] + metrics) if named else "<p>No point succeeded.</p>",
    ]
    if failed:
        parts += ["<h2>Failed points</h2>",
                  _table(failed, point + [c for c in ("point", "status", "reason") if any(c in r for r in failed)])]
    parts += ["<h2>Plots</h2>", *(_image(p) for p in plots)]
    if env_rows:
        parts += ["<h2>Environment</h2>", _table(env_rows, env)]
    all_columns = list(dict.fromkeys(c for r in rows for c in r))
    parts += ["<details><summary>Every column</summary>", _table(rows, all_columns), "</details>",
              "</body></html>"]
    return "\n".join(parts)


def main(argv: Optional[list[str]] = None) -> None:
    parser = ArgumentParser(
        prog="bench-report", description="Turn sweep directories into summary.csv, plots and report.html.")
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep or run directories (or summary.csv files)")
    parser.add_argument("--out", type=Path, help="where to write (default: the first directory)")
    args = parser.parse_args(argv)
    try:
        if args.out is None and args.dirs[0].is_file():
            raise UserError(f"{args.dirs[0]} is a file: give --out DIR to say where the report goes")
        for path in summarize(args.dirs, args.out):
            print(f"wrote {path}")
    except Exception as err:  # bad input or an unwritable --out: one line, exit 2
        if not reportable(err):
            raise
        exit_with(err)


if __name__ == "__main__":
    main()
