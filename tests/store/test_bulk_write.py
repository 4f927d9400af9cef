"""Store.write_batches (store/ingest.py): the one writer of both ship modes.

On SQLite, PostgreSQL (COPY into a temporary table) and MariaDB (multi-row INSERT IGNORE):
the same batches written one kind at a time (the store's single-kind methods), one batch a
transaction (the direct shipper) and as one group (the collector) leave every table
identical, the usage rollups included; a group written twice lands once; a batch that
fails leaves nothing of itself.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from slurm_gpu.collector.service import collector_store
from slurm_gpu.config import read_config
from slurm_gpu.errors import StoreError
from slurm_gpu.models import (
    GpuActivity,
    GpuDevice,
    GpuInterval,
    GpuPhysicalInterval,
    JobEvent,
    JobEventKind,
    JobGpuSummary,
    LostGpu,
    NodeHeartbeat,
)
from slurm_gpu.node.shipper import DecodedBatch
from slurm_gpu.store import Store
from slurm_gpu.store.schema import ALL_TABLES, job_usage
from tests.store.conftest import PG_URL, _server_database

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z: a job of two hours spans midnight UTC
GPUS = 8
MODEL = "NVIDIA H100 80GB HBM3"


def uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def started(node: str, job_id: int, user: str, t: float = T0) -> JobEvent:
    return JobEvent(
        node=node, job_id=job_id, kind=JobEventKind.STARTED, time=t, user=user, uid=1001,
        account="physics", partition="gpu", gpu_indices=tuple(range(GPUS)),
    )  # fmt: skip


def ended(node: str, job_id: int, t: float = T0 + 7200) -> JobEvent:
    return JobEvent(node=node, job_id=job_id, kind=JobEventKind.ENDED, time=t, exit_code=0)


def interval(node: str, index: int, start: float, job_id: int) -> GpuInterval:
    return GpuInterval(
        node, uuid(node, index), start, start + 60, job_id, 37.5 + index, 90.25, 3.5, 60,
        22.5, 59.5, 2**34 + index, 2**36, 301.5, 18090.0, 61.0, 0, (),
    )  # fmt: skip


def physical(node: str, index: int, start: float) -> GpuPhysicalInterval:
    return GpuPhysicalInterval(
        node, uuid(node, index), start, start + 60, 59.5, 301.5, 18090.0, 61.0, 0, 2**34, 2**36
    )


def activity(node: str, job_id: int, index: int, at: float) -> GpuActivity:
    return GpuActivity(
        job_id=job_id, node=node, gpu_uuid=uuid(node, index), slurm_index=index, start=T0,
        last_reading=at, last_active=at - 5, util_recent_percent=41.5, mem_used_bytes=2**33,
        process_count=1, measured_since=T0,
    )  # fmt: skip


def summary(node: str, job_id: int, index: int, user: str) -> JobGpuSummary:
    return JobGpuSummary(
        job_id=job_id, node=node, gpu_uuid=uuid(node, index), gpu_model=MODEL,
        start=T0, end=T0 + 7200, gpu_seconds=7200.0, util_mean_percent=40.25 + index,
        util_max_percent=99.5, active_seconds=2900.5, mem_max_bytes=2**34,
        mem_gib_seconds=115200.0, energy_joules=2.1e6, reading_count=120,
        missing_seconds=12.0, user=user, account="physics", partition="gpu",
    )  # fmt: skip


def devices(node: str) -> list[GpuDevice]:
    return [
        GpuDevice(uuid(node, i), MODEL, i, i, f"00000000:{i:02X}:00.0", 2**36) for i in range(GPUS)
    ]


def minutes(node: str, job_id: int, first: int, count: int) -> DecodedBatch:
    """Every GPU of `node` for `count` minutes, and the heartbeat of the last one."""
    starts = [T0 + 60 * m for m in range(first, first + count)]
    slots = tuple(uuid(node, i) for i in range(GPUS))
    return DecodedBatch(
        intervals=[interval(node, i, s, job_id) for s in starts for i in range(GPUS)],
        physical=[physical(node, i, s) for s in starts for i in range(GPUS)],
        heartbeats=[NodeHeartbeat(node, starts[-1] + 60, slots)],
    )


def batches() -> list[tuple[str, DecodedBatch]]:
    """Job 42 on gpu1 and gpu2 (alice), job 43 on gpu2 (bob): start, run, end, summaries.

    The events of a job and its summaries come in different batches, and in one batch
    (gpu1's last: its epilog's event and its summaries).
    """
    first = minutes("gpu1", 42, 0, 3)
    first.events = [started("gpu1", 42, "alice")]
    first.inventory = [(devices("gpu1"), T0, [LostGpu(uuid("gpu1", 7), 7, T0, "GPU is lost")])]
    first.activity = [activity("gpu1", 42, i, T0 + 180) for i in range(GPUS)]
    second = minutes("gpu2", 42, 0, 3)
    second.events = [started("gpu2", 42, "alice"), started("gpu2", 43, "bob", T0 + 60)]
    second.inventory = [(devices("gpu2"), T0, [])]
    second.activity = [activity("gpu2", 42, i, T0 + 180) for i in range(GPUS)]
    last_gpu1 = minutes("gpu1", 42, 3, 2)
    last_gpu1.events = [ended("gpu1", 42)]
    last_gpu1.summaries = [summary("gpu1", 42, i, "alice") for i in range(GPUS)]
    last_gpu2 = minutes("gpu2", 43, 3, 2)
    last_gpu2.events = [ended("gpu2", 42), ended("gpu2", 43, T0 + 3600)]
    last_gpu2.activity = [activity("gpu2", 43, i, T0 + 300) for i in range(GPUS)]
    last_gpu2.summaries = [summary("gpu2", 42, i, "alice") for i in range(GPUS)]
    return [("gpu1", first), ("gpu2", second), ("gpu1", last_gpu1), ("gpu2", last_gpu2)]


def contents(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, sorted: what two ways of writing must leave alike."""
    with store.reading("reading every table") as conn:
        return {
            t.name: sorted((tuple(r) for r in conn.execute(sa.select(t))), key=repr)
            for t in ALL_TABLES
        }


