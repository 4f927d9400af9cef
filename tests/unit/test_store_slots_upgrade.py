"""A store written at revision 0008 (before GPU slots) upgraded to 0009 (issue 14).

The same history (jobs and their GPUs, minute intervals and hourly rollups, summaries of
a requeued job, running jobs' activity, the inventory, the controller's audit log) is
written twice: through the write API into a store at head, and, table by table with the
columns 0008 has, into a store at 0008 that is then upgraded. Every row survives with
whole-GPU slots (slot_id = gpu_uuid), and every figure the reports compute (`sacct`
records per job and per GPU, `report` by user/account/node/model, `report monthly`, a
job's timeline) is the same over both stores.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config import Config
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.models import (
    Action,
    GpuActivity,
    GpuDevice,
    GpuInterval,
    JobEvent,
    JobEventKind,
    JobGpuSummary,
    Measurement,
    SlotKind,
    Verdict,
)
from slurm_gpu.reports.jobview import job_timeline
from slurm_gpu.reports.monthly import build_monthly
from slurm_gpu.reports.records import gpu_records, job_records
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.usage import load_usage
from slurm_gpu.store import Store
from slurm_gpu.store.schema import ALL_TABLES
from tests.usage_sources import period_report

UTC = dt.UTC
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
H = 3600.0
T0 = NOV + 10 * H
NOW = NOV + 12 * H  # job 3 still runs
ROOT = Scope(Caller(0, "root"), True, reason="root")
PRICES = CostSettings(currency="EUR", unit="gpu_hour", prices={"a100": 2.0, "h100": 4.0})
SLOT_COLUMNS = {"slot_id", "slot_kind", "share", "mig_profile", "measured_by"}
A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"


def minute(node: str, gpu: str, start: float, job: int | None, util: float) -> GpuInterval:
    return GpuInterval(
        node=node, gpu_uuid=gpu, period_start=start, period_end=start + 60.0, job_id=job,
        util_mean_percent=util, util_max_percent=util + 5, util_min_percent=max(util - 5, 0),
        util_sample_count=6, active_seconds=60.0 if util > 5 else 0.0, covered_seconds=60.0,
        mem_used_max_bytes=2**33, mem_total_bytes=2**36, power_mean_watts=250.0 + util,
        energy_joules=60 * (250.0 + util), temperature_max_celsius=50.0, ecc_errors_total=0,
        gpm_seconds=60.0 if gpu.startswith("GPU-h") else 0.0,
        sm_active_mean_percent=util / 2 if gpu.startswith("GPU-h") else None,
    )  # fmt: skip


def summary(job: int, node: str, gpu: str, model: str, start: float, hours: float,
            util: float, restart: int = 0, user: str = "alice",
            account: str = "physics") -> JobGpuSummary:  # fmt: skip
    seconds = hours * H
    return JobGpuSummary(
        job_id=job, node=node, gpu_uuid=gpu, gpu_model=model, start=start, end=start + seconds,
        gpu_seconds=seconds, util_mean_percent=util, util_max_percent=util + 5,
        active_seconds=seconds * util / 100, mem_max_bytes=2**33, mem_gib_seconds=8 * seconds,
        energy_joules=300.0 * seconds, reading_count=int(seconds / 60),
        missing_seconds=60.0 if job == 2 else 0.0, user=user, account=account, partition="gpu",
        restart=restart, gpm_seconds=seconds if model == H100 else 0.0,
        sm_active_mean_percent=util / 2 if model == H100 else None,
    )  # fmt: skip


def fill(store: Store) -> None:
    """The history, through the write API (at head)."""
    jobs = [  # id, user, account, start, end, nodes, gpus
        (1, "alice", "physics", T0, T0 + 2 * H, "gpu1", 2),
        (2, "bob", "bio", T0 - 3 * H, T0 - H, "gpu2", 1),
        (3, "carol", "physics", T0 + H, None, "gpu2", 1),
    ]
    store.upsert_jobs([
        {"job_id": j, "user": u, "account": a, "partition": "gpu", "job_name": f"job{j}",
         "state": "COMPLETED" if end else "RUNNING", "submit_time": start - 30,
         "start_time": start, "end_time": end, "nodes": nodes, "gpus": gpus}
        for j, u, a, start, end, nodes, gpus in jobs
    ])  # fmt: skip
    store.add_events([
        JobEvent("gpu1", 1, JobEventKind.STARTED, T0, "alice", account="physics",
                 partition="gpu", gpu_indices=(0, 1)),
        JobEvent("gpu1", 1, JobEventKind.ENDED, T0 + 2 * H, exit_code=0),
        JobEvent("gpu2", 2, JobEventKind.STARTED, T0 - 3 * H, "bob", account="bio",
                 gpu_indices=(0,)),
        JobEvent("gpu2", 2, JobEventKind.ENDED, T0 - 2 * H, exit_code=1),
        JobEvent("gpu2", 2, JobEventKind.STARTED, T0 - 2 * H + 60, "bob", account="bio",
                 gpu_indices=(1,), restart=1),
        JobEvent("gpu2", 2, JobEventKind.ENDED, T0 - H, exit_code=0, restart=1),
        JobEvent("gpu2", 3, JobEventKind.STARTED, T0 + H, "carol", account="physics",
                 gpu_indices=(0,)),
    ])  # fmt: skip
    old = [minute("gpu1", g, T0 + 60 * i, 1, 10.0 * i) for g in ("GPU-a0", "GPU-a1")
           for i in range(5)]  # fmt: skip
    running = [minute("gpu2", "GPU-h0", T0 + H + 60 * i, 3, 70.0) for i in range(10)]
    store.add_intervals([*old, *running, minute("gpu2", "GPU-h1", T0, None, 0.0)])
    store.rollup_and_prune(T0 + H)  # the old minutes become hourly rows
    store.add_intervals([minute("gpu1", "GPU-a0", T0 + H + 60 * i, 1, 50.0) for i in range(3)])
    store.add_summaries([
        summary(1, "gpu1", "GPU-a0", A100, T0, 2.0, 60.0),
        summary(1, "gpu1", "GPU-a1", A100, T0, 2.0, 20.0),
        summary(2, "gpu2", "GPU-h0", H100, T0 - 3 * H, 1.0, 0.0, user="bob", account="bio"),
        summary(2, "gpu2", "GPU-h1", H100, T0 - 2 * H + 60, 1.0, 90.0, restart=1, user="bob",
                account="bio"),
    ])  # fmt: skip
    end = T0 + H + 600
    activity = GpuActivity(3, "gpu2", "GPU-h0", 0, T0 + H, end, end - 10, 70.0, 2**33, 1, T0 + H,
                           35.0, end)  # fmt: skip
    store.add_activity([activity])
    devices = [GpuDevice(f"GPU-a{i}", A100, i, i, f"0000:0{i}:00.0", 2**36) for i in range(2)]
    store.upsert_inventory("gpu1", devices, seen_at=T0 - H)
    h100s = [GpuDevice(f"GPU-h{i}", H100, i, i, f"0000:1{i}:00.0", 2**36, True) for i in range(2)]
    store.upsert_inventory("gpu2", h100s, seen_at=T0 - 4 * H)
    verdict = Verdict("idle_gpu", Action.WARN, "job:2", "idle", job_id=2, user="bob", account="bio")
    store.control.audit([verdict], time=T0 - 2 * H, cycle="c", controller="h", dry_run=False,
                        outcome="recorded")  # fmt: skip


def _dump(conn: sa.Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, every column of head's schema, in one order."""
    out = {}
    for table in ALL_TABLES:
        columns = list(table.columns)
        out[table.name] = [tuple(r) for r in conn.execute(sa.select(*columns).order_by(*columns))]
    return out


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """(written at head, written at 0008 and then upgraded): the same history in each."""
    head = Store(f"sqlite:///{tmp_path / 'head.db'}", cluster="c")
    head.upgrade()
    fill(head)
    old = Store(f"sqlite:///{tmp_path / 'old.db'}", cluster="c")
    old.upgrade("0008")
    with head.reading("the history") as source, old.writing("the history at 0008") as target:
        inspector = sa.inspect(target)
        present = set(inspector.get_table_names())
        assert "gpu_physical_intervals" not in present
        for table in ALL_TABLES:
            if table.name not in present:
                continue
            names = [c["name"] for c in inspector.get_columns(table.name)]
            assert table.name == "jobs" or not SLOT_COLUMNS & set(names)  # 0008: no slots
            query = sa.select(*(table.c[n] for n in names))
            rows = [dict(r) for r in source.execute(query).mappings()]
            if rows:
                target.execute(sa.insert(sa.table(table.name, *map(sa.column, names))), rows)
    assert "0008" == old.current_revision()
    old.upgrade()
    assert Store.head_revision() == old.current_revision()  # 0009 and every later one
    yield head, old
    head.dispose()
    old.dispose()


