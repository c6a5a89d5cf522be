"""Request streams: arrival times (Poisson or gamma) and prompt / output lengths, seeded.

Length distributions:
- `sharegpt`: a monotone quantile function interpolated in log space through knots fitted to
  the published ShareGPT statistics (docs/facts.md: input median 35, p90 507, p99 1464, mean 161.31;
  output median 271, p90 754, p99 1280, mean 337.99). Those are statistics of the pairs that
  fit in 2048 tokens, so pairs longer than max_model_len are redrawn and the knots are set so
  that the statistics after that filter match (100k draws: input mean 162.6, median 35, p90
  520, p99 1466; output mean 336.4, median 269, p90 748, p99 1280). The p25 / p75 knots are
  not published and only shape the mean.
- `alpaca`: log-normal lengths with the published means (input 19.31, output 58.45) and an
  assumed spread (sigma 0.6 / 0.8).
- `uniform`: vLLM's random dataset, lengths uniform in [L(1-r), L(1+r)].
- `fixed`: every request has the same lengths.
- `trace`: a CSV with `input_len,output_len` and optionally `arrival_s`, counted from the first
  arrival (vLLM's `prompt_len,expected_output_len`, BurstGPT's `Request tokens,Response tokens,
  Timestamp` and Vidur's `num_prefill_tokens,num_decode_tokens,arrived_at` are read too):
  requests in the order of their arrival times when the file has them (every row must), else in
  file order.
"""

from __future__ import annotations

import csv
import logging
import math
import os

import numpy as np

from kvbench.core.sequence import Request
from kvbench.errors import UserError

SHAREGPT_INPUT_KNOTS = ((0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0), (1, 12, 36, 140, 585, 1600, 2047))
SHAREGPT_OUTPUT_KNOTS = ((0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0), (1, 112, 276, 488, 762, 1290, 2047))
KINDS = ("sharegpt", "alpaca", "uniform", "fixed", "trace")


def _quantile_draw(rng: np.random.Generator, knots, size: int) -> np.ndarray:
    q, v = knots
    return np.maximum(1, np.rint(np.exp(np.interp(rng.random(size), q, np.log(v))))).astype(np.int64)


