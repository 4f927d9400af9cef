"""One ledger over every source (issue 24): the rollups' sums are the raw rows' sums.

A period's usage is read as sums rows from two sources: the usage rollups that ingest
folds (finished jobs: reports/rollups.py `period_usage`) and the raw rows of any job
(summaries and intervals: reports/grouped.py `raw_sums` of `load_usage`). Whatever the
jobs and whatever the period (cut days, whole days, whole months), every sum is the same
from both, so every figure and price made of them is: a property, checked by hypothesis
on SQLite (and on PostgreSQL and MariaDB with the `db` marker).
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.ledger.sums import SUMS
from slurm_gpu.models import JobGpuSummary
from slurm_gpu.reports.grouped import raw_sums
from slurm_gpu.reports.rollups import period_usage
from slurm_gpu.reports.usage import load_usage
from slurm_gpu.store import Store

UTC = dt.UTC
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
H = 3600.0
ROOT = Scope(Caller(0, "root"), True, reason="root")
COST = CostSettings(prices={"a100": 2.0, "h100": 3.0}, unit="gpu_hour")
CLUSTERS = itertools.count()

job_shapes = st.lists(
    st.tuples(
        st.floats(-40 * H, 45 * 24 * H),  # start after Nov 1
        st.sampled_from([0.0, 90.0, 5 * H, 30 * H, 80 * H]),  # length
        st.integers(1, 3),  # GPUs
        st.sampled_from([None, 0.0, 4.0, 60.0]),  # utilization
        st.sampled_from([0.0, 0.3, 1.4]),  # missing share (over 1: clipped)
        st.booleans(),  # H100 (else A100)
        st.sampled_from([None, 0.0, 0.25, 1.5]),  # suspended share (sacct's; over 1: clipped)
    ),
    min_size=1,
    max_size=6,
)
periods = st.tuples(
    st.floats(-3 * 24 * H, 40 * 24 * H), st.sampled_from([7 * H, 3 * 24 * H, 31 * 24 * H])
)


def fill(store: Store, jobs: list[tuple[Any, ...]]) -> None:
    summaries = []
    for n, (start, seconds, gpus, util, missing, h100, suspended) in enumerate(jobs):
        begin = NOV + start
        store.upsert_jobs(
            [
                {"job_id": n + 1, "user": f"u{n % 2}", "account": f"a{n % 3}",
                 "partition": "gpu", "job_name": "j", "state": "COMPLETED",
                 "submit_time": begin - 60, "start_time": begin, "end_time": begin + seconds,
                 "nodes": "gpu1", "gpus": gpus,
                 "suspended_seconds": None if suspended is None else seconds * suspended},
            ]
        )  # fmt: skip
        for g in range(gpus):
            summaries.append(
                JobGpuSummary(
                    job_id=n + 1,
                    node="gpu1",
                    gpu_uuid=f"G{g}",
                    gpu_model="NVIDIA H100" if h100 else "NVIDIA A100",
                    start=begin,
                    end=begin + seconds,
                    gpu_seconds=seconds,
                    util_mean_percent=util,
                    util_max_percent=util,
                    active_seconds=seconds * (util or 0.0) / 100,
                    mem_max_bytes=2**33,
                    mem_gib_seconds=seconds * (g + 1),
                    energy_joules=None if g else seconds * 200.0,
                    reading_count=3,
                    missing_seconds=seconds * missing,
                    user=f"u{n % 2}",
                    account=f"a{n % 3}",
                    partition="gpu",
                )
            )
    store.add_summaries(summaries)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(jobs=job_shapes, period=periods)
def test_every_sum_of_a_period_is_the_same_from_the_rollups_and_the_raw_rows(
    store: Store, jobs: list[tuple[Any, ...]], period: tuple[float, float]
) -> None:
    """The rollups' sums of any period equal the raw rows' sums of the same jobs.

    Each example is a cluster of its own in the one database (the rollups are per cluster).
    """
    store = Store(
        store.engine.url.render_as_string(hide_password=False), cluster=f"c{next(CLUSTERS)}"
    )
    try:
        fill(store, jobs)
        since = NOV + period[0]
        until = since + period[1]
        now = NOV + 90 * 24 * H
        folded, _ = period_usage(store, since, until, now, ROOT, cost=COST)
        usage = load_usage(
            store, since=since, until=until, now=now, sacct_jobs=None, scope=ROOT, cost=COST
        )
        raw, _ = raw_sums(usage, since, until, now)
        for name in (*SUMS, "cost"):
            expected = float(raw[name].sum()) if len(raw) else 0.0
            actual = float(folded[name].sum()) if len(folded) else 0.0
            assert expected == pytest.approx(actual, rel=1e-9, abs=1e-6), name
    finally:
        store.dispose()


def test_a_suspended_jobs_suspension_is_in_both_sources_and_not_in_its_gpu_hours(
    store: Store,
) -> None:
    """2 GPUs 330 s, 120 s of it suspended: 2 x 210 s held, 2 x 120 s suspended.

    Idle is only what was measured idle besides, from the rollups and the raw rows alike.
    """
    store = Store(
        store.engine.url.render_as_string(hide_password=False), cluster=f"c{next(CLUSTERS)}"
    )
    try:
        fill(store, [(H, 330.0, 2, 60.0, 0.0, False, None)])
        store.upsert_jobs([{"job_id": 1, "suspended_seconds": 120.0}])  # `slurm-gpu sync`
        since, until, now = NOV, NOV + 24 * H, NOV + 90 * 24 * H
        folded, _ = period_usage(store, since, until, now, ROOT, cost=COST)
        usage = load_usage(
            store, since=since, until=until, now=now, sacct_jobs=None, scope=ROOT, cost=COST
        )
        raw, _ = raw_sums(usage, since, until, now)
        for sums in (folded, raw):
            assert 2 * 210.0 == pytest.approx(float(sums["gpu_seconds"].sum()))
            assert 2 * 120.0 == pytest.approx(float(sums["suspended_seconds"].sum()))
            # 60 % of 330 s active: 198 s; the 132 s idle hold the 120 s suspended.
            assert 2 * 198.0 == pytest.approx(float(sums["active_seconds"].sum()))
            assert 2 * 210.0 * 2.0 / 3600 == pytest.approx(float(sums["cost"].sum()))
        assert 210.0 == float(usage.jobs["elapsed_seconds"].iloc[0])
    finally:
        store.dispose()
