"""bench/collector-write: Store.write_batches (group commit) against a transaction per kind.

The same node batches (each one minute of a node of 8 GPUs: 8 intervals, 8 physical
intervals, 8 activity rows) are written into two fresh stores of each backend: one batch
at a time through the store's single-kind methods (a transaction per kind, as the direct
shipper and the collector wrote before group commit), and in groups of `--group-size`
batches through `Store.write_batches` (one transaction a group; COPY on PostgreSQL).
Prints rows/s of each and their ratio; the two stores' row counts are checked equal
afterwards.

The last line: `collector-write: ratio=<min over backends> goal=1.5 ok|short`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

import sqlalchemy as sa

from slurm_gpu.models import GpuActivity, GpuInterval, GpuPhysicalInterval
from slurm_gpu.node.shipper import DecodedBatch
from slurm_gpu.store import Store

GOAL = 1.5
GPUS = 8
T0 = 1_700_000_000.0
PG_URL = os.environ.get(
    "SLURM_GPU_TEST_PG_URL",
    "postgresql+psycopg://slurmgpu:slurmgpu-testbed@127.0.0.1:15432/slurm_gpu",
)

Batches = list[tuple[str, DecodedBatch]]


def node_minute(node: int, minute: int) -> tuple[str, DecodedBatch]:
    """One minute of node `node`: what its agent ships per tick (8 GPUs, one job)."""
    name = f"gpu{node:05d}"
    start = T0 + 60 * minute
    job = 1000 + node
    batch = DecodedBatch()
    for i in range(GPUS):
        gpu = f"GPU-{node:08x}-{i:04x}-0000-0000-000000000000"
        interval = GpuInterval(
            name, gpu, start, start + 60, job, 37.5 + i, 99.0, 1.0, 60, 42.5, 60.0,
            21_474_836_480, 85_899_345_920, 250.5, 15030.0, 65.0, 0, (),
        )  # fmt: skip
        physical = GpuPhysicalInterval(
            name, gpu, start, start + 60, 60.0, 250.5, 15030.0, 65.0, 0,
            21_474_836_480, 85_899_345_920,
        )  # fmt: skip
        activity = GpuActivity(
            job_id=job, node=name, gpu_uuid=gpu, slurm_index=i, start=T0,
            last_reading=start + 60, last_active=start + 55, util_recent_percent=41.5,
            mem_used_bytes=2**33, process_count=1, measured_since=T0,
        )  # fmt: skip
        batch.intervals.append(interval)
        batch.physical.append(physical)
        batch.activity.append(activity)
    return name, batch


def rows_of(batches: Batches) -> int:
    """Rows in these batches."""
    return sum(len(b.intervals) + len(b.physical) + len(b.activity) for _, b in batches)


def write_per_kind(store: Store, batch: DecodedBatch) -> None:
    """The kinds these batches carry, a transaction each (the shipper's order)."""
    store.add_activity(batch.activity)
    store.add_intervals(batch.intervals)
    store.add_physical_intervals(batch.physical)


def per_kind(store: Store, groups: Sequence[Batches]) -> float:
    """Seconds to write every batch alone, one transaction per kind."""
    began = time.perf_counter()
    for group in groups:
        for _node, batch in group:
            write_per_kind(store, batch)
    return time.perf_counter() - began


def grouped(store: Store, groups: Sequence[Batches]) -> float:
    """Seconds to write each group in one transaction (Store.write_batches)."""
    began = time.perf_counter()
    for group in groups:
        store.write_batches(group)
    return time.perf_counter() - began


def contents(store: Store) -> list[int]:
    """Rows of the tables written, to check both ways stored as many."""
    with store.reading("counting rows") as conn:
        return [
            int(conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one())
            for t in ("gpu_intervals", "gpu_physical_intervals", "gpu_activity")
        ]


def measure(name: str, urls: tuple[str, str], groups: Sequence[Batches]) -> float:
    """Prints both rates on `name`; returns grouped / per kind."""
    stores = [Store(url, cluster="bench") for url in urls]
    for store in stores:
        store.upgrade()
    try:
        # Interleaved halves, so a warming cache or a busy moment favours neither way.
        half = len(groups) // 2
        slow = per_kind(stores[0], groups[:half]) + per_kind(stores[0], groups[half:])
        fast = grouped(stores[1], groups[:half]) + grouped(stores[1], groups[half:])
        alike = contents(stores[0]) == contents(stores[1])
    finally:
        for store in stores:
            store.dispose()
    rows = sum(rows_of(g) for g in groups)
    ratio = slow / fast
    print(
        f"{name}: {len(groups)} groups of {len(groups[0])} node batches ({rows} rows): "
        f"per kind {rows / slow:,.0f} rows/s, grouped {rows / fast:,.0f} rows/s, "
        f"ratio {ratio:.2f}; stores alike: {alike}"
    )
    if not alike:
        raise SystemExit(f"{name}: the two ways stored different rows")
    return ratio


def server_databases(admin_url: str) -> tuple[sa.Engine, tuple[str, str]]:
    """Two fresh databases on the server; the admin engine and their URLs."""
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    names = [f"slurm_gpu_test_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    with engine.connect() as conn:
        for db in names:
            conn.exec_driver_sql(f"CREATE DATABASE {db}")
    url = sa.make_url(admin_url)
    return engine, (
        url.set(database=names[0]).render_as_string(False),
        url.set(database=names[1]).render_as_string(False),
    )


def drop(engine: sa.Engine, urls: tuple[str, str]) -> None:
    """Drops the run's databases (again a second later: an autovacuum worker may hold one)."""
    with engine.connect() as conn:
        for url in urls:
            sql = f"DROP DATABASE IF EXISTS {sa.make_url(url).database} WITH (FORCE)"
            try:
                conn.exec_driver_sql(sql)
            except sa.exc.DBAPIError:
                time.sleep(1)
                conn.exec_driver_sql(sql)
    engine.dispose()


def main() -> int:
    """Measures SQLite and PostgreSQL; 0 when the worse ratio meets the goal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100, help="groups written (default 100)")
    parser.add_argument("--group-size", type=int, default=32, help="node batches per group")
    args = parser.parse_args()
    size = args.group_size
    groups = [
        [node_minute(n, g // 8) for n in range((g % 8) * size, (g % 8 + 1) * size)]
        for g in range(args.groups)
    ]
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        files = (f"sqlite:///{tmp}/per-kind.db", f"sqlite:///{tmp}/grouped.db")
        ratios.append(measure("sqlite", files, groups))
    try:
        engine, urls = server_databases(PG_URL)
    except sa.exc.OperationalError as exc:
        print(f"postgresql: unreachable, left out ({str(exc.orig).splitlines()[0]})")
    else:
        try:
            ratios.append(measure("postgresql", urls, groups))
        finally:
            drop(engine, urls)
    worst = min(ratios)
    print(f"collector-write: ratio={worst:.2f} goal={GOAL:g} {'ok' if worst >= GOAL else 'short'}")
    return 0 if worst >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
