"""Reports over GPU slots (issue 14): MIG slices, shards and whole GPUs, from store rows.

Job 10 held a 1g.10gb slice of an H100 (GPM), job 11 one of an A100 (memory only),
job 12 a shard 1/4 of an A100 (per process), job 13 a whole H100, and jobs 20-26 the
seven 1g.10gb slices of one H100 for an hour. Prices a100 2.0, h100 4.0 per GPU-hour: a
slice costs its share of its GPU's price unless "model:profile" prices it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config import Config
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.models import JobGpuSummary, Measurement, SlotKind
from slurm_gpu.reports.fields import job_fields
from slurm_gpu.reports.jobview import Thresholds, measurement_of, render_job, slot_of
from slurm_gpu.reports.monthly import build_monthly, write_monthly
from slurm_gpu.reports.records import gpu_records, job_records
from slurm_gpu.reports.render import parse_format, render
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.summary import report_fields
from slurm_gpu.reports.usage import JobFilter, load_usage
from slurm_gpu.store import Store
from tests.usage_sources import as_source, period_report

UTC = dt.UTC
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
H = 3600.0
T0 = NOV + 10 * H
END = NOV + 30 * 24 * H
ROOT = Scope(Caller(0, "root"), True, reason="root")
PRICES = CostSettings(currency="EUR", unit="gpu_hour", prices={"a100": 2.0, "h100": 4.0})
A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"


def summary(job: int, gpu: str, model: str, hours: float, util: float | None,
            **slot: Any) -> JobGpuSummary:  # fmt: skip
    seconds = hours * H
    return JobGpuSummary(
        job_id=job, node="gpu3", gpu_uuid=gpu, gpu_model=model, start=T0, end=T0 + seconds,
        gpu_seconds=seconds, util_mean_percent=util, util_max_percent=util,
        active_seconds=seconds * (util or 0.0) / 100, mem_max_bytes=2**30,
        mem_gib_seconds=seconds, energy_joules=None, reading_count=int(seconds / 60),
        missing_seconds=0.0, user=f"u{job}", account="physics", partition="gpu", **slot,
    )  # fmt: skip


def mig(job: int, gpu: str, model: str, hours: float, util: float | None, slot_id: str,
        measured_by: Measurement = Measurement.GPM) -> JobGpuSummary:  # fmt: skip
    return summary(job, gpu, model, hours, util, slot_id=slot_id, slot_kind=SlotKind.MIG,
                   share=1 / 7, mig_profile="1g.10gb", measured_by=measured_by)  # fmt: skip


SUMMARIES = [
    mig(10, "GPU-h0", H100, 2.0, 20.0, "MIG-s10"),
    mig(11, "GPU-a0", A100, 1.0, None, "MIG-m11", Measurement.MEMORY_ONLY),
    summary(12, "GPU-a1", A100, 4.0, 40.0, slot_id="GPU-a1/shard/12", slot_kind=SlotKind.SHARD,
            share=0.25, measured_by=Measurement.PER_PROCESS),
    summary(13, "GPU-h1", H100, 1.0, 50.0),
    *(mig(20 + i, "GPU-h2", H100, 1.0, 10.0, f"MIG-h2-{i}") for i in range(7)),
]  # fmt: skip


def fill(store: Store) -> None:
    store.upsert_jobs([
        {"job_id": s.job_id, "user": s.user, "account": "physics", "partition": "gpu",
         "job_name": f"job{s.job_id}", "state": "COMPLETED", "submit_time": T0 - 30,
         "start_time": T0, "end_time": s.end, "nodes": "gpu3", "gpus": 1}
        for s in SUMMARIES
    ])  # fmt: skip
    store.add_summaries(SUMMARIES)


@pytest.fixture
def store(tmp_path: Path, usage_source: str) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'slots.db'}", cluster="c")
    s.upgrade()
    fill(s)
    yield as_source(s, usage_source)
    s.dispose()


def usage(store: Store, cost: CostSettings = PRICES) -> Any:
    return load_usage(store, since=NOV, until=END, now=END, sacct_jobs=None, scope=ROOT,
                      cost=cost, lag=120.0)  # fmt: skip


def test_sacct_slot_fields(store: Store) -> None:
    """`sacct --gpus -o JobID,Slot,SlotKind,MIGProfile,Share,MeasuredBy,GPUHours,...`."""
    fields = job_fields("EUR")
    columns = parse_format(
        "JobID,SlotKind,MIGProfile,Share,MeasuredBy,GPUHours,PhysGPUHours,GPUUtilAvg,Cost", fields
    )
    records = [r for r in gpu_records(usage(store)) if r["job_id"] < 20]
    expected = (
        "JobID|SlotKind|MIGProfile|Share|MeasuredBy|GPUHours|PhysGPUHours|GPUUtilAvg|Cost\n"
        "10|mig|1g.10gb|1/7|GPM of its GPU instance|2.0000|0.2857|20.0|1.14\n"
        "11|mig|1g.10gb|1/7|memory only: utilization not measured on an Ampere MIG slice|"
        "1.0000|0.1429||0.29\n"
        "12|shard||1/4|per process|4.0000|1.0000|40.0|2.00\n"
        "13|gpu||1|NVML samples|1.0000|1.0000|50.0|4.00\n"
    )
    assert expected == render(columns, records, "parsable2")


def test_slice_price_share_and_explicit(store: Store) -> None:
    """Share of the parent's price by default; a "model:profile" key prices it per hour."""
    by_job = {r["job_id"]: r for r in job_records(usage(store))}
    assert pytest.approx(2 * 4.0 / 7) == by_job[10]["cost"]
    assert pytest.approx(2 * H / 7) == by_job[10]["physical_gpu_seconds"]
    assert pytest.approx(2.0 * 0.25 * 4) == by_job[12]["cost"]
    assert 4.0 == by_job[13]["cost"]
    priced = dataclasses.replace(PRICES, prices={**PRICES.prices, "h100:1g.10gb": 1.0})
    explicit = {r["job_id"]: r for r in job_records(usage(store, priced))}
    assert (2.0, pytest.approx(2.0 / 7)) == (explicit[10]["cost"], explicit[11]["cost"])
    whole = {r["job_id"]: r for r in job_records(usage(store, dataclasses.replace(
        PRICES, slot_price="whole")))}  # fmt: skip
    assert (8.0, 2.0, 8.0) == (whole[10]["cost"], whole[11]["cost"], whole[12]["cost"])


