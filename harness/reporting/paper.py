"""kvbench's numbers beside the PagedAttention paper's (Kwon et al., SOSP 2023), per figure.

An experiment config (conf/experiment/NAME.yaml) sets `report.paper=NAME`; when its sweep ends,
`PaperComparison` writes `paper_comparison.csv` and `paper_comparison.md` (paper value, kvbench
value, delta for every number the paper states for that figure) and the figure's own plot. The
categories and baselines compared are defined in docs/paper.md.

Capacity at a latency target, the paper's headline metric: on each system's normalized latency
against request rate, the highest rate whose latency stays under `report.slo_s_per_token`,
interpolated between the last rate under it and the first above it; and each system's capacity
as a ratio to `report.baseline`'s.
"""

from __future__ import annotations

import logging
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from kvbench.errors import UserError
from kvbench.reporting.results import write_atomic, write_csv
from kvbench.schema.docs import constraints
from kvbench.schema.groups import Report

log = logging.getLogger("kvbench")

SYSTEMS = {"contiguous": "Orca (Max)", "pow2": "Orca (Pow2)", "oracle": "Orca (Oracle)", "paged": "vLLM"}
PAPER_ORDER = ("contiguous", "pow2", "oracle", "paged")

# The paper's Fig. 2 categories as sums of kvbench's columns: the paper files rounding (block
# and buddy padding) under "external fragmentation & other".
FIG2_PARTS = {
    "token states": ("kv_token_util",),
    "reservation": ("kv_reserved_frac",),
    "internal fragmentation": ("kv_internal_frag_frac",),
    "external fragmentation & other": ("kv_rounding_frac", "kv_external_frag_frac"),
}
# the setup of Fig. 2: OPT-13B on an A100-40GB (docs/paper.md)
FIG2_SETUP = ("opt-13b", "a100-40gb")
FIG2 = {  # % of KV memory at 4 req/s, ShareGPT (Fig. 2); None where the paper gives no number
    "contiguous": (20.4, 13.3, 57.3, 8.9),
    "pow2": (26.8, 17.9, 13.6, 41.6),
    "oracle": (38.2, 25.2, None, 36.6),
    "paged": (96.3, None, None, None),
}
FIG13 = {  # mean batched requests (Fig. 13): ShareGPT at 2 req/s, Alpaca at 30 req/s
    ("sharegpt", 2.0): {"paged": 30.42, "oracle": 13.62, "pow2": 9.81, "contiguous": 7.00},
    ("alpaca", 30.0): {"paged": 132.44, "oracle": 72.75, "pow2": 43.24, "contiguous": 7.00},
}
# % of KV blocks sharing saves, OPT-13B, each range over the widths 2, 4, 6 (Fig. 14 / 15, Sec. 6.3)
FIG14_15 = {
    ("alpaca", "parallel"): (6.1, 9.8),
    ("alpaca", "beam"): (37.6, 55.2),
    ("sharegpt", "parallel"): (16.2, 30.5),
    ("sharegpt", "beam"): (44.3, 66.3),
}
# fig14_15.sharing -> (what it is, what its width counts)
SHARING = {"parallel": ("parallel sampling", "n"), "beam": ("beam search", "width")}
FIG12 = {  # request rate vLLM sustains at similar normalized latency, ShareGPT (Sec. 6.2)
    ("paged", "oracle"): (1.7, 2.7),
    ("paged", "contiguous"): (2.7, 8.0),
}


def number(row: dict, key: str) -> float:
    """A result cell as a float; NaN for a missing or non-numeric cell (a failed point)."""
    try:
        return float(row.get(key, "nan"))
    except (TypeError, ValueError):
        return float("nan")


def _ok(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("status", "ok") == "ok"]


def mean_over_seeds(rows: list[dict], key: str, **where) -> tuple[float, int]:
    """The mean of `key` over the ok rows whose columns equal `where`, and how many there were."""
    values = [number(r, key) for r in _ok(rows) if all(r.get(k) == v for k, v in where.items())]
    return (float(np.mean(values)) if values else float("nan")), len(values)


def _workloads(rows: list[dict]) -> str:
    return "+".join(sorted({str(r.get("workload")) for r in _ok(rows)}))


def comparison_row(figure, workload, system, quantity, paper, value, runs) -> dict:
    """One line of the comparison; `paper` is a number or a (low, high) range."""
    if isinstance(paper, tuple):
        low, high = paper
        delta = 0.0 if low <= value <= high else (value - high if value > high else value - low)
        paper_text, relative = f"{low:g}-{high:g}", delta / (high if value > high else low)
    else:
        delta, paper_text, relative = value - paper, f"{paper:g}", (value - paper) / paper
    return {
        "figure": figure,
        "workload": workload,
        "system": system,
        "quantity": quantity,
        "paper": paper_text,
        "kvbench": round(value, 4),
        "delta": round(delta, 4),
        "delta_pct": round(100 * relative, 2),
        "runs": runs,
    }