def empty(store: Store) -> None:
    with store.writing("emptying every table") as conn:
        for table in ALL_TABLES:
            conn.execute(sa.delete(table))


def write_per_kind(store: Store, node: str, batch: DecodedBatch) -> None:
    """The batch one kind a transaction, through the store's single-kind methods."""
    store.add_events(batch.events)
    for devices_seen, seen_at, lost in batch.inventory:
        store.upsert_inventory(node, devices_seen, seen_at)
        if lost is not None:
            store.set_lost_gpus(node, lost)
    store.add_activity(batch.activity)
    store.add_intervals(batch.intervals)
    store.add_physical_intervals(batch.physical)
    if batch.summaries:
        store.add_summaries(batch.summaries)
        store.forget_activity(sorted({s.job_id for s in batch.summaries}), node)
    store.add_heartbeats(batch.heartbeats)


def test_group_stores_what_per_kind_writes_store(store: Store) -> None:
    """Per kind (a transaction each) and in one group: every table alike, rollups included."""
    for node, batch in batches():
        write_per_kind(store, node, batch)
    per_kind = contents(store)
    empty(store)
    written = store.write_batches(batches())
    grouped = contents(store)
    assert per_kind == grouped
    # Not vacuous: every kind landed, and the finished jobs were folded.
    expected = {
        "jobs": 2,
        "job_gpus": 24,
        "job_events": 6,
        "gpu_intervals": 80,
        "gpu_physical_intervals": 80,
        "gpu_inventory": 16,
        "gpu_activity": 8,  # job 43's; job 42's is forgotten once summarized
        "job_gpu_summaries": 16,
        "job_usage": 2,  # job 42 on each node; job 43 has no summary yet
        "usage_daily": 4,  # job 42 spans midnight UTC: two days on each node
        "node_heartbeats": 2,  # each node's newest
    }
    assert expected == {name: len(grouped[name]) for name in expected}
    # new events, intervals, physical intervals; activity rows, summaries upserted; nodes
    # whose heartbeat was offered
    assert 6 + 80 + 80 + 24 + 16 + 2 == written


