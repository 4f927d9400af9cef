"""`slurm-gpu report monthly` from the usage rollups equals the raw-rows report.

The synthetic store of tests/unit/test_report_rollups.py (jobs of every shape: whole
GPUs, MIG slices, shards, a model only the inventory knows, missing data, jobs over
midnight and over the month's ends, a requeued job, a job of no length, a running job
and an ended one with no summary), plus enforced controller actions. Every table of the
month's report, in UTC and in a local time zone that cuts the UTC days, under the [cost]
settings whose idle cost the rollups keep, for an admin, a user and -u/-A/-r, is the same
read from the rollups (reports/monthly_rollups.py) as from raw rows (`env.usage`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config import Config
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.models import Action, Verdict
from slurm_gpu.reports import monthly_rollups
from slurm_gpu.reports.monthly import MonthlyReport, build_monthly, month_bounds
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.usage import JobFilter
from slurm_gpu.store import Store, rollup_reads
from slurm_gpu.store.schema import job_usage
from tests.unit.test_report_rollups import COSTS, DEC, NOV, fill

H = 3600.0
NOW = dt.datetime.fromtimestamp(DEC + 5 * 24 * H, dt.UTC)
ROOT = Scope(Caller(0, "root"), True, reason="root")
# Local time 5:30 ahead of UTC: the month's days are not the rollups' UTC days.
KOLKATA = dt.timezone(dt.timedelta(hours=5, minutes=30))
HELD_COSTS = [c for c in COSTS if c.unit == "gpu_hour"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'store.db'}", cluster="c1") as s:
        s.upgrade()
        fill(s)
        enforce(s)
        yield s


def enforce(store: Store) -> None:
    """Enforced entries: a done cancellation of job 104 (u4), a warning to job 901 (u2)."""
    cancel = Verdict("idle_gpu", Action.CANCEL, "job:104", "idle", job_id=104, user="u4",
                     account="acct2")  # fmt: skip
    warn = Verdict("idle_gpu", Action.WARN, "job:901", "idle", job_id=901, user="u2",
                   account="acct1")  # fmt: skip
    for verdict, at in ((cancel, NOV + 5 * H), (warn, NOV + 9 * H)):
        store.control.audit([verdict], time=at, cycle="x", controller="h", dry_run=False,
                            outcome="done")  # fmt: skip


def env(
    store: Store,
    cost: CostSettings = COSTS[0],
    tz: dt.tzinfo = dt.UTC,
    scope: Scope = ROOT,
) -> ReportEnv:
    config = dataclasses.replace(Config(), cost=cost)
    return ReportEnv(config, store, None, scope, NOW.astimezone(tz), [])


def both(
    report_env: ReportEnv, month: str, filters: JobFilter | None = None
) -> tuple[MonthlyReport, MonthlyReport]:
    raw = build_monthly(report_env, month, filters=filters, from_rollups=False)
    folded = build_monthly(report_env, month, filters=filters, from_rollups=True)
    return raw, folded


def assert_same(expected: Any, actual: Any, where: str = "report") -> None:
    """Equal, floats to 1e-9 (relative, or absolute near 0); None and NaN as unknown."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), where
        assert set(expected) == set(actual), f"{where}: {set(expected) ^ set(actual)}"
        for key in expected:
            assert_same(expected[key], actual[key], f"{where}.{key}")
    elif isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple), where
        assert len(expected) == len(actual), f"{where}: {len(expected)} != {len(actual)}"
        for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(expected, float) or isinstance(actual, float):
        unknown = [
            v is None or (isinstance(v, float) and math.isnan(v)) for v in (expected, actual)
        ]
        assert unknown[0] == unknown[1], f"{where}: {expected!r} != {actual!r}"
        if not unknown[0]:
            assert math.isclose(expected, actual, rel_tol=1e-9, abs_tol=1e-9), (
                f"{where}: {expected!r} != {actual!r}"
            )
    else:
        assert expected == actual, f"{where}: {expected!r} != {actual!r}"


