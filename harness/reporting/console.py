"""The console summary printed after a run and after a sweep, laid out as `vllm bench` prints its
result: throughput, latency medians and tails, where KV memory went, preemptions."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kvbench.reporting.results import in_paper_order, ok_rows, point_labels, varying_keys

if TYPE_CHECKING:
    import pandas as pd

WIDTH = 56
# (section, [(label, column, format)]); a line whose column a run lacks is left out
RUN_LINES = [
    (
        "",
        [
            ("Successful requests", "completed", "{:.0f}"),
            ("Benchmark duration (s)", "duration_s", "{:.2f}"),
            ("Total input tokens", "total_input_tokens", "{:.0f}"),
            ("Total generated tokens", "total_output_tokens", "{:.0f}"),
            ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
            ("Request goodput (req/s)", "request_goodput", "{:.2f}"),
            ("Output token throughput (tok/s)", "output_throughput", "{:.2f}"),
            ("Total token throughput (tok/s)", "total_token_throughput", "{:.2f}"),
            ("Normalized latency (s/token)", "normalized_latency_s_per_tok", "{:.4f}"),
        ],
    ),
    *[
        (
            title,
            [
                (
                    f"{stat.capitalize() if stat in ('mean', 'median') else stat.upper()} {short} (ms)",
                    f"{stat}_{short.lower()}_ms",
                    "{:.2f}",
                )
                for stat in ("mean", "median", "p99")
            ],
        )
        for title, short in (
            ("Time to First Token", "TTFT"),
            ("Time per Output Token (excl. 1st token)", "TPOT"),
            ("Inter-token Latency", "ITL"),
            ("End-to-end Latency", "E2EL"),
        )
    ],
    (
        "KV cache (time-averaged over the window)",
        [
            ("Token states", "kv_token_util", "{:.1%}"),
            ("Reserved", "kv_reserved_frac", "{:.1%}"),
            ("Internal fragmentation", "kv_internal_frag_frac", "{:.1%}"),
            ("Rounding to blocks or chunks", "kv_rounding_frac", "{:.1%}"),
            ("External fragmentation & free", "kv_external_frag_frac", "{:.1%}"),
            ("Mean batch size (sequences)", "mean_batch_size", "{:.2f}"),
            ("Preemptions", "preemptions", "{:.0f}"),
        ],
    ),
    (
        "Step-time profile (scenario=profile)",
        [
            ("Shapes measured", "profile_shapes", "{:.0f}"),
            ("Shapes skipped", "profile_shapes_skipped", "{:.0f}"),
            ("Profiling time (s)", "profile_s", "{:.1f}"),
            ("Fit", "fit_form", "{}"),
            ("Held-out shapes", "fit_heldout_shapes", "{:.0f}"),
            ("Held-out median error", "fit_heldout_median_err", "{:.1%}"),
            ("Held-out max error", "fit_heldout_max_err", "{:.1%}"),
            ("In-sample median error", "fit_median_err", "{:.1%}"),
        ],
    ),
    (
        "Attention kernel",
        [
            ("Latency p50 (us)", "latency_us_p50", "{:.2f}"),
            ("Achieved bandwidth (GB/s)", "achieved_gbps", "{:.3g}"),  # a CPU's can be 0.0025
            ("Share of the roofline", "roofline_frac", "{:.1%}"),
            ("Paged / contiguous latency", "paging_overhead", "{:.2f}x"),
            ("Max abs error vs eager", "max_abs_err_vs_eager", "{:.2e}"),
        ],
    ),
]
# the sweep table's columns: (header, column, format)
SWEEP_COLUMNS = [
    ("req/s", "request_throughput", "{:.3f}"),
    ("goodput req/s", "request_goodput", "{:.3f}"),  # where report.goodput set SLOs
    ("out tok/s", "output_throughput", "{:.1f}"),
    ("median TTFT ms", "median_ttft_ms", "{:.1f}"),
    ("median TPOT ms", "median_tpot_ms", "{:.2f}"),
    ("s/token", "normalized_latency_s_per_tok", "{:.4f}"),
    ("token states", "kv_token_util", "{:.1%}"),
    ("preemptions", "preemptions", "{:.0f}"),
    ("kernel us p50", "latency_us_p50", "{:.2f}"),
    ("paged/contig", "paging_overhead", "{:.2f}x"),
    ("GB/s", "achieved_gbps", "{:.3g}"),
]


def _value(row, column: str, fmt: str) -> str | None:
    value = row.get(column)
    if fmt == "{}":  # text
        return None if value is None or value == "" or value != value else str(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else fmt.format(number)


def swap_note(label: str, fallbacks: str, preemptions: str) -> str:
    """A run's or a sweep point's preemptions by swap that found the swap pool full."""
    return (
        f"swap pool full: {label}{fallbacks} of {preemptions} preemptions recomputed instead "
        f"(engine.swap_space_bytes; serve: scenario.swap_space_tokens)"
    )


def run_table(row: dict) -> str:
    """One run's result, one line per headline number."""
    scenario = row.get("scenario")
    where = "hardware" if scenario == "simulate" else "device"
    if row.get("executor") == "calibrated" and row.get("executor_device"):  # its steps are that device's
        where = "executor_device"
    if scenario == "kernel":  # a backend timed on one batch: no workload
        named = ("scenario", "backend", "allocator", "model", where, "batch_spec")
    else:
        named = ("scenario", "allocator", "model", where, "workload")
    title = " · ".join(str(row[k]) for k in named if row.get(k))
    lines = [f"== kvbench result: {title} ==".center(WIDTH, "=")]
    for section, specs in RUN_LINES:
        shown = [(label, text) for label, column, fmt in specs if (text := _value(row, column, fmt)) is not None]
        if shown and section:
            lines.append(f" {section} ".center(WIDTH, "-"))
        lines += [f"{label + ':':<40}{text:>{WIDTH - 40}}" for label, text in shown]
    lines.append("=" * WIDTH)
    spread = _spread(row)
    if spread:
        lines.append(spread)
    if row.get("interpreted") in (True, "True"):  # serve logs it; a kernel's console said nothing
        lines.append("interpreted: Triton's interpreter ran the kernels (TRITON_INTERPRET=1): times are not a GPU's")
    fallbacks = _value(row, "swap_fallbacks", "{:.0f}")
    if fallbacks not in (None, "0"):
        lines.append(swap_note("", fallbacks, _value(row, "preemptions", "{:.0f}")) + ": raise it to swap them all")
    note = layout_note(row)
    if note:
        lines.append(note)
    if scenario == "profile" and row.get("profile"):  # what executor=calibrated reads
        lines.append(f"profile: {row['profile']} (bench executor=calibrated executor.profile=PATH)")
    return "\n".join(lines)


