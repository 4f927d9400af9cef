"""Missing data is never idle (#11 items 1, 2, 12, 13): figures, sacct, report, job, status.

A job's GPU time held with no readings (agent down, GPU lost) is missing: its own
figure, never idle, never a reason to rank a job as wasteful, charged all the same.
Unknown utilization is blank, stale readings are not shown as current, and the
fewer-GPUs advice needs GPUs that did nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config import Config
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.durations import Duration
from slurm_gpu.models import GpuActivity, GpuDevice, GpuInterval, JobGpuSummary
from slurm_gpu.reports import jobview, status
from slurm_gpu.reports.fields import job_fields
from slurm_gpu.reports.jobview import Thresholds, notes, render_job
from slurm_gpu.reports.monthly import build_monthly
from slurm_gpu.reports.records import job_records
from slurm_gpu.reports.render import parse_format, render
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.status import build_status, render_status
from slurm_gpu.reports.usage import JobFilter, Usage, load_usage
from slurm_gpu.slurm.admin_comment import parse_token, summary_token
from slurm_gpu.slurm.sacct import DELIMITER, FIELDS, parse_sacct
from slurm_gpu.slurm.scontrol import parse_node_gpus
from slurm_gpu.slurm.squeue import parse_running_owners
from slurm_gpu.store import Store
from tests.usage_sources import as_source, period_report

UTC = dt.UTC
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
H = 3600.0
A100 = "NVIDIA A100-SXM4-80GB"
ROOT = Scope(Caller(0, "root"), True, reason="root")
PRICES = CostSettings(currency="EUR", prices={"a100": 2.0}, default_price=0.0)
LIMITS = Thresholds(idle_percent=5.0)
LAG = 20.0  # ship_aggregate 10 s + two 5 s agent intervals


def summary(
    job: int,
    uuid: str,
    *,
    hours: float,
    util: float | None,
    missing_hours: float = 0.0,
    node: str = "gpu1",
    model: str = A100,
    start: float = NOV + 10 * H,
) -> JobGpuSummary:
    seconds = hours * H
    measured = seconds - missing_hours * H
    return JobGpuSummary(
        job_id=job,
        node=node,
        gpu_uuid=uuid,
        gpu_model=model,
        start=start,
        end=start + seconds,
        gpu_seconds=seconds,
        util_mean_percent=util,
        util_max_percent=util,
        active_seconds=measured if (util or 0.0) >= 5.0 else 0.0,
        mem_max_bytes=None if util is None else 2**30,
        mem_gib_seconds=measured,
        energy_joules=None if util is None else 1000.0,
        reading_count=0 if util is None else 10,
        missing_seconds=missing_hours * H,
        user="alice",
        account="physics",
        partition="gpu",
    )


def job_row(job: int, user: str, hours: float, gpus: int, **extra: Any) -> dict[str, Any]:
    start = extra.pop("start", NOV + 10 * H)
    return {
        "job_id": job,
        "user": user,
        "account": "physics",
        "partition": "gpu",
        "job_name": f"j{job}",
        "state": "COMPLETED",
        "submit_time": start - 60,
        "start_time": start,
        "end_time": start + hours * H,
        "nodes": "gpu1",
        "gpus": gpus,
        **extra,
    }


DEVICES = [
    GpuDevice(
        uuid=f"G{i}",
        name=A100,
        minor=i,
        nvml_index=i,
        pci_bus_id=f"0000:{i:02x}:00.0",
        memory_total_bytes=80 * 2**30,
    )
    for i in range(4)
]


@pytest.fixture
def store(store: Store, usage_source: str) -> Store:
    """Job 1: 4 GPUs busy at 60% on 2 nodes, half its time unmeasured (an agent down).

    Job 2: 1 GPU idle for 1 h, all measured. Job 3: 1 GPU for 2 h, no reading at all,
    its summary without a model (the agent never read it). gpu1 holds four A100s.
    """
    store.upsert_inventory("gpu1", DEVICES, seen_at=NOV)
    store.upsert_jobs(
        [
            job_row(1, "alice", 2.0, 4, nodes="gpu1,gpu2"),
            job_row(2, "bob", 1.0, 1),
            job_row(3, "carol", 2.0, 1),
        ]
    )
    store.add_summaries(
        [
            summary(1, "G0", hours=2.0, util=60.0, missing_hours=1.0),
            summary(1, "G1", hours=2.0, util=60.0, missing_hours=1.0),
            summary(1, "X0", hours=2.0, util=60.0, missing_hours=1.0, node="gpu2"),
            summary(1, "X1", hours=2.0, util=60.0, missing_hours=1.0, node="gpu2"),
            summary(2, "G2", hours=1.0, util=0.0),
            summary(3, "G3", hours=2.0, util=None, missing_hours=2.0, model=""),
        ]
    )
    return as_source(store, usage_source)


def usage(store: Store, now: float = NOV + 30 * H, **kw: Any) -> Usage:
    return load_usage(
        store,
        since=NOV,
        until=NOV + 30 * 24 * H,
        now=now,
        sacct_jobs=kw.pop("sacct_jobs", None),
        scope=ROOT,
        filters=kw.pop("filters", JobFilter()),
        cost=PRICES,
        lag=LAG,
        **kw,
    )


def records(store: Store, **kw: Any) -> dict[int, dict[str, Any]]:
    return {r["job_id"]: r for r in job_records(usage(store, **kw))}


def test_missing_time_is_not_idle_in_a_jobs_record(store: Store) -> None:
    """Busy at 60% throughout, half unmeasured: 4 missing GPU-hours, no idle."""
    job = records(store)[1]
    assert (8 * H, 4 * H, 4 * H, 0.0) == (
        job["gpu_seconds"],
        job["active_seconds"],
        job["missing_seconds"],
        job["idle_seconds"],
    )


def test_a_job_with_no_readings_is_unknown_and_charged(store: Store) -> None:
    """No reading: utilization, active and idle unknown; 2 h missing; the A100 price paid."""
    job = records(store)[3]
    assert (None, None, None, 2 * H) == (
        job["util_mean_percent"],
        job["active_seconds"],
        job["idle_seconds"],
        job["missing_seconds"],
    )
    assert (A100, 4.0) == (job["gpu_model"], job["cost"])


def test_sacct_shows_missing_gpu_hours_and_blank_unknowns(store: Store) -> None:
    """MissingGPUHours is a sacct field with its help; unknown figures print blank."""
    fields = job_fields("EUR")
    assert "no readings" in fields["MissingGPUHours"].help
    columns = parse_format("JobIDRaw,GPUUtilAvg,IdleGPUHours,MissingGPUHours,Cost", fields)
    text = render(columns, [records(store)[3]], "parsable")
    assert "3|||2.0000|4.00|" == text.splitlines()[-1]


def test_report_groups_have_missing_hours_and_no_blank_model(store: Store) -> None:
    """`report users`: missing its own column; `report gpu-models`: no row without a model."""
    since, until, now = NOV, NOV + 30 * 24 * H, NOV + 30 * H
    report = period_report(store, "user", since=since, until=until, now=now)
    users = {r["key"]: r for r in report.rows}
    assert (4.0, 0.0, 50.0) == (
        users["alice"]["missing_gpu_hours"],
        users["alice"]["idle_gpu_hours"],
        users["alice"]["missing_percent"],
    )
    assert (None, None, None) == (
        users["carol"]["util_mean_percent"],
        users["carol"]["idle_gpu_hours"],
        users["carol"]["idle_percent"],
    )
    models = period_report(store, "gpu_model", since=since, until=until, now=now)
    assert [A100] == [r["key"] for r in models.rows]


def test_top_waste_ranks_measured_idle_only(store: Store) -> None:
    """Only bob's measured idle hour makes a user or a job wasteful; idle cost is his."""
    report = period_report(store, "user", since=NOV, until=NOV + 30 * 24 * H, now=NOV + 30 * H)
    assert ["bob"] == [w["key"] for w in report.top_waste]
    monthly = build_monthly(
        ReportEnv(Config(), store, None, ROOT, dt.datetime(2026, 12, 15, tzinfo=UTC), []),
        "2026-11",
    )
    assert ["2"] == [j["job_id"] for j in monthly.waste_jobs]
    assert 0.0 == monthly.overview["idle_cost"]  # no [cost] prices in Config()
    assert 6.0 == pytest.approx(monthly.overview["missing_gpu_hours"])
    assert 1.0 == pytest.approx(monthly.overview["idle_gpu_hours"])