# settings that size the KV pool or change a system (a prefix: any key under it): the paper's
# numbers are its setup's pool, one A100-40GB's memory less OPT-13B's weights, and its systems
# as it defines them (vLLM in blocks of 16, Pow2 a buddy allocator)
POOL_KEYS = ("model.", "hardware.", "engine.kv_cache_bytes", "allocator.")


def fig2_setup(config, figure: str = "fig2") -> None:
    """Before fig2's, fig12's or fig13's sweep runs: the paper's model and GPU (and for fig2 its
    workload and rate, each swept value checked) as the sweep's config and command line give
    them, and no override that sizes the pool or changes a system (POOL_KEYS)."""
    sweep = config.hydra.sweeper.get("params") or {}
    given = {"model": config.get("model", {}).get("name"), "hardware": config.get("hardware", {}).get("name")}
    wanted = {"model": (FIG2_SETUP[0],), "hardware": (FIG2_SETUP[1],)}
    if figure == "fig2":  # fig12's and fig13's workloads and rates are their own sweeps'
        given |= {"workload": config.get("workload", {}).get("kind"), "rate": config.get("workload", {}).get("rate")}
        wanted |= {"workload": ("sharegpt", "trace"), "rate": (4.0,)}
    off = []
    for key, value in given.items():
        swept = swept_values(config, "workload" if key == "workload" else "workload.rate") if key in RUN_KEYS else None
        if swept is not None:  # the command line's values (a sweep's, or choice(2)'s one), each checked
            off += [f"{key}={v}" for v in swept if _as_given(key, v) not in wanted[key]]
        elif value is not None and key not in sweep and f"workload.{key}" not in sweep and value not in wanted[key]:
            off.append(f"{key}={value}")
    if off:
        setup = " with ShareGPT's lengths at 4 req/s" if figure == "fig2" else ""
        raise UserError(
            f"{figure}: the paper's numbers are {FIG2_SETUP[0]} on {FIG2_SETUP[1]}'s{setup}; this sweep would run "
            f"{', '.join(off)}: drop that override (or sweep without +experiment={figure})"
        )
    pool = [o.input_line for o in _parsed_overrides(config) if o.key_or_group.lstrip("+~").startswith(POOL_KEYS)]
    if pool:
        raise UserError(
            f"{figure}: {pool[0]} sizes the KV pool or changes a system, and the paper's numbers are its setup's "
            f"pool and systems ({FIG2_SETUP[0]} on one {FIG2_SETUP[1]}, blocks of 16): drop it (or sweep without "
            f"+experiment={figure})"
        )


RUN_KEYS = ("workload", "rate")  # fig2's keys a command line may set for every point or sweep


def _as_given(key: str, text: str):
    """A command line's value as the config holds it: a rate as a number (text that is none stays
    text, off the paper's setup; the sweep's check of its points has refused it already)."""
    if key != "rate":
        return text
    try:
        return float(text)
    except ValueError:
        return text


def fig2(rows: list[dict], cfg) -> list[dict]:
    _same_setup(rows, "fig2")
    off = set()  # the paper's setup beside the model: ShareGPT lengths at 4 req/s, blocks of 16
    for r in _ok(rows):
        if r.get("workload") not in ("sharegpt", "trace"):  # a trace: ShareGPT's lengths, maybe
            off.add(f"workload={r.get('workload')}")
        for key, paper in (("rate", 4.0), ("block_size", 16.0)):
            value = number(r, key)
            if value == value and value != paper:  # recorded (not NaN), and not the paper's
                off.add(f"{key}={value:g}")
    if off:
        raise UserError(
            f"fig2: the paper's shares are ShareGPT's at 4 req/s with blocks of 16 tokens; this sweep ran "
            f"{', '.join(sorted(off))}: drop that override (or sweep without +experiment=fig2)"
        )
    out = []
    for allocator in PAPER_ORDER:
        if not mean_over_seeds(rows, "kv_token_util", allocator=allocator)[1]:
            continue  # a system the sweep did not run (or whose points all failed) is left out
        for (part, columns), paper in zip(FIG2_PARTS.items(), FIG2[allocator]):
            if paper is None:
                continue
            # whatever the lengths come from (the built-in sharegpt workload or a ShareGPT trace)
            values = [mean_over_seeds(rows, c, allocator=allocator) for c in columns]
            out.append(
                comparison_row(
                    "fig2",
                    _workloads(rows),
                    SYSTEMS[allocator],
                    f"% {part}",
                    paper,
                    100 * sum(v for v, _ in values),
                    values[0][1],
                )
            )
    return out


def _same_setup(rows: list[dict], figure: str) -> None:
    """The paper's model and GPU (fig2, fig13: OPT-13B on an A100-40GB): its numbers depend on
    the pool's size against the requests'."""
    ran = {(r.get("model"), r.get("hardware")) for r in _ok(rows) if r.get("model") and r.get("hardware")}
    other = sorted({f"{m} on {h}" for m, h in ran if (m, h) != FIG2_SETUP}, key=str)
    if other:
        raise UserError(
            f"{figure}: the paper's numbers are {FIG2_SETUP[0]} on {FIG2_SETUP[1]}'s; this sweep ran "
            f"{', '.join(other)}: drop the model or hardware override (or sweep without +experiment={figure})"
        )


