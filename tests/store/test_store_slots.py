"""Revision 0009 on every backend: GPU slots (issue 14) in the store.

A job holds a slot: a whole GPU (its slot id is its UUID, as before slots), a MIG slice
(its MIG UUID) or a share of a GPU (`<GPU>/shard/<job>`). Rows are keyed by slot, so two
jobs' shares of one GPU in one minute are two rows; `gpu_uuid` stays the physical GPU.
The physical GPU's own totals are `gpu_physical_intervals`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import sqlalchemy as sa

from slurm_gpu.models import (
    GpuActivity,
    GpuInterval,
    GpuPhysicalInterval,
    GpuSlot,
    JobEvent,
    JobEventKind,
    JobGpuSummary,
    Measurement,
    MigDevice,
    SlotKind,
)
from slurm_gpu.store import Store, queries
from slurm_gpu.store.schema import ALL_TABLES

T0 = 1_700_000_040.0  # 14 min past an hour
H100 = "GPU-5e1c0000-0000-4000-8000-000000000001"
A100 = "GPU-a1000000-0000-4000-8000-000000000002"
MIG = MigDevice("MIG-3f000000-0000-4000-8000-000000000003", H100, 0, 1, 0, "3g.40gb", 3)
SHARD_42 = GpuSlot.shared(SlotKind.SHARD, A100, 42, 0.25)
MPS_43 = GpuSlot.shared(SlotKind.MPS, A100, 43, 0.5, restart=1)


def interval(
    start: float,
    slot: GpuSlot | None = None,
    job_id: int = 42,
    measured: Measurement = Measurement.NVML,
) -> GpuInterval:
    """A one-minute interval of `slot` (None: the whole H100)."""
    whole = slot is None or slot.kind is SlotKind.GPU
    return GpuInterval(
        node="gpu3", gpu_uuid=H100 if slot is None else slot.parent_uuid, period_start=start,
        period_end=start + 60.0, job_id=job_id, util_mean_percent=None if
        measured is Measurement.MEMORY_ONLY else 40.0, util_max_percent=None, util_min_percent=None,
        util_sample_count=0, active_seconds=30.0, covered_seconds=60.0,
        mem_used_max_bytes=2**33, mem_total_bytes=2**35,
        power_mean_watts=300.0 if whole else None, energy_joules=18_000.0 if whole else None,
        temperature_max_celsius=55.0 if whole else None, ecc_errors_total=0 if whole else None,
        slot_id="" if slot is None else slot.slot_id,
        slot_kind=SlotKind.GPU if slot is None else slot.kind,
        share=1.0 if slot is None else slot.share,
        mig_profile="" if slot is None else slot.mig_profile, measured_by=measured,
    )  # fmt: skip


def summary(slot: GpuSlot, job_id: int, measured: Measurement, restart: int = 0) -> JobGpuSummary:
    """Job `job_id`'s summary of one slot."""
    return JobGpuSummary(
        job_id=job_id, node="gpu3", gpu_uuid=slot.parent_uuid, gpu_model="NVIDIA H100",
        start=T0, end=T0 + 600.0, gpu_seconds=600.0, util_mean_percent=None, util_max_percent=None,
        active_seconds=0.0, mem_max_bytes=2**33, mem_gib_seconds=4800.0, energy_joules=None,
        reading_count=10, missing_seconds=0.0, user="alice", account="physics", partition="gpu",
        restart=restart, slot_id=slot.slot_id, slot_kind=slot.kind, share=slot.share,
        mig_profile=slot.mig_profile, measured_by=measured,
    )  # fmt: skip


# ---------------------------------------------------------------------- schema


def test_keys_are_slots_and_the_parent_gpu_is_kept(store: Store) -> None:
    """Each slot table's primary key has slot_id where gpu_uuid was; gpu_uuid stays NOT NULL."""
    inspector = sa.inspect(store.engine)
    keys = {t: inspector.get_pk_constraint(t)["constrained_columns"] for t in (
        "gpu_intervals", "gpu_intervals_hourly", "job_gpu_summaries", "gpu_activity",
        "gpu_physical_intervals")}  # fmt: skip
    assert {
        "gpu_intervals": ["node", "slot_id", "period_start"],
        "gpu_intervals_hourly": ["node", "slot_id", "hour_start", "job_id"],
        "job_gpu_summaries": ["cluster", "job_id", "node", "slot_id", "restart"],
        "gpu_activity": ["cluster", "job_id", "node", "slot_id"],
        "gpu_physical_intervals": ["node", "gpu_uuid", "period_start"],
    } == keys
    expected = {t.name: [c.name for c in t.primary_key.columns] for t in ALL_TABLES}
    assert all(expected[t] == key for t, key in keys.items())  # schema.py says the same
    for table in ("gpu_intervals", "gpu_intervals_hourly", "job_gpu_summaries", "gpu_activity"):
        nullable = {c["name"]: c["nullable"] for c in inspector.get_columns(table)}
        assert (False, False) == (nullable["gpu_uuid"], nullable["slot_id"]), table


