"""kvbench's numbers beside the PagedAttention paper's (Kwon et al., SOSP 2023), per figure.

An experiment config (conf/experiment/NAME.yaml) sets `report.paper=NAME`; when its sweep ends,
`PaperComparison` writes `paper_comparison.csv` and `paper_comparison.md` (paper value, kvbench
value, delta for every number the paper states for that figure) and the figure's own plot. The
categories and baselines compared are defined in docs/paper.md.

Fig. 12's numbers are capacities at a latency target (kvbench.reporting.capacity); what an
experiment's comparison needs of its sweep is checked before the sweep runs
(kvbench.reporting.experiment_checks).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from kvbench.errors import UserError
from kvbench.reporting.capacity import capacities, capacity_rows, over_served
from kvbench.reporting.results import number, ok_dicts, write_atomic, write_csv
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


def mean_over_seeds(rows: list[dict], key: str, **where) -> tuple[float, int]:
    """The mean of `key` over the ok rows whose columns equal `where`, and how many there were."""
    values = [number(r, key) for r in ok_dicts(rows) if all(r.get(k) == v for k, v in where.items())]
    return (float(np.mean(values)) if values else float("nan")), len(values)


def _workloads(rows: list[dict]) -> str:
    return "+".join(sorted({str(r.get("workload")) for r in ok_dicts(rows)}))


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


def fig2(rows: list[dict], cfg) -> list[dict]:
    _same_setup(rows, "fig2")
    off = set()  # the paper's setup beside the model: ShareGPT lengths at 4 req/s, blocks of 16
    for r in ok_dicts(rows):
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
    ran = {(r.get("model"), r.get("hardware")) for r in ok_dicts(rows) if r.get("model") and r.get("hardware")}
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
        at_rate = [r for r in ok_dicts(rows) if number(r, "rate") == rate and r.get("workload") in (workload, "trace")]
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
    for r in ok_dicts(rows):
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
    knobs = sorted(
        {k for r in ok_dicts(rows) for k in ("workload.n", "workload.beam_width") if r.get(k) not in (None, "")}
    )
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
    others = sorted({r.get("allocator") for r in ok_dicts(rows)} - {"paged", None, ""})
    if others:
        raise UserError(f"fig18 is vLLM's block size (allocator paged); this sweep ran allocator {', '.join(others)}")
    out = []
    for workload in sorted({r.get("workload") for r in ok_dicts(rows)}):
        by_block = {}
        for r in ok_dicts(rows):
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
    preempted = any(number(r, "preemptions") > 0 for r in ok_dicts(rows))
    out = []
    for measure, column_of in measures.items():
        by_block = defaultdict(dict)
        for r in ok_dicts(rows):
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


def setup_lines(rows: list[dict], given: list[str] = ()) -> list[str]:
    """What the compared points ran (scenario, model, the hardware simulated or the device that
    served), what the command line set beside the experiment (`given`), and a caveat where it is
    not the paper's setup (OPT-13B simulated on an A100-40GB), or where a point's measurement
    window was its batch draining (a run too short for its rate), not the steady state the
    paper's numbers describe."""
    ran: dict[str, dict[str, list]] = {}  # setup -> workload -> its rates, in the order they ran
    for r in ok_dicts(rows):
        rates = ran.setdefault(f"{r.get('model') or '?'} on {ran_on(r) or '?'} ({r.get('scenario') or 'simulate'})", {})
        rates.setdefault(str(r.get("workload") or "?"), []).append(number(r, "rate"))

    def listed(rates: list) -> str:  # 1, 2, 4 req/s: each rate once, in increasing order (inf: at once)
        return (", ".join(f"{x:g}" for x in sorted({x for x in rates if x == x})) or "?") + " req/s"

    setups = [f"{setup}: " + "; ".join(f"{w} at {listed(r)}" for w, r in loads.items()) for setup, loads in ran.items()]
    lines = [f"kvbench ran: {'; '.join(setups)}."]
    paper = ("opt-13b", "a100-40gb", "simulate")
    if any((r.get("model"), r.get("hardware"), r.get("scenario") or "simulate") != paper for r in ok_dicts(rows)):
        lines.append(
            "The paper's numbers are OPT-13B's on an A100-40GB; these points ran another model or GPU, or served "
            "on this host, so compare which way and how far each figure moves, not its value."
        )
    if given:
        lines.append(f"Besides the experiment, the command line set: {', '.join(given)}.")
    drained = [r for r in ok_dicts(rows) if str(r.get("window_drained", "")).strip().lower() == "true"]
    if drained:
        lines.append(
            f"{len(drained)} of the {len(ok_dicts(rows))} points compared admitted every request within their "
            f"warm-up: their window is the batch draining, not the steady state the paper's numbers describe, "
            f"and their shares and batch sizes are not the paper's quantities (give the run more requests or "
            f"time: workload.num_requests, workload.duration_s)."
        )
    return lines


def command_line_settings(sweep_dir: Path) -> list[str]:
    """What a sweep's command line set beside +experiment (multirun.yaml's task overrides), less
    Hydra's own keys and those that change how a point runs, not what it measures."""
    from omegaconf import OmegaConf

    from kvbench.schema.overrides import run_mode_keys, split_override, task_overrides

    saved = Path(sweep_dir) / "multirun.yaml"
    if not saved.is_file():
        return []
    try:
        overrides = task_overrides(OmegaConf.load(saved))
    except Exception:  # noqa: BLE001 (not a config: the comparison says nothing of it)
        return []
    skipped = set(run_mode_keys()) | {"experiment"}
    keys = [split_override(o)[0] for o in overrides]
    return [o for o, key in zip(overrides, keys) if key not in skipped and not key.startswith("hydra")]


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
    if not ok_dicts(rows):
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
    write_atomic(written[1], markdown(compared, title, failed, setup_lines(rows, command_line_settings(sweep_dir))))
    if name == "fig12":
        import pandas as pd

        from kvbench.reporting.winners import configured, resolve_baseline  # it imports this module

        # as the report's verdict takes it: the default falls back to the sweep's first system in
        # the paper's order (fig12 narrowed to paged and oracle), a baseline set explicitly does not
        explicit = configured(sweep_dir)[1]
        baseline = (
            resolve_baseline(pd.DataFrame(ok_dicts(rows)), settings["baseline"], explicit) or settings["baseline"]
        )
        # a workload whose baseline is unplaced has no ratios
        placed = {key: c for key, c in found.items() if (key[0], baseline) not in unplaced}
        write_csv(sweep_dir / "capacity.csv", capacity_rows(placed, baseline))
        written.append(sweep_dir / "capacity.csv")
    if plots:
        from kvbench.reporting import paper_plots  # matplotlib is slow to load; only plots need it

        if name == "fig2":
            written.append(paper_plots.fig2_breakdown(ok_dicts(rows), sweep_dir))
        if name == "fig14_15":
            written.append(paper_plots.sharing_savings(sharing_points(rows), sweep_dir))
        if name == "fig12":
            written.append(paper_plots.latency_knees(ok_dicts(rows), found, settings["slo"], sweep_dir))
    if unplaced:
        first, *rest = unplaced.values()
        more = f"; {len(rest)} more curve(s) cannot be placed either" if rest else ""
        raise UserError(f"{first}{more} ({', '.join(p.name for p in written)} written from the curves placed)")
    return written
