"""`slurm-gpu report monthly` (reports/monthly.py, reports/charts.py) over a small SQLite store."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu.access import Caller, Scope
from slurm_gpu.cli.main import cli
from slurm_gpu.config import Config
from slurm_gpu.models import Action, GpuDevice, JobGpuSummary, Verdict
from slurm_gpu.reports.monthly import (
    CSV_FILES,
    MonthlyReport,
    _returned,
    build_monthly,
    month_bounds,
    write_monthly,
)
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.widgets import esc, heat_colour
from slurm_gpu.store import Store
from slurm_gpu.store.control import ControlStore
from tests.usage_sources import as_source

UTC = dt.UTC
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
H = 3600.0
EVIL = "<script>alert(1)</script>"


def summary(job: int, user: str, account: str, start: float, hours: float, gpu: str,
            util: float) -> JobGpuSummary:  # fmt: skip
    seconds = hours * H
    return JobGpuSummary(
        job_id=job, node="gpu1", gpu_uuid=gpu, gpu_model="NVIDIA A100", start=start,
        end=start + seconds, gpu_seconds=seconds, util_mean_percent=util,
        util_max_percent=util, active_seconds=seconds * (1.0 if util > 5 else 0.0),
        mem_max_bytes=2**30, mem_gib_seconds=seconds, energy_joules=1000.0,
        reading_count=10, missing_seconds=0.0, user=user, account=account, partition="gpu",
    )  # fmt: skip


@pytest.fixture
def store(store: Store, usage_source: str) -> Store:
    """Four jobs: two in November, one from Oct 31 22:00 to Nov 1 02:00, one in December."""
    jobs = [
        (1, "alice", "physics", NOV + 10 * H, 2.0, "busy", ["G1", "G2"], 80.0),
        (2, "bob", "bio", NOV + 20 * H, 3.0, EVIL, ["G3"], 0.0),
        (3, "alice", "physics", NOV - 2 * H, 4.0, "span", ["G4"], 50.0),
        (4, "bob", "bio", NOV + 31 * 24 * H, 1.0, "december", ["G1"], 90.0),
    ]
    store.upsert_jobs(
        [
            {"job_id": j, "user": u, "account": a, "partition": "gpu", "job_name": name,
             "state": "COMPLETED", "submit_time": start - 60, "start_time": start,
             "end_time": start + hours * H, "nodes": "gpu1", "gpus": len(gpus)}
            for j, u, a, start, hours, name, gpus, _ in jobs
        ]
    )  # fmt: skip
    store.add_summaries(
        [
            summary(j, u, a, start, hours, g, util)
            for j, u, a, start, hours, _, gpus, util in jobs
            for g in gpus
        ]
    )
    control = ControlStore(store)
    at = NOV + 21 * H
    for action, dry, outcome in (
        (Action.WARN, False, "recorded"),
        (Action.CANCEL, False, "done"),
        (Action.CANCEL, True, "dry-run"),
        (Action.NONE, False, "recorded"),
    ):
        verdict = Verdict("idle_gpu", action, "job:2", "idle", job_id=2, user="bob", account="bio")
        control.audit([verdict], time=at, cycle="x", controller="h", dry_run=dry, outcome=outcome)
    hold = Verdict("gpu_quota", Action.HOLD, "job:1", "quota", job_id=1, user="alice",
                   account="physics")  # fmt: skip
    control.audit([hold], time=at, cycle="y", controller="h", dry_run=False, outcome="done")
    return as_source(store, usage_source)


def env(store: Store, scope: Scope | None = None) -> ReportEnv:
    now = dt.datetime(2026, 12, 15, tzinfo=UTC)
    who = scope or Scope(Caller(0, "root"), True, reason="root")
    return ReportEnv(Config(), store, None, who, now, [])


def report(store: Store, scope: Scope | None = None) -> MonthlyReport:
    return build_monthly(env(store, scope), "2026-11")


def test_month_bounds() -> None:
    """2026-11 is [Nov 1, Dec 1) in the given zone; December rolls into the next year."""
    assert (NOV, dt.datetime(2026, 12, 1, tzinfo=UTC).timestamp()) == month_bounds("2026-11", UTC)
    assert dt.datetime(2027, 1, 1, tzinfo=UTC).timestamp() == month_bounds("2026-12", UTC)[1]


def test_overview_counts_only_the_part_inside_the_month(store: Store) -> None:
    """2 x 2 h + 3 h + half of the 4 h job spanning Nov 1; December's job left out."""
    r = report(store)
    assert 9.0 == pytest.approx(r.overview["gpu_hours"])
    assert 3 == r.overview["jobs"]
    assert 9.0 == pytest.approx(sum(r.daily_gpu_hours))


def test_accounts_and_users_add_up(store: Store) -> None:
    """Per-account and per-user GPU-hours sum to the total; most GPU-hours first."""
    r = report(store)
    assert ["physics", "bio"] == [a["key"] for a in r.accounts]
    assert 6.0 == pytest.approx(r.accounts[0]["gpu_hours"])
    assert 9.0 == pytest.approx(sum(u["gpu_hours"] for u in r.users))


def test_idle_and_waste(store: Store) -> None:
    """bob's idle job is all idle and tops the wasteful jobs."""
    r = report(store)
    assert 3.0 == pytest.approx({i["key"]: i for i in r.idle}["bio"]["idle_gpu_hours"])
    assert "2" == r.waste_jobs[0]["job_id"]