def test_one_batch_a_transaction_stores_what_the_group_stores(store: Store) -> None:
    """The direct shipper's writes (a batch at a time) leave every table as the group's."""
    for node, batch in batches():
        store.write_batches([(node, batch)])
    alone = contents(store)
    empty(store)
    store.write_batches(batches())
    assert alone == contents(store)


def test_a_failing_batch_leaves_nothing_of_itself(store: Store) -> None:
    """A batch whose summary breaks NOT NULL fails whole: its event is not stored either."""
    node, batch = batches()[2]  # gpu1's last: job 42's end, its summaries, intervals
    broken = dataclasses.replace(batch.summaries[0], gpu_seconds=None)  # type: ignore[arg-type]
    batch.summaries.append(broken)
    with pytest.raises(StoreError):
        store.write_batches([(node, batch)])
    assert not any(contents(store).values())


def test_event_and_its_summary_in_one_group_are_folded(store: Store) -> None:
    """The prolog's event, the epilog's and the summaries in one group: the job is folded."""
    store.write_batches(batches())
    j = store.job(42)
    assert j is not None
    with store.reading("reading job_usage") as conn:
        u = job_usage.c
        usage = [tuple(r) for r in conn.execute(sa.select(u.node, u.user, u.gpu_seconds))]
    assert ((T0, T0 + 7200), sorted(usage)) == (
        (j["start_time"], j["end_time"]),
        [("gpu1", "alice", 8 * 7200.0), ("gpu2", "alice", 8 * 7200.0)],
    )


def test_group_written_twice_lands_once(store: Store) -> None:
    """The same group again, and a batch twice within one group: nothing stored twice."""
    store.write_batches(batches())
    once = contents(store)
    again = batches()
    store.write_batches(again[:1] + again)
    assert once == contents(store)
    assert 80 == len(store.intervals())


def test_group_of_two_nodes_keeps_each_nodes_rows_apart(store: Store) -> None:
    """Inventory, lost GPUs and intervals land under the node whose batch held them."""
    store.write_batches(batches()[:2])
    lost = {(e.node, e.device.uuid) for e in store.inventory() if e.lost_since is not None}
    assert (
        {("gpu1", uuid("gpu1", 7))},
        [8, 8],
        [24, 24],
    ) == (
        lost,
        [len(store.inventory(node)) for node in ("gpu1", "gpu2")],
        [len(store.intervals(node=node)) for node in ("gpu1", "gpu2")],
    )


def test_empty_group_writes_nothing(store: Store) -> None:
    """No batches: no transaction, 0 rows."""
    assert 0 == store.write_batches([])
    assert not any(contents(store).values())


# ---------------------------------------------------------------------------- the pool


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from _server_database(PG_URL, "SLURM_GPU_TEST_PG_URL")


@pytest.mark.db
def test_collector_store_opens_at_most_pool_size_connections(pg_url: str, tmp_path: Path) -> None:
    """12 writers at once through the collector's store of pool_size 2: PostgreSQL sees 2."""
    conf = tmp_path / "slurm-gpu.toml"
    conf.write_text(f'[store]\nurl = "{pg_url}"\n[collector]\npool_size = 2\n')
    store = collector_store(read_config(conf))
    store.upgrade()
    database = sa.make_url(pg_url).database
    watcher = sa.create_engine(pg_url, poolclass=sa.pool.NullPool)
    counts: list[int] = []
    done = threading.Event()

    def watch() -> None:
        with watcher.connect() as conn:
            while not done.is_set():
                counts.append(
                    conn.execute(
                        sa.text(
                            "SELECT count(*) FROM pg_stat_activity"
                            " WHERE datname = :db AND pid <> pg_backend_pid()"
                        ),
                        {"db": database},
                    ).scalar_one()
                )
                conn.rollback()

    def write(node: str) -> None:
        for first in range(0, 30, 3):
            store.write_batches([(node, minutes(node, 7, first, 3))])

    watching = threading.Thread(target=watch)
    watching.start()
    writers = [threading.Thread(target=write, args=(f"gpu{n}",)) for n in range(12)]
    try:
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join(120)
        stored = len(store.intervals())
    finally:
        done.set()
        watching.join(10)
        store.dispose()
        watcher.dispose()
    assert (12 * 30 * GPUS, True) == (stored, 1 <= max(counts) <= 2), max(counts)
