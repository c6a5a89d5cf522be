"""Result files: CSV rows written atomically, the environment columns, and sweep summaries.

Every file is written to a temporary name in the same folder and renamed into place, so an
interrupted run leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import csv
import functools
import io
import os
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

import kvbench

IDENTITY = ["scenario", "allocator", "backend", "graph", "model", "hardware", "workload", "seed"]
ENVIRONMENT = ["kvbench_version", "git_sha", "torch", "triton", "device"]


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


def ordered_columns(rows: list[dict]) -> list[str]:
    """Identity first, then the rest in first-seen order, environment last."""
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            seen.setdefault(key, None)
    head = [c for c in IDENTITY if c in seen]
    tail = [c for c in ENVIRONMENT if c in seen]
    middle = [c for c in seen if c not in head and c not in tail]
    return head + middle + tail


def write_csv(path: Path, rows: list[dict]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=ordered_columns(rows), restval="", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(v) for k, v in row.items()})
    write_atomic(path, buffer.getvalue())


def _fmt(value):
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    if isinstance(value, float):
        return repr(round(value, 9)) if value == value else "nan"
    return value


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def collect(sweep_dir: Path) -> list[dict]:
    """Every point's rows under a sweep directory, in directory order."""
    rows = []
    for metrics in sorted(Path(sweep_dir).glob("*/metrics.csv")):
        for row in read_csv(metrics):
            row.setdefault("point", metrics.parent.name)
            rows.append(row)
    return rows


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


@functools.lru_cache(maxsize=1)
def environment() -> dict:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=Path(kvbench.__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        sha = "unknown"
    return {"kvbench_version": kvbench.__version__, "git_sha": sha,
            "torch": _version("torch"), "triton": _version("triton")}