# ---------------------------------------------------------------------- round trips


def test_slot_intervals_of_each_kind_round_trip(store: Store) -> None:
    """A whole GPU, a MIG slice (GPM, memory only), a shard and an MPS share come back equal."""
    rows = [
        interval(T0),
        interval(T0, MIG.slot, measured=Measurement.GPM),
        interval(T0 + 60, MIG.slot, measured=Measurement.MEMORY_ONLY),
        interval(T0, SHARD_42, measured=Measurement.PER_PROCESS),
        interval(T0, MPS_43, job_id=43, measured=Measurement.PER_PROCESS),
    ]
    assert 5 == store.add_intervals(rows)
    stored = store.intervals()
    assert sorted(rows, key=lambda r: (r.gpu_uuid, r.effective_slot_id, r.period_start)) == stored
    assert [SlotKind.MPS, SlotKind.SHARD] == [r.slot_kind for r in store.intervals(gpu_uuid=A100)]
    assert [SlotKind.GPU] == [r.slot_kind for r in store.intervals(slot_id=H100)]
    assert [MIG.uuid, MIG.uuid] == [r.slot_id for r in store.intervals(slot_id=MIG.uuid)]
    assert (3 / 7, "3g.40gb") == (stored[1].share, stored[1].mig_profile)


def test_a_slot_interval_shipped_twice_is_stored_once(store: Store) -> None:
    """Insert-or-ignore on (node, slot, period_start): the resend counts 0 and changes nothing."""
    rows = [interval(T0, MIG.slot, measured=Measurement.GPM), interval(T0, SHARD_42)]
    assert 2 == store.add_intervals(rows)
    assert 0 == store.add_intervals(rows)
    assert 1 == store.add_intervals([*rows, interval(T0 + 60, SHARD_42)])
    assert 3 == len(store.intervals())


def test_two_jobs_sharing_one_gpu_in_one_minute_are_two_rows(store: Store) -> None:
    """Two shard slots of one A100, same period: both stored, one filter finds the GPU's."""
    shard_43 = GpuSlot.shared(SlotKind.SHARD, A100, 43, 0.75)
    rows = [interval(T0, SHARD_42), interval(T0, shard_43, job_id=43)]
    assert 2 == store.add_intervals(rows)
    assert [(42, 0.25), (43, 0.75)] == [(r.job_id, r.share) for r in store.intervals(gpu_uuid=A100)]
    totals = queries.interval_totals_for(store, [42, 43])
    assert [(42, SHARD_42.slot_id), (43, shard_43.slot_id)] == [
        (t.job_id, t.slot_id) for t in totals
    ]
    assert {A100} == {t.gpu_uuid for t in totals}


def test_slot_summaries_and_activity_round_trip_and_upsert_by_slot(store: Store) -> None:
    """Summaries of a MIG slice and a share beside the whole GPU's; a resend replaces by slot."""
    whole = replace(summary(GpuSlot.whole(H100), 42, Measurement.NVML), slot_id="")
    mig = summary(MIG.slot, 42, Measurement.GPM)
    mps = summary(MPS_43, 42, Measurement.PER_PROCESS, restart=1)
    store.add_summaries([whole, mig, mps])
    store.add_summaries([replace(mig, gpu_seconds=700.0)])
    assert [whole, replace(mig, gpu_seconds=700.0), mps] == store.job_summaries(42)
    assert f"42:gpu3:{H100}" == whole.key  # the key of before slots
    assert f"42:gpu3:{MIG.uuid}" == mig.key

    base = GpuActivity(42, "gpu3", H100, 4, T0, T0 + 60, T0 + 30, 20.0, 2**30, 1, T0)
    slices = [
        base,
        replace(base, slot_id=MIG.uuid, slot_kind=SlotKind.MIG, share=3 / 7,
                mig_profile="3g.40gb", measured_by=Measurement.GPM, slurm_index=5),
    ]  # fmt: skip
    store.add_activity(slices)
    assert slices == store.activity([42])