def fig13(rows: list[dict], cfg) -> list[dict]:
    _same_setup(rows, "fig13")
    out = []
    for (workload, rate), papers in FIG13.items():
        # the paper's workload at its rate; a trace (of the paper's dataset, its user says) at that rate too
        at_rate = [r for r in _ok(rows) if number(r, "rate") == rate and r.get("workload") in (workload, "trace")]
        for ours in sorted({r.get("workload") for r in at_rate}):  # never a mean over two workloads' points
            label = workload if ours == workload else f"{workload} ({ours})"
            for allocator in PAPER_ORDER:
                value, runs = mean_over_seeds(at_rate, "mean_batch_size", allocator=allocator, workload=ours)
                if runs:  # a system the sweep did not run at this rate is left out
                    quantity = f"mean batch at {rate:g} req/s"
                    out.append(
                        comparison_row("fig13", label, SYSTEMS[allocator], quantity, papers[allocator], value, runs)
                    )
    return out


class Capacity(float):
    """A capacity in req/s, interpolated between the two swept rates that bracket the target:
    `between` = (the last rate under it, the first above), how far the interpolation reaches;
    `served` = the most requests a second the curve's system served at any swept rate (NaN where
    the rows hold no request_throughput). A capacity above `served` is the interpolation's, not
    the system's: no rate above what it can serve stays within any latency target for long."""

    between: tuple[float, float]
    served: float

    def __new__(cls, value: float, between: tuple[float, float], served: float = math.nan):
        capacity = super().__new__(cls, value)
        capacity.between, capacity.served = between, served
        return capacity


def rerun(rates: list[float]) -> str:
    """The advice for a curve whose knee lies at rates whose points failed."""
    return f"its points at {', '.join(f'{x:g}' for x in rates)} req/s failed (summary.csv says why): rerun them"


def capacities(rows: list[dict], slo: float, unplaced: dict | None = None) -> dict[tuple[str, str], float]:
    """(workload, allocator) -> the highest request rate with normalized latency <= `slo`. A curve
    whose rates cannot place it is an error; where `unplaced` is given, its reason goes there
    under (workload, allocator) instead, and the other curves are placed."""
    series = defaultdict(lambda: defaultdict(list))
    served = defaultdict(lambda: defaultdict(list))
    for r in _ok(rows):
        latency = number(r, "normalized_latency_s_per_tok")
        series[(r.get("workload"), r.get("allocator"))][number(r, "rate")].append(latency)
        if r.get("request_throughput") not in (None, ""):
            served[(r.get("workload"), r.get("allocator"))][number(r, "rate")].append(number(r, "request_throughput"))
    found = {}
    for (workload, allocator), by_rate in sorted(series.items()):
        rates = sorted(by_rate)
        latency = [float(np.mean(by_rate[rate])) for rate in rates]
        where = f"{allocator} on {workload} (rates {', '.join(f'{x:g}' for x in rates)})"
        above = next((i for i, v in enumerate(latency) if v > slo), None)
        failed = sorted(
            {
                number(r, "rate")
                for r in rows
                if r.get("status", "ok") != "ok" and (r.get("workload"), r.get("allocator")) == (workload, allocator)
            }
        )
        reason = None
        if len(rates) < 2:
            reason = f"report: {where} has fewer than 2 rates: a rate sweep is needed to find its knee"
        elif latency[0] > slo:
            lower = [x for x in failed if x < rates[0]]
            fix = rerun(lower) if lower else "add lower rates (workload.rate; fig12.rates under +experiment=fig12)"
            reason = (
                f"report: {where} is above report.slo_s_per_token={slo:g} already at the lowest "
                f"rate ({latency[0]:.3g} s/token): {fix}"
            )
        elif above is None:
            higher = [x for x in failed if x > rates[-1]]
            fix = (
                rerun(higher)
                if higher
                else "the sweep is too short to find its knee; add higher rates (workload.rate; fig12.rates under "
                "+experiment=fig12), or more requests a point (workload.num_requests): a run too short to build a "
                "queue stays under the target at any rate"
            )
            reason = (
                f"report: {where} never exceeds report.slo_s_per_token={slo:g} (highest "
                f"{latency[-1]:.3g} s/token): {fix}"
            )
        if reason is not None:
            if unplaced is None:
                raise UserError(reason)
            unplaced[(workload, allocator)] = reason
            continue
        # interpolate in log latency: the curve is close to exponential around its knee
        lo, hi = np.log(latency[above - 1]), np.log(latency[above])
        bracket = (rates[above - 1], rates[above])
        most = max((float(np.mean(v)) for v in served[(workload, allocator)].values()), default=math.nan)
        found[(workload, allocator)] = Capacity(np.interp(np.log(slo), [lo, hi], bracket), bracket, most)
    return found


