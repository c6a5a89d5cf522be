"""What every kvbench figure shares: the headless matplotlib backend, one colour per system, a
title naming what was measured, and atomic PNG writing.

matplotlib is not imported here: a report, bench-compare or a console table use the titles and
colours without drawing, and loading pyplot costs about half a second (kvbench.reporting.plots
and the other drawing modules import it through `pyplot()`)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from kvbench.reporting.results import write_bytes_atomic

if TYPE_CHECKING:
    import pandas as pd

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


def pyplot():
    """matplotlib.pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def context_title(frame: pd.DataFrame) -> str:
    """`opt-13b on a100-40gb, sharegpt workload (simulate)`: what every point of `frame` measured."""

    def values(column: str) -> str:
        return "/".join(map(str, dict.fromkeys(frame[column].dropna()))) if column in frame else "?"

    return f"{values('model')} on {values('hardware')}, {values('workload')} workload ({values('scenario')})"


def save_figure(fig, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    pyplot().close(fig)
    write_bytes_atomic(path, buffer.getvalue())
    return path
