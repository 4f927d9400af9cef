"""Revision 0006 on every backend: the NVML GPM figures (issue #13) in the store.

Intervals, summaries, activity and the inventory keep them; the hourly rollup folds them
exactly (time-weighted over the GPM-measured seconds only); the reports' bulk reads
return them by the models' field names; a GPU without GPM, or a row from before 0006,
reads back as not measured (0 GPM seconds, None means), never as 0%.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from slurm_gpu.models import GpuActivity, GpuDevice, GpuInterval, JobGpuSummary
from slurm_gpu.store import Store, convert, queries
from slurm_gpu.store.schema import ALL_TABLES

T0 = 1_700_000_000.0  # 13 min 20 s past an hour
H100 = "NVIDIA H100 80GB HBM3"
GPM_MEANS = (
    "sm_active_mean_percent",
    "sm_occupancy_mean_percent",
    "tensor_active_mean_percent",
    "dram_bw_mean_percent",
)


def interval(
    start: float,
    *,
    uuid: str = "GPU-h100",
    job_id: int | None = 42,
    sm: float | None = 30.25,
    gpm_seconds: float = 60.0,
    tensor: float | None = 60.5,
) -> GpuInterval:
    """A one-minute interval of an H100 (sm None: a GPU without GPM)."""
    measured = sm is not None
    return GpuInterval(
        node="gpu2", gpu_uuid=uuid, period_start=start, period_end=start + 60.0,
        job_id=job_id, util_mean_percent=90.0, util_max_percent=95.0, util_min_percent=85.0,
        util_sample_count=360, active_seconds=54.0, covered_seconds=60.0,
        mem_used_max_bytes=2**34, mem_total_bytes=2**36, power_mean_watts=400.0,
        energy_joules=24_000.0, temperature_max_celsius=60.0, ecc_errors_total=0,
        gpm_seconds=gpm_seconds if measured else 0.0,
        sm_active_mean_percent=sm,
        sm_occupancy_mean_percent=None if sm is None else sm / 2,
        tensor_active_mean_percent=tensor if measured else None,
        dram_bw_mean_percent=None if sm is None else 100.0 / 3,
    )  # fmt: skip


def summary(uuid: str = "GPU-h100", sm: float | None = 30.25, node: str = "gpu2") -> JobGpuSummary:
    """Job 42's summary of one GPU (sm None: not measured)."""
    return JobGpuSummary(
        job_id=42, node=node, gpu_uuid=uuid, gpu_model=H100, start=T0, end=T0 + 3600.0,
        gpu_seconds=3600.0, util_mean_percent=90.0, util_max_percent=97.0,
        active_seconds=3240.0, mem_max_bytes=2**34, mem_gib_seconds=57_600.0,
        energy_joules=1.44e6, reading_count=60, missing_seconds=0.0, user="alice",
        account="physics", partition="gpu",
        gpm_seconds=0.0 if sm is None else 3540.5,
        sm_active_mean_percent=sm,
        sm_occupancy_mean_percent=None if sm is None else 17.125,
        tensor_active_mean_percent=None if sm is None else 60.0625,
        dram_bw_mean_percent=None if sm is None else 0.1 + 0.2,
    )  # fmt: skip


# ---------------------------------------------------------------------- round trips


def test_gpm_figures_round_trip(store: Store) -> None:
    """Intervals and summaries keep every GPM figure bit-exactly; unmeasured stays None."""
    rows = [interval(T0), interval(T0 + 60, sm=None), interval(T0 + 120, tensor=None)]
    store.add_intervals(rows)
    assert rows == store.intervals()
    summaries = [summary(), summary("GPU-a100", sm=None, node="gpu1")]
    store.add_summaries(summaries)
    assert sorted(summaries, key=lambda s: (s.node, s.gpu_uuid)) == store.job_summaries(42)
    (unmeasured,) = [s for s in store.job_summaries(42) if s.node == "gpu1"]
    assert (0.0, None, None, None, None) == (
        unmeasured.gpm_seconds,
        *(getattr(unmeasured, name) for name in GPM_MEANS),
    )


def test_activity_keeps_sm_activity_and_last_sm_active_never_goes_back(store: Store) -> None:
    """The newest window's SM activity is replaced; last_sm_active only moves forward."""
    row = GpuActivity(
        7, "gpu2", "GPU-h", 0, T0, T0 + 60, T0 + 60, 90.0, 2**30, 1, T0, 35.5, T0 + 50
    )
    store.add_activity([row])
    assert [row] == store.activity([7])
    # A restarted agent that has not seen the SM active yet: its None does not erase it.
    newer = replace(row, last_reading=T0 + 120, sm_active_recent_percent=1.5, last_sm_active=None)
    store.add_activity([newer])
    assert [replace(newer, last_sm_active=T0 + 50)] == store.activity([7])
    later = replace(newer, last_reading=T0 + 180, last_sm_active=T0 + 170)
    store.add_activity([later])
    assert [T0 + 170] == [a.last_sm_active for a in store.activity([7])]
    a100 = GpuActivity(8, "gpu1", "GPU-a", 0, T0, T0 + 60, T0 + 60, 90.0, 2**30, 1, T0)
    store.add_activity([a100])
    assert [(None, None)] == [
        (a.sm_active_recent_percent, a.last_sm_active) for a in store.activity([8])
    ]


