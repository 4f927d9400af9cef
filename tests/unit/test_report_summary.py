"""Report figures (reports/jobs.py, reports/summary.py) from a hand-made store."""

from __future__ import annotations

import pytest

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.ledger.pricing import price_for
from slurm_gpu.models import GpuInterval, JobGpuSummary
from slurm_gpu.reports.records import job_records
from slurm_gpu.reports.summary import report_fields
from slurm_gpu.reports.usage import JobFilter, Usage, load_usage
from slurm_gpu.store import Store
from tests.usage_sources import as_source, period_report

T0 = 1_800_000_000.0
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
ROOT = Scope(Caller(0, "root"), True, reason="root")
PRICES = CostSettings(currency="EUR", prices={"a100": 2.0, "H100": 4.0}, default_price=1.0)
ALL_JOBS = JobFilter()  # no sacct selection option given


def summary(
    job: int,
    uuid: str,
    model: str,
    seconds: float,
    util: float,
    active: float,
    node: str = "gpu1",
    mem_gib: float = 10.0,
) -> JobGpuSummary:
    return JobGpuSummary(
        job_id=job,
        node=node,
        gpu_uuid=uuid,
        gpu_model=model,
        start=T0,
        end=T0 + seconds,
        gpu_seconds=seconds,
        util_mean_percent=util,
        util_max_percent=util + 5,
        active_seconds=active,
        mem_max_bytes=int(mem_gib * 2**30),
        mem_gib_seconds=mem_gib * seconds,
        energy_joules=300.0 * seconds,
        reading_count=10,
        missing_seconds=0.0,
    )


@pytest.fixture
def store(store: Store, usage_source: str) -> Store:
    """Jobs 1 (alice) and 2 (bob) ended, with summaries; job 3 (alice) runs, one interval."""
    store.upsert_jobs(
        [
            {
                "job_id": 1,
                "user": "alice",
                "account": "physics",
                "partition": "gpu",
                "state": "COMPLETED",
                "submit_time": T0 - 10,
                "start_time": T0,
                "end_time": T0 + 3600,
                "nodes": "gpu1",
            },
            {
                "job_id": 2,
                "user": "bob",
                "account": "bio",
                "partition": "gpu",
                "state": "COMPLETED",
                "submit_time": T0 - 100,
                "start_time": T0,
                "end_time": T0 + 1800,
                "nodes": "gpu2",
            },
            {
                "job_id": 3,
                "user": "alice",
                "account": "physics",
                "partition": "debug",
                "state": "RUNNING",
                "submit_time": T0,
                "start_time": T0,
                "nodes": "gpu1",
            },
        ]
    )
    store.add_summaries(
        [
            summary(1, "GPU-a", A100, 3600, 80.0, 3600),
            summary(1, "GPU-b", A100, 3600, 40.0, 1800),
            summary(2, "GPU-h", H100, 1800, 0.0, 0.0, node="gpu2", mem_gib=0.0),
        ]
    )
    store.add_intervals(
        [
            GpuInterval(
                node="gpu1",
                gpu_uuid="GPU-c",
                period_start=T0,
                period_end=T0 + 60,
                job_id=3,
                util_mean_percent=50.0,
                util_max_percent=60.0,
                util_min_percent=40.0,
                util_sample_count=12,
                active_seconds=60.0,
                covered_seconds=60.0,
                mem_used_max_bytes=2**30,
                mem_total_bytes=80 * 2**30,
                power_mean_watts=100.0,
                energy_joules=6000.0,
                temperature_max_celsius=50.0,
                ecc_errors_total=0,
            ),
        ]
    )
    return as_source(store, usage_source)


def usage(
    store: Store,
    scope: Scope = ROOT,
    *,
    filters: JobFilter = ALL_JOBS,
) -> Usage:
    return load_usage(
        store,
        since=T0 - 1,
        until=T0 + 7200,
        now=T0 + 120,
        sacct_jobs=None,
        scope=scope,
        filters=filters,
        cost=PRICES,
    )


def test_job_figures(store: Store) -> None:
    """GPU-hours, weighted utilization, idle hours, memory-hours, energy, cost per job."""
    rec = {r["job_id"]: r for r in job_records(usage(store))}
    job = rec[1]
    assert 2 * 3600.0 == job["gpu_seconds"]
    assert 60.0 == job["util_mean_percent"]
    assert 1800.0 == job["idle_seconds"]
    assert 2 * 10.0 * 3600 == job["mem_gib_seconds"]
    assert 2 * 300.0 * 3600 == job["energy_joules"]
    assert 4.0 == job["cost"]  # 2 GPU-hours of A100 at 2.0
    assert 10.0 == job["queue_wait_seconds"]
    assert 2.0 == rec[2]["cost"]  # half an hour of H100 at 4.0


def test_running_job_reads_intervals(store: Store) -> None:
    """A job without summaries gets its figures from its intervals."""
    rec = {r["job_id"]: r for r in job_records(usage(store))}
    assert (60.0, 50.0, "intervals") == (
        rec[3]["gpu_seconds"],
        rec[3]["util_mean_percent"],
        rec[3]["source"],
    )


def test_scope_hides_other_users(store: Store) -> None:
    """A user sees their own jobs only; a coordinator their account's too."""
    alice = Scope(Caller(1001, "alice"), False)
    assert [1, 3] == [r["job_id"] for r in job_records(usage(store, alice))]
    coordinator = Scope(Caller(1003, "carol"), False, frozenset({"bio"}))
    assert [2] == [r["job_id"] for r in job_records(usage(store, coordinator))]