def test_report_by_slot(store: Store) -> None:
    """`report slots`: model and slot per row, slot-hours, physical GPU-hours and cost."""
    report = period_report(store, "slot", since=NOV, until=END, now=END, cost=PRICES, lag=120.0)
    got = [
        (r["key"], r["jobs"], round(r["gpu_hours"], 4), round(r["physical_gpu_hours"], 4),
         round(r["cost"], 4))
        for r in sorted(report.rows, key=lambda r: r["key"])
    ]  # fmt: skip
    expected = [
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 1, 1.0, round(1 / 7, 4), round(2 / 7, 4)),
        ("NVIDIA A100-SXM4-80GB shard", 1, 4.0, 1.0, 2.0),
        ("NVIDIA H100 80GB HBM3", 1, 1.0, 1.0, 4.0),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 8, 9.0, round(9 / 7, 4), round(36 / 7, 4)),
    ]
    assert expected == got
    assert (15.0, pytest.approx(1 / 7 + 1 + 1 + 9 / 7)) == (
        report.total["gpu_hours"],
        report.total["physical_gpu_hours"],
    )


def test_seven_slices_of_one_gpu_are_one_gpu_hour(store: Store) -> None:
    """Seven 1g.10gb slices of one H100 for an hour: 7 slot-hours, 1 GPU-hour, cost 4.0."""
    report = period_report(store, "node", since=NOV, until=END, now=END, cost=PRICES, lag=120.0)
    assert report.rows  # one node
    seven = [r for r in job_records(usage(store)) if r["job_id"] >= 20]
    assert (7.0, pytest.approx(1.0), pytest.approx(4.0)) == (
        sum(r["gpu_seconds"] for r in seven) / H,
        sum(r["physical_gpu_seconds"] for r in seven) / H,
        sum(r["cost"] for r in seven),
    )


