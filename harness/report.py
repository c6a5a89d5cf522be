"""Turn sweep directories into summary.csv and the comparison plots."""

from __future__ import annotations

from pathlib import Path

from kvbench.errors import UserError
from kvbench.plots import draw_all
from kvbench.results import collect, write_csv


def summarize(sweep_dir: Path, out_dir: Path | None = None) -> list[Path]:
    sweep_dir = Path(sweep_dir)
    rows = collect(sweep_dir)
    if not rows:
        raise UserError(f"{sweep_dir} has no results (no */metrics.csv below it)")
    out_dir = Path(out_dir or sweep_dir)
    summary = out_dir / "summary.csv"
    write_csv(summary, rows)
    return [summary, *draw_all(rows, out_dir)]
