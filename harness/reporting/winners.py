"""Which system wins at each swept setting, how much load each sustains, and both against the
baseline allocator.

At one setting (a request rate, say) every system is offered the same load; the winner serves
it at the lowest normalized latency, the paper's measure (mean over requests of end-to-end
latency / output tokens). Its margin is the baseline's normalized latency over the winner's,
beside the ratio of their request throughputs. Across the rates of a sweep, a system's capacity
is the highest rate it serves within the latency target (kvbench.reporting.capacity.capacities).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from kvbench.errors import UserError
from kvbench.reporting.capacity import capacities, capacity_row, capacity_rows
from kvbench.reporting.results import ALLOCATOR_ORDER, ok_rows, point_labels, rate_curves, varying_keys
from kvbench.schema.overrides import task_overrides

METRIC = "normalized_latency_s_per_tok"
DEFAULT_BASELINE = "contiguous"
DEFAULT_SLO = 0.5  # conf/bench.yaml's report.slo_s_per_token
TIE = 1e-3  # systems within 0.1 % of the best share the win (an unloaded server serves all alike)


def times(ratio: float) -> str:
    """A ratio with the digits that tell it from 1: 1.002, not 1.00 (a near-tie is not a tie,
    and reads as one at two decimals)."""
    if 0 < abs(ratio) < 0.01:  # 0.003, not 0.00
        return f"{ratio:.2g}"
    off = abs(ratio - 1)  # below 1e-12: one number's rounding against another's, a tie
    digits = 2 if off < 1e-12 or not math.isfinite(off) else max(2, math.ceil(-math.log10(off)))
    return f"{ratio:.{digits}f}"


def configured(sweep_dir: Path) -> tuple[str, bool, float]:
    """The sweep's `report.baseline`, whether its command line set it, and its
    `report.slo_s_per_token` (from multirun.yaml)."""
    saved = Path(sweep_dir) / "multirun.yaml"
    if not saved.is_file():
        return DEFAULT_BASELINE, False, DEFAULT_SLO
    try:
        cfg = OmegaConf.load(saved)
        overrides = task_overrides(cfg)
        baseline = OmegaConf.select(cfg, "report.baseline", default=DEFAULT_BASELINE)
        slo = OmegaConf.select(cfg, "report.slo_s_per_token", default=DEFAULT_SLO)
    except Exception as err:  # noqa: BLE001 (YAML's and OmegaConf's errors alike: the file is not a config)
        raise UserError(
            f"{saved} is not the sweep's saved config ({type(err).__name__}); give --baseline and --slo"
        ) from None
    if isinstance(slo, bool) or not isinstance(slo, (int, float)) or not 0 < slo < math.inf:
        raise UserError(f"{saved}: report.slo_s_per_token={slo!r} must be a number > 0 (s per token); or give --slo")
    if baseline is None:  # null: the default, which falls back to the sweep's first system
        return DEFAULT_BASELINE, False, float(slo)
    explicit = any(str(o).lstrip("+~").startswith("report.baseline=") for o in overrides)
    return str(baseline), explicit, float(slo)


def verdict_settings(frame: pd.DataFrame, sweep_dir: Path, baseline: str | None = None, slo: float | None = None):
    """(the baseline the ratios are taken against, the baseline asked for, the latency target):
    `baseline` and `slo` as given, else the sweep's report.baseline and report.slo_s_per_token."""
    name, explicit, configured_slo = (baseline, True, slo) if baseline and slo else configured(sweep_dir)
    name, explicit = (baseline, True) if baseline else (name, explicit)
    return resolve_baseline(frame, name, explicit), name, slo or configured_slo


def resolve_baseline(frame: pd.DataFrame, name: str, explicit: bool) -> str | None:
    """`name` when the sweep has it; an explicit name it lacks is an error, a default one falls
    back to the sweep's first system in the paper's order. None for a sweep of one system."""
    systems = list(dict.fromkeys(frame["allocator"].dropna())) if "allocator" in frame else []
    if name in systems:
        return name
    if explicit:
        raise UserError(f"report.baseline={name!r} is not in the sweep; its allocators: {', '.join(systems) or 'none'}")
    if len(systems) < 2:
        return None
    rank = {system: i for i, system in enumerate(ALLOCATOR_ORDER)}
    return min(systems, key=lambda s: rank.get(s, len(rank)))


def ranked(frame: pd.DataFrame) -> pd.DataFrame:
    """The points winners are named from: those that ran and measured normalized latency."""
    ok = ok_rows(frame)
    return ok[ok[METRIC].notna()] if METRIC in ok else ok.iloc[0:0]


