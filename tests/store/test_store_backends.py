"""The accounting store on real SQLite, PostgreSQL and MariaDB: one suite, three backends.

Each test gets a fresh, empty database (see conftest.py).
"""

from __future__ import annotations

import math
import socket

import numpy as np
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner

from slurm_gpu.cli.db import db
from slurm_gpu.errors import StoreError
from slurm_gpu.models import GpuDevice, GpuInterval, JobEvent, JobEventKind, JobGpuSummary
from slurm_gpu.store import Store, queries
from slurm_gpu.store.schema import ALL_TABLES, metadata

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z, 13 min 20 s past an hour


def interval(
    start: float,
    *,
    node: str = "gpu1",
    uuid: str = "GPU-0000",
    job_id: int | None = 42,
    util: float | None = 37.5,
    seconds: float = 60.0,
    pids: tuple[int, ...] = (),
) -> GpuInterval:
    """A one-minute interval with distinct, non-round values in every field."""
    return GpuInterval(
        node=node,
        gpu_uuid=uuid,
        period_start=start,
        period_end=start + seconds,
        job_id=job_id,
        util_mean_percent=util,
        util_max_percent=None if util is None else min(100.0, util + 20.25),
        util_min_percent=None if util is None else util / 3,
        util_sample_count=0 if util is None else 360,
        active_seconds=0.0 if util is None else seconds * util / 100,
        covered_seconds=seconds * 0.9,
        mem_used_max_bytes=21_474_836_480 + int(start) % 1000,
        mem_total_bytes=85_899_345_920,
        power_mean_watts=None if util is None else 87.3 + util,
        energy_joules=None if util is None else (87.3 + util) * seconds,
        temperature_max_celsius=61.0,
        ecc_errors_total=3,
        unallocated_pids=pids,
    )


def minutes(n: int, start: float = T0, **kwargs: object) -> list[GpuInterval]:
    """n consecutive one-minute intervals from start."""
    return [interval(start + 60 * i, **kwargs) for i in range(n)]  # type: ignore[arg-type]