def _lengths(cfg: dict, rng: np.random.Generator, size: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    kind = cfg["kind"]
    if kind == "sharegpt":
        draw_in = lambda k: _quantile_draw(rng, SHAREGPT_INPUT_KNOTS, k)
        draw_out = lambda k: _quantile_draw(rng, SHAREGPT_OUTPUT_KNOTS, k)
    elif kind == "alpaca":
        draw_in = lambda k: np.maximum(1, np.rint(rng.lognormal(math.log(19.31) - 0.18, 0.6, k))).astype(np.int64)
        draw_out = lambda k: np.maximum(1, np.rint(rng.lognormal(math.log(58.45) - 0.32, 0.8, k))).astype(np.int64)
    elif kind == "uniform":
        r = float(cfg["range_ratio"])
        if not 0 <= r < 1:
            raise UserError(f"workload.range_ratio={r} must be in [0, 1)")
        draw_in = lambda k: _uniform(rng, int(cfg["input_len"]), r, k)
        draw_out = lambda k: _uniform(rng, int(cfg["output_len"]), r, k)
    elif kind == "fixed":
        draw_in = lambda k: np.full(k, int(cfg["input_len"]), dtype=np.int64)
        draw_out = lambda k: np.full(k, int(cfg["output_len"]), dtype=np.int64)
    else:
        raise UserError(f"unknown workload kind {kind!r}; known: {', '.join(KINDS)}")
    inputs, outputs = draw_in(size), draw_out(size)
    if kind in ("sharegpt", "alpaca"):  # the datasets' pairs are filtered to fit the model
        for _ in range(100):
            bad = inputs + outputs > max_len
            if not bad.any():
                break
            inputs[bad], outputs[bad] = draw_in(int(bad.sum())), draw_out(int(bad.sum()))
        else:
            if (inputs + outputs > max_len).any():  # a limit few of the dataset's pairs fit under
                raise UserError(
                    f"workload={kind}: too few of its length pairs fit in {max_len} tokens (the model's "
                    f"max_model_len, less any workload.prefix_len) to draw {size} requests; raise "
                    f"model.max_model_len, or use workload=fixed or uniform for requests that short"
                )
    return inputs, outputs


def _uniform(rng: np.random.Generator, length: int, r: float, size: int) -> np.ndarray:
    lo, hi = max(1, int(length * (1 - r))), max(1, int(length * (1 + r)))
    return rng.integers(lo, hi + 1, size=size)


def arrivals(
    rng: np.random.Generator,
    rate: float,
    burstiness: float,
    count: int | None,
    duration_s: float | None,
    most: int | None = None,
) -> np.ndarray:
    """Arrival times: gamma-distributed gaps with mean 1/rate (shape 1 = Poisson); `count` of
    them, or those within `duration_s`, and then no more than `most` (a trace's rows: a 3-row
    trace at 1e5 req/s for 1,000 s draws 3 gaps, not 1e8)."""
    if count is not None and (math.isinf(rate) or burstiness != 1):
        # Drawn apart, and `rng` moved on by the draws Poisson gaps take (one standard exponential
        # each, as gamma of shape 1 draws them): the lengths drawn next are the same at every rate
        # and burstiness, so a sweep of either compares the same requests.
        own = rng.spawn(1)[0]
        rng.standard_exponential(size=count)
        rng = own
    if math.isinf(rate):
        return np.zeros(count or 0)
    scale = 1.0 / (rate * burstiness)
    if count is not None:
        return np.cumsum(rng.gamma(burstiness, scale, size=count))
    times, t = [], 0.0
    chunk = max(16, int(rate * duration_s * 1.2))
    if most is not None:
        chunk = min(chunk, most + 1)  # the arrival after the last is drawn, to end as before
    while True:
        for gap in rng.gamma(burstiness, scale, size=chunk):
            t += gap
            if t > duration_s or len(times) == most:
                return np.array(times)
            times.append(t)


# Column spellings of other tools' length traces, mapped onto kvbench's: vLLM's benchmark
# requests (SampleRequest's prompt_len, expected_output_len), BurstGPT's CSV (a trace vLLM's
# benchmark replays: Timestamp in seconds from its start, Request / Response tokens) and Vidur's
# request traces (arrived_at in seconds).
# arrivals further apart than this are in another unit (milliseconds since the epoch) or a typo
MAX_TRACE_SPAN_S = 1e9
TRACE_COLUMNS = {
    "input_len": ("input_len", "prompt_len", "num_prefill_tokens", "Request tokens"),
    "output_len": ("output_len", "expected_output_len", "num_decode_tokens", "Response tokens"),
    "arrival_s": ("arrival_s", "arrived_at", "Timestamp"),
}


def trace_has_arrival_times(path: str) -> bool:
    """Whether the trace's header names an arrival-time column (then `rate` and `burstiness` are
    not read); False for a file that cannot be read, which load_trace then refuses."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # a spreadsheet's BOM is no header
            header = [name.strip() for name in next(csv.reader(f), [])]
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return any(name in header for name in TRACE_COLUMNS["arrival_s"])


def refuse_shuffled_arrivals(cfg, timed: bool) -> None:
    """workload.shuffle on a trace with arrival times (`timed`) would hand each time another
    row's lengths: a trace that never happened."""
    if cfg.get("shuffle") is True and timed:
        raise UserError(
            f"workload.shuffle=true would give the arrival times of trace {cfg.get('path')} other rows' lengths; "
            f"a trace with arrival times is replayed as it is: drop it"
        )


def _trace_columns(path: str, header) -> dict[str, str]:
    """kvbench's column name -> the file's, for the columns the file has."""
    found = {}
    for ours, spellings in TRACE_COLUMNS.items():
        present = [name for name in spellings if name in (header or ())]
        if len(present) > 1 or (present and header.count(present[0]) > 1):  # which one would be read?
            named = " and ".join(present) if len(present) > 1 else f"{present[0]} twice"
            raise UserError(f"trace {path}: the header has {named}, two columns for {ours}: keep one")
        if present:
            found[ours] = present[0]
    if header is None:  # an empty file: no header line at all
        raise UserError(f"trace {path}: header must have input_len,output_len[,arrival_s]; the file is empty")
    if not header:
        raise UserError(f"trace {path}: line 1 is blank; the first line is the header (input_len,output_len,...)")
    missing = [ours for ours in ("input_len", "output_len") if ours not in found]
    if missing and header[0].lstrip()[:1] in ("[", "{"):  # a JSON file, or JSON lines
        raise UserError(
            f"trace {path} reads as JSON; a trace is a CSV file whose first line names its columns "
            f"(input_len,output_len[,arrival_s], or vLLM's, Vidur's or BurstGPT's names: docs/paper.md)"
        )
    if missing:
        allowed = "; ".join(f"{ours}: {' or '.join(TRACE_COLUMNS[ours])}" for ours in missing)
        raise UserError(f"trace {path}: the header {','.join(header or ())!r} has no column for {allowed}")
    return found


def load_trace(path: str) -> list[tuple[int, int, float | None, int]]:
    """The rows of a length trace as (input_len, output_len, arrival_s or None, file line).

    kvbench's one table read with the csv module, not pandas (docs/design.md): row by row, so
    an error names the bad row's line, and without pandas' import."""
    if not path:
        raise UserError("workload=trace needs workload.path=FILE.csv (columns input_len,output_len[,arrival_s])")
    if not os.path.isfile(path):
        raise UserError(f"trace file {path!r} does not exist")
    with open(path, newline="", encoding="utf-8-sig") as f:  # a spreadsheet's BOM is no header
        reader = csv.DictReader(f)
        try:
            rows = _trace_rows(path, reader)
        except csv.Error as err:  # a field past the csv module's limit, a NUL byte
            raise UserError(f"trace {path} line {reader.line_num + 1}: {err}") from None  # the line it was reading
    if not rows:
        raise UserError(f"trace {path} has no rows")
    return rows


def _trace_rows(path: str, reader: csv.DictReader) -> list[tuple[int, int, float | None, int]]:
    """Each row of a trace as load_trace returns it; a bad row is one line that names it."""
    rows = []
    if reader.fieldnames:  # ` input_len , output_len `: the names without their spaces
        reader.fieldnames = [name.strip() for name in reader.fieldnames]
    columns = _trace_columns(path, reader.fieldnames)
    width = len(reader.fieldnames)
    failed = 0  # BurstGPT's failed requests
    for row in reader:
        line = reader.line_num  # the file's line (blank lines are skipped, not counted as rows)
        if None in row or None in row.values():  # DictReader's extra fields, or missing ones
            fields = width + len(row.get(None, ())) - sum(v is None for v in row.values())
            raise UserError(f"trace {path} line {line}: {fields} field(s), but the header has {width}")
        i, o = (_number(path, line, columns[c], row[columns[c]]) for c in ("input_len", "output_len"))
        a = row.get(columns.get("arrival_s", "arrival_s"))
        a = _number(path, line, columns["arrival_s"], a) if a not in (None, "") else None
        for value, key in ((i, "input_len"), (o, "output_len")):
            if not value.is_integer():
                raise UserError(
                    f"trace {path} line {line}: {columns[key]}={row[columns[key]]!r} is not a whole number of tokens"
                )
        if o == 0 and columns["output_len"] == "Response tokens":  # BurstGPT logs its failed requests so
            failed += 1
            continue
        if i < 1 or o < 1 or (a is not None and (a < 0 or not math.isfinite(a))):
            arrival = f" and {columns['arrival_s']} a finite number >= 0" if "arrival_s" in columns else ""
            raise UserError(f"trace {path} line {line}: lengths must be >= 1{arrival}, got {row}")
        if "arrival_s" in columns and a is None:
            raise UserError(
                f"trace {path} line {line}: no {columns['arrival_s']}; give every row its arrival "
                f"time, or drop the column to have requests arrive at workload.rate"
            )
        rows.append((int(i), int(o), a, line))
    if failed and not rows:
        raise UserError(f"trace {path}: all {failed} rows are failed requests (0 Response tokens), which runs skip")
    return rows


def _number(path, line: int, column: str, text) -> float:
    """A trace cell as a number; one that is not (`12 tokens`, `1_000`, blank) names its column."""
    try:
        if "_" in text or not text.isascii():  # float() reads 1_000 as 1000 (a typo 1_0 as 10), and ١٠ as 10
            raise ValueError(text)
        return float(text)
    except (TypeError, ValueError):
        raise UserError(f"trace {path} line {line}: {column}={text!r} is not a number") from None


def trace_requests(
    cfg: dict,
    rng: np.random.Generator,
    rate: float,
    burstiness: float,
    count: int | None,
    duration: float | None,
    max_len: int,
    at_most: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Arrival times and lengths of a trace run, and how many of its rows were dropped.

    Rows longer than `max_len` are dropped (the paper filtered its datasets so) and counted when
    they lie among the rows the run reads, or refused with `strict`. With arrival times the run
    reads rows in arrival order: `count` of them where given (it takes precedence over
    `duration`, as it does for a generated workload), else those arriving within `duration`;
    without, it reads rows in file order, as many as the Poisson arrivals at `rate` within
    `duration` (or `count` of them) need; and `at_most` of them where `count` is not given.
    `shuffle` shuffles the rows it took with the seed, as the paper's artifact does.
    """
    path = cfg.get("path")
    rows = load_trace(path)
    refuse_shuffled_arrivals(cfg, rows[0][2] is not None)  # load_trace: every row has its time, or none
    first = 0.0
    if rows[0][2] is not None:  # load_trace: every row has its arrival time, or none has
        # Times count from the trace's first arrival: one that starts at 1,000 s, or at an epoch
        # time, runs as one that starts at 0 (else the measurement window, a share of the run from
        # 0, would open before the first request, and durations at 1e17 s would round to nothing).
        first = min(r[2] for r in rows)
        rows = [(i, o, a - first, line) for i, o, a, line in rows]
    prefix = int(cfg.get("prefix_len", 0) or 0)  # max_len is what the shared prefix leaves of max_model_len
    limit = (
        f"max_model_len={max_len + prefix} less workload.prefix_len={prefix}: {max_len}"
        if prefix
        else f"max_model_len={max_len}"
    )
    too_long = [r for r in rows if r[0] + r[1] > max_len]
    if cfg.get("strict") and too_long:
        i, o, _, line = too_long[0]
        raise UserError(
            f"trace {path} line {line}: {i} input + {o} output tokens exceed {limit} "
            f"(workload.strict=true; false drops such rows and counts them)"
        )
    kept = [r for r in rows if r[0] + r[1] <= max_len]
    if not kept:
        i, o, _, line = min(rows, key=lambda r: r[0] + r[1])
        raise UserError(
            f"trace {path}: every row has more than {limit} tokens "
            f"(the shortest, line {line}: {i} input + {o} output); raise model.max_model_len"
        )
    if count is not None and count > len(kept):  # with or without arrival times
        raise UserError(f"workload.num_requests={count} but trace {path} has only {len(kept)} rows that fit {limit}")
    if kept[0][2] is not None:
        kept.sort(key=lambda r: r[2])
        cutoff = math.inf if duration is None or count is not None else duration  # num_requests first
        within = [r for r in kept if r[2] <= cutoff]
        if not within:  # the rows that arrive in time were all too long
            raise UserError(
                f"trace {path}: no row that fits {limit} arrives within workload.duration_s={duration} "
                f"(the first arrives at {kept[0][2]:.6g} s from the trace's start); raise workload.duration_s"
            )
        kept = within
        most = count if count is not None else at_most
        taken = kept[:most] if most is not None else kept
        if len(taken) < len(kept):
            cutoff = taken[-1][2]
        times = np.array([r[2] for r in taken], dtype=float)
        if times[-1] - times[0] > MAX_TRACE_SPAN_S:  # sorted: the span of the arrivals taken
            raise UserError(
                f"trace {path}: its arrival times span {times[-1] - times[0]:.3g} s, more than "
                f"{MAX_TRACE_SPAN_S:.0e} s (31 years): give them in seconds"
            )
        if np.spacing(first + times[-1]) > 1e-6:
            raise UserError(
                f"trace {path}: arrival times as large as {first + times[-1]:.3g} cannot be told apart to the "
                f"microsecond: give them in seconds, from the trace's start"
            )
        dropped = sum(1 for r in too_long if r[2] <= cutoff)
    else:
        if count is None and duration is not None and math.isinf(rate):
            raise UserError(
                f"workload.rate=inf sends every row of trace {path} at t=0, so workload.duration_s={duration} "
                f"cannot bound them: drop it (every row runs), or set workload.num_requests"
            )
        if count is None and (duration is None or math.isinf(rate)):
            count = len(kept) if at_most is None else min(len(kept), at_most)
        most = len(kept) if at_most is None else min(len(kept), at_most)
        times = arrivals(rng, rate, burstiness, count, duration, most)[:most]
        taken = kept[: len(times)]
        # the line after which no row was read: the file's end, or none (no arrival in duration)
        last = (taken[-1][3] if taken else -math.inf) if len(taken) < len(kept) else math.inf
        dropped = sum(1 for r in too_long if r[3] < last)
    if dropped:  # a column of the row, and said where the run is watched
        logging.getLogger("kvbench").warning(
            "trace %s: %d of its rows are longer than %d tokens (input + output, the model's max_model_len less any "
            "shared prefix) and were dropped, as dropped_requests counts; workload.strict=true refuses them instead",
            path,
            dropped,
            max_len,
        )
    if cfg.get("shuffle"):
        taken = [taken[i] for i in rng.permutation(len(taken))]
    inputs = np.array([r[0] for r in taken], dtype=np.int64)
    outputs = np.array([r[1] for r in taken], dtype=np.int64)
    return times, inputs, outputs, dropped


def served(workload: dict, rate, cap) -> tuple[dict, int | None]:
    """`workload` as scenario=serve draws it: its rate replaced by `rate` (scenario.rate) where
    that is set, and its count capped at `cap` (scenario.num_requests; a workload without a
    count of its own takes the cap); and the most rows a trace without a count may give."""
    spec = dict(workload)
    if rate is not None:
        spec["rate"] = rate
    if cap is None:
        return spec, None
    count = spec.get("num_requests")
    if count is None and spec.get("kind") == "trace":
        return spec, int(cap)
    spec["num_requests"] = int(cap) if count is None else min(int(cap), int(count))
    return spec, None


class Requests(list):
    """A run's requests, sorted by arrival, and how many trace rows were dropped as too long."""

    dropped = 0


def generate(
    cfg: dict,
    seed: int,
    max_model_len: int,
    with_tokens: bool = False,
    vocab_size: int = 50272,
    at_most: int | None = None,
) -> Requests:
    """The requests of one run, sorted by arrival. Token ids are drawn only `with_tokens`.
    `at_most`: a trace without a count of its own gives at most this many (serve's cap), and
    all its rows where it has fewer."""
    rate = float(cfg["rate"])
    if not rate > 0:
        raise UserError(f"workload.rate={cfg['rate']} must be > 0 (req/s; inf = all at t=0)")
    burstiness = float(cfg.get("burstiness", 1.0))
    if not burstiness > 0:
        raise UserError(f"workload.burstiness={burstiness} must be > 0 (1 = Poisson)")
    count = cfg.get("num_requests")
    duration = cfg.get("duration_s")
    if count is not None and int(count) < 1:
        raise UserError(f"workload.num_requests={count} must be >= 1")
    if cfg["kind"] != "trace" and count is None and math.isinf(rate):
        raise UserError(
            "workload.rate=inf sends every request at t=0, so workload.duration_s cannot bound them: "
            "set workload.num_requests"
        )
    if cfg["kind"] != "trace" and count is None and duration is None:
        raise UserError("set workload.num_requests or workload.duration_s: one of them must bound the run")
    if duration is not None and not float(duration) > 0:
        raise UserError(f"workload.duration_s={duration} must be > 0")
    n, beam = int(cfg.get("n", 1)), int(cfg.get("beam_width", 1))
    if n < 1:
        raise UserError(f"workload.n={n} must be >= 1 (parallel samples per request)")
    if beam < 1:
        raise UserError(f"workload.beam_width={beam} must be >= 1")
    if n > 1 and beam > 1:
        raise UserError("workload.n and workload.beam_width cannot both be > 1")
    prefix_len = int(cfg.get("prefix_len", 0))
    num_prefixes = int(cfg.get("num_prefixes", 1))
    if prefix_len < 0 or num_prefixes < 1:
        raise UserError(f"workload.prefix_len={prefix_len} must be >= 0 and num_prefixes={num_prefixes} >= 1")
    if prefix_len >= max_model_len:
        raise UserError(f"workload.prefix_len={prefix_len} must be shorter than max_model_len={max_model_len}")
    rng = np.random.default_rng(seed)

    dropped = 0
    if cfg["kind"] == "trace":
        if cfg.get("shuffle") not in (None, True, False) or cfg.get("strict") not in (None, True, False):
            raise UserError(
                f"workload.shuffle={cfg.get('shuffle')!r} and workload.strict={cfg.get('strict')!r} "
                f"must be true or false"
            )
        times, inputs, outputs, dropped = trace_requests(
            cfg,
            rng,
            rate,
            burstiness,
            None if count is None else int(count),
            None if duration is None else float(duration),
            max_model_len - prefix_len,
            at_most,
        )
    else:
        times = arrivals(
            rng, rate, burstiness, None if count is None else int(count), None if duration is None else float(duration)
        )
        if len(times) and times[-1] > MAX_TRACE_SPAN_S:
            raise UserError(
                f"a rate of {rate:g} req/s (workload.rate; scenario.rate under serve) spreads {len(times)} "
                f"requests over {times[-1]:.3g} s, more than {MAX_TRACE_SPAN_S:.0e} s (31 years): a rate in "
                f"requests per second, e.g. 4"
            )
        # the shared prefix counts against the length limit the dataset's pairs are filtered by
        inputs, outputs = _lengths(cfg, rng, len(times), max_model_len - prefix_len)

    token_rng = np.random.default_rng(seed + 1)
    prefixes = [token_rng.integers(0, vocab_size, prefix_len) for _ in range(num_prefixes)] if prefix_len else []
    requests = Requests()
    requests.dropped = dropped
    for i, (t, p, o) in enumerate(zip(times, inputs, outputs)):
        p, o = int(p) + prefix_len, int(o)
        if p + o > max_model_len:
            raise UserError(
                f"request {i} has {p} prompt + {o} output tokens, more than "
                f"max_model_len={max_model_len}; shorten it or raise model.max_model_len"
            )
        prefix_id = int(token_rng.integers(num_prefixes)) if prefix_len else -1
        tokens = None
        if with_tokens or prefix_len:
            body = token_rng.integers(0, vocab_size, p - prefix_len)
            tokens = np.concatenate([prefixes[prefix_id], body]) if prefix_len else body
        requests.append(Request(i, float(t), p, o, tokens, n, beam, prefix_id))
    if not requests:
        raise UserError("the workload has no requests: raise workload.duration_s or set workload.num_requests")
    requests.sort(key=lambda r: r.arrival_s)
    return requests