def test_gpu_model_from_the_gres_type_when_the_node_is_unknown(store: Store) -> None:
    """A job on a node the inventory lacks gets the gres type sacct recorded (a100)."""
    store.upsert_jobs([job_row(4, "dave", 1.0, 1, nodes="gpu9")])
    store.add_summaries([summary(4, "Z0", hours=1.0, util=None, missing_hours=1.0, model="",
                                 node="gpu9")])  # fmt: skip
    row = {
        "JobID": "4", "JobIDRaw": "4", "User": "dave", "Account": "physics",
        "Partition": "gpu", "QOS": "normal", "State": "COMPLETED",
        "Submit": "2026-11-01T09:59:00", "Start": "2026-11-01T10:00:00",
        "End": "2026-11-01T11:00:00", "Elapsed": "01:00:00", "Timelimit": "UNLIMITED",
        "NodeList": "gpu9", "AllocTRES": "billing=1,cpu=1,gres/gpu:a100=1,gres/gpu=1,node=1",
        "ExitCode": "0:0", "JobName": "j4",
    }  # fmt: skip
    (sacct_job,) = parse_sacct(DELIMITER.join(row.get(f, "") for f in FIELDS) + "\n", tz=UTC)
    job = records(store, sacct_jobs=[sacct_job], filters=JobFilter(job_ids=("4",)))[4]
    assert ("a100", 2.0) == (job["gpu_model"], job["cost"])


