"""bench-report: sweep directories become summary.csv, plots and one HTML page with no broken image."""

from __future__ import annotations

import base64
import csv
import io
import subprocess
import sys
from html.parser import HTMLParser

import matplotlib.image
import pytest

SMALL = ["workload.num_requests=50", "workload.duration_s=null", "progress=false"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(cwd, *args):
    return subprocess.run([sys.executable, "-m", "kvbench.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def bench_report(*args):
    return subprocess.run([sys.executable, "-m", "kvbench.reporting.report", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    result = bench(root, "-m", "+allocator=oracle,paged", *SMALL, "hydra.sweep.dir=sweep")
    assert result.returncode == 0, result.stderr
    with open(root / "sweep" / "summary.csv") as f:
        failed = [r["reason"] for r in csv.DictReader(f) if r["status"] != "ok"]
    assert not failed, failed
    return root / "sweep"


class Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources, self.cells = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(dict(attrs).get("src", ""))

    def handle_data(self, data):
        self.cells.append(data.strip())


def decoded_images(page) -> tuple[list[bytes], list[str]]:
    parser = Images()
    parser.feed(page.read_text())
    images = []
    for src in parser.sources:
        assert src.startswith("data:image/png;base64,"), src[:60]
        images.append(base64.b64decode(src.split(",", 1)[1], validate=True))
    return images, parser.cells


def test_report_of_a_sweep_embeds_every_plot_as_a_png(sweep, tmp_path):
    result = bench_report(sweep, "--out", tmp_path)
    assert result.returncode == 0, result.stderr

    pngs = sorted(tmp_path.glob("*.png"))
    assert {p.name for p in pngs} >= {"kv_breakdown.png", "throughput_latency.png"}
    images, cells = decoded_images(tmp_path / "report.html")
    assert len(images) == len(pngs)
    for data in images:
        assert data.startswith(PNG_MAGIC)
        height, width, _ = matplotlib.image.imread(io.BytesIO(data), format="png").shape
        assert height > 100 and width > 100
    assert {p.read_bytes() for p in pngs} == set(images)
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["allocator"] for r in rows) == ["oracle", "paged"]
    assert {"oracle", "paged"} <= set(cells)


def test_sweep_end_writes_the_report_into_the_sweep_directory(sweep):
    images, _ = decoded_images(sweep / "report.html")
    assert len(images) >= 2 and all(data.startswith(PNG_MAGIC) for data in images)


def test_two_sweeps_make_one_report_with_a_sweep_column_and_failed_points_apart(sweep, tmp_path):
    other = tmp_path / "other"
    result = bench(tmp_path, "-m", "+allocator=pow2", "allocator.block_size=16,300", *SMALL,
                   f"hydra.sweep.dir={other}")
    assert result.returncode == 2, result.stderr  # the refused point is recorded, and the sweep says so
    result = bench_report(other, sweep)
    assert result.returncode == 0, result.stderr
    with open(other / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["sweep"], r["allocator"], r["status"]) for r in rows) == [
        ("other", "pow2", "failed"), ("other", "pow2", "ok"), ("sweep", "oracle", "ok"), ("sweep", "paged", "ok")]
    _, cells = decoded_images(other / "report.html")
    assert "sweep" in cells
    page = (other / "report.html").read_text()
    assert "<h2>Failed points</h2>" in page
    assert "allocator.block_size=300 must be" in page


def test_a_directory_without_results_is_one_line_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    result = bench_report(tmp_path / "empty")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'empty'} has no results (no */metrics.csv, metrics.csv or summary.csv in it)"]