def test_inventory_says_which_gpus_have_gpm(store: Store) -> None:
    """gpm_supported round-trips and follows the agent's newest word."""
    a100 = GpuDevice("GPU-a", "NVIDIA A100", 0, 0, "00000000:07:00.0", 2**36)
    h100 = GpuDevice("GPU-h", H100, 1, 1, "00000000:0F:00.0", 2**36, gpm_supported=True)
    store.upsert_inventory("gpu1", [a100, h100], T0)
    assert [a100, h100] == [e.device for e in store.inventory()]
    store.upsert_inventory("gpu1", [replace(h100, gpm_supported=False)], T0 + 10)
    assert [False, False] == [e.device.gpm_supported for e in store.inventory()]


def test_row_of_an_older_writer_reads_as_not_measured(store: Store) -> None:
    """Rows inserted without the 0006 columns: 0 GPM seconds, None means, no GPM."""
    old = interval(T0, sm=None)
    values = {
        k: v
        for k, v in convert.interval_to_row(old).items()
        if k != "gpm_seconds" and k not in GPM_MEANS
    }
    with store.writing("an older agent's rows") as conn:
        conn.execute(sa.insert(sa.table("gpu_intervals", *map(sa.column, values))), values)
        device = {
            "node": "gpu1", "uuid": "GPU-a", "model": "NVIDIA A100", "minor": 0,
            "nvml_index": 0, "pci_bus_id": "00000000:07:00.0", "memory_total_bytes": None,
            "first_seen": T0, "last_seen": T0,
        }  # fmt: skip
        conn.execute(sa.insert(sa.table("gpu_inventory", *map(sa.column, device))), device)
    assert [old] == store.intervals()
    assert [False] == [e.device.gpm_supported for e in store.inventory()]
    # A mapping lacking the new keys (a caller's row from before 0006) converts too.
    assert old == convert.row_to_interval(values)


# ---------------------------------------------------------------------- rollup


def weighted(rows: list[GpuInterval], name: str) -> float | None:
    """The GPM-seconds-weighted mean of `name` over the rows that measured it."""
    pairs = [(getattr(r, name), r.gpm_seconds) for r in rows if getattr(r, name) is not None]
    seconds = sum(s for _, s in pairs)
    return sum(v * s for v, s in pairs) / seconds if seconds else None


def test_rollup_folds_gpm_exactly_and_only_over_measured_time(store: Store) -> None:
    """Hourly GPM means are the time-weighted means of what was measured, fold after fold.

    One GPU with measured minutes of unequal GPM seconds, a few unmeasured ones (GPM's
    first sample) and some without a tensor reading; an A100 with no GPM at all.
    """
    h100 = [
        interval(T0 + 60 * i, sm=float(i % 11) * 7.5, gpm_seconds=30.0 + i % 5)
        if i % 9
        else interval(T0 + 60 * i, sm=None)
        for i in range(150)
    ]
    h100 = [
        replace(r, tensor_active_mean_percent=None) if i % 4 == 0 else r for i, r in enumerate(h100)
    ]
    a100 = [interval(T0 + 60 * i, uuid="GPU-a100", sm=None) for i in range(150)]
    store.add_intervals(h100 + a100)
    cut1, cut2 = T0 + 45 * 60 + 1, T0 + 150 * 60
    store.rollup_and_prune(cut1)
    store.rollup_and_prune(cut2)  # merges into the hour cut1 left half folded
    assert [] == store.intervals()
    hours = store.hourly(gpu_uuid="GPU-h100")
    assert math.isclose(sum(h.gpm_seconds for h in hours), sum(r.gpm_seconds for r in h100))
    for name in GPM_MEANS:
        metric = name.removesuffix("_mean_percent")
        folded = sum(getattr(h, f"{metric}_weighted_sum") for h in hours) / sum(
            getattr(h, f"{metric}_gpm_seconds") for h in hours
        )
        assert folded == pytest.approx(weighted(h100, name), rel=1e-12), name
    first = [r for r in h100 if r.period_start < T0 + (3600 - T0 % 3600)]
    assert hours[0].tensor_active_mean_percent == pytest.approx(
        weighted(first, "tensor_active_mean_percent"), rel=1e-12
    )
    for hour in store.hourly(gpu_uuid="GPU-a100"):
        assert (0.0, None, None, None, None) == (
            hour.gpm_seconds,
            *(getattr(hour, name) for name in GPM_MEANS),
        )
        assert hour.util_mean_percent == pytest.approx(90.0)


