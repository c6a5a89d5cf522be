"""Repeated measurement of one point: each metric's median, and every repeat's value as samples.

Wall-clock metrics (serve, kernel) vary from run to run on a shared host, so one number cannot
say whether a change moved them. A point run `repeats=N` times keeps all N values of every
numeric metric in its `samples` column (JSON, metric -> list), which bench-compare's
significance test reads; the metric's own column holds the median of the N. Simulated points
are exact for a seed, so they run once whatever `repeats` says. Configurations measured
together (run_interleaved, and bench-compare --against) alternate repeat by repeat.
"""

from __future__ import annotations

import json
import math
import numbers
import statistics
from collections.abc import Callable
from contextvars import ContextVar

from kvbench.errors import UserError

MEASURED = ("serve", "kernel")  # scenarios whose metrics are wall-clock measurements
SAMPLES = "samples"
# which repeat of a repeated point is running (1, 2, ...): each writes its own requests.K.jsonl
repeat: ContextVar[int | None] = ContextVar("repeat", default=None)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def aggregate(repeats: list[list[dict]]) -> list[dict]:
    """One row per point from N repeats of the same rows: medians, and every value as samples.

    A repeat whose row already holds samples (a run that was itself repeated) contributes all
    of them, so runs of `repeats=K` pool into K x N samples."""
    if len({len(rows) for rows in repeats}) != 1:
        raise ValueError("every repeat of a point must produce the same rows")
    merged = []
    for rows in zip(*repeats):
        row = {k: v for k, v in rows[0].items() if k not in (SAMPLES, "repeats")}
        samples = {}
        held = [samples_of(r.get(SAMPLES)) for r in rows]
        for key in row:
            values = [r.get(key) for r in rows]
            if all(isinstance(v, bool) for v in values):  # a flag (window_drained): whether any repeat raised it
                row[key] = any(values)
                continue
            if not all(_is_number(v) for v in values):
                continue
            pooled = [x for r, h in zip(rows, held) for x in h.get(key, [r[key]])]
            if all(v == values[0] for v in values) and all(x == pooled[0] for x in pooled):
                if math.isfinite(values[0]):  # a count, a parameter: keep its type
                    samples[key] = [float(x) for x in pooled]
                continue
            finite = [float(x) for x in pooled if math.isfinite(x)]
            row[key] = statistics.median(finite) if finite else math.nan
            samples[key] = [float(x) for x in pooled]
        _shares_of_the_median_repeat(row, rows)
        row.update(
            repeats=len(next(iter(samples.values()), rows)), **{SAMPLES: json.dumps(samples, separators=(",", ":"))}
        )
        merged.append(row)
    return merged


# a pool's accounting categories: each repeat's add up to 1, and so must the row's
KV_SHARES = ("kv_token_util", "kv_reserved_frac", "kv_internal_frag_frac", "kv_rounding_frac", "kv_external_frag_frac")


def _shares_of_the_median_repeat(row: dict, rows: tuple[dict, ...]) -> None:
    """The KV shares of one pool (the whole, and each layer kind's view, `kv_token_util_full`)
    taken together from the median repeat by kv_token_util (the mean of the middle two for an
    even count), not each column's own median: those need not add up to 1."""
    for lead in [c for c in row if c == KV_SHARES[0] or c.startswith(KV_SHARES[0] + "_")]:
        suffix = lead.removeprefix(KV_SHARES[0])
        columns = [c + suffix for c in KV_SHARES if c + suffix in row]
        if not all(_is_number(r.get(c)) and math.isfinite(r[c]) for r in rows for c in columns):
            continue
        order = sorted(range(len(rows)), key=lambda i: rows[i][lead])
        middle = order[(len(rows) - 1) // 2 : len(rows) // 2 + 1]
        for column in columns:
            row[column] = sum(rows[i][column] for i in middle) / len(middle)


def run_repeated(scenario: str, repeats, run_once: Callable[[], list[dict]]) -> list[dict]:
    """Run a point once, or `repeats` times when its scenario is measured."""
    try:
        count = int(repeats)
    except (TypeError, ValueError):
        count = 0
    if count < 1 or str(count) != str(repeats).strip():
        raise UserError(f"repeats={repeats!r} must be a whole number >= 1")
    if count == 1 or scenario not in MEASURED:
        return run_once()
    rows = []
    for index in range(1, count + 1):
        token = repeat.set(index)
        try:
            rows.append(run_once())
        finally:
            repeat.reset(token)
    return aggregate(rows)


def interleaved_order(names: list[str], repeats: int):
    """(repeat, name) pairs, the order reversed every other repeat (ABBA): drift in the host's
    load during the measurement then falls on every configuration alike."""
    for index in range(repeats):
        for name in names if index % 2 == 0 else names[::-1]:
            yield index, name


def run_interleaved(runs: dict[str, Callable[[], list[dict]]], repeats: int) -> dict[str, list[dict]]:
    """Several configurations measured together: repeat by repeat, in ABBA order, aggregated."""
    results: dict[str, list[list[dict]]] = {name: [] for name in runs}
    for _, name in interleaved_order(list(runs), repeats):
        results[name].append(runs[name]())
    return {name: aggregate(rows) for name, rows in results.items()}


def samples_of(cell) -> dict[str, list[float]]:
    """The samples column of a result row read back from CSV ({} when the point ran once)."""
    if isinstance(cell, dict):
        return cell
    if cell is None or (isinstance(cell, float) and math.isnan(cell)) or (isinstance(cell, str) and not cell.strip()):
        return {}  # blank: a point that ran once
    if not isinstance(cell, str):  # a number, which pandas read as one
        cell = str(cell)
    try:
        data = json.loads(cell)
    except ValueError:
        raise UserError(f"a result row's {SAMPLES} column is not JSON: {cell[:60]!r}") from None
    if data is None:  # null: a point that ran once
        return {}
    if not isinstance(data, dict):  # [1, 2, 3] or 42 read as "ran once" and went ungated
        raise UserError(
            f"a result row's {SAMPLES} column is {cell[:60]!r}: it maps each metric to its samples, "
            f'e.g. {{"median_ttft_ms": [12.1, 12.4]}}'
        )
    for metric, values in data.items():
        if not isinstance(values, list) or not all(type(x) in (int, float) for x in values):
            raise UserError(
                f"a result row's {SAMPLES} column gives {metric} as {json.dumps(values)[:60]}: "
                f"each metric's samples are a list of numbers"
            )
    return {k: [float(x) for x in v] for k, v in data.items()}
