"""gpu_check.sh's last stage: gather its sweeps into CSVs and print the figures it checks against goals.

    python scripts/gpu_figures.py WORK_DIR OUT_DIR

WORK_DIR holds the sweeps `kernel/`, `flashinfer/` and `graphs/` (each with summary.csv);
OUT_DIR receives kernel.csv, graphs.csv and latency_vs_context.png.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

from script_checks import run_main, writable_folder

from kvbench.errors import ArgumentParser, UserError
from kvbench.reporting.results import path_given, read_csv, write_csv

MEASURED_HBM_BYTES_PER_S = 4.3e12  # H200 device-to-device copy measured here (docs/facts.md)
GOAL_BANDWIDTH_FRAC, GOAL_PAGING_OVERHEAD = 0.80, 1.10
LONG_CONTEXT = 4096


def num(row: dict, key: str) -> float:
    try:
        return float(row.get(key, "nan"))
    except ValueError:
        return float("nan")


def interpreted(row: dict) -> bool:
    """Whether the point ran under the Triton interpreter: its times are not performance. The
    column reads back as a bool, or as text from a hand-made table."""
    return str(row.get("interpreted")).strip().lower() == "true"


def pct(value: float) -> str:
    return f"{value:.1%}" if value == value else "n/a"  # NaN: no roofline (a CPU has no profiled peak)


SWEEPS = {  # each sweep's summary.csv and the columns its figures read
    "kernel": ("status", "backend", "batch_spec", "dtype"),
    "flashinfer": ("status", "backend", "batch_spec", "dtype"),
    "graphs": ("status", "requests", "graph"),
}


def ok_rows(work: Path, sweep: str) -> list[dict]:
    """The points of `sweep` that ran; a summary.csv without a column the figures read is refused
    before anything is written."""
    path = work / sweep / "summary.csv"
    if not path.exists():
        return []
    frame = read_csv(path)
    missing = [c for c in SWEEPS[sweep] if c not in frame]
    if missing:
        raise UserError(f"{path} lacks column(s) {', '.join(missing)}: not a {sweep} sweep's summary.csv")
    rows = frame[frame["status"] == "ok"].to_dict("records")
    if sweep == "graphs":
        if any(num(r, "requests") != num(r, "requests") for r in rows):  # NaN: blank, or not a number
            raise UserError(f"{path}: a point that ran has no number in its requests column")
    return rows


def kernel_figures(rows: list[dict]) -> list[str]:
    lines = []
    decode = [r for r in rows if r["backend"] == "triton_paged"]
    if not decode:
        return ["kernel: no triton_paged point finished"]
    reference = [r for r in decode if r["batch_spec"] == "64d4k"] or [max(decode, key=lambda r: num(r, "kv_tokens"))]
    for r in sorted(reference, key=lambda r: r["dtype"]):
        frac = num(r, "achieved_gbps") * 1e9 / MEASURED_HBM_BYTES_PER_S
        lines.append(
            f"triton_paged {r['batch_spec']} {r['dtype']}: {num(r, 'latency_us_p50'):.1f} us, "
            f"{num(r, 'achieved_gbps'):.0f} GB/s = {frac:.1%} of measured "
            f"{MEASURED_HBM_BYTES_PER_S / 1e12:.1f} TB/s ({pct(num(r, 'roofline_frac'))} of "
            f"{r.get('roofline_hardware') or 'no profiled'} peak), paging overhead {num(r, 'paging_overhead'):.3f}x, "
            f"max err vs eager {num(r, 'max_abs_err_vs_eager'):.2e}"
            + (" [interpreted: not performance]" if interpreted(r) else "")
        )
    long = [r for r in decode if num(r, "context_len") >= LONG_CONTEXT and not interpreted(r)]
    if long:
        worst_bw = min(num(r, "achieved_gbps") * 1e9 / MEASURED_HBM_BYTES_PER_S for r in long)
        worst_paging = max(num(r, "paging_overhead") for r in long)
        lines.append(
            f"goal at contexts >= {LONG_CONTEXT}: bandwidth >= {GOAL_BANDWIDTH_FRAC:.0%} of measured "
            f"(worst {worst_bw:.1%}: {'PASS' if worst_bw >= GOAL_BANDWIDTH_FRAC else 'FAIL'}), "
            f"paging overhead <= {GOAL_PAGING_OVERHEAD - 1:.0%} (worst {worst_paging - 1:+.1%}: "
            f"{'PASS' if worst_paging <= GOAL_PAGING_OVERHEAD else 'FAIL'})"
        )
    by_backend = defaultdict(list)
    for r in rows:
        if r["batch_spec"] == reference[0]["batch_spec"] and r["dtype"] == reference[0]["dtype"]:
            by_backend[r["backend"]].append(r)
    for backend, points in sorted(by_backend.items()):
        r = points[0]
        lines.append(
            f"  {backend:13s} {r['batch_spec']} {r['dtype']}: {num(r, 'latency_us_p50'):9.1f} us "
            f"{num(r, 'achieved_gbps'):8.1f} GB/s  paging {num(r, 'paging_overhead'):.3f}x"
        )
    return lines


def graph_figures(rows: list[dict]) -> list[str]:
    """Decode step time (TPOT p50) of each graph mode against eager's, per batch size."""
    lines = []
    by_point = {(int(num(r, "requests")), r["graph"], str(r.get("async_scheduling", False))): r for r in rows}
    for batch in sorted({key[0] for key in by_point}):
        eager = by_point.get((batch, "eager", "False"))
        for graph in ("eager", "full", "piecewise"):
            for async_ in ("False", "True"):
                r = by_point.get((batch, graph, async_))
                if r is None:
                    continue
                tpot = num(r, "median_tpot_ms") / 1e3
                versus = f"({tpot * 1e3 / num(eager, 'median_tpot_ms'):.2f}x eager)" if eager else ""
                lines.append(
                    f"batch {batch:3d} {graph:9s} async={async_:5s}: {tpot * 1e3:8.3f} ms/decode step "
                    f"{versus}, launch {num(r, 'launch_s') * 1e3:.3f} ms, device "
                    f"{num(r, 'device_s') * 1e3:.3f} ms, cpu_overhead_frac "
                    f"{num(r, 'cpu_overhead_frac'):.2f}, uncaptured steps {r.get('graph_eager_steps', '')}"
                )
    return lines or ["graphs: no serve point finished"]