def test_filters(store: Store) -> None:
    """-u, -A, -r, -s and -j select like sacct."""

    def ids(**kw: tuple[str, ...]) -> list[int]:
        return [r["job_id"] for r in job_records(usage(store, filters=JobFilter(**kw)))]

    assert [2] == ids(users=("bob",))
    assert [1, 3] == ids(accounts=("physics",))
    assert [3] == ids(partitions=("debug",))
    assert [3] == ids(states=("RUNNING",))
    assert [2] == ids(job_ids=("2",))


def test_price_longest_key_wins() -> None:
    """The longest key contained in the model name sets the price; else the default."""
    prices = CostSettings(prices={"a100": 2.0, "a100-sxm4-80gb": 3.0})
    assert 3.0 == price_for(A100, prices)
    assert 0.0 == price_for("Tesla T4", prices)


def test_cost_units(store: Store) -> None:
    """gpu_mem_hour charges GiB-hours; job_hour charges runtime once per job."""
    mem = CostSettings(unit="gpu_mem_hour", prices={"a100": 0.1})
    rec = {
        r["job_id"]: r
        for r in job_records(
            load_usage(
                store, since=None, until=None, now=T0 + 120, sacct_jobs=None, scope=ROOT, cost=mem
            )
        )
    }
    assert pytest.approx(0.1 * 20.0) == rec[1]["cost"]
    hour = CostSettings(unit="job_hour", prices={"a100": 3.0})
    rec = {
        r["job_id"]: r
        for r in job_records(
            load_usage(
                store, since=None, until=None, now=T0 + 120, sacct_jobs=None, scope=ROOT, cost=hour
            )
        )
    }
    assert pytest.approx(3.0) == rec[1]["cost"]  # one hour of runtime, 2 GPUs


def test_report_users(store: Store) -> None:
    """Per-user totals, the TOTAL row and the top users by idle GPU-hours."""
    report = period_report(store, "user", since=T0 - 1, until=T0 + 7200, now=T0 + 120)
    rows = {r["key"]: r for r in report.rows}
    assert ["alice", "bob"] == [r["key"] for r in report.rows]  # by GPU-hours
    assert 2 == rows["alice"]["jobs"]
    assert pytest.approx(2.0 + 60 / 3600) == rows["alice"]["gpu_hours"]
    assert pytest.approx(0.5) == rows["bob"]["idle_gpu_hours"]
    assert 100.0 == rows["bob"]["idle_percent"]
    total = report.total
    assert pytest.approx(2.5 + 60 / 3600) == total["gpu_hours"]
    weighted = (80 * 3600 + 40 * 3600 + 0 * 1800 + 50 * 60) / (3600 * 2 + 1800 + 60)
    assert pytest.approx(weighted) == total["util_mean_percent"]
    assert ["alice", "bob"] == [w["key"] for w in report.top_waste]  # tie: by name
    assert pytest.approx((10 + 100 + 0) / 3) == total["queue_wait_mean"]


def test_report_prorates_to_the_period(store: Store) -> None:
    """A job half inside the period counts half."""
    report = period_report(store, "user", since=T0 + 1800, until=T0 + 7200, now=T0 + 120)
    rows = {r["key"]: r for r in report.rows}
    assert pytest.approx(1.0) == rows["alice"]["gpu_hours"]  # job 1 half; job 3 before
    assert "bob" not in rows  # ended at the period's start: nothing inside


def test_busy_nodes(store: Store) -> None:
    """A node with more than factor x the mean share is busy; unused nodes are listed."""
    report = period_report(
        store,
        "node",
        since=T0 - 1,
        until=T0 + 7200,
        now=T0 + 120,
        all_nodes=["gpu1", "gpu2", "gpu3"],
        busy_factor=1.5,
    )
    busy = {r["key"]: r["busy"] for r in report.rows}
    assert {"gpu1": "busy", "gpu2": "", "gpu3": ""} == busy


def test_node_report_shows_a_busy_column(store: Store) -> None:
    """`report nodes` has a Busy column (formerly Hot) showing "busy" or nothing."""
    report = period_report(
        store, "node", since=T0 - 1, until=T0 + 7200, now=T0 + 120, all_nodes=["gpu3"]
    )
    fields = report_fields("", "node")
    shown = {r["key"]: fields["Busy"].get(r) for r in report.rows}
    assert ({"gpu1": "busy", "gpu2": "", "gpu3": ""}, False) == (shown, "Hot" in fields)


def test_sort_and_top(store: Store) -> None:
    """--sort by any column (numbers descending), --top N."""
    report = period_report(
        store, "user", since=T0 - 1, until=T0 + 7200, now=T0 + 120, sort="IdlePct", top=1
    )
    assert ["bob"] == [r["key"] for r in report.rows]
    with pytest.raises(ValueError, match="unknown field"):
        period_report(store, "user", since=T0, until=T0 + 1, now=T0, sort="Nope")


def test_nothing_visible_is_empty_not_an_error(store: Store) -> None:
    """A filter that matches nothing gives no rows (and keeps every column)."""
    alice = Scope(Caller(1001, "alice"), False)
    result = usage(store, alice, filters=JobFilter(job_ids=("2",)))
    assert [] == job_records(result)
    assert "job_id" in result.jobs.columns
