"""What every kvbench figure shares: the headless matplotlib backend, one colour per system, a
title naming what was measured, and atomic PNG writing."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from kvbench.reporting.results import write_bytes_atomic  # noqa: E402

# Figures stay within ~1,400 px (12.5 in at 110 dpi) so a report page shows them unscaled.
DPI = 110
MAX_WIDTH_IN = 12.5
SYSTEM_COLORS = {
    "contiguous": "#c92a2a",
    "pow2": "#e67700",
    "oracle": "#5f3dc4",
    "paged": "#1971c2",
    "hybrid": "#2b8a3e",
}
LINE_STYLES = ("-", "--", ":", "-.")


def context_title(frame: pd.DataFrame) -> str:
    """`opt-13b on a100-40gb, sharegpt workload (simulate)`: what every point of `frame` measured."""

    def values(column: str) -> str:
        return "/".join(map(str, dict.fromkeys(frame[column].dropna()))) if column in frame else "?"

    return f"{values('model')} on {values('hardware')}, {values('workload')} workload ({values('scenario')})"


def save_figure(fig, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    write_bytes_atomic(path, buffer.getvalue())
    return path