def test_every_row_is_kept_as_a_whole_gpu_slot(stores: tuple[Store, Store]) -> None:
    """Each table holds the same rows after the upgrade; every slot is its whole GPU."""
    head, old = stores
    with head.reading("head") as a, old.reading("upgraded") as b:
        expected, actual = _dump(a), _dump(b)
        slots = b.execute(sa.text("SELECT slot_id, gpu_uuid, slot_kind, share, mig_profile, "
                                  "measured_by FROM gpu_intervals UNION ALL SELECT slot_id, "
                                  "gpu_uuid, slot_kind, share, mig_profile, measured_by FROM "
                                  "job_gpu_summaries UNION ALL SELECT slot_id, gpu_uuid, "
                                  "slot_kind, share, mig_profile, measured_by FROM "
                                  "gpu_intervals_hourly UNION ALL SELECT slot_id, gpu_uuid, "
                                  "slot_kind, share, mig_profile, measured_by FROM "
                                  "gpu_activity")).all()  # fmt: skip
    assert expected == actual
    counts = {name: len(rows) for name, rows in actual.items() if rows}
    assert {"jobs": 3, "job_gpus": 5, "gpu_intervals": 13, "gpu_intervals_hourly": 3,
            "job_gpu_summaries": 4, "gpu_activity": 1, "gpu_inventory": 4, "job_events": 7,
            "audit_log": 1, "job_usage": 3, "usage_daily": 2, "usage_monthly": 2,
            "usage_unfolded": 1, "usage_extent": 1} == counts  # fmt: skip
    assert 21 == len(slots)  # 13 intervals, 4 summaries, 3 hours, 1 activity
    assert all((s, k, sh, p, m) == (g, "gpu", 1.0, "", "nvml") for s, g, k, sh, p, m in slots)
    assert old.intervals() == head.intervals()
    assert all(r.slot_id == "" and r.effective_slot_id == r.gpu_uuid for r in old.intervals())
    assert old.hourly() == head.hourly()
    assert old.job_summaries(2) == head.job_summaries(2)
    assert [s.key for s in old.job_summaries(2)] == ["2:gpu2:GPU-h0", "2:gpu2:GPU-h1:1"]
    assert old.activity() == head.activity()
    assert (SlotKind.GPU, Measurement.NVML) == (old.activity()[0].slot_kind,
                                                old.activity()[0].measured_by)  # fmt: skip
    assert old.job_gpus(2) == head.job_gpus(2)


