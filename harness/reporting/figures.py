"""What every kvbench figure shares: the headless matplotlib backend, tolerant number parsing of
result cells, and atomic PNG writing."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kvbench.reporting.results import write_bytes_atomic  # noqa: E402


def number(row: dict, key: str) -> float:
    """A result cell as a float; NaN for a missing or non-numeric cell (a failed point)."""
    try:
        return float(row.get(key, "nan"))
    except (TypeError, ValueError):
        return float("nan")


def save_figure(fig, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_bytes_atomic(path, buffer.getvalue())
    return path