def between_text(capacity: float) -> str:
    """`2-4`: the swept rates a capacity was interpolated between (a finer sweep there pins it)."""
    low, high = getattr(capacity, "between", (math.nan, math.nan))
    return f"{low:g}-{high:g}" if low == low else ""


# How far a capacity may lie above the most its system served before it is called the
# interpolation's: below the knee a point serves a few percent under its offered rate (a seed's
# arrivals run 2-3 % under the rate at 900 s; requests still running when the window closes),
# so a capacity interpolated between close rates sits just above the served rate (2.29 req/s
# against 2.15 served, paged between 2.2 and 2.4), while 1, 2, 4, 8 put it 18 % above (2.62 / 2.22).
OVER_SERVED = 1.10


def over_served(capacity: float) -> bool:
    """The interpolation put `capacity` well above the most its system served (OVER_SERVED)."""
    return bool(capacity > OVER_SERVED * getattr(capacity, "served", math.nan))


def capacity_row(workload: str, allocator: str, capacity: float) -> dict:
    """capacity.csv's columns of one curve's capacity; `over_served` says that the interpolation
    put it well above the most the system served (`served_max_req_s`, OVER_SERVED): a finer
    sweep between the bracketing rates, or a longer window, would place it lower."""
    served = getattr(capacity, "served", math.nan)
    return {
        "workload": workload,
        "allocator": allocator,
        "capacity_req_s": round(capacity, 4),
        "between_req_s": between_text(capacity),
        "served_max_req_s": round(served, 4),
        "over_served": over_served(capacity),
    }


def capacity_note(row) -> str:
    """The console's and the report's words for a capacity above what its system served."""
    if not getattr(row, "over_served", False):
        return ""
    low, high = re.fullmatch(r"(.+?(?:e-\d+)?)-(.+)", row.between_req_s).groups()  # 1e-05-2e-05 too
    most = f"{row.served_max_req_s:.3g}"
    return (
        f"; above the {most} req/s it served at most: a finer sweep between {low} and {high}, or a longer "
        f"workload.duration_s, places it lower"
    )


def capacity_rows(found: dict, baseline: str) -> list[dict]:
    out = []
    for (workload, allocator), capacity in found.items():
        base = found.get((workload, baseline))
        if base is None:
            known = sorted({a for w, a in found if w == workload})
            raise UserError(
                f"report.baseline={baseline!r} is not a system of the {workload} sweep; known: {', '.join(known)}"
            )
        row = capacity_row(workload, allocator, capacity)
        out.append({**row, f"ratio_to_{baseline}": round(capacity / base, 4)})
    return out


def fig12(found: dict, slo: float) -> list[dict]:
    """The paper's capacity ratios (FIG12) from each ShareGPT curve's capacity (`found`, which
    write_comparison finds once for the ratios, capacity.csv and the figure)."""
    out = []
    for (system, other), paper in FIG12.items():
        if ("sharegpt", system) in found and ("sharegpt", other) in found:
            ratio = found[("sharegpt", system)] / found[("sharegpt", other)]
            over = [SYSTEMS[s] for s in (system, other) if over_served(found[("sharegpt", s)])]
            out.append(
                comparison_row(
                    "fig12",
                    "sharegpt",
                    f"{SYSTEMS[system]} / {SYSTEMS[other]}",
                    f"capacity ratio at {slo:g} s/token"
                    + (f" ({' and '.join(over)} above what it served: capacity.csv, over_served)" if over else ""),
                    paper,
                    ratio,
                    1,
                )
            )
    return out


def sharing_points(rows: list[dict]) -> dict[tuple[str, str, int], list[dict]]:
    """(workload, sharing mode, width) -> its ok rows, in the paper's order; the mode and width are
    the columns conf/experiment/fig14_15.yaml sweeps."""
    points = defaultdict(list)
    for r in _ok(rows):
        key = (r.get("workload"), r.get("fig14_15.sharing"))
        if key in FIG14_15 and r.get("fig14_15.width"):
            points[(*key, int(number(r, "fig14_15.width")))].append(r)
    order = list(FIG14_15)
    return {k: points[k] for k in sorted(points, key=lambda k: (order.index(k[:2]), k[2]))}


def fig14_15(rows: list[dict], cfg) -> list[dict]:
    """The paper gives a range over the widths 2, 4, 6: each width is compared with it."""
    points = sharing_points(rows)
    if not points:
        raise UserError(
            "fig14_15: no point says its sharing (columns fig14_15.sharing and fig14_15.width, "
            "workload alpaca or sharegpt): run bench +experiment=fig14_15"
        )
    knobs = sorted({k for r in _ok(rows) for k in ("workload.n", "workload.beam_width") if r.get(k) not in (None, "")})
    if knobs:  # the experiment sets them from fig14_15.width: the width compared would not be the one run
        raise UserError(
            f"fig14_15: {knobs[0]} is set on the command line, but the experiment sets it from fig14_15.sharing "
            f"and fig14_15.width: drop it, and give the width as fig14_15.width=2,4,6"
        )
    alone = sorted({width for _, _, width in points if width < 2})
    if alone:
        raise UserError(
            f"fig14_15: fig14_15.width={alone[0]} shares nothing (one sequence a request), and the paper's "
            f"ranges are over widths 2, 4 and 6: give widths of 2 or more"
        )
    out = []
    for (workload, mode, width), mine in points.items():
        value, runs = mean_over_seeds(mine, "kv_blocks_saved_frac")
        name, knob = SHARING[mode]
        paper = FIG14_15[(workload, mode)]
        quantity = f"% KV blocks saved, {name} {knob}={width}"
        if width not in (2, 4, 6):  # the paper's range is over these
            quantity += " (the paper's range is over 2, 4, 6)"
        out.append(comparison_row("fig14_15", workload, "vLLM", quantity, paper, 100 * value, runs))
    return out


