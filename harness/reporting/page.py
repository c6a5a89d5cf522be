"""report.html: one self-contained page that opens with its verdict (each system's capacity at
the latency target and its ratio to the baseline's, the winner at each swept setting and its
margin, why each failed point failed), then the plots embedded as PNG and the table of every
point; and the paper's figures where an experiment drew them."""

from __future__ import annotations

import base64
import html
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import UserError
from kvbench.reporting.capacity import capacity_note
from kvbench.reporting.console import drained_note
from kvbench.reporting.figures import context_title
from kvbench.reporting.inputs import KEY_METRICS
from kvbench.reporting.results import (
    ENVIRONMENT,
    cell_text,
    ok_rows,
    point_labels,
    read_csv,
    varying_keys,
    write_atomic,
)
from kvbench.reporting.winners import (
    DEFAULT_BASELINE,
    DEFAULT_SLO,
    METRIC,
    capacity,
    ranked,
    times,
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
