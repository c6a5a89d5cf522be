"""report.html of a 12-rate sweep in a real headless browser at 1,400 px: every image loads at
its own size, the page needs no horizontal scroll bar (the results table scrolls inside its box,
its first column sticky), and a screenshot is taken."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import matplotlib.image
import pytest

BROWSER = next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"))), None
)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium or Chrome on PATH (apt-get install chromium)")
RATES = "0.5,1,1.5,2,2.5,3,3.5,4,4.5,5,5.5,6"
# Appended to a copy of the page: what the browser laid out, written into the DOM it dumps.
PROBE = """<script>window.addEventListener("load", () => {
  const images = [...document.images];
  const cell = document.querySelector(".scroll td");
  const box = document.querySelector(".scroll");
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({
    images: images.length,
    loaded: images.filter(i => i.complete && i.naturalWidth > 0).length,
    scale: Math.min(...images.map(i => i.getBoundingClientRect().width / i.naturalWidth)),
    pageWidth: document.documentElement.scrollWidth, viewWidth: document.documentElement.clientWidth,
    boxRight: box.getBoundingClientRect().right, boxOverflow: getComputedStyle(box).overflowX,
    firstColumn: getComputedStyle(cell).position});
  document.body.appendChild(probe);
});</script>"""


def headless(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("rates")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvbench.cli",
            "-m",
            "+allocator=contiguous,paged",
            f"workload.rate={RATES}",
            "workload.num_requests=20",
            "workload.duration_s=null",
            "progress=false",
            "hydra.sweep.dir=sweep",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return root / "sweep" / "report.html"


def test_every_image_loads_unscaled_and_the_page_needs_no_horizontal_scroll(report, tmp_path):
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dom = headless("--window-size=1400,900", "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()).stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom)
    assert found, dom[-2000:]
    seen = json.loads(found.group(1))
    assert seen["images"] == seen["loaded"] == 3  # kv_breakdown, throughput_latency, latency_vs_rate
    assert seen["scale"] > 0.9  # no figure shrunk to unreadable text
    assert seen["pageWidth"] <= seen["viewWidth"] == 1400
    assert seen["boxOverflow"] == "auto" and seen["boxRight"] <= seen["viewWidth"]  # the table scrolls in its box
    assert seen["firstColumn"] == "sticky"


def test_a_screenshot_at_1400_px(report, tmp_path):
    shot = tmp_path / "report.png"
    result = headless("--window-size=1400,3200", f"--screenshot={shot}", report.as_uri())
    assert shot.is_file(), result.stderr
    height, width, _ = matplotlib.image.imread(shot).shape
    assert (width, height) == (1400, 3200)
    assert matplotlib.image.imread(shot)[:400].std() > 0.01  # the top of the page is not blank