def test_report_knows_whether_its_rows_held_slots(store: Store) -> None:
    """PhysGPUHours follows the rows the report summed: u13 held a whole H100 only."""
    seen = {
        users: period_report(store, "user", since=NOV, until=END, now=END, cost=PRICES,
                             filters=JobFilter(users=users)).held_slots
        for users in ((), ("u13",), ("u10",))
    }  # fmt: skip
    assert {(): True, ("u13",): False, ("u10",): True} == seen


def test_report_fields_show_physical_hours_only_with_slots() -> None:
    """PhysGPUHours is a column where slots are, and not in a whole-GPU report."""
    assert "PhysGPUHours" not in report_fields("EUR")
    assert "PhysGPUHours" in report_fields("EUR", slots=True)


def test_monthly_report_lists_slices_and_their_cost(store: Store, tmp_path: Path) -> None:
    """`report monthly`: a slots table (slot-hours, GPU-hours, cost) and slots.csv."""
    config = dataclasses.replace(Config(), cost=PRICES)
    env = ReportEnv(config, store, None, ROOT, dt.datetime(2026, 12, 15, tzinfo=UTC), [])
    monthly = build_monthly(env, "2026-11")
    got = [(r["key"], round(r["gpu_hours"], 4), round(r["physical_gpu_hours"], 4),
            round(r["cost"], 4)) for r in monthly.slots]  # fmt: skip
    assert [
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9.0, round(9 / 7, 4), round(36 / 7, 4)),
        ("NVIDIA A100-SXM4-80GB shard", 4.0, 1.0, 2.0),
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 1.0, round(1 / 7, 4), round(2 / 7, 4)),
        ("NVIDIA H100 80GB HBM3", 1.0, 1.0, 4.0),
    ] == got
    files = {p.name for p in write_monthly(monthly, tmp_path / "out")}
    assert "slots.csv" in files
    lines = (tmp_path / "out" / "slots.csv").read_text().splitlines()
    assert (
        "name,jobs,users,gpu_hours,physical_gpu_hours,cost,util_mean_percent,idle_gpu_hours,idle_cost"
        == lines[0]
    )
    page = (tmp_path / "out" / "index.html").read_text()
    assert "GPU slots: MIG slices and shares" in page


def test_job_view_shows_each_slot_and_its_measurement(store: Store) -> None:
    """`slurm-gpu job 11`: the slot in words, measured by memory only, utilization "-"."""
    u = usage(store)
    job = next(r for r in job_records(u) if r["job_id"] == 11)
    gpus = u.gpus[u.gpus["job_id"] == 11].to_dict("records")
    text = render_job(job, gpus, memory_total={}, limits=Thresholds(idle_percent=5.0),
                      currency="EUR")  # fmt: skip
    lines = text.splitlines()
    assert (
        "  Slot-hours held 1.0000  physical GPU-hours 0.1429 (share of the GPU x slot-hours)"
        in lines
    )
    assert [
        "  Node     Slot: measured by",
        "  gpu3     MIG 1g.10gb of GPU-a0: memory only: utilization not measured on an Ampere "
        "MIG slice",
    ] == lines[lines.index("  Node     Slot: measured by") :][:2]
    row = next(line for line in lines if line.startswith("  gpu3     GPU-a0"))
    assert "     -/     -" in row  # utilization unknown, never 0%


def test_job_json_names_slot_and_measurement(store: Store) -> None:
    """The JSON's per-GPU "slot" and "measurement" texts, for each kind."""
    u = usage(store)
    got = {
        int(g["job_id"]): (slot_of(g), measurement_of(g))
        for g in u.gpus.to_dict("records")
        if g["job_id"] < 20
    }
    assert {
        10: ("MIG 1g.10gb of GPU-h0", "GPM of its GPU instance"),
        11: ("MIG 1g.10gb of GPU-a0",
             "memory only: utilization not measured on an Ampere MIG slice"),
        12: ("shard 1/4 of GPU-a1", "per process"),
        13: ("whole GPU GPU-h1", "NVML samples"),
    } == got  # fmt: skip