def test_a_running_job_whose_agent_is_down_has_missing_time(store: Store) -> None:
    """Running 10 min, nothing ever shipped: 2 GPUs x (10 min - the lag) missing, charged."""
    start = NOV + 40 * H
    store.upsert_jobs([job_row(5, "erin", 0.0, 2, start=start, state="RUNNING", end_time=None)])
    job = records(store, now=start + 600)[5]
    assert (2 * (600 - LAG), 2 * (600 - LAG), None) == (
        job["gpu_seconds"],
        job["missing_seconds"],
        job["idle_seconds"],
    )
    assert pytest.approx(2 * (600 - LAG) / H * 2.0) == job["cost"]
    assert A100 == job["gpu_model"]


def test_a_running_job_with_stale_intervals_has_missing_time(store: Store) -> None:
    """Intervals for its first 2 min, then silence: the time since (less the lag) is missing."""
    start = NOV + 50 * H
    store.upsert_jobs([job_row(6, "erin", 0.0, 1, start=start, state="RUNNING", end_time=None)])
    store.add_intervals([interval(6, "G0", start, start + 120.0, util=60.0)])
    job = records(store, now=start + 600)[6]
    assert (120.0, 600 - LAG - 120.0, 0.0) == (
        job["active_seconds"],
        job["missing_seconds"],
        job["idle_seconds"],
    )


def test_a_healthy_running_job_has_no_missing_time(store: Store) -> None:
    """Newest interval within the lag: the unshipped seconds are neither measured nor missing."""
    start = NOV + 60 * H
    store.upsert_jobs([job_row(7, "erin", 0.0, 1, start=start, state="RUNNING", end_time=None)])
    store.add_intervals([interval(7, "G0", start, start + 590.0, util=60.0)])
    job = records(store, now=start + 600)[7]
    assert (590.0, 0.0) == (job["gpu_seconds"], job["missing_seconds"])


def interval(job: int, uuid: str, start: float, end: float, util: float) -> GpuInterval:
    return GpuInterval(
        node="gpu1",
        gpu_uuid=uuid,
        period_start=start,
        period_end=end,
        job_id=job,
        util_mean_percent=util,
        util_max_percent=util,
        util_min_percent=util,
        util_sample_count=10,
        active_seconds=end - start,
        covered_seconds=end - start,
        mem_used_max_bytes=2**30,
        mem_total_bytes=80 * 2**30,
        power_mean_watts=100.0,
        energy_joules=100.0,
        temperature_max_celsius=50.0,
        ecc_errors_total=0,
    )