def assert_same_report(raw: MonthlyReport, folded: MonthlyReport) -> None:
    expected, actual = dataclasses.asdict(raw), dataclasses.asdict(folded)
    assert_same(expected, actual)


@pytest.mark.parametrize("month", ["2026-11", "2026-12"])
@pytest.mark.parametrize("tz", [dt.UTC, KOLKATA], ids=["utc", "kolkata"])
@pytest.mark.parametrize("cost", range(len(HELD_COSTS)))
def test_every_table_from_rollups_equals_raw_rows(
    store: Store, month: str, tz: dt.tzinfo, cost: int
) -> None:
    raw, folded = both(env(store, HELD_COSTS[cost], tz), month)
    assert raw.overview["jobs"] > 0 and raw.waste_jobs and raw.nodes
    assert_same_report(raw, folded)


def test_the_month_holds_what_the_tables_show(store: Store) -> None:
    """The comparison is not vacuous: slots, GPM, unfolded jobs, actions, queue waits."""
    _, folded = both(env(store, HELD_COSTS[1]), "2026-11")
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
    raw, folded = both(env(store), "2026-12")
    assert_same_report(raw, folded)
    u1 = next(u for u in folded.users if u["key"] == "u1")
    assert u1["gpu_hours"] > 0
    with store.writing("dropping the running job") as conn:
        conn.execute(sa.text("DELETE FROM gpu_intervals WHERE job_id = 900"))
        conn.execute(sa.text("DELETE FROM jobs WHERE job_id = 900"))
        conn.execute(sa.text("DELETE FROM usage_unfolded WHERE job_id = 900"))
    fewer = build_monthly(env(store), "2026-12", from_rollups=True)
    assert fewer.overview["jobs"] == folded.overview["jobs"] - 1


@pytest.mark.parametrize(
    "filters",
    [JobFilter(users=("u1", "u3")), JobFilter(accounts=("acct2",)), JobFilter(partitions=("mig",))],
    ids=["users", "account", "partition"],
)
def test_filters_from_rollups_equal_raw_rows(store: Store, filters: JobFilter) -> None:
    raw, folded = both(env(store, tz=KOLKATA), "2026-11", filters)
    assert raw.users
    assert_same_report(raw, folded)


def test_scoped_user_sees_what_the_raw_path_shows(store: Store) -> None:
    """u4 (not an admin) sees u4's jobs and the cancellation of u4's job only."""
    scoped = env(store, scope=Scope(Caller(1004, "u4"), False))
    raw, folded = both(scoped, "2026-11")
    assert {u["key"] for u in folded.users} == {"u4"}
    assert [a["job_id"] for a in folded.actions] == [104]
    assert folded.overview["gpus"] == 0 and folded.nodes
    assert_same_report(raw, folded)