def winners(frame: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """One row per setting: the winner (`a = b` for a tie), its normalized latency and throughput,
    and both as ratios to the baseline's (NaN where the baseline has no successful point there).
    `baseline_state` says which: `ok`, `failed` (it ran and failed there) or `absent` (it did
    not run there). Of several sweeps (a `sweep` column), one that never ran the baseline takes
    its own first system in the paper's order (`baseline` names each row's; empty for a sweep of
    one system), as its own report does."""
    ok = ranked(frame)
    if ok.empty or "allocator" not in ok:
        return pd.DataFrame()
    keys = [k for k in varying_keys(frame) if k != "allocator"]
    ran = frame.groupby("sweep")["allocator"].agg(set) if "sweep" in frame else None
    result = []
    for _, every in frame.groupby(keys, sort=False, dropna=False) if keys else [((), frame)]:
        rows = ok.loc[ok.index.intersection(every.index)]
        if rows.empty:
            continue
        local = baseline
        if ran is not None and baseline not in ran[every["sweep"].iloc[0]]:
            local = resolve_baseline(frame[frame["sweep"] == every["sweep"].iloc[0]], str(baseline), False)
        best = rows.loc[rows[METRIC].idxmin()]
        tied = rows.loc[rows[METRIC] <= best[METRIC] * (1 + TIE), "allocator"]
        base = rows[rows["allocator"] == local]
        entry = {
            "setting": point_labels(rows.iloc[:1], keys).iloc[0] if keys else "all points",
            "winner": " = ".join(tied),
            METRIC: best[METRIC],
            "request_throughput": best.get("request_throughput"),
            "baseline": local or "",  # "": a sweep of one system (pandas would read None as NaN)
            "baseline_state": "ok" if len(base) else "failed" if (every["allocator"] == local).any() else "absent",
            "latency_vs_baseline": float("nan"),
            "throughput_vs_baseline": float("nan"),
            # the baseline's mean wait for a first token, and the span its requests arrived over
            "baseline_wait_s": float("nan"),
            "arrival_span_s": float("nan"),
        }
        if len(base):
            entry["latency_vs_baseline"] = base[METRIC].iloc[0] / best[METRIC]
            if "request_throughput" in rows:
                entry["throughput_vs_baseline"] = best["request_throughput"] / base["request_throughput"].iloc[0]
            wait, requests, rate = (
                pd.to_numeric(base.get(column, pd.Series([None])), errors="coerce").iloc[0]
                for column in ("mean_ttft_ms", "requests", "rate")
            )
            # 0 where every request arrived at once (rate=inf); unknown for one request, or no rate (a trace)
            span = 0.0 if rate == math.inf else (requests - 1) / rate if requests > 1 else float("nan")
            entry["baseline_wait_s"], entry["arrival_span_s"] = wait / 1e3, span
        result.append(entry)
    return pd.DataFrame(result)


def capacity(frame: pd.DataFrame, slo: float, baseline: str | None) -> tuple[pd.DataFrame, list[str]]:
    """Each system's capacity at `slo` s/token for every setting of the keys but rate, with its
    ratio to the baseline's where that is known; and one line for each curve (or the whole sweep)
    whose crossing of the target the swept rates cannot place."""
    ok = ok_rows(frame)
    ok = ok[ok[METRIC].notna()] if METRIC in ok and "allocator" in ok else ok.iloc[0:0]
    curves = None if ok.empty else rate_curves(ok)
    if curves is None:
        rates = sorted(pd.to_numeric(ok.get("rate", pd.Series()), errors="coerce").unique())
        listed = ", ".join(f"{r:g}" for r in rates) or "none"
        several_finite = len(rates) > 1 and all(math.isfinite(r) for r in rates)
        taken = (
            f"each curve was taken at one request rate (rates: {listed})"
            if several_finite  # each workload at its own rate (fig13)
            else f"the points were not taken at several finite request rates (rate: {listed})"
        )
        served = "scenario" in frame and not frame.empty and frame["scenario"].astype(str).eq("serve").all()
        key = "scenario.rate" if served else "workload.rate"  # a served run's rate is its scenario's
        crossing = f"to find where each system crosses {slo:g} s/token"
        return pd.DataFrame(), [f"{taken}; sweep {key} (e.g. {key}=1,2,4,8) {crossing}"]
    ok = ok[np.isfinite(pd.to_numeric(ok["rate"], errors="coerce"))]  # rate=inf is on no curve
    keys = [k for k in curves if k != "allocator"]  # the curves the plots draw; a system's each
    found, unplaced = [], []
    for _, rows in ok.groupby(keys, sort=False, dropna=False) if keys else [((), ok)]:
        setting = point_labels(rows.iloc[:1], keys).iloc[0] if keys else ""
        curves = {}
        for _, curve in rows.groupby("allocator", sort=False):
            try:  # capacity.capacities reads the rows as text cells, every one of them an ok point
                curves |= capacities(curve.assign(status="ok").to_dict("records"), slo)
            except UserError as err:  # named by its setting: two seeds' curves read alike
                reason = str(err).removeprefix("report: ")
                unplaced.append(f"{setting}: {reason}" if setting else reason)
        if any(system == baseline for _, system in curves):
            found += [{"setting": setting, **row} for row in capacity_rows(curves, baseline)]
        else:
            found += [{"setting": setting, **capacity_row(w, a, c)} for (w, a), c in curves.items()]
    return pd.DataFrame(found).rename(columns={f"ratio_to_{baseline}": "ratio_to_baseline"}), unplaced
