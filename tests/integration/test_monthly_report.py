"""`slurm-gpu report monthly` on the test bed, checked in headless Chromium.

A job named `<script>alert(1)</script>` (idle, so it is a wasteful job) runs as alice; the
report of the current month is written as root and opened in Chromium (`--dump-dom`,
`--screenshot`): the section headings are there, the job name is text (no script
element), the SVG charts have a size, the cluster's GPU-hours match the store's job
summaries, and the screenshot is not blank.
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from slurm_gpu.config import load_config
from slurm_gpu.store import Store
from slurm_gpu.store import queries as store_usage
from tests.integration.testbed import TestBed

pytestmark = pytest.mark.slurm
CLI = str(Path(os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin" / "slurm-gpu")
EVIL = "<script>alert(1)</script>"
HEADINGS = [
    "Cluster overview",
    "GPU-hours and cost by account",
    "GPU-hours and cost by user",
    "Utilization distribution",
    "Efficiency beyond utilization",
    "Idle waste",
    "Top wasteful jobs",
    "Queue wait by partition",
    "Node heat map",
    "What the controller did",
]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Dom(HTMLParser):
    """Tags, h2 texts, SVG sizes, KPI values and all text of a dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.h2: list[str] = []
        self.svgs: list[tuple[float, float]] = []
        self.kpis: dict[str, str] = {}
        self.text: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        self._in_h2 = tag == "h2"
        if tag == "svg":
            self.svgs.append((float(a.get("width") or 0), float(a.get("height") or 0)))
        if (a.get("id") or "").startswith("kpi-"):
            self.kpis[str(a["id"])[4:]] = a.get("data-value") or ""

    def handle_endtag(self, tag: str) -> None:
        self._in_h2 = False if tag == "h2" else self._in_h2

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_h2:
            self.h2.append(data.strip())


def png_colours(path: Path) -> int:
    """Distinct colours of an 8-bit RGB/RGBA PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 4
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * channels
    previous, colours = bytearray(stride), set()
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up, corner = previous[x], previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[x] = (line[x] + pred) & 255
        for x in range(0, stride, channels * 3):  # every third pixel is plenty
            colours.add(bytes(line[x : x + 3]))
        previous = line
    return len(colours)


@pytest.fixture(scope="module")
def evil_job(testbed: TestBed) -> int:
    """alice's idle 2-GPU job named <script>alert(1)</script>, finished and summarized."""
    config = load_config(Path(testbed.env["SLURM_GPU_CONFIG"]))
    store = Store(config.store.url, cluster=config.cluster.name)
    job_id = testbed.submit(
        "alice",
        "--gres=gpu:2",
        f"--job-name={EVIL}",
        wrap=testbed.gpu_load("--pattern", "idle", "--seconds", "20"),
    )
    try:
        testbed.wait_done(job_id, timeout=600)
        deadline = dt.datetime.now().timestamp() + 120
        while len(store.job_summaries(job_id)) < 2 and dt.datetime.now().timestamp() < deadline:
            subprocess.run(["sleep", "1"], check=False)
    finally:
        testbed.run("scancel", str(job_id), check=False)
        store.dispose()
    return job_id


def test_monthly_report_in_chromium(testbed: TestBed, evil_job: int) -> None:
    """The page renders in Chromium with every section, the escaped name and the store's figures."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is not installed (scripts/install-deps installs it)")
    month = dt.datetime.now().strftime("%Y-%m")
    with tempfile.TemporaryDirectory(prefix="monthly-") as tmp:
        out = Path(tmp, "report")
        done = subprocess.run(
            [CLI, "report", "monthly", "--month", month, "--out", str(out), "--top", "100000"],
            env=testbed.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert 0 == done.returncode, done.stderr
        page = out / "index.html"
        base = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile"]
        dumped = subprocess.run(
            [*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
        )
        assert 0 == dumped.returncode, dumped.stderr[-2000:]
        dom = Dom()
        dom.feed(dumped.stdout)
        assert HEADINGS == dom.h2[: len(HEADINGS)]
        assert "script" not in dom.tags
        assert EVIL in "".join(dom.text)  # shown as text, never run
        assert len(dom.svgs) >= 5  # daily, accounts, utilization, idle, heat map
        assert all(w > 0 and h > 0 for w, h in dom.svgs)
        # The figure against the store, independently: every job of the month whose
        # summaries are in, prorated to the month; other developers' running jobs may
        # add more, never less.
        with (out / "overview.csv").open() as handle:
            overview = {r["figure"]: r["value"] for r in csv.DictReader(handle)}
        shown = float(dom.kpis["gpu_hours"])
        # overview.csv keeps six decimals: agree to that precision.
        assert shown == pytest.approx(float(overview["gpu_hours"]), abs=1e-6)
        assert shown >= summed_gpu_hours(testbed, month) - 1e-6
        with (out / "top_waste_jobs.csv").open() as handle:
            assert EVIL in {r["name"] for r in csv.DictReader(handle)}
        shot = Path(tmp, "page.png")
        subprocess.run(
            [*base, f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri()],
            capture_output=True, timeout=120, check=True,
        )  # fmt: skip
        assert png_colours(shot) > 50


def summed_gpu_hours(testbed: TestBed, month: str) -> float:
    """GPU-hours of the month from the job summaries, prorated by hand.

    A GPU row's GPU-hours leave out the time Slurm had its job suspended, as sacct's
    Elapsed does (the jobs' `suspended_seconds`, stored by `slurm-gpu sync`).
    """
    config = load_config(Path(testbed.env["SLURM_GPU_CONFIG"]))
    store = Store(config.store.url, cluster=config.cluster.name)
    try:
        first = dt.datetime.strptime(month, "%Y-%m").astimezone()
        since = first.timestamp()
        until = (first.replace(day=28) + dt.timedelta(days=4)).replace(day=1).timestamp()
        window = store_usage.jobs_in_window(store, since, until)
        suspended = {int(r["job_id"]): float(r.get("suspended_seconds") or 0.0) for r in window}
        total = 0.0
        for s in store_usage.summaries_for(store, list(suspended)):
            length = s.end - s.start
            inside = min(s.end, until) - max(s.start, since)
            share = min(max(inside / length, 0.0), 1.0) if length > 0 else 1.0
            total += (s.gpu_seconds - min(suspended[s.job_id], s.gpu_seconds)) * share
        return total / 3600.0
    finally:
        store.dispose()
