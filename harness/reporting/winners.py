"""Which system wins at each swept setting, and by how much against the baseline allocator.

At one setting (a request rate, say) every system is offered the same load; the winner serves
it at the lowest normalized latency, the paper's measure (mean over requests of end-to-end
latency / output tokens). Its margin is the baseline's normalized latency over the winner's,
beside the ratio of their request throughputs.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from kvbench.errors import UserError
from kvbench.reporting.results import ALLOCATOR_ORDER, ok_rows, point_labels, varying_keys

METRIC = "normalized_latency_s_per_tok"
DEFAULT_BASELINE = "contiguous"
TIE = 1e-3  # systems within 0.1 % of the best share the win (an unloaded server serves all alike)


def configured_baseline(sweep_dir: Path) -> tuple[str, bool]:
    """The sweep's `report.baseline` and whether its command line set it (from multirun.yaml)."""
    saved = Path(sweep_dir) / "multirun.yaml"
    if not saved.is_file():
        return DEFAULT_BASELINE, False
    cfg = OmegaConf.load(saved)
    overrides = OmegaConf.select(cfg, "hydra.overrides.task", default=[]) or []
    explicit = any(o.lstrip("+~").startswith("report.baseline=") for o in overrides)
    return str(OmegaConf.select(cfg, "report.baseline", default=DEFAULT_BASELINE)), explicit


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


def winners(frame: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """One row per setting: the winner (`a = b` for a tie), its normalized latency and throughput,
    and both as ratios to the baseline's (NaN where the baseline has no successful point there)."""
    ok = ok_rows(frame)
    ok = ok[ok[METRIC].notna()] if METRIC in ok else ok.iloc[0:0]
    if ok.empty or "allocator" not in ok:
        return pd.DataFrame()
    keys = [k for k in varying_keys(frame) if k != "allocator"]
    groups = ok.groupby(keys, sort=False, dropna=False) if keys else [((), ok)]
    result = []
    for _, rows in groups:
        best = rows.loc[rows[METRIC].idxmin()]
        tied = rows.loc[rows[METRIC] <= best[METRIC] * (1 + TIE), "allocator"]
        base = rows[rows["allocator"] == baseline]
        entry = {
            "setting": point_labels(rows.iloc[:1], keys).iloc[0] if keys else "all points",
            "winner": " = ".join(tied),
            METRIC: best[METRIC],
            "request_throughput": best.get("request_throughput"),
            "latency_vs_baseline": float("nan"),
            "throughput_vs_baseline": float("nan"),
        }
        if len(base):
            entry["latency_vs_baseline"] = base[METRIC].iloc[0] / best[METRIC]
            if "request_throughput" in rows:
                entry["throughput_vs_baseline"] = best["request_throughput"] / base["request_throughput"].iloc[0]
        result.append(entry)
    return pd.DataFrame(result)