def test_job_gpus_have_a_slot_column(store: Store) -> None:
    """A prolog's GPU rows carry slot_id ("" until a GPU is known), beside gpu_uuid."""
    store.add_events([JobEvent("gpu3", 42, JobEventKind.STARTED, T0, "alice", gpu_indices=(0,))])
    (row,) = store.job_gpus(42)
    assert ("", "") == (row["gpu_uuid"], row["slot_id"])


# ---------------------------------------------------------------------- rollup


def test_rollup_groups_by_slot_and_keeps_what_the_slot_is(store: Store) -> None:
    """A MIG slice's and two shares' minutes on one GPU fold into one hourly row per slot."""
    shard_43 = GpuSlot.shared(SlotKind.SHARD, A100, 43, 0.75)
    rows = [
        *(interval(T0 + 60 * i, MIG.slot, measured=Measurement.GPM) for i in range(3)),
        *(interval(T0 + 60 * i, SHARD_42, measured=Measurement.PER_PROCESS) for i in range(2)),
        interval(T0, shard_43, job_id=43, measured=Measurement.PER_PROCESS),
        interval(T0),
    ]
    store.add_intervals(rows)
    assert (4, 7) == store.rollup_and_prune(T0 + 3600)
    hours = {h.effective_slot_id: h for h in store.hourly()}
    assert {H100, MIG.uuid, SHARD_42.slot_id, shard_43.slot_id} == set(hours)
    mig = hours[MIG.uuid]
    assert (3, H100, SlotKind.MIG, 3 / 7, "3g.40gb", Measurement.GPM) == (
        mig.interval_count, mig.gpu_uuid, mig.slot_kind, mig.share, mig.mig_profile,
        mig.measured_by)  # fmt: skip
    shard = hours[SHARD_42.slot_id]
    assert (2, 0.25, 42) == (shard.interval_count, shard.share, shard.job_id)
    assert ("", SlotKind.GPU, 1.0) == (
        hours[H100].slot_id,
        hours[H100].slot_kind,
        hours[H100].share,
    )
    assert 2 == len(store.hourly(gpu_uuid=A100))
    # A late minute of the slice merges into its hour's row, not beside it.
    store.add_intervals([interval(T0 + 180, MIG.slot, measured=Measurement.GPM)])
    store.rollup_and_prune(T0 + 3600)
    assert 4 == store.hourly(slot_id=MIG.uuid)[0].interval_count


# ---------------------------------------------------------------------- physical GPUs


def test_physical_gpu_totals_are_stored_once_per_period(store: Store) -> None:
    """gpu_physical_intervals: insert-or-ignore on (node, GPU, period), read back by GPU/time."""
    rows = [
        GpuPhysicalInterval("gpu3", H100, T0 + 60 * i, T0 + 60 * (i + 1), 60.0, 350.5,
                            21_030.0, 61.0, 0, 2**34, 2**36)
        for i in range(3)
    ]  # fmt: skip
    rows.append(GpuPhysicalInterval("gpu3", A100, T0, T0 + 60, 60.0, *[None] * 6))
    assert 4 == store.add_physical_intervals(rows)
    assert 0 == store.add_physical_intervals(rows[:2])
    assert sorted(rows, key=lambda r: (r.gpu_uuid, r.period_start)) == store.physical_intervals()
    assert rows[1:3] == store.physical_intervals(gpu_uuid=H100, since=T0 + 60)
    assert [rows[0]] == store.physical_intervals(node="gpu3", gpu_uuid=H100, until=T0 + 60)


@pytest.mark.parametrize("kind", [SlotKind.MIG, SlotKind.SHARD])
def test_the_report_gpu_rows_carry_the_slot(store: Store, kind: SlotKind) -> None:
    """The reports' summary reads give each slot's id, kind, share, profile and measurement."""
    slot = MIG.slot if kind is SlotKind.MIG else SHARD_42
    measured = Measurement.GPM if kind is SlotKind.MIG else Measurement.PER_PROCESS
    store.add_summaries([summary(slot, 42, measured)])
    (row,) = queries.summary_rows_for(
        store, [42], columns=("job_id", *queries.SLOT_SUMMARY_COLUMNS)
    )
    assert (42, slot.slot_id, kind.value, slot.share, slot.mig_profile, measured.value) == row