def test_node_gpus_from_the_inventory_or_the_gpus_jobs_used(store: Store) -> None:
    """gpu1, not in the inventory, has the 4 GPUs November's jobs used there; then its 8.

    (G1 also ran December's job.) Once the agent registers its 8 GPUs, those count.
    """
    (node,) = report(store).nodes
    assert ("gpu1", 4) == (node["node"], node["gpus"])
    assert 9.0 / (4 * 30 * 24) * 100 == pytest.approx(node["occupancy_percent"])
    devices = [
        GpuDevice(uuid=f"G{i}", name="NVIDIA A100", minor=i, nvml_index=i,
                  pci_bus_id=f"0000:{i:02x}:00.0", memory_total_bytes=80 * 2**30)
        for i in range(8)
    ]  # fmt: skip
    store.upsert_inventory("gpu1", devices, seen_at=NOV)
    (node,) = report(store).nodes
    assert ("gpu1", 8) == (node["node"], node["gpus"])


def test_utilization_bins(store: Store) -> None:
    """GPU-hours land in the bin of their mean utilization."""
    bins = {b["bin"]: b["gpu_hours"] for b in report(store).utilization}
    assert 3.0 == pytest.approx(bins["0-10%"])
    assert 4.0 == pytest.approx(bins["80-90%"])
    assert 2.0 == pytest.approx(bins["50-60%"])


def test_controller_enforced_entries_only(store: Store) -> None:
    """Dry runs and withdrawn ("none") entries are left out; kinds are counted."""
    kinds = {(c["kind"], c["action"]): c["entries"] for c in report(store).controller}
    assert {
        ("warning", "warn"): 1,
        ("cancellation", "cancel"): 1,
        ("quota action", "hold"): 1,
    } == kinds


def test_gpu_hours_returned() -> None:
    """GPUs x time left to Start + Timelimit; unknown limit: None."""
    job = {"start_time": 0.0, "time_limit_seconds": 10 * H, "alloc_gpus": 2}
    assert 12.0 == pytest.approx(_returned(job, 4 * H) or 0.0)
    assert _returned({**job, "time_limit_seconds": None}, 4 * H) is None


def test_user_sees_only_own_jobs_and_entries(store: Store) -> None:
    """alice's report has alice's jobs and the hold of her job, not bob's cancellation."""
    r = report(store, Scope(Caller(1000, "alice"), False))
    assert {"alice"} == {u["key"] for u in r.users}
    assert {"hold"} == {c["action"] for c in r.controller}
    assert 0 == r.overview["gpus"]


def test_page_escapes_job_names(store: Store, tmp_path: Path) -> None:
    """The idle job named <script>... appears escaped; no script element, no external URL."""
    write_monthly(report(store), tmp_path / "out")
    page = (tmp_path / "out" / "index.html").read_text()
    assert "<script" not in page.lower()
    assert esc(EVIL) in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page
    assert page.count("<svg") >= 5


def test_csv_one_per_section(store: Store, tmp_path: Path) -> None:
    """Every CSV file is written and parses; users.csv sums to the overview's GPU-hours."""
    files = write_monthly(report(store), tmp_path / "out")
    assert set(CSV_FILES) | {"index.html"} == {f.name for f in files}
    with (tmp_path / "out" / "users.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert 9.0 == pytest.approx(sum(float(r["gpu_hours"]) for r in rows))
    with (tmp_path / "out" / "top_waste_jobs.csv").open() as handle:
        names = {r["name"] for r in csv.DictReader(handle)}
    assert EVIL in names  # CSV keeps the name as typed


def test_busy_node_keeps_the_old_word_in_csv_and_page(store: Store, tmp_path: Path) -> None:
    """A busy node is `hot` in node_heatmap.csv and listed as a "Hot node" on the page.

    The monthly format keeps the old word until its next version (byte-identical output).
    """
    month = report(store)
    month = dataclasses.replace(month, nodes=[{**n, "busy": True} for n in month.nodes])
    write_monthly(month, tmp_path / "out")
    with (tmp_path / "out" / "node_heatmap.csv").open() as handle:
        cells = [(r["node"], r["hot"]) for r in csv.DictReader(handle)]
    page = (tmp_path / "out" / "index.html").read_text()
    busy_table = page.split('<th class="">Hot node</th>')[1].split("</table>")[0]
    expected = ([("gpu1", "hot")], True)
    assert expected == (cells, '<td class="">gpu1</td>' in busy_table)


def test_heat_colour_scale() -> None:
    """0 is white, 1 dark red, out of range clamps."""
    assert "#ffffff" == heat_colour(0.0)
    assert "#bd0026" == heat_colour(1.0) == heat_colour(7.0)


def test_cli_writes_the_report(store: Store, tmp_path: Path) -> None:
    """`slurm-gpu report monthly --month --out` writes index.html; a bad month is a usage error."""
    config = tmp_path / "c.toml"
    config.write_text(
        f'[cluster]\nname = "c"\n[store]\nurl = "{store.engine.url}"\n'
        "[reports]\nlive_sacct = false\n[access]\nslurm_roles = false\n"
    )
    runner = CliRunner()
    out = tmp_path / "report"
    done = runner.invoke(
        cli, ["--config", str(config), "report", "monthly", "--month", "2026-11", "--out", str(out)]
    )
    assert 0 == done.exit_code, done.output
    assert (out / "index.html").exists()
    bad = runner.invoke(
        cli, ["--config", str(config), "report", "monthly", "--month", "2026-13", "--out", str(out)]
    )
    assert 2 == bad.exit_code
    assert "--month" in bad.output
