"""Result tables: metrics.csv and summary.csv as pandas DataFrames, written atomically.

Every file is written to a temporary name in the same folder and renamed into place, so an
interrupted run leaves either the old file or the new one, never half of one. pandas is
imported by the functions that build tables: a single run's one row is written without it, as
pandas would write it, because loading pandas takes longer than a short simulated run.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import math
import os
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

import kvbench
from kvbench.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

IDENTITY = ["scenario", "allocator", "backend", "graph", "model", "hardware", "workload", "seed"]
ENVIRONMENT = ["kvbench_version", "git_sha", "torch", "triton", "device"]
# The paper's order: the more an allocator reserves, the further left; hybrid models last.
ALLOCATOR_ORDER = ("contiguous", "pow2", "oracle", "paged", "hybrid")
SYSTEM_RANK = {name: i for i, name in enumerate(ALLOCATOR_ORDER)}  # a system not in it comes after them


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def column_order(columns) -> list[str]:
    """Identity columns first, environment columns last, the others as they come."""
    head = [c for c in IDENTITY if c in columns]
    tail = [c for c in ENVIRONMENT if c in columns]
    return head + [c for c in columns if c not in head and c not in tail] + tail


def table(rows) -> pd.DataFrame:
    """Rows (a DataFrame or dicts) with identity columns first and environment columns last."""
    import pandas as pd

    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    return frame[column_order(list(frame))]


def _cell(value):
    """One cell of a one-row table as pandas writes it: floats rounded to 9 decimals, missing blank."""
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        return "" if math.isnan(value) else str(np.round(value, 9) + 0.0)  # + 0.0: -5e-17 is 0.0, not -0.0
    return value


def write_csv(path: Path, rows) -> None:
    if isinstance(rows, list) and len(rows) == 1 and isinstance(rows[0], dict):  # a single run's row
        (row,) = rows
        columns = column_order(list(row))
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(columns)
        writer.writerow([_cell(row[c]) for c in columns])
        return write_atomic(path, text.getvalue())
    # 9 decimals keep a file stable across platforms' last-bit differences
    frame = table(rows).round(9)
    for column in frame.select_dtypes("float"):
        frame[column] += 0.0  # a -5e-17 rounded is -0.0, which reads as "-0.0": 0.0
        values = frame[column].dropna()
        if len(values) < len(frame) and np.isfinite(values).all() and (values == values.round()).all():
            frame[column] = frame[column].astype("Int64")  # integers a missing cell made float
    write_atomic(path, frame.to_csv(index=False))


# Identity columns that hold names: read as text, so that an allocator named 1 is not a number
TEXT_IDENTITY = {c: str for c in IDENTITY if c != "seed"}


def read_csv(path: Path) -> pd.DataFrame:
    """A result table. Its shape is checked first, with the csv module, because pandas reads a
    malformed one without a word: a header that names a column twice (renamed `name.1`), a row
    with a field more than the header (its first field taken for an index, every cell shifted)
    or fewer (filled with blanks)."""
    import pandas as pd

    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # read once, for both
        rows = csv.reader(io.StringIO(text, newline=""))
        header = [name.strip() for name in next(rows, [])]  # ` allocator`: a spreadsheet's space is no name
        if len(header) == 1 and any(mark in header[0] for mark in ";\t|"):
            raise UserError(f"{path}: its header is one column, {header[0][:40]!r}: a result table is comma-separated")
        twice = [name for name, count in Counter(header).items() if count > 1]
        if "" in twice:  # `garbage,,,`: not a table's header
            raise UserError(f"{path}: its header has {header.count('')} blank column names; every column is named")
        if twice:
            raise UserError(f"{path}: its header names {', '.join(twice[:3])} twice; a column is named once")
        for row in rows:
            if row and len(row) != len(header):
                raise UserError(
                    f"{path} line {rows.line_num}: {len(row)} fields, but its header has {len(header)} "
                    f"(a row cut short, or a field too many)"
                )
        return pd.read_csv(io.StringIO(text), header=0, names=header or None, dtype=TEXT_IDENTITY)
    except (UnicodeDecodeError, ValueError) as err:  # csv.Error is a ValueError too
        raise UserError(f"{path} is not a readable CSV file ({type(err).__name__})") from None


def collect(sweep_dir: Path) -> pd.DataFrame:
    """Every point's rows under a sweep directory, in directory order, with a `point` column."""
    import pandas as pd

    frames = []
    for path in sorted(Path(sweep_dir).glob("*/metrics.csv")):
        frames.append(read_csv(path).assign(point=path.parent.name))
        if frames[-1].empty:  # a run writes its row and header together, atomically: this file was cut
            raise UserError(f"{path} has a header but no row: its point's result is lost; rerun that point")
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def number(row: dict, key: str) -> float:
    """A result cell as a float; NaN for a missing or non-numeric cell (a failed point)."""
    try:
        return float(row.get(key, "nan"))
    except (TypeError, ValueError):
        return float("nan")