def fig18(rows: list[dict], cfg) -> list[dict]:
    """The block size of lowest latency, per workload. Where several tie, the quantity names them
    all: a tie that includes the paper's 16 (a load no block size strains) neither confirms nor
    refutes it, and compares nothing (n/a); one without it compares its block nearest 16. A
    sweep that did not run 16 compares nothing either, and names its best."""
    others = sorted({r.get("allocator") for r in _ok(rows)} - {"paged", None, ""})
    if others:
        raise UserError(f"fig18 is vLLM's block size (allocator paged); this sweep ran allocator {', '.join(others)}")
    out = []
    for workload in sorted({r.get("workload") for r in _ok(rows)}):
        by_block = {}
        for r in _ok(rows):
            if r.get("workload") == workload:
                by_block.setdefault(int(number(r, "block_size")), []).append(number(r, "normalized_latency_s_per_tok"))
        if len(by_block) < 2:
            raise UserError(
                f"fig18: {workload} ran at one block size ({', '.join(map(str, by_block))}): the best block size "
                f"needs several; run bench +experiment=fig18 without fixing allocator.block_size"
            )
        latency = {block: float(np.mean(values)) for block, values in sorted(by_block.items())}
        latency = {block: value for block, value in latency.items() if value == value}  # NaN: no request finished
        if not latency:
            raise UserError(f"fig18: no point of {workload} finished a request, so none has a latency to compare")
        tied = [block for block, value in latency.items() if value <= min(latency.values()) * (1 + 1e-9)]
        quantity = "block size of lowest normalized latency"
        best = float(min(tied, key=lambda block: (abs(block - 16), block)))
        notes = [f"tied: {', '.join(map(str, tied))}"] if len(tied) > 1 else []
        if len(tied) > 1 and 16 in tied:  # the paper's 16 among equals: neither confirmed nor refuted
            notes[0] += "; this load does not tell them apart"
            best = math.nan
        if 16 not in latency:  # the best of what ran says nothing of a block that did not run
            missing = "16 finished no request" if 16 in by_block else "16 not run"
            notes.append(f"{missing}: of the blocks run, {' and '.join(map(str, tied))} lowest")
            best = math.nan
        if notes:
            quantity += f" ({'; '.join(notes)})"
        out.append(comparison_row("fig18", workload, "vLLM", quantity, 16.0, best, len(by_block)))
    return out


def fig19(rows: list[dict], cfg) -> list[dict]:
    """The paper states where the two curves meet (blocks of 16-64), not their values: compared is
    the smallest block from which swapping costs no more than recomputing, in modelled
    preemption time and in normalized latency."""
    measures = {
        "preemption time": {"swap": "swap_time_model_s", "recompute": "recompute_time_model_s"},
        "normalized latency": {"swap": "normalized_latency_s_per_tok", "recompute": "normalized_latency_s_per_tok"},
    }
    preempted = any(number(r, "preemptions") > 0 for r in _ok(rows))
    out = []
    for measure, column_of in measures.items():
        by_block = defaultdict(dict)
        for r in _ok(rows):
            mode = r.get("engine.preemption")
            if mode in column_of:
                by_block[int(number(r, "block_size"))][mode] = number(r, column_of[mode])
        both = sorted(b for b, t in by_block.items() if len(t) == 2)
        if not both:
            raise UserError(
                "fig19: no block size ran with both engine.preemption=swap and recompute, so there is no "
                "crossover to find: run bench +experiment=fig19 without fixing engine.preemption"
            )
        if len(both) < 2:
            raise UserError(
                f"fig19: both preemptions ran at one block size ({both[0]}): a crossover needs several; run bench "
                f"+experiment=fig19 without fixing allocator.block_size"
            )
        if not preempted:
            raise UserError(
                "fig19: no point preempted a request, so swapping and recomputing cost nothing at every block size "
                "and there is no crossover to compare: run under the paper's memory pressure (workload.rate=4, its "
                "default)"
            )
        crossover = next((b for b in both if by_block[b]["swap"] <= by_block[b]["recompute"]), None)
        if crossover is None:
            raise UserError(
                f"fig19: swapping costs more {measure} than recomputing at every block size "
                f"swept ({', '.join(map(str, both))}): no crossover to compare"
            )
        out.append(
            comparison_row(
                "fig19",
                "sharegpt",
                "vLLM",
                f"smallest block where swap {measure} <= recompute",
                (16.0, 64.0),
                float(crossover),
                len(both),
            )
        )
    return out


