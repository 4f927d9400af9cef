"""Quota use is the bill (issue 24): what a [[quota]] counts is what the account is billed.

The controller measures a quota through the composition root's meter (App.quota_meter,
reports/quota.py), which reads the same sums the monthly report and the statements are
made of: held GPU-hours with their missing time, from the rollups of folded jobs and the
raw rows of running ones. So it survives `db prune`, which deletes raw intervals.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from slurm_gpu.access import Caller, Scope
from slurm_gpu.app import App
from slurm_gpu.config import Config
from slurm_gpu.config.core import ClusterSettings, StoreSettings
from slurm_gpu.config.policy import QuotaRule
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.models import GpuInterval, JobGpuSummary
from slurm_gpu.policy.controller import Controller
from slurm_gpu.reports.monthly import build_monthly
from slurm_gpu.reports.quota import quota_used
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.store import Store
from slurm_gpu.testing import FakeSlurmClient

UTC = dt.UTC
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
DEC = dt.datetime(2026, 12, 1, tzinfo=UTC).timestamp()
H = 3600.0
NOW = NOV + 20 * H
A100 = "NVIDIA A100-SXM4-80GB"


def interval(job: int, uuid: str, start: float, covered: float) -> GpuInterval:
    return GpuInterval(
        node="gpu1", gpu_uuid=uuid, period_start=start, period_end=start + 60.0, job_id=job,
        util_mean_percent=50.0, util_max_percent=50.0, util_min_percent=50.0,
        util_sample_count=10, active_seconds=covered, covered_seconds=covered,
        mem_used_max_bytes=2**30, mem_total_bytes=80 * 2**30, power_mean_watts=100.0,
        energy_joules=100.0, temperature_max_celsius=50.0, ecc_errors_total=0,
    )  # fmt: skip


@pytest.fixture
def store(store: Store) -> Store:
    """physics: a finished 2-GPU job with 1 h of its 3 h missing; a running 1-GPU job."""
    store.upsert_jobs(
        [
            {"job_id": 1, "user": "alice", "account": "physics", "partition": "gpu",
             "job_name": "done", "state": "COMPLETED", "submit_time": NOV, "start_time": NOV,
             "end_time": NOV + 3 * H, "nodes": "gpu1", "gpus": 2},
            {"job_id": 2, "user": "carol", "account": "physics", "partition": "gpu",
             "job_name": "running", "state": "RUNNING", "submit_time": NOW - 600,
             "start_time": NOW - 600, "end_time": None, "nodes": "gpu1", "gpus": 1},
            {"job_id": 3, "user": "bob", "account": "bio", "partition": "gpu",
             "job_name": "other", "state": "COMPLETED", "submit_time": NOV, "start_time": NOV,
             "end_time": NOV + H, "nodes": "gpu1", "gpus": 1},
        ]
    )  # fmt: skip
    summaries = [
        JobGpuSummary(
            job_id=job,
            node="gpu1",
            gpu_uuid=uuid,
            gpu_model=A100,
            start=NOV,
            end=NOV + hours * H,
            gpu_seconds=hours * H,
            util_mean_percent=50.0,
            util_max_percent=50.0,
            active_seconds=(hours - missing) * H,
            mem_max_bytes=2**30,
            mem_gib_seconds=(hours - missing) * H,
            energy_joules=1000.0,
            reading_count=10,
            missing_seconds=missing * H,
            user=user,
            account=account,
            partition="gpu",
        )
        for job, uuid, hours, missing, user, account in (
            (1, "G1", 3.0, 1.0, "alice", "physics"),
            (1, "G2", 3.0, 0.0, "alice", "physics"),
            (3, "G3", 1.0, 0.0, "bob", "bio"),
        )
    ]
    store.add_summaries(summaries)
    # Job 2's readings: 10 minutes of intervals, the last minute not yet shipped.
    store.add_intervals([interval(2, "G4", NOW - 600 + 60 * i, 60.0) for i in range(9)])
    return store


def config(store: Store) -> Config:
    return dataclasses.replace(
        Config(),
        cluster=ClusterSettings(name=store.cluster),
        cost=CostSettings(prices={"a100": 2.0}),
        store=StoreSettings(url=store.engine.url.render_as_string(hide_password=False)),
    )


def billed_gpu_hours(store: Store) -> float:
    """physics' GPU-hours in November's report, as of NOW."""
    env = ReportEnv(
        config(store), store, None, Scope(Caller(0, "root"), True, reason="root"),
        dt.datetime.fromtimestamp(NOW, UTC), [],
    )  # fmt: skip
    report = build_monthly(env, "2026-11")
    return float(next(r["gpu_hours"] for r in report.accounts if r["key"] == "physics"))


def test_quota_counts_the_gpu_hours_the_bill_charges(store: Store) -> None:
    """An account's quota use this month is its billed GPU-hours, missing time included."""
    app = App(config(store), caller=Caller(0, "root"), clock=lambda: NOW)
    used = app.quota_meter("account:physics", "gpu_hours", NOV, NOW, NOW)
    # 6 GPU-hours held by job 1 (one of them missing) and job 2's 9 minutes shipped so
    # far (its last minute is within the agents' lag: not yet missing).
    assert billed_gpu_hours(store) == pytest.approx(used, rel=1e-12)
    assert 6.0 + 540 / H == pytest.approx(used, rel=1e-9)


def test_quota_use_survives_db_prune(store: Store) -> None:
    """Pruning the raw intervals of a finished job leaves its quota use as it was."""
    before = quota_used(store, "account:physics", "gpu_hours", NOV, NOW, now=NOW, lag=120.0)
    store.rollup_and_prune(NOW - 700)  # the finished job's intervals folded and deleted
    after = quota_used(store, "account:physics", "gpu_hours", NOV, NOW, now=NOW, lag=120.0)
    assert before == pytest.approx(after, rel=1e-12)


def test_a_user_scope_and_the_other_units(store: Store) -> None:
    """user:NAME counts that user's jobs; GiB-hours and job-hours as the bill's units."""

    def used(scope: str, unit: str) -> float:
        return quota_used(store, scope, unit, NOV, NOV + 10 * H, now=NOW, lag=120.0)

    assert 1.0 == pytest.approx(used("user:bob", "gpu_hours"))
    assert 5.0 == pytest.approx(used("account:physics", "gpu_mem_hours"))
    assert 3.0 == pytest.approx(used("account:physics", "job_hours"))


def test_a_controller_with_quota_rules_needs_the_meter(store: Store) -> None:
    """Quota rules without a meter are refused at once (no second way to measure)."""
    rule = QuotaRule(account="physics", limit=1.0)
    with_quota = dataclasses.replace(config(store), quota=[rule])
    with pytest.raises(ValueError, match="quota meter"):
        Controller(with_quota, FakeSlurmClient(), store)