def test_rollups_path_reads_no_raw_usage_of_folded_jobs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default path reads the rollups, not `env.usage`: its figures follow `job_usage`.

    Doubling the stored rollups' GPU-seconds leaves the raw report as it was and doubles
    the folded GPU-hours of the report from the rollups.
    """
    report_env = env(store)
    assert monthly_rollups.usable(report_env, JobFilter())
    before = build_monthly(report_env, "2026-11")
    with store.writing("doubling the folded usage") as conn:
        conn.execute(sa.update(job_usage).values(gpu_seconds=job_usage.c.gpu_seconds * 2))
    raw = build_monthly(report_env, "2026-11", from_rollups=False)
    assert raw.overview["gpu_hours"] == pytest.approx(before.overview["gpu_hours"], rel=1e-9)
    with store.writing("undoing it") as conn:
        conn.execute(sa.update(job_usage).values(gpu_seconds=job_usage.c.gpu_seconds / 2))

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the raw rows were read")

    monkeypatch.setattr(ReportEnv, "usage", refuse)
    assert_same(
        dataclasses.asdict(before), dataclasses.asdict(build_monthly(report_env, "2026-11"))
    )
    with store.writing("doubling the folded usage") as conn:
        conn.execute(sa.update(job_usage).values(gpu_seconds=job_usage.c.gpu_seconds * 2))
    after = build_monthly(report_env, "2026-11")
    unfolded = next(u for u in before.users if u["key"] == "u2")  # holds job 901 (no rows)
    assert after.overview["gpu_hours"] > 1.9 * before.overview["gpu_hours"] - unfolded["gpu_hours"]


def test_rollups_are_read_only_where_they_keep_the_figures(store: Store) -> None:
    """Raw rows for -j/-w/-s, a [cost] unit other than gpu_hour, a store before 0010."""
    assert not monthly_rollups.usable(env(store), JobFilter(job_ids=("101",)))
    assert not monthly_rollups.usable(env(store), JobFilter(nodes=("gpu1",)))
    assert not monthly_rollups.usable(env(store), JobFilter(states=("COMPLETED",)))
    for cost in COSTS:
        assert monthly_rollups.usable(env(store, cost), JobFilter()) == (cost.unit == "gpu_hour")


def test_a_month_with_no_usage_is_the_same_empty_report(store: Store) -> None:
    raw, folded = both(env(store), "2025-01")
    assert raw.overview["jobs"] == 0 and not raw.users
    assert_same_report(raw, folded)


def test_a_cancelled_job_of_unknown_allocation_counts_its_gpu_rows(store: Store) -> None:
    """Job 950 (u0) names no GPUs: its two summaries are its GPUs, as from raw rows."""
    import random

    from tests.unit.test_report_rollups import A100, _summary

    start = NOV + 10 * 24 * H
    store.upsert_jobs(
        [{"job_id": 950, "user": "u0", "account": "acct2", "partition": "gpu",
          "submit_time": start - 60.0, "start_time": start, "end_time": start + 5 * H,
          "nodes": "gpu3", "gpus": 0}]
    )  # fmt: skip
    rng = random.Random(3)
    store.add_summaries(
        [_summary(950, 0, "gpu3", f"GPU-gpu3-{g}", A100, start, 5 * H, rng) for g in range(2)]
    )
    cancel = Verdict("idle_gpu", Action.CANCEL, "job:950", "idle", job_id=950, user="u0",
                     account="acct2")  # fmt: skip
    store.control.audit([cancel], time=start + H, cycle="z", controller="h", dry_run=False,
                        outcome="done")  # fmt: skip
    raw, folded = both(env(store), "2026-11")
    assert [a["gpus"] for a in folded.actions if a["job_id"] == 950] == [2]
    assert_same_report(raw, folded)


def test_gpu_hours_returned_take_sacct_time_limits(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store keeps no time limit: with live sacct, the cancelled job's comes from it."""
    from slurm_gpu.slurm.sacct import SacctJob

    report_env = env(store)
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
        for a in build_monthly(report_env, "2026-11", from_rollups=True).actions
        if a["job_id"] == 104
    ]
    assert returned == [pytest.approx(gpus * max(start + 100 * H - (NOV + 5 * H), 0.0) / H)]
    assert returned[0] > 0


def test_top_waste_jobs_take_sacct_names_as_raw_rows_do(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job the store knows without a name (no `slurm-gpu sync` yet): sacct names it.

    Both paths list it with sacct's name and state, as `slurm-gpu sacct` shows it.
    """
    from slurm_gpu.slurm.sacct import SacctJob

    report_env = env(store)
    wasteful = build_monthly(report_env, "2026-11", from_rollups=True).waste_jobs[0]
    job_id = int(wasteful["job_id"])
    with store.writing("forgetting a job's name") as conn:
        conn.execute(sa.text("UPDATE jobs SET job_name = NULL WHERE job_id = :j"), {"j": job_id})
    unnamed = build_monthly(report_env, "2026-11", from_rollups=True).waste_jobs[0]
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
    for from_rollups in (True, False):
        listed = build_monthly(report_env, "2026-11", from_rollups=from_rollups).waste_jobs
        shown = next(j for j in listed if int(j["job_id"]) == job_id)
        assert ("<b>train</b>", "CANCELLED by 1001") == (shown["name"], shown["state"])