# each figure's comparison from the sweep's rows and the report settings; fig12's from its curves'
# capacities instead (write_comparison)
FIGURES = {"fig2": fig2, "fig12": fig12, "fig13": fig13, "fig14_15": fig14_15, "fig18": fig18, "fig19": fig19}


def report_settings(report) -> dict:
    """The `report` config, checked: what a user typed wrong is one line."""
    report = dict(report or {})
    paper = report.get("paper")
    if paper is not None and paper not in FIGURES:
        raise UserError(f"report.paper={paper!r} is not one of {', '.join(FIGURES)}")
    fields = Report.model_fields  # the defaults and the range are the schema's
    slo = report.get("slo_s_per_token", fields["slo_s_per_token"].default)
    most = next(c.le for c in constraints(fields["slo_s_per_token"]) if getattr(c, "le", None) is not None)
    if isinstance(slo, bool) or not isinstance(slo, (int, float)) or not 0 < slo <= most:
        written = f"{most:.0e}".replace("e+0", "e")  # 1e6, as the schema writes it
        raise UserError(
            f"report.slo_s_per_token={slo!r} must be a number > 0 and <= {written} (seconds per output token)"
        )
    baseline = report.get("baseline") or fields["baseline"].default  # null: the default
    if not isinstance(baseline, str):
        raise UserError(f"report.baseline={baseline!r} must name an allocator of the sweep")
    return {"paper": paper, "slo": float(slo), "baseline": baseline}


def ran_on(row: dict) -> str:
    """Where a point ran: the hardware it simulated, or the device that served it."""
    scenario = row.get("scenario") or "simulate"
    return str((row.get("hardware") if scenario == "simulate" else row.get("device") or row.get("hardware")) or "")


def setup_lines(rows: list[dict]) -> list[str]:
    """What the compared points ran (scenario, model, the hardware simulated or the device that
    served), and a caveat where it is not the paper's setup: OPT-13B simulated on an A100-40GB."""
    ran: dict[str, dict[str, list]] = {}  # setup -> workload -> its rates, in the order they ran
    for r in _ok(rows):
        rates = ran.setdefault(f"{r.get('model') or '?'} on {ran_on(r) or '?'} ({r.get('scenario') or 'simulate'})", {})
        rates.setdefault(str(r.get("workload") or "?"), []).append(number(r, "rate"))

    def listed(rates: list) -> str:  # 1, 2, 4 req/s: each rate once, in increasing order (inf: at once)
        return (", ".join(f"{x:g}" for x in sorted({x for x in rates if x == x})) or "?") + " req/s"

    setups = [f"{setup}: " + "; ".join(f"{w} at {listed(r)}" for w, r in loads.items()) for setup, loads in ran.items()]
    lines = [f"kvbench ran: {'; '.join(setups)}."]
    paper = ("opt-13b", "a100-40gb", "simulate")
    if any((r.get("model"), r.get("hardware"), r.get("scenario") or "simulate") != paper for r in _ok(rows)):
        lines.append(
            "The paper's numbers are OPT-13B's on an A100-40GB; these points ran another model or GPU, or served "
            "on this host, so compare which way and how far each figure moves, not its value."
        )
    return lines


def markdown(rows: list[dict], title: str, failed: list[dict] = (), setup: list[str] = ()) -> str:
    """The comparison as a table, under what the points ran (`setup`); points that failed (not
    compared) listed under it."""
    lines = [
        f"# {title}",
        "",
        *[line for text in setup for line in (text, "")],
        "| figure | workload | system | quantity | paper | kvbench | delta | delta % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['figure']} | {r['workload']} | {r['system']} | {r['quantity']} | {r['paper']} "
            + (  # a figure kvbench's run could not decide (fig18's tie) has no value to compare
                "| n/a | n/a | n/a |"
                if math.isnan(r["kvbench"])
                else f"| {r['kvbench']:.4g} | {r['delta']:+.3g} | {r['delta_pct']:+.1f} |"
            )
        )
    if failed:
        lines += ["", f"{len(failed)} point(s) failed and are not compared (summary.csv has their rows):", ""]
        lines += [
            f"- {r.get('point', '?')}: {(str(r.get('reason') or '') or 'no reason').splitlines()[0]}" for r in failed
        ]
    return "\n".join(lines) + "\n"


def sweep_rows(sweep_dir: Path) -> list[dict]:
    """Every point's rows as text cells (a missing one is ""), in directory order, with a `point` key.

    The figures compare cells as the CSV holds them; results.collect's DataFrame turns a column's
    blanks into NaN and its numbers into floats, so rows are read here as text."""
    import pandas as pd

    rows = []
    for metrics in sorted(Path(sweep_dir).glob("*/metrics.csv")):
        for row in pd.read_csv(metrics, dtype=str, keep_default_na=False).to_dict("records"):
            row.setdefault("point", metrics.parent.name)
            rows.append(row)
    return rows