# ---------------------------------------------------------------------- bulk reads


def test_report_bulk_reads_return_gpm_by_field_name(store: Store) -> None:
    """Summary rows (tuples and numpy) and running jobs' interval totals carry the GPM figures."""
    store.upsert_jobs([{"job_id": 42, "start_time": T0, "end_time": T0 + 3600.0}])
    store.add_summaries([summary(), summary("GPU-a100", sm=None, node="gpu1")])
    columns = ("job_id", "node", "gpu_uuid", *queries.GPM_SUMMARY_COLUMNS)
    assert ("gpm_seconds", *GPM_MEANS) == queries.GPM_SUMMARY_COLUMNS
    expected = [
        (42, "gpu1", "GPU-a100", 0.0, None, None, None, None),
        (42, "gpu2", "GPU-h100", 3540.5, 30.25, 17.125, 60.0625, 0.1 + 0.2),
    ]
    assert expected == queries.summary_rows_in_window(store, T0, T0 + 7200, columns=columns)
    assert expected == queries.summary_rows_for(store, [42], columns=columns)
    dtype = np.dtype([("node", "O"), *((name, "f8") for name in queries.GPM_SUMMARY_COLUMNS)])
    array = np.sort(queries.summary_array_in_window(store, T0, T0 + 7200, (42, 42), dtype))
    assert [0.0, 3540.5] == array["gpm_seconds"].tolist()
    assert np.isnan(array["sm_active_mean_percent"][0])
    assert 30.25 == array["sm_active_mean_percent"][1]

    running = [
        interval(T0 + 60 * i, job_id=43, sm=10.0 * i, gpm_seconds=20.0 + i) for i in range(4)
    ]
    running.append(interval(T0 + 240, job_id=43, sm=None))
    unmeasured = [interval(T0 + 60 * i, uuid="GPU-a100", job_id=43, sm=None) for i in range(3)]
    store.add_intervals(running + unmeasured)
    a100, h100 = queries.interval_totals_for(store, [43])
    assert (0.0, None, None, None, None) == (
        a100.gpm_seconds,
        *(getattr(a100, name) for name in GPM_MEANS),
    )
    assert h100.gpm_seconds == sum(r.gpm_seconds for r in running)
    for name in GPM_MEANS:
        assert getattr(h100, name) == pytest.approx(weighted(running, name), rel=1e-12)
    recent = queries.recent_intervals(store, T0)
    assert {"gpm_seconds", *GPM_MEANS} <= set(recent[0])


# ---------------------------------------------------------------------- migration


def _old_columns(conn: sa.Connection) -> dict[str, list[str]]:
    """Each table's columns as the database has them now (reflected)."""
    inspector = sa.inspect(conn)
    present = set(inspector.get_table_names())  # a later revision's tables are not there yet
    return {
        t.name: [c["name"] for c in inspector.get_columns(t.name)]
        for t in ALL_TABLES
        if t.name in present
    }


