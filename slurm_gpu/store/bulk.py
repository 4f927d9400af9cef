"""Many nodes' batches in one transaction: the collector's group commit (issue 16).

`write_batches` writes what `shipper.write_batch` writes of each batch, through the
same per-kind code of `Store` (its conn-taking `_add_*`), in one transaction:

- Per batch, in `write_batch`'s order: events (and their job merge), inventory and lost
  GPUs, activity (replaced), summaries then the summarized jobs' activity forgotten. A
  later batch sees what an earlier one wrote, as it would one commit later. The activity
  rows of consecutive batches go in one executemany, in batch order, flushed before a
  summarized job's activity is forgotten: nothing else reads or writes `gpu_activity`.
- Heartbeats of every batch at once, last (`heartbeats.write_heartbeats`: each node's
  newest wins, so the order within the group does not matter).
- The bulk kinds, intervals and physical intervals, of every batch at once: nothing
  else in the group reads or writes those tables, so one statement per table stores
  exactly what one per batch would. PostgreSQL: COPY into a temporary table, then
  `INSERT ... SELECT ... ON CONFLICT DO NOTHING`; elsewhere the multi-row
  insert-or-ignore of `Store._insert_ignore` (executemany).
- The usage rollups of every job whose events or summaries the group wrote, refolded
  once at the end: `usage_rollup.refold` recomputes a job's rows from its `jobs` row and
  summaries only, so once after the last write equals once after each.

Idempotent keys stay: a group written twice lands once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from slurm_gpu.models import GpuActivity, NodeHeartbeat
from slurm_gpu.store import convert, heartbeats, usage_rollup
from slurm_gpu.store.schema import gpu_intervals, gpu_physical_intervals

if TYPE_CHECKING:
    from slurm_gpu.node.shipper import DecodedBatch
    from slurm_gpu.store.store import Store


def write_batches(
    store: Store, conn: sa.Connection, batches: Sequence[tuple[str, DecodedBatch]]
) -> int:
    """Writes `(node, batch)` pairs in `conn`'s transaction; returns the rows written.

    The count: new events, intervals and physical intervals, plus activity rows and
    summaries written (upserts count every row) and nodes whose heartbeat was offered.
    """
    written = 0
    refold: set[int] = set()
    intervals: list[dict[str, Any]] = []
    physical: list[dict[str, Any]] = []
    activity: list[GpuActivity] = []  # of consecutive batches: one executemany
    beats: list[NodeHeartbeat] = []
    for node, batch in batches:
        if batch.events:
            written += store._add_events(conn, batch.events)
            refold.update(e.job_id for e in batch.events)
        for devices, seen_at, lost in batch.inventory:
            if devices:
                store._upsert_inventory(conn, node, devices, seen_at)
            if lost is not None:
                store._set_lost_gpus(conn, node, lost)
        activity += batch.activity
        intervals += (convert.interval_to_row(r) for r in batch.intervals)
        physical += (convert.physical_to_row(r) for r in batch.physical)
        beats += batch.heartbeats
        if batch.summaries:
            written += store._add_summaries(conn, batch.summaries)
            written += _flush(store, conn, activity)  # stored before any is forgotten
            jobs = sorted({s.job_id for s in batch.summaries})
            store._forget_activity(conn, jobs, node)
            refold.update(jobs)
    written += _flush(store, conn, activity)
    # After every activity row, as write_batch writes each batch's last; the newest of
    # each node wins whatever the order, so one statement for the group.
    written += heartbeats.write_heartbeats(conn, store.cluster, beats)
    for table, params in ((gpu_intervals, intervals), (gpu_physical_intervals, physical)):
        if params:
            written += insert_ignore_many(store, conn, table, params)
    usage_rollup.refold(conn, store.cluster, sorted(refold))
    return written


def _flush(store: Store, conn: sa.Connection, activity: list[GpuActivity]) -> int:
    """Upserts the activity rows held back so far, in batch order; empties the list.

    Rows upserted in one executemany, in order, land as one call per batch would: only
    forgetting a summarized job's activity (or the end of the group) needs them stored.
    """
    if not activity:
        return 0
    written = store._add_activity(conn, activity)
    activity.clear()
    return written


def insert_ignore_many(
    store: Store, conn: sa.Connection, table: sa.Table, params: list[dict[str, Any]]
) -> int:
    """Inserts `params` into `table`, skipping stored keys; the number inserted."""
    if store.engine.dialect.driver == "psycopg":
        return _copy_insert_ignore(conn, table, params)
    return store._insert_ignore(conn, table, params)


def _copy_insert_ignore(conn: sa.Connection, table: sa.Table, params: list[dict[str, Any]]) -> int:
    """COPY into a temporary twin of `table`, then insert what is not stored yet.

    COPY cannot skip conflicting keys itself, hence the temporary table. It lives as long
    as the connection and is emptied at each commit (ON COMMIT DELETE ROWS); a rolled
    back transaction takes its rows, or its creation, with it.
    https://www.psycopg.org/psycopg3/docs/basic/copy.html
    """
    staging = f"slurm_gpu_bulk_{table.name}"
    columns = [c.name for c in table.columns]
    names = ", ".join(f'"{c}"' for c in columns)
    conn.exec_driver_sql(
        f"CREATE TEMPORARY TABLE IF NOT EXISTS {staging} "
        f"(LIKE {table.name} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
    )
    cursor = conn.connection.cursor()
    try:
        copying = cursor.copy(f"COPY {staging} ({names}) FROM STDIN")
        with copying as copy:
            for row in params:
                copy.write_row(tuple(row[c] for c in columns))
        cursor.execute(
            f"INSERT INTO {table.name} ({names}) SELECT {names} FROM {staging} "
            "ON CONFLICT DO NOTHING"
        )
        return max(int(cursor.rowcount), 0)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise sa.exc.DBAPIError.instance(
            f"COPY {staging}", None, exc, Exception, hide_parameters=True
        ) from exc
    finally:
        cursor.close()