# what each comparison needs of a sweep's points, for the message when none has it
PAPER_SETUPS = {
    "fig2": "the Orca allocators and paged on ShareGPT at 4 req/s",
    "fig13": " or ".join(f"{workload} at {rate:g} req/s" for workload, rate in FIG13),
}


def write_comparison(sweep_dir: Path, report, plots: bool = True) -> list[Path]:
    """Compare a finished experiment sweep with the paper; return the files written (its figure
    only with `plots`: `plots=false` draws nothing)."""
    settings = report_settings(report)
    rows = sweep_rows(sweep_dir)
    if not _ok(rows):
        raise UserError(f"{sweep_dir} has no successful point to compare with the paper")
    name = settings["paper"]
    # fig12's capacities, found once: a curve its rates cannot place (a workload's sweep too
    # short) leaves the others' comparison and capacities written, and is the error after them
    unplaced: dict = {}
    if name == "fig12":
        _same_setup(rows, "fig12")
    found = capacities(rows, settings["slo"], unplaced) if name == "fig12" else {}
    compared = fig12(found, settings["slo"]) if name == "fig12" else FIGURES[name](rows, settings)
    if not compared and unplaced:  # the reason of a curve the comparison needed (fig12's: ShareGPT's) first
        raise UserError(sorted(unplaced.items(), key=lambda item: item[0][0] != "sharegpt")[0][1])
    if not compared:  # fig13: no point at one of the paper's rates
        raise UserError(
            f"report.paper={name}: no successful point of {sweep_dir} is one the paper measured "
            f"({PAPER_SETUPS.get(name, 'see docs/paper.md')}); nothing to compare"
        )
    written = [sweep_dir / "paper_comparison.csv", sweep_dir / "paper_comparison.md"]
    write_csv(written[0], compared)
    failed = [r for r in rows if r.get("status", "ok") != "ok"]
    title = f"{name}: the paper's numbers and kvbench's"
    write_atomic(written[1], markdown(compared, title, failed, setup_lines(rows)))
    if name == "fig12":
        import pandas as pd

        from kvbench.reporting.winners import configured, resolve_baseline  # it imports this module

        # as the report's verdict takes it: the default falls back to the sweep's first system in
        # the paper's order (fig12 narrowed to paged and oracle), a baseline set explicitly does not
        explicit = configured(sweep_dir)[1]
        baseline = resolve_baseline(pd.DataFrame(_ok(rows)), settings["baseline"], explicit) or settings["baseline"]
        # a workload whose baseline is unplaced has no ratios
        placed = {key: c for key, c in found.items() if (key[0], baseline) not in unplaced}
        write_csv(sweep_dir / "capacity.csv", capacity_rows(placed, baseline))
        written.append(sweep_dir / "capacity.csv")
    if plots:
        from kvbench.reporting import paper_plots  # matplotlib is slow to load; only plots need it

        if name == "fig2":
            written.append(paper_plots.fig2_breakdown(_ok(rows), sweep_dir))
        if name == "fig14_15":
            written.append(paper_plots.sharing_savings(sharing_points(rows), sweep_dir))
        if name == "fig12":
            written.append(paper_plots.latency_knees(_ok(rows), found, settings["slo"], sweep_dir))
    if unplaced:
        first, *rest = unplaced.values()
        more = f"; {len(rest)} more curve(s) cannot be placed either" if rest else ""
        raise UserError(f"{first}{more} ({', '.join(p.name for p in written)} written from the curves placed)")
    return written


# The axes an experiment's comparison needs several values of (fig12's capacity curve, fig18's
# best block, fig19's crossover); the others (a system, a workload) may be narrowed
NEEDED_AXES = {  # workload.rate: fig12's and fig13's rates are their tables' (fig12.rates, fig13.rates)
    "fig12": ("fig12.point", "workload.rate"),
    "fig13": ("workload.rate",),
    "fig18": ("allocator.block_size",),
    "fig19": ("engine.preemption", "allocator.block_size"),
}


def task_overrides(config) -> list[str]:
    """A saved sweep config's command line (hydra.overrides.task) as it was typed: an override
    that holds an interpolation (`seed=${hydra:job.num}`) stays text, where reading it would
    resolve it without the point it belongs to."""
    node = OmegaConf.select(config, "hydra.overrides.task", default=None)
    return [str(item) for item in OmegaConf.to_container(node, resolve=False)] if node is not None else []