def _dump(conn: sa.Connection, columns: dict[str, list[str]]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, only `columns`, in key order."""
    out = {}
    for table in ALL_TABLES:
        if table.name not in columns:
            continue
        names = columns[table.name]
        # The key's columns this revision has, then the rest: one order at any revision
        # (slot_id, 0009, replaced gpu_uuid in the keys).
        keys = [c.name for c in table.primary_key.columns if c.name in names]
        order = [*keys, *(n for n in names if n not in keys)]
        query: Any = sa.select(*(sa.column(n) for n in names)).select_from(sa.table(table.name))
        out[table.name] = [
            tuple(r) for r in conn.execute(query.order_by(*(sa.column(k) for k in order)))
        ]
    return out


def _insert(
    conn: sa.Connection, table: str, columns: list[str], rows: list[dict[str, Any]]
) -> None:
    kept = [{k: v for k, v in row.items() if k in columns} for row in rows]
    conn.execute(sa.insert(sa.table(table, *map(sa.column, kept[0]))), kept)


@pytest.fixture
def store_at_0005(store_url: str) -> Iterator[Store]:
    """A store at revision 0005 holding rows of every kind the reports read."""
    old = Store(store_url, cluster="alpha")
    old.upgrade("0005")
    yield old
    old.dispose()


def test_upgrade_from_0005_keeps_every_row_and_the_reports_figures(store_at_0005: Store) -> None:
    """0005 -> 0006: no row lost, every old column identical, the bulk reads unchanged.

    The old rows read back as not measured (GPM seconds 0, means None); new rows with
    GPM figures go in beside them, and a rollup merges into a pre-0006 hourly row.
    """
    store = store_at_0005
    intervals = [interval(T0 + 60 * i, sm=None) for i in range(5)]
    summaries = [summary(sm=None), summary("GPU-a100", sm=None, node="gpu1")]
    activity = GpuActivity(42, "gpu2", "GPU-h100", 0, T0, T0 + 60, T0 + 30, 90.0, 2**30, 1, T0)
    device = GpuDevice("GPU-h100", H100, 0, 0, "00000000:07:00.0", 2**36)
    hourly = {
        "node": "gpu2", "gpu_uuid": "GPU-h100", "hour_start": T0 - T0 % 3600 - 3600,
        "job_id": 42, "interval_count": 60, "first_period_start": T0 - T0 % 3600 - 3600,
        "last_period_end": T0 - T0 % 3600, "period_seconds": 3600.0, "covered_seconds": 3600.0,
        "active_seconds": 3000.0, "util_weighted_sum": 3600.0 * 80, "util_covered_seconds": 3600.0,
        "util_max_percent": 99.0, "util_min_percent": 1.0, "util_sample_count": 21_600,
        "mem_used_max_bytes": 2**34, "mem_total_bytes": 2**36, "energy_joules": 1.0e6,
        "power_weighted_sum": 3600.0 * 300, "power_covered_seconds": 3600.0,
        "temperature_max_celsius": 70.0, "ecc_errors_total": 0,
    }  # fmt: skip
    with store.writing("rows at revision 0005") as conn:
        old_columns = _old_columns(conn)
        _insert(conn, "jobs", old_columns["jobs"],  # as 0005 has it (no sluid, 0008)
                [{"cluster": "alpha", "job_id": 42, "user": "alice", "account": "physics",
                  "partition": "gpu", "start_time": T0, "end_time": T0 + 3600.0,
                  "gpus": 2}])  # fmt: skip
        assert "gpm_seconds" not in old_columns["gpu_intervals"]
        _insert(conn, "gpu_intervals", old_columns["gpu_intervals"],
                [convert.interval_to_row(r) for r in intervals])  # fmt: skip
        _insert(conn, "job_gpu_summaries", old_columns["job_gpu_summaries"],
                [convert.summary_to_row(s, "alpha") for s in summaries])  # fmt: skip
        _insert(conn, "gpu_activity", old_columns["gpu_activity"],
                [convert.activity_to_row(activity, "alpha")])  # fmt: skip
        _insert(conn, "gpu_inventory", old_columns["gpu_inventory"],
                [convert.device_to_row("gpu2", device, T0)])  # fmt: skip
        _insert(conn, "gpu_intervals_hourly", old_columns["gpu_intervals_hourly"], [hourly])
    # sluid: 0008, suspended_seconds: 0016
    old_jobs = [c for c in queries.JOB_ROW_COLUMNS if c not in ("sluid", "suspended_seconds")]
    jobs_before = queries.job_rows_in_window(store, T0, T0 + 7200, columns=old_jobs)
    summary_rows_before = queries.summary_rows_in_window(store, T0, T0 + 7200)
    with store.reading("rows before") as conn:
        before = _dump(conn, old_columns)

    store.upgrade("0006")
    assert "0006" == store.current_revision()
    with store.reading("rows after") as conn:
        assert before == _dump(conn, old_columns)
    assert jobs_before == queries.job_rows_in_window(store, T0, T0 + 7200, columns=old_jobs)
    assert summary_rows_before == queries.summary_rows_in_window(store, T0, T0 + 7200)
    store.upgrade()  # on to head: the read API reads the newest revision's columns
    assert intervals == store.intervals()
    assert sorted(summaries, key=lambda s: (s.node, s.gpu_uuid)) == store.job_summaries(42)
    assert [activity] == store.activity([42])
    assert [device] == [e.device for e in store.inventory()]
    (old_hour,) = store.hourly()
    assert (80.0, 0.0, None) == (
        old_hour.util_mean_percent,
        old_hour.gpm_seconds,
        old_hour.sm_active_mean_percent,
    )
    (totals,) = queries.interval_totals_for(store, [42])
    assert (5, 0.0, None) == (
        totals.interval_count,
        totals.gpm_seconds,
        totals.sm_active_mean_percent,
    )

    # After the upgrade: measured rows beside the old ones, folded with them exactly.
    hour = T0 - T0 % 3600 - 3600
    store.add_intervals([interval(hour + 60 * i, sm=40.0) for i in range(3)])
    store.rollup_and_prune(T0)
    merged = next(h for h in store.hourly() if h.hour_start == hour)
    assert (63, 180.0, 40.0) == (
        merged.interval_count,
        merged.gpm_seconds,
        merged.sm_active_mean_percent,
    )
    assert merged.util_weighted_sum == pytest.approx(3600.0 * 80 + 3 * 60 * 90.0)