def _spread(row) -> str | None:
    """A repeated run's range of each headline number the table shows as its median: one run of
    a kernel on a busy host can read half or twice its neighbour's time."""
    from kvbench.errors import UserError
    from kvbench.scenarios.repeats import KV_SHARES, SAMPLES, samples_of  # a repeated run's only

    try:
        samples = samples_of(row.get(SAMPLES))
    except UserError:
        return None
    shown = [
        f"{label} {fmt.format(min(runs))} - {fmt.format(max(runs))}"
        for _, specs in RUN_LINES
        for label, column, fmt in specs
        if fmt != "{}" and len(runs := [x for x in samples.get(column, []) if x == x]) > 1 and min(runs) < max(runs)
    ]
    if not shown:
        return None
    count = max(len(v) for v in samples.values())
    shares = " (its KV shares: the median run's, or the middle two's mean)" if KV_SHARES[0] in row else ""
    return f"the table shows the runs' medians{shares}; over the {count} runs (lowest - highest): " + "; ".join(shown)


DRAINED = (
    "the batch draining: mean_batch_size and the kv_* shares describe that drain, not a steady state (give more "
    "requests: workload.num_requests or workload.duration_s; or measure.warmup_frac=0)"
)


def drained_note(frame: pd.DataFrame) -> str | None:
    """A note naming the points whose measurement window was their batch draining (every request
    admitted within the warm-up: a run too short for its rate), whose mean batch and KV shares
    describe that drain, not a steady state: beside other points, they read as a system that
    used its memory worse under more load."""
    if "window_drained" not in frame:
        return None
    drained = frame["window_drained"].astype(str).str.strip().str.lower().eq("true")
    if not drained.any():
        return None
    names = point_labels(frame, varying_keys(frame) if len(frame) > 1 else [])[drained]
    listed = "; ".join(names.head(6)) + (f"; and {len(names) - 6} more" if len(names) > 6 else "")  # a name has commas
    return f"{len(names)} point(s) admitted every request within the warm-up ({listed}): their window is {DRAINED}"