def _parsed_overrides(config, before: tuple | list = ()) -> list:
    """`before`, then the sweep's command line (hydra.overrides.task), as Hydra parses overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides([*before, *task_overrides(config)])


def swept_values(config, key: str) -> list[str] | None:
    """The values a sweep's points take for `key` (a group or key, with or without its +), as the
    basic sweeper combines them: the experiment's params, then the command line's, the later
    winning; None where neither names it (the config's one value), or where only the sweeper
    knows them (glob(), which it expands against the config's options)."""
    from hydra.errors import HydraException

    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    values = None
    for override in _parsed_overrides(config, params):
        if override.key_or_group != key:
            continue
        if override.is_delete():
            values = None  # `~workload`: whatever that leaves is refused elsewhere
            continue
        try:
            taken = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        except HydraException:  # glob(): expanded by the sweeper, against the config's options
            values = None
            continue
        values = [str(getattr(value, "text", value)) for value in taken]  # 'sharegpt': its text
    return values


def fig12_setup(config) -> None:
    """Before fig12's sweep: its ratios are paged's capacity over oracle's and contiguous's, on
    ShareGPT; a sweep narrowed to fewer systems or another workload would run every point and
    then have nothing to compare."""
    allocators, workloads = swept_values(config, "allocator"), swept_values(config, "workload")
    if allocators is not None and not any(a in allocators and b in allocators for a, b in FIG12):
        pairs = " or ".join(f"{a} with {b}" for a, b in FIG12)
        raise UserError(
            f"fig12's ratios compare {pairs}; this sweep runs allocator {', '.join(allocators)} only: "
            f"sweep a pair (+allocator=paged,oracle) or drop the override"
        )
    if workloads is not None and "sharegpt" not in workloads:
        raise UserError(
            f"fig12's ratios are ShareGPT's; this sweep runs workload {', '.join(workloads)} only: add sharegpt "
            f"(workload=sharegpt,{workloads[0]}) or drop the override"
        )


# where fig12's and fig13's rates are set: a workload's own table, which the points read by its kind
RATE_TABLES = {
    "fig12": "fig12.rates.sharegpt.r1=0.4 (each workload's points r1..r10)",
    "fig13": "fig13.rates.sharegpt=2",
}


def refuse_fixed_axes(config, paper: str | None) -> None:
    """Before an experiment's sweep: a command line that fixes an axis its comparison needs
    (`+experiment=fig19 engine.preemption=swap`) would run every point and then be refused."""
    needed = NEEDED_AXES.get(paper or "", ())
    tables = paper in RATE_TABLES and OmegaConf.select(config, f"{paper}.rates", default=None) is not None
    for override in _parsed_overrides(config) if needed else []:
        if override.key_or_group == "workload.rate" and tables:  # +experiment's tables: one value or several
            raise UserError(
                f"+experiment={paper} takes each workload's rates from {paper}.rates, not {override.input_line}: "
                f"give {RATE_TABLES[paper]} (a trace's: +{paper}.rates.trace=..., +{paper}.duration_s.trace=...)"
            )
        if override.key_or_group in needed and not override.is_sweep_override():
            swept = (config.hydra.sweeper.get("params") or {}).get(override.key_or_group, "several values")
            raise UserError(
                f"+experiment={paper} sweeps {override.key_or_group} over {swept}, and its comparison needs them: "
                f"{override.input_line} fixes it to one; drop it (or sweep without +experiment={paper})"
            )


SHARING_KNOBS = ("workload.n", "workload.beam_width")
# experiments whose numbers are vLLM's alone (sharing, block size, preemption): their config chooses paged
PAGED_ONLY = ("fig14_15", "fig18", "fig19")


def paged_only(config, paper: str) -> None:
    """Before fig14_15's, fig18's or fig19's sweep: another allocator's points would be compared
    with vLLM's numbers (or fail one by one: Orca shares nothing)."""
    names = swept_values(config, "allocator") or [OmegaConf.select(config, "allocator.name", default=None)]
    others = [str(name) for name in names if name not in (None, "paged")]
    if others:
        raise UserError(
            f"+experiment={paper} measures vLLM's paged allocator; this sweep would run allocator "
            f"{', '.join(others)}: drop that override (or sweep without +experiment={paper})"
        )


class PaperComparison(Callback):
    """Checks `report.*` before a sweep runs. The comparison itself is written at the sweep's
    end, after its summary (kvbench.callbacks.paper_comparison)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        paper = self._settings(config)["paper"]
        try:
            check_experiment(config, paper)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    @staticmethod
    def _settings(config: DictConfig) -> dict:
        try:
            return report_settings(config.get("report"))
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)


def check_experiment(config: DictConfig, paper: str | None) -> None:
    """What the paper comparison would refuse at a sweep's end, known before it runs (the
    sweep's start, and `bench --cfg job`): `config` with its hydra node."""
    if paper in ("fig2", "fig12", "fig13"):
        fig2_setup(config, paper)
    if paper == "fig12":
        fig12_setup(config)
    if paper in PAGED_ONLY:
        paged_only(config, paper)
    if paper == "fig14_15":  # the experiment sets them from its width; the rows would be refused at the end
        knob = next((o for o in _parsed_overrides(config) if o.key_or_group in SHARING_KNOBS), None)
        if knob is not None:
            raise UserError(
                f"+experiment=fig14_15 sets workload.n and workload.beam_width from fig14_15.sharing and "
                f"fig14_15.width; {knob.input_line} would run another width than the one compared: drop it, "
                f"and give the width as fig14_15.width=2,4,6"
            )
    refuse_fixed_axes(config, paper)