def test_admin_comment_token_leaves_unknown_out() -> None:
    """No reading: no util_avg or util_max (never 0), the missing seconds said."""
    token = parse_token(summary_token([summary(3, "G3", hours=1.0, util=None, missing_hours=1.0)]))
    assert {"gpus": "1", "gpu_s": "3600", "missing_s": "3600", "missing": "1"} == token


def test_admin_comment_token_of_a_job_that_failed_at_once() -> None:
    """Exit 1 after a second, no sample: no util_avg=0.0."""
    failed = JobGpuSummary(
        job_id=9, node="gpu1", gpu_uuid="G0", gpu_model=A100, start=NOV, end=NOV + 1,
        gpu_seconds=1.0, util_mean_percent=None, util_max_percent=None, active_seconds=0.0,
        mem_max_bytes=None, mem_gib_seconds=0.0, energy_joules=None, reading_count=0,
        missing_seconds=0.0,
    )  # fmt: skip
    token = parse_token(summary_token([failed]))
    assert "util_avg" not in token and "util_max" not in token
    measured = parse_token(summary_token([summary(1, "G0", hours=1.0, util=60.0)]))
    assert ("60.0", "60") == (measured["util_avg"], measured["util_max"])


def test_job_view_shows_missing_hours_and_no_idle(store: Store) -> None:
    """`slurm-gpu job`: a missing GPU-hours line; idle 0; no fewer-GPUs advice at 60% each."""
    u = usage(store)
    job = records(store)[1]
    gpus = [
        {str(k): v for k, v in g.items()} for g in u.gpus[u.gpus["job_id"] == 1].to_dict("records")
    ]
    text = render_job(job, gpus, memory_total={}, limits=LIMITS, currency="EUR")
    assert "idle 0.0000" in text
    assert "Missing GPU-hours 4.0000 (50% of the GPU-hours)" in text
    assert not any("would have done" in n for n in notes(job, gpus, LIMITS))


def gpu(uuid: str, util: float | None, node: str = "gpu1") -> dict[str, Any]:
    return {
        "node": node,
        "gpu_uuid": uuid,
        "gpu_seconds": H,
        "util_mean_percent": util,
        "mem_max_bytes": 0,
        "missing_seconds": 0.0,
    }


def test_fewer_gpus_note_never_on_uniform_load() -> None:
    """4 GPUs on 2 nodes all at 60%, or 2 at 30%: no "would have done the same work"."""
    job = {"state": "COMPLETED", "alloc_gpus": 4}
    for gpus in (
        [gpu("a", 60.0), gpu("b", 60.0), gpu("c", 60.0, "gpu2"), gpu("d", 60.0, "gpu2")],
        [gpu("a", 30.0), gpu("b", 30.0)],
    ):
        assert not any("would have done" in n for n in notes(job, gpus, LIMITS))


def test_fewer_gpus_note_when_some_gpus_were_idle() -> None:
    """1 of 3 GPUs idle: 2 would have done the same work."""
    job = {"state": "COMPLETED", "alloc_gpus": 3}
    text = notes(job, [gpu("a", 90.0), gpu("b", 80.0), gpu("c", 0.0)], LIMITS)
    assert any("2 GPU(s) would have done the same work" in n for n in text)


SCONTROL = (
    "NodeName=gpu1 CfgTRES=cpu=8,gres/gpu=4 AllocTRES=cpu=2,gres/gpu=2 State=MIXED\n"
    "NodeName=gpu2 CfgTRES=cpu=8,gres/gpu=4 AllocTRES= State=IDLE\n"
)


def status_row(node: str, uuid: str, job: int | None, util: float, end: float) -> dict[str, Any]:
    return {
        "node": node,
        "gpu_uuid": uuid,
        "period_start": end - 5,
        "period_end": end,
        "job_id": job,
        "util_mean_percent": util,
        "mem_used_max_bytes": 2**30,
        "unallocated_pids": "",
    }


