"""`slurm-gpu report monthly` is the same from every source of sums (issue 24).

The synthetic store of tests/synthetic_usage.py (jobs of every shape: whole GPUs, MIG
slices, shards, a model only the inventory knows, missing data, jobs over midnight and
over the month's ends, a requeued job, a job of no length, a running job and an ended one
with no summary), plus enforced controller actions. Every table of the month's report, in
UTC and in a local time zone that cuts the UTC days, under every [cost] unit and charge
(idle cost is a sum the rollups keep), for an admin, a user and -u/-A/-r, and an empty
month, is the same whether the month's sums rows come from the rollups (folded store),
from raw rows (raw-only store) or from both (half-folded store; tests/usage_sources.py).
The folded jobs' figures are read from the rollups, not from raw rows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from slurm_gpu.access import Caller, Scope
from slurm_gpu.models import Action, Verdict
from slurm_gpu.reports.monthly import MonthlyReport, build_monthly, month_bounds
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.usage import JobFilter
from slurm_gpu.store import Store, rollup_reads
from slurm_gpu.store.schema import job_usage
from tests.synthetic_usage import (
    A100,
    COSTS,
    KOLKATA,
    NOV,
    H,
    assert_same,
    assert_same_monthly,
    copied,
    monthly_env,
    summary,
    synthetic_file,
)
from tests.usage_sources import by_source


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_file(tmp_path_factory.mktemp("synthetic"), enforced=True)


@pytest.fixture
def store(synthetic: Path, tmp_path: Path) -> Iterator[Store]:
    """A copy of the synthetic store (tests/synthetic_usage.py), folded as ingest left it."""
    with copied(synthetic, tmp_path) as s:
        yield s


def monthly(
    store: Store, month: str, filters: JobFilter | None = None, **env: Any
) -> dict[str, MonthlyReport]:
    """{source: the month's report of `store` from it} (`monthly_env` takes `env`)."""
    return by_source(store, lambda s: build_monthly(monthly_env(s, **env), month, filters=filters))


@pytest.mark.parametrize("month", ["2026-11", "2026-12"])
@pytest.mark.parametrize("tz", [dt.UTC, KOLKATA], ids=["utc", "kolkata"])
def test_every_table_is_the_same_from_every_source(store: Store, month: str, tz: dt.tzinfo) -> None:
    """Every table, under every [cost] unit and charge, gpu_mem_hour and job_hour too."""
    reports = by_source(
        store,
        lambda s: {
            n: build_monthly(monthly_env(s, cost, tz), month) for n, cost in enumerate(COSTS)
        },
    )
    for report in reports["folded"].values():
        assert report.overview["jobs"] > 0 and report.waste_jobs and report.nodes
        assert report.overview["idle_cost"] > 0
    assert_same_monthly(reports)


def test_the_month_holds_what_the_tables_show(store: Store) -> None:
    """The comparison is not vacuous: slots, GPM, unfolded jobs, actions, queue waits."""
    folded = build_monthly(monthly_env(store, COSTS[1]), "2026-11")
    assert folded.slots and folded.efficiency and folded.actions
    assert {a["kind"] for a in folded.actions} == {"cancellation", "warning"}
    assert any(u["bin"] == "no readings" and u["gpus"] > 0 for u in folded.utilization)
    assert folded.queue[-1]["jobs"] > 10 and folded.queue[-1]["p95_seconds"] is not None
    since, until = month_bounds("2026-11", dt.UTC)
    assert 901 in rollup_reads.unfolded_job_ids(store, since, until)


def test_unfolded_running_job_counted(store: Store) -> None:
    """Job 900 runs across December's start (intervals only): counted from raw rows."""
    since, until = month_bounds("2026-12", dt.UTC)
    assert 900 in rollup_reads.unfolded_job_ids(store, since, until)
    reports = monthly(store, "2026-12")
    assert_same_monthly(reports)
    folded = reports["folded"]
    u1 = next(u for u in folded.users if u["key"] == "u1")
    assert u1["gpu_hours"] > 0
    with store.writing("dropping the running job") as conn:
        conn.execute(sa.text("DELETE FROM gpu_intervals WHERE job_id = 900"))
        conn.execute(sa.text("DELETE FROM jobs WHERE job_id = 900"))
        conn.execute(sa.text("DELETE FROM usage_unfolded WHERE job_id = 900"))
    fewer = build_monthly(monthly_env(store), "2026-12")
    assert fewer.overview["jobs"] == folded.overview["jobs"] - 1


def test_filters_are_the_same_from_every_source(store: Store) -> None:
    """-u, -A and -r select the same jobs from every source, in a zone that cuts days."""
    filters = {
        "users": JobFilter(users=("u1", "u3")),
        "account": JobFilter(accounts=("acct2",)),
        "partition": JobFilter(partitions=("mig",)),
    }
    reports = by_source(
        store,
        lambda s: {
            name: build_monthly(monthly_env(s, tz=KOLKATA), "2026-11", filters=f)
            for name, f in filters.items()
        },
    )
    for report in reports["folded"].values():
        assert report.users
    assert {u["key"] for u in reports["folded"]["users"].users} == {"u1", "u3"}
    assert_same_monthly(reports)


def test_scoped_user_sees_the_same_from_every_source(store: Store) -> None:
    """u4 (not an admin) sees u4's jobs and the cancellation of u4's job only."""
    reports = monthly(store, "2026-11", scope=Scope(Caller(1004, "u4"), False))
    folded = reports["folded"]
    assert {u["key"] for u in folded.users} == {"u4"}
    assert [a["job_id"] for a in folded.actions] == [104]
    assert folded.overview["gpus"] == 0 and folded.nodes
    assert_same_monthly(reports)


def test_rollups_path_reads_no_raw_usage_of_folded_jobs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report reads the folded jobs from the rollups: its figures follow `job_usage`.

    It never calls `env.usage` (every raw row of the month). Doubling the stored rollups'
    GPU-seconds doubles the folded GPU-hours of the report; the raw-only source (rollups
    dropped) is the report of before, and so is the store folded again.
    """

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the raw rows were read")

    monkeypatch.setattr(ReportEnv, "usage", refuse)
    report_env = monthly_env(store)
    before = build_monthly(report_env, "2026-11")
    with store.writing("doubling the folded usage") as conn:
        conn.execute(sa.update(job_usage).values(gpu_seconds=job_usage.c.gpu_seconds * 2))
    doubled = by_source(store, lambda s: build_monthly(monthly_env(s), "2026-11"))
    unfolded = next(u for u in before.users if u["key"] == "u2")  # holds job 901 (no rows)
    after = doubled["folded"].overview["gpu_hours"]
    assert after > 1.9 * before.overview["gpu_hours"] - unfolded["gpu_hours"]
    raw = doubled["raw"].overview["gpu_hours"]
    assert raw == pytest.approx(before.overview["gpu_hours"], rel=1e-9)
    # `by_source` folded the store again from its raw rows: the doubling is gone.
    again = build_monthly(monthly_env(store), "2026-11")
    assert_same(dataclasses.asdict(before), dataclasses.asdict(again))


def test_a_month_with_no_usage_is_the_same_empty_report(store: Store) -> None:
    """A month before any job: no jobs, no users, from every source."""
    reports = monthly(store, "2025-01")
    assert reports["folded"].overview["jobs"] == 0 and not reports["folded"].users
    assert_same_monthly(reports)


def test_a_cancelled_job_of_unknown_allocation_counts_its_gpu_rows(store: Store) -> None:
    """Job 950 (u0) names no GPUs: its two summaries are its GPUs, from every source."""
    start = NOV + 10 * 24 * H
    store.upsert_jobs(
        [{"job_id": 950, "user": "u0", "account": "acct2", "partition": "gpu",
          "submit_time": start - 60.0, "start_time": start, "end_time": start + 5 * H,
          "nodes": "gpu3", "gpus": 0}]
    )  # fmt: skip
    rng = random.Random(3)
    store.add_summaries(
        [summary(950, 0, "gpu3", f"GPU-gpu3-{g}", A100, start, 5 * H, rng) for g in range(2)]
    )
    cancel = Verdict("idle_gpu", Action.CANCEL, "job:950", "idle", job_id=950, user="u0",
                     account="acct2")  # fmt: skip
    store.control.audit([cancel], time=start + H, cycle="z", controller="h", dry_run=False,
                        outcome="done")  # fmt: skip
    reports = monthly(store, "2026-11")
    for report in reports.values():
        assert [a["gpus"] for a in report.actions if a["job_id"] == 950] == [2]
    assert_same_monthly(reports)


def test_gpu_hours_returned_take_sacct_time_limits(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store keeps no time limit: with live sacct, the cancelled job's comes from it."""
    from slurm_gpu.slurm.sacct import SacctJob

    report_env = monthly_env(store)
    job = next(j for j in build_monthly(report_env, "2026-11").actions if j["job_id"] == 104)
    assert job["gpu_hours_returned"] is None  # no sacct: the limit is unknown
    with store.reading("job 104") as conn:
        start, gpus = conn.execute(
            sa.text("SELECT start_time, gpus FROM jobs WHERE job_id = 104")
        ).one()
    row = SacctJob(104, "104", "j104", "u4", "acct2", "mig" if 104 % 2 else "gpu", "normal",
                   "COMPLETED", "COMPLETED", None, start, None, None, 100 * H, ("gpu2",),
                   gpus, (), 0)  # fmt: skip
    monkeypatch.setattr(ReportEnv, "sacct", lambda self, since, until, filters: [row])
    returned = [
        a["gpu_hours_returned"]
        for a in build_monthly(report_env, "2026-11").actions
        if a["job_id"] == 104
    ]
    assert returned == [pytest.approx(gpus * max(start + 100 * H - (NOV + 5 * H), 0.0) / H)]
    assert returned[0] > 0


def test_top_waste_jobs_take_sacct_names_from_every_source(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job the store knows without a name (no `slurm-gpu sync` yet): sacct names it.

    Every source lists it with sacct's name and state, as `slurm-gpu sacct` shows it.
    """
    from slurm_gpu.slurm.sacct import SacctJob

    report_env = monthly_env(store)
    wasteful = build_monthly(report_env, "2026-11").waste_jobs[0]
    job_id = int(wasteful["job_id"])
    with store.writing("forgetting a job's name") as conn:
        conn.execute(sa.text("UPDATE jobs SET job_name = NULL WHERE job_id = :j"), {"j": job_id})
    unnamed = build_monthly(report_env, "2026-11").waste_jobs[0]
    assert (job_id, "") == (int(unnamed["job_id"]), unnamed["name"])
    with store.reading("the job") as conn:
        user, account, partition, start = conn.execute(
            sa.text("SELECT user, account, partition, start_time FROM jobs WHERE job_id = :j"),
            {"j": job_id},
        ).one()
    row = SacctJob(job_id, str(job_id), "<b>train</b>", user, account, partition, "normal",
                   "CANCELLED", "CANCELLED by 1001", None, start, None, None, None, (),
                   0, (), 0)  # fmt: skip
    monkeypatch.setattr(ReportEnv, "sacct", lambda self, since, until, filters: [row])
    for source, report in monthly(store, "2026-11").items():
        shown = next(j for j in report.waste_jobs if int(j["job_id"]) == job_id)
        assert ("<b>train</b>", "CANCELLED by 1001") == (shown["name"], shown["state"]), source