def layout_note(row) -> str | None:
    """A line where a calibrated run's profile timed another KV layout than its allocator keeps."""
    profiled, layout = row.get("executor_profile_layout"), row.get("kv_layout")
    if not (isinstance(profiled, str) and isinstance(layout, str) and profiled and layout and profiled != layout):
        return None
    return (
        f"profile: its steps were timed with the {profiled} KV layout, this run's allocator keeps the {layout} "
        f"one (a backend times the two apart: 17 % with eager on a CPU): profile with this allocator for "
        f"its own step times"
    )


def validation_table(rows, points: bool = False) -> str:
    """scenario=validate's rows, one a metric: the served runs' mean beside the calibrated
    simulator's, its error and the served runs' own spread (validation.md has every column);
    with `points`, a sweep's, each line named by its point."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    number = lambda column: pd.to_numeric(frame[column], errors="coerce")
    mean = lambda side: frame.filter(regex=rf"^{side}_\d+$").apply(pd.to_numeric, errors="coerce").mean(axis=1)
    table = pd.DataFrame({"point": point_labels(frame)} if points else {}, index=frame.index)
    table["metric"] = frame["column"] if "column" in frame else frame["metric"]  # vLLM's names carry the unit
    table["measured"] = mean("measured").map("{:.4g}".format)
    table["simulated"] = mean("simulated").map("{:.4g}".format)
    table["error"] = number("rel_error").map("{:+.1%}".format)
    table["spread"] = number("measured_spread").map(lambda x: "n/a" if x != x else f"{x:.1%}")  # n/a: one run
    body = table.to_string(index=False, justify="right")
    first = frame.iloc[0]
    named = [str(first[k]) for k in ("allocator", "model", "device", "workload") if k in first and first[k] == first[k]]
    head = f" kvbench validation: the calibrated simulator against serve · {' · '.join(named)} "
    rule = "=" * max(WIDTH, len(body.splitlines()[0]), len(head) + 4)
    layouts = frame.reindex(columns=["executor_profile_layout", "kv_layout"]).drop_duplicates()
    notes = [layout_note(row) for _, row in layouts.iterrows()]
    return "\n".join([head.center(len(rule), "="), body, rule, *filter(None, notes)])


def sweep_table(frame: pd.DataFrame, slo: float | None = None, baseline: str | None = None) -> str:
    """Every point of a sweep, one line each, systems in the paper's order; with `slo`, each
    system's capacity at that latency target below it, where points measured normalized latency."""
    import pandas as pd  # a single run's summary needs neither pandas nor the capacity code

    from kvbench.reporting.capacity import capacity_note
    from kvbench.reporting.winners import METRIC, capacity, times

    if "metric" in frame and "scenario" in frame and (frame["scenario"] == "validate").all():  # a line a metric
        return validation_table(ok_rows(frame), points=True)
    frame = in_paper_order(frame)
    table = pd.DataFrame({"point": point_labels(frame)})
    if "status" in frame:
        table["status"] = frame["status"].fillna("ok")
    ok = ok_rows(frame)
    for header, column, fmt in SWEEP_COLUMNS:
        if column in ok and ok[column].notna().any():
            table[header] = [_value(row, column, fmt) or "" for _, row in frame.iterrows()]
    body = table.to_string(index=False, justify="right")
    rule = "=" * max(WIDTH, len(body.splitlines()[0]))
    lines = [f" kvbench sweep: {len(frame)} point(s) ".center(len(rule), "="), body, rule]
    if "swap_fallbacks" in ok:  # a preemption by swap that found the swap pool full recomputed
        full = ok[pd.to_numeric(ok["swap_fallbacks"], errors="coerce").fillna(0) > 0]
        for label, row in zip(point_labels(full, varying_keys(frame)), full.itertuples()):
            lines.append(swap_note(f"{label}: ", f"{row.swap_fallbacks:.0f}", f"{row.preemptions:.0f}"))
    lines += filter(None, [drained_note(frame)])
    if slo is not None and METRIC in frame and frame[METRIC].notna().any():  # no kernel's or profile's
        found, unplaced = capacity(frame, slo, baseline)
        lines.append(f" capacity at {slo:g} s/token (req/s) ".center(len(rule), "-"))
        for row in found.itertuples():
            ratio = getattr(row, "ratio_to_baseline", float("nan"))
            name = ", ".join(filter(None, [row.setting, row.allocator]))
            against = f"  {times(ratio)}x {baseline}" if ratio == ratio else ""
            note = capacity_note(row)
            lines.append(f"{name:<32}{row.capacity_req_s:>8.3g}  (between {row.between_req_s}{note}){against}")
        lines += [f"none: {line}" for line in unplaced]
        lines.append(rule)
    return "\n".join(lines)