def _usage(store: Store) -> Any:
    return load_usage(store, since=NOV, until=NOV + 30 * 24 * H, now=NOW, sacct_jobs=None,
                      scope=ROOT, cost=PRICES, lag=120.0)  # fmt: skip


def test_sacct_records_are_the_same(stores: tuple[Store, Store]) -> None:
    """`sacct` per job and per GPU (`--gpus`): every figure and text the same."""
    head, old = stores
    expected, actual = _usage(head), _usage(old)
    assert repr(job_records(expected)) == repr(job_records(actual))
    assert repr(gpu_records(expected)) == repr(gpu_records(actual))
    per_job = {r["job_id"]: r for r in job_records(actual)}
    assert (4 * H, 2 * H) == (per_job[1]["gpu_seconds"], per_job[2]["gpu_seconds"])
    # Running job 3: held from its start to what the agent can have shipped (now - lag).
    assert H - 120.0 == per_job[3]["gpu_seconds"]
    gpus = gpu_records(actual)
    assert {("gpu", 1.0, "", "nvml")} == {
        (g["slot_kind"], g["share"], g["mig_profile"], g["measured_by"])
        for g in gpus
        if g["gpu_uuid"]
    }
    assert all(g["slot_id"] == g["gpu_uuid"] for g in gpus)


@pytest.mark.parametrize("group", ["user", "account", "partition", "node", "gpu_model", "cluster"])
def test_reports_are_the_same(stores: tuple[Store, Store], group: str) -> None:
    """`slurm-gpu report <group>`: the same rows, totals and top waste over both stores."""
    head, old = stores
    reports = [
        period_report(
            s,
            group,
            since=NOV,
            until=NOV + 30 * 24 * H,
            now=NOW,
            cost=PRICES,
            lag=120.0,
            cluster="c",
        )
        for s in (head, old)
    ]
    assert repr(dataclasses.asdict(reports[0])) == repr(dataclasses.asdict(reports[1]))
    assert reports[1].total["jobs"] == 3


def test_monthly_report_is_the_same(stores: tuple[Store, Store]) -> None:
    """`slurm-gpu report monthly` for November: every table of the page and CSV files."""
    now = dt.datetime(2026, 12, 15, tzinfo=UTC)
    monthly = [
        build_monthly(ReportEnv(Config(), store, None, ROOT, now, []), "2026-11")
        for store in stores
    ]
    assert repr(dataclasses.asdict(monthly[0])) == repr(dataclasses.asdict(monthly[1]))
    assert monthly[1].overview["jobs"] == 3


def test_job_timeline_is_the_same(stores: tuple[Store, Store]) -> None:
    """`slurm-gpu job 1`'s timeline: hourly rollups and minutes per GPU, the same."""
    timelines = []
    for store in stores:
        usage = _usage(store)
        job = usage.jobs[usage.jobs["job_id"] == 1].to_dict("records")[0]
        gpus = usage.gpus[usage.gpus["job_id"] == 1].to_dict("records")
        timelines.append(job_timeline(store, job, gpus))
    expected, actual = timelines
    assert expected is not None and actual is not None
    assert repr(expected) == repr(actual)
    assert ["GPU-a0", "GPU-a1"] == [g.gpu_uuid for g in actual.gpus]


def test_the_upgraded_store_takes_slot_rows(stores: tuple[Store, Store]) -> None:
    """After the upgrade a shard of a GPU with a whole-GPU row in that minute is stored too."""
    _, old = stores
    whole = old.intervals(slot_id="GPU-h0")[0]
    shard = dataclasses.replace(
        whole, slot_id="GPU-h0/shard/4", slot_kind=SlotKind.SHARD, share=0.5, job_id=4,
        measured_by=Measurement.PER_PROCESS,
    )  # fmt: skip
    assert (1, 0) == (old.add_intervals([shard]), old.add_intervals([whole]))
    assert [whole, shard] == old.intervals(gpu_uuid="GPU-h0", since=whole.period_start,
                                           until=whole.period_end)  # fmt: skip