def activity(job: int, node: str, uuid: str, last: float) -> GpuActivity:
    return GpuActivity(
        job_id=job,
        node=node,
        gpu_uuid=uuid,
        slurm_index=0,
        start=NOV,
        last_reading=last,
        last_active=last,
        util_recent_percent=90.0,
        mem_used_bytes=2**30,
        process_count=1,
    )


def test_status_shows_a_stopped_agents_gpus_as_stale() -> None:
    """gpu1's agent stopped 60 s ago: its GPUs are stale, not reporting, no utilization."""
    now = NOV + 1000.0
    nodes, _ = parse_node_gpus(SCONTROL)
    owners, _ = parse_running_owners("7|alice|physics\n")
    rows = [
        status_row("gpu1", "a", 7, 90.0, now - 60),
        status_row("gpu1", "b", None, 0.0, now - 60),
        status_row("gpu2", "c", None, 0.0, now - 5),
    ]
    cluster = build_status(
        nodes,
        rows,
        {},
        owners,
        ROOT,
        idle_percent=5.0,
        freshness=status.Freshness(now, stale_after=10.0, interval_lag=LAG),
        activity=[activity(7, "gpu1", "a", now - 58)],
    )
    by_node = {n.node: n for n in cluster.nodes}
    assert (0, 2, None) == (
        by_node["gpu1"].reporting,
        by_node["gpu1"].stale,
        by_node["gpu1"].util_mean_percent,
    )
    assert (1, 0) == (by_node["gpu2"].reporting, by_node["gpu2"].stale)
    text = render_status(cluster, "all jobs", "3m")
    assert "gpu1: 2 GPU(s) stopped reporting" in text and "(58 s ago)" in text


def test_status_a_running_jobs_fresh_activity_keeps_its_gpu_reporting() -> None:
    """Activity 3 s old: reporting, even though its newest interval is 19 s old."""
    now = NOV + 1000.0
    nodes, _ = parse_node_gpus(SCONTROL)
    owners, _ = parse_running_owners("7|alice|physics\n")
    cluster = build_status(
        nodes,
        [status_row("gpu1", "a", 7, 90.0, now - 19)],
        {},
        owners,
        ROOT,
        idle_percent=5.0,
        freshness=status.Freshness(now, stale_after=10.0, interval_lag=LAG),
        activity=[activity(7, "gpu1", "a", now - 3)],
    )
    gpu1 = cluster.nodes[0]
    assert (1, 0, 90.0) == (gpu1.reporting, gpu1.stale, gpu1.util_mean_percent)


def test_running_job_view_names_the_node_that_stopped_reporting() -> None:
    """gpu2's newest reading is 2 min old, gpu1's is fresh: only gpu2 is named."""
    now = NOV + 1000.0
    job = {"state": "RUNNING", "nodes": "gpu1,gpu2", "start_time": NOV}
    gpus = [
        {"node": "gpu1", "data_until": now - 8},
        {"node": "gpu2", "data_until": now - 120},
    ]
    lines = jobview.stale_nodes(
        job, gpus, [activity(7, "gpu1", "a", now - 2)], status.Freshness(now, 10.0, LAG)
    )
    assert 1 == len(lines) and lines[0].startswith("Node gpu2 stopped reporting")
    assert "(120 s ago)" in lines[0]
    silent = jobview.stale_nodes(
        {**job, "nodes": "gpu1,gpu3"}, gpus[:1], [], status.Freshness(now, 10.0, LAG)
    )
    assert ["Node gpu3 has sent no readings"] == [line[:30] for line in silent]


def test_freshness_allows_for_the_ship_interval() -> None:
    """`slurm-gpu status`: activity is stale past two intervals plus [node] ship_interval."""
    base = Config()
    shipped = dataclasses.replace(
        base, node=dataclasses.replace(base.node, ship_interval=Duration(60.0))
    )
    now = 1_800_000_000.0
    rule, plain = status.Freshness.of(shipped, now), status.Freshness.of(base, now)
    assert (80.0, 140.0) == (rule.stale_after, rule.interval_lag)
    assert (True, False) == (rule.is_fresh(None, now - 79), plain.is_fresh(None, now - 79))