def main(work: Path, out: str) -> None:
    kernel = ok_rows(work, "kernel") + ok_rows(work, "flashinfer")
    graphs = ok_rows(work, "graphs")
    out = writable_folder(out, "OUT_DIR")  # made once the tables it gets are known good
    if kernel:
        write_csv(out / "kernel.csv", kernel)
    if graphs:
        write_csv(out / "graphs.csv", graphs)
    plot = work / "kernel" / "latency_vs_context.png"
    if plot.is_file():
        shutil.copy(plot, out / plot.name)
    print(f"kernel points: {len(kernel)}, serve points: {len(graphs)}")
    print("\n".join(kernel_figures(kernel) + graph_figures(graphs)))


def cli() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", help="gpu_check.sh's work folder (kernel/, flashinfer/, graphs/)")
    parser.add_argument("out", help="the folder to write kernel.csv, graphs.csv and the plot into")
    args = parser.parse_args()
    work = path_given(args.work, "WORK_DIR", "gpu_check.sh's work folder")
    if not work.is_dir():
        raise UserError(f"{work} is not a folder: give gpu_check.sh's work folder (kernel/, graphs/ ...)")
    if not any((work / sweep).is_dir() for sweep in SWEEPS):  # a sweep that finished nothing has no summary.csv
        raise UserError(f"{work} holds none of {', '.join(f'{s}/' for s in SWEEPS)}: not gpu_check.sh's work folder")
    main(work, args.out)


if __name__ == "__main__":
    run_main(cli)