def ok_dicts(rows: list[dict]) -> list[dict]:
    """The rows (dicts) of the points that ran: status ok, or no status."""
    return [r for r in rows if r.get("status", "ok") == "ok"]


def ok_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"].fillna("ok") == "ok"] if "status" in frame else frame


def varying_keys(frame: pd.DataFrame) -> list[str]:
    """The columns that tell points apart: the sweep, identity, and every swept `group.key`
    whose `key` is not already an identity column (workload.rate -> rate)."""
    named = ["sweep"] + IDENTITY + ["block_size", "rate", "batch_spec"]  # batch_spec: a kernel's batch
    swept = sorted(c for c in frame if "." in c and c.rsplit(".", 1)[-1] not in named)
    return [k for k in named + swept if k in frame and frame[k].nunique(dropna=False) > 1]


def curve_keys(frame: pd.DataFrame, keys: list[str]) -> list[str]:
    """Of `keys` (what tells points apart, the rate left out), those that tell curves over the rate
    apart. A key that only renames the rate (fig12.point: r1..r10 name the rates of each workload's
    curve) would cut every curve into single points, so it is left out: a key whose values and
    the rates pair one to one among points that share every other key. Where two keys pair so
    with the rate (fig12's point and workload, whose curves take different rates), the one with
    more values per group goes first (point: 10 a workload; workload: 2 a point), and the rest are
    tested again. A key pairs so only with three values or more a group, on average: two values
    at two rates is what failed points can leave of a real key (seeds 0 and 1 at rates 1 and 2,
    each with one failure). The sweep, the allocator and the workload always stay (a curve is
    one system's, on one workload's requests)."""
    kept = list(keys)
    while "rate" in frame:
        best, most = None, 2.0
        for key in kept:
            if key in ("sweep", "allocator", "workload"):
                continue
            others = [k for k in kept if k != key]
            sizes = []
            for _, group in frame.groupby(others, dropna=False) if others else [((), frame)]:
                pairs = group[[key, "rate"]].drop_duplicates()
                if pairs[key].nunique(dropna=False) != len(pairs) or pairs["rate"].nunique(dropna=False) != len(pairs):
                    break  # a value of the key at several rates, or a rate under several values: a real key
                sizes.append(len(pairs))
            else:
                if sum(sizes) / len(sizes) > most:
                    best, most = key, sum(sizes) / len(sizes)
        if best is None:
            break
        kept.remove(best)
    return kept


def rate_curves(frame: pd.DataFrame) -> list[str] | None:
    """The keys that tell the sweep's curves over the request rate apart (curve_keys: every key
    but the rate and those that only name it), where some curve was taken at several finite
    rates; None where there is no rate axis (one rate, or each workload at its own one rate, as in
    fig13). Points at an infinite rate are on no curve. The plots and the verdict's capacities
    draw and place the same curves from it."""
    import pandas as pd

    varying = varying_keys(frame)
    if "rate" not in varying:
        return None
    finite = frame[np.isfinite(pd.to_numeric(frame["rate"], errors="coerce"))]  # rate=inf is on no curve
    keys = curve_keys(finite, [k for k in varying if k != "rate"])
    most = finite.groupby(keys, dropna=False)["rate"].nunique().max() if keys else finite["rate"].nunique()
    return keys if len(finite) and most >= 2 else None