def closed_port() -> int:
    """A loopback TCP port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------- schema


def test_db_upgrade_creates_schema_and_is_idempotent(store_url: str) -> None:
    """`slurm-gpu db upgrade` on an empty database creates every table; a rerun changes nothing."""
    runner = CliRunner()
    first = runner.invoke(db, ["upgrade", "--url", store_url])
    second = runner.invoke(db, ["upgrade", "--url", store_url])
    current = runner.invoke(db, ["current", "--url", store_url])
    assert (first.exit_code, second.exit_code, current.exit_code) == (0, 0, 0), (
        first.output + second.output + current.output
    )
    assert f"schema upgraded (empty) -> {Store.head_revision()}" in first.output
    assert f"schema already at {Store.head_revision()}" in second.output
    assert "up to date" in current.output
    store = Store(store_url)
    try:
        assert Store.head_revision() == store.current_revision()
        tables = set(sa.inspect(store.engine).get_table_names())
    finally:
        store.dispose()
    assert {t.name for t in ALL_TABLES} <= tables


def test_migration_matches_schema_module(store: Store) -> None:
    """The first migration creates exactly the tables, columns and indexes of schema.py."""
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = [
            d
            for d in compare_metadata(context, metadata)
            if not (d[0] == "remove_table" and d[1].name == "slurm_gpu_alembic_version")
        ]
    assert diff == []


# ---------------------------------------------------------------------- intervals


def test_intervals_round_trip_exactly(store: Store) -> None:
    """Every field of a GpuInterval, floats to the last bit, nulls and pids, comes back equal."""
    rows = [
        interval(T0 + 0.123456789, pids=(1234, 99_999)),
        interval(T0 + 60.1 + 0.2, util=None, job_id=None),
        interval(1e-3, node="n" * 128, uuid="GPU-" + "f" * 92, util=100.0 / 3),
    ]
    store.add_intervals(rows)
    assert sorted(rows, key=lambda r: (r.node, r.gpu_uuid, r.period_start)) == store.intervals()


def test_same_batch_twice_is_stored_once(store: Store) -> None:
    """Re-shipping a batch inserts nothing: the store holds each interval once."""
    batch = minutes(50)
    assert store.add_intervals(batch) == 50
    assert store.add_intervals(batch) == 0
    assert batch == store.intervals()


def test_half_old_half_new_batch_stores_only_new(store: Store) -> None:
    """A batch overlapping what is stored adds only the rows not yet stored."""
    old, new = minutes(20), minutes(20, start=T0 + 20 * 60)
    store.add_intervals(old)
    assert store.add_intervals(old[10:] + new[:10]) == 10
    assert old + new[:10] == store.intervals()


def test_interval_filters(store: Store) -> None:
    """intervals() filters by node, GPU, job and the overlap with [since, until)."""
    a = minutes(3, node="gpu1", job_id=1)
    b = minutes(3, node="gpu2", uuid="GPU-1111", job_id=2)
    store.add_intervals(a + b)
    assert b == store.intervals(node="gpu2")
    assert a == store.intervals(job_id=1)
    assert [b[1]] == store.intervals(gpu_uuid="GPU-1111", since=T0 + 60.5, until=T0 + 119)


# ---------------------------------------------------------------------- jobs


def started(node: str = "gpu1", t: float = T0, gpus: tuple[int, ...] = (0, 1)) -> JobEvent:
    """The prolog event of job 42 on node."""
    return JobEvent(
        node=node, job_id=42, kind=JobEventKind.STARTED, time=t, user="alice", uid=1001,
        account="physics", partition="gpu", gpu_indices=gpus, array_job_id=40, array_task_id=2,
    )  # fmt: skip


def ended(node: str = "gpu1", t: float = T0 + 3600, exit_code: int = 0) -> JobEvent:
    """The epilog event of job 42 on node."""
    return JobEvent(node=node, job_id=42, kind=JobEventKind.ENDED, time=t, exit_code=exit_code)


def test_started_then_ended_fills_the_job(store: Store) -> None:
    """A prolog event creates the jobs row; the epilog event completes it."""
    assert store.add_events([started()]) == 1
    running = store.job(42)
    assert running is not None
    assert (
        running["user"], running["uid"], running["account"], running["partition"],
        running["start_time"], running["end_time"], running["state"], running["gpus"],
        running["array_job_id"], running["array_task_id"],
    ) == ("alice", 1001, "physics", "gpu", T0, None, "RUNNING", 2, 40, 2)  # fmt: skip
    store.add_events([ended(exit_code=1)])
    done = store.job(42)
    assert done is not None
    assert (
        done["start_time"], done["end_time"], done["exit_code"], done["state"], done["user"]
    ) == (T0, T0 + 3600, 1, "FAILED", "alice")  # fmt: skip


def test_ended_first_then_started_gives_the_same_job(store: Store, store_url: str) -> None:
    """Events arriving out of order, and twice, give the same row as in order."""
    store.add_events([ended(), ended("gpu2", T0 + 3601)])
    store.add_events([started("gpu2", T0 + 1, (3,)), started()])
    assert store.add_events([started(), ended()]) == 0
    job = store.job(42)
    assert job is not None
    expected = ("alice", T0, T0 + 3601, 0, "COMPLETED", "gpu1,gpu2", 3, "alpha")
    assert expected == (
        job["user"], job["start_time"], job["end_time"], job["exit_code"], job["state"],
        job["nodes"], job["gpus"], job["cluster"],
    )  # fmt: skip
    gpus = [(g["node"], g["slurm_index"], g["start"], g["end"]) for g in store.job_gpus(42)]
    assert gpus == [
        ("gpu1", 0, T0, T0 + 3600),
        ("gpu1", 1, T0, T0 + 3600),
        ("gpu2", 3, T0 + 1, T0 + 3601),
    ]
    other = Store(store_url, cluster="beta")
    try:
        assert other.job(42) is None
    finally:
        other.dispose()


def test_upsert_jobs_merges_non_null_fields(store: Store) -> None:
    """Facts from Slurm fill and override fields; nulls and empty strings never erase them."""
    store.add_events([started()])
    store.upsert_jobs([{"job_id": 42, "job_name": "train", "state": "CANCELLED", "user": ""}])
    job = store.job(42)
    assert job is not None
    assert (job["job_name"], job["state"], job["user"]) == ("train", "CANCELLED", "alice")
    store.add_events([ended()])
    job = store.job(42)
    assert job is not None
    assert job["state"] == "CANCELLED"


# ---------------------------------------------------------------------- summaries, inventory


def summary(util: float, node: str = "gpu1") -> JobGpuSummary:
    """A summary of job 42 on one GPU."""
    return JobGpuSummary(
        job_id=42, node=node, gpu_uuid="GPU-0000", gpu_model="NVIDIA A100-SXM4-80GB",
        start=T0, end=T0 + 3600.5, gpu_seconds=3600.5, util_mean_percent=util,
        util_max_percent=99.5, active_seconds=1800.25, mem_max_bytes=None,
        mem_gib_seconds=12.5, energy_joules=None, reading_count=60, missing_seconds=0.5,
        user="alice", account="physics", partition="gpu",
    )  # fmt: skip


def test_summaries_upsert_by_key(store: Store) -> None:
    """A summary sent again with new figures replaces the stored one (one row per key)."""
    store.add_summaries([summary(10.0), summary(20.0, node="gpu2")])
    store.add_summaries([summary(55.5)])
    assert [summary(55.5), summary(20.0, node="gpu2")] == store.job_summaries(42)
    assert store.job_summaries(43) == []


def test_inventory_keeps_first_seen_and_latest_last_seen(store: Store) -> None:
    """Inventory upserts keep the first sighting and the latest, whatever the order."""
    a = GpuDevice("GPU-a", "NVIDIA A100", 0, 0, "00000000:07:00.0", 85_899_345_920)
    b = GpuDevice("GPU-b", "NVIDIA A100", 1, 1, "00000000:0F:00.0", None)
    store.upsert_inventory("gpu1", [a, b], T0 + 100)
    store.upsert_inventory("gpu1", [a], T0 + 200)
    store.upsert_inventory("gpu1", [a], T0)  # a late, older report
    got = [(e.node, e.device, e.first_seen, e.last_seen) for e in store.inventory()]
    assert [("gpu1", a, T0, T0 + 200), ("gpu1", b, T0 + 100, T0 + 100)] == got


def test_report_bulk_reads_give_the_stored_values(store: Store) -> None:
    """The reports' bulk reads give the stored values.

    Binary rows on psycopg; NULL as None in a tuple, NaN in a numpy number field.
    """
    store.upsert_jobs(
        [
            {"job_id": 42, "user": "alice", "account": "physics", "partition": "gpu",
             "submit_time": T0 - 60.25, "start_time": T0, "end_time": T0 + 3600.5, "gpus": 2},
            {"job_id": 43, "account": "bio", "start_time": T0, "end_time": T0 + 10.0},
        ]
    )  # fmt: skip
    store.add_summaries([summary(37.25, node="gpu2"), summary(12.125)])
    job_columns = ("job_id", "user", "account", "partition", "submit_time", "end_time", "gpus")
    jobs = queries.job_rows_in_window(store, T0, T0 + 7200, columns=job_columns)
    assert [
        (42, "alice", "physics", "gpu", T0 - 60.25, T0 + 3600.5, 2),
        (43, None, "bio", None, None, T0 + 10.0, None),
    ] == jobs
    columns = ("job_id", "node", "gpu_model", "gpu_seconds", "util_mean_percent", "mem_max_bytes")
    rows = queries.summary_rows_in_window(store, T0, T0 + 7200, columns=columns, ordered=False)
    model = "NVIDIA A100-SXM4-80GB"
    assert [
        (42, "gpu1", model, 3600.5, 12.125, None),
        (42, "gpu2", model, 3600.5, 37.25, None),
    ] == sorted(rows)

    dtype = np.dtype([("job_id", "i8"), ("node", "O"), ("mem_max_bytes", "f8")])
    array = queries.summary_array_in_window(store, T0, T0 + 7200, (42, 43), dtype)
    assert [(42, "gpu1"), (42, "gpu2")] == sorted((int(j), n) for j, n, _ in array.tolist())
    assert np.isnan(array["mem_max_bytes"]).all()
    assert {"gpu1": 1, "gpu2": 1} == queries.gpus_used_on(
        store, ["gpu1", "gpu2", "gpu9"], T0, T0 + 7200
    )
    a = GpuDevice("GPU-a", "NVIDIA A100", 0, 0, "00000000:07:00.0", None)
    b = GpuDevice("GPU-b", "NVIDIA A100", 1, 1, "00000000:0F:00.0", None)
    store.upsert_inventory("gpu1", [a, b], T0)
    store.upsert_inventory("gpu2", [a], T0)
    assert {"gpu1": 2, "gpu2": 1} == queries.gpus_per_node(store)


# ---------------------------------------------------------------------- rollup


def totals(rows: list[GpuInterval]) -> dict[str, float]:
    """What a rollup must preserve, computed from intervals."""
    pairs = [(r.util_mean_percent, r.covered_seconds) for r in rows]
    util = [(mean, seconds) for mean, seconds in pairs if mean is not None]
    return {
        "gpu_seconds": sum(r.period_end - r.period_start for r in rows),
        "covered": sum(r.covered_seconds for r in rows),
        "active": sum(r.active_seconds for r in rows),
        "energy": sum(r.energy_joules or 0.0 for r in rows),
        "util": sum(mean * seconds for mean, seconds in util) / sum(s for _, s in util),
        "count": len(rows),
    }


def test_rollup_preserves_totals_and_means_and_is_idempotent(store: Store) -> None:
    """Folding into hours keeps GPU-seconds, active seconds, energy and the weighted mean util.

    Folding twice at the same cutoff changes nothing; a later cutoff merges into the hours
    already written.
    """
    rows = (
        minutes(150, util=80.0)
        + minutes(150, uuid="GPU-1111", job_id=None, util=None)
        + [interval(T0 + 60 * i, uuid="GPU-2222", util=float(i % 7) * 9.5) for i in range(150)]
    )
    store.add_intervals(rows)
    cut1, cut2 = T0 + 45 * 60 + 1, T0 + 130 * 60
    written, deleted = store.rollup_and_prune(cut1)
    assert deleted == 3 * 46 and written > 0
    before = store.hourly()
    assert store.rollup_and_prune(cut1) == (0, 0)
    assert before == store.hourly()
    store.rollup_and_prune(cut2)
    folded = [r for r in rows if r.period_start < cut2]
    assert sorted(set(rows) - set(folded), key=lambda r: (r.gpu_uuid, r.period_start)) == (
        store.intervals()
    )
    hours = store.hourly()
    expected = totals(folded)
    with_util = [h for h in hours if h.util_covered_seconds > 0]
    actual = {
        "gpu_seconds": sum(h.period_seconds for h in hours),
        "covered": sum(h.covered_seconds for h in hours),
        "active": sum(h.active_seconds for h in hours),
        "energy": sum(h.energy_joules or 0.0 for h in hours),
        "util": sum(h.util_weighted_sum for h in with_util)
        / sum(h.util_covered_seconds for h in with_util),
        "count": sum(h.interval_count for h in hours),
    }
    assert expected == pytest.approx(actual, rel=1e-12)
    job_hours = [h for h in hours if h.gpu_uuid == "GPU-0000"]
    assert all(h.job_id == 42 and h.util_mean_percent == pytest.approx(80.0) for h in job_hours)
    assert all(h.hour_start % 3600 == 0 for h in hours)
    unattributed = [h for h in hours if h.gpu_uuid == "GPU-1111"]
    assert all(h.job_id is None and h.util_mean_percent is None for h in unattributed)
    assert math.isclose(
        sum(h.period_seconds for h in store.hourly(job_id=42)),
        sum(r.period_end - r.period_start for r in folded if r.job_id == 42),
    )


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize("backend", ["postgresql+psycopg", "mysql+pymysql"])
def test_unreachable_server_raises_store_error_without_password(backend: str) -> None:
    """A server nobody listens on gives a StoreError naming it, never the password."""
    url = f"{backend}://slurmgpu:Sup3rSecret@127.0.0.1:{closed_port()}/slurm_gpu"
    store = Store(url)
    with pytest.raises(StoreError) as caught:
        store.ping()
    store.dispose()
    message = str(caught.value)
    assert "Sup3rSecret" not in message
    assert "127.0.0.1" in message and "slurm_gpu" in message and "ping" in message


def test_unopenable_sqlite_file_raises_store_error(tmp_path: object) -> None:
    """A SQLite path that cannot be created gives a StoreError, not a traceback."""
    with pytest.raises(StoreError, match="/proc/"):
        Store("sqlite:////proc/no-such/dir/store.db").upgrade()


def test_db_prune_folds_old_readings_into_hourly_rows(store_url: str) -> None:
    """`slurm-gpu db prune --older-than 0` rolls every reading up and deletes it."""
    from click.testing import CliRunner

    from slurm_gpu.cli.main import cli
    from slurm_gpu.models import GpuInterval

    store = Store(store_url)
    store.upgrade()
    rows = [
        GpuInterval(
            "n1",
            "U",
            3600.0 + 60 * k,
            3660.0 + 60 * k,
            7,
            50.0,
            60.0,
            40.0,
            60,
            30.0,
            60.0,
            None,
            None,
            None,
            10.0,
            None,
            None,
        )
        for k in range(3)
    ]
    store.add_intervals(rows)
    result = CliRunner().invoke(cli, ["db", "prune", "--url", store_url, "--older-than", "0"])
    assert (0, "3 readings folded into 1 hourly rows") == (
        result.exit_code,
        result.output.strip().split(": ", 1)[1],
    )
    assert [] == store.intervals()
    (hour,) = store.hourly()
    assert (180.0, 90.0) == (hour.covered_seconds, hour.active_seconds)