def cell_text(value) -> str:
    """A cell as a reader wants it: integral numbers without `.0`, missing as blank."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, (float, np.floating)) and np.isfinite(value) and value == int(value):
        return str(int(value))
    return str(value)


def identity_text(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The columns that name a point as points are matched on: each cell as cell_text writes it,
    so a number matches by its value (rate 1 is rate 1.0, which a column of 1, 8 and 0.5 or a
    blank cell reads), a text as it is, and a missing cell is empty."""
    cells = frame[columns].astype(object)
    return cells.where(cells.notna(), None).map(cell_text)


# `key=value` or `+group=option`: how a bench override reads
OVERRIDE = re.compile(r"[+~]{0,2}[A-Za-z_][\w.]*=")


def path_given(text: str, name: str, wanted: str, options: str = "") -> Path:
    """A path from a command line. An empty one (an unset variable) is refused: Path("") would
    be the current folder; so is a missing one that reads as a bench override (`report.baseline=
    paged`), naming the command's `options` instead."""
    if not str(text).strip():
        raise UserError(f"{name} is empty (an unset variable?): give {wanted}")
    path = Path(text)
    if options and OVERRIDE.match(str(text)) and not path.exists():
        raise UserError(f"{text} is not a file or folder: KEY=VALUE overrides are bench's; here {options}")
    return path


def point_labels(frame: pd.DataFrame, keys: list[str] | None = None) -> pd.Series:
    """Each row's name from the columns that tell points apart: `paged, rate=4`. A key a row
    has no value for (a sweep that did not set it: its default) is left out of its name."""
    import pandas as pd

    keys = varying_keys(frame) if keys is None else keys
    if not keys or frame.empty:
        return frame.get("allocator", pd.Series("point", index=frame.index, dtype=object)).map(cell_text)
    shown = lambda v: f"{v:.6g}" if isinstance(v, (float, np.floating)) and np.isfinite(v) else cell_text(v)
    texts = pd.DataFrame({k: frame[k].map(shown) for k in keys})  # rate=10.100226994 reads 10.1002
    named = texts.apply(
        lambda text: text if text.name in ("sweep", "allocator") else f"{text.name.rsplit('.', 1)[-1]}=" + text
    )
    return named.where(texts != "").apply(lambda row: ", ".join(row.dropna()), axis=1)


def in_paper_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Sweeps in the order given, then every other varying key, then systems in the paper's order."""
    import pandas as pd

    keys = [k for k in varying_keys(frame) if k not in ("sweep", "allocator")]
    order = frame.assign(
        _sweep=pd.factorize(frame["sweep"])[0] if "sweep" in frame else 0,
        _system=frame["allocator"].map(SYSTEM_RANK).fillna(len(SYSTEM_RANK)) if "allocator" in frame else 0,
    )
    return order.sort_values(["_sweep", *keys, "_system"], kind="stable").drop(columns=["_sweep", "_system"])


def _version(dist: str) -> str:
    from importlib import metadata  # here: bench's helper imports this module and asks no version

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


# what kvbench runs (pathspecs from the checkout's root): a run's own output written inside the
# checkout (bench from scripts/, a hydra.sweep.dir there) does not make it dirty, nor do the docs
SOURCES = (":/harness", ":/plugins", ":/kernels", ":/conf", ":/pyproject.toml")


def _git(*args: str) -> str | None:
    """A git command's output in kvbench's own checkout; None where there is none (an install)."""
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=Path(kvbench.__file__).parent, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def environment() -> dict:
    """What produced a row. `git_sha` ends in `-dirty` where kvbench's sources in the checkout
    (SOURCES) have changes not committed, untracked files included, as `git describe --dirty`
    marks it: a row is then not reproducible from its sha alone."""
    sha = (_git("rev-parse", "--short=12", "HEAD") or "").strip() or "unknown"
    if sha != "unknown" and _git("status", "--porcelain", "--", *SOURCES):
        sha += "-dirty"
    return {
        "kvbench_version": kvbench.__version__,
        "git_sha": sha,
        "torch": _version("torch"),
        "triton": _version("triton"),
    }


def source_changes() -> str | None:
    """The sha256 of the sources' changes not committed (a diff against HEAD, and the names of
    untracked files); None for a clean checkout or an install."""
    if not environment()["git_sha"].endswith("-dirty"):
        return None
    changes = (_git("diff", "HEAD", "--", *SOURCES) or "") + (_git("status", "--porcelain", "--", *SOURCES) or "")
    return hashlib.sha256(changes.encode()).hexdigest()
