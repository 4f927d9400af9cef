"""Ingest: the one writer of what the node agents ship (issue 24).

Both ship modes write through here: the agent's direct mode (node/shipper.py hands each
batch to `Store.write_batches`) and the collector (a group of nodes' batches, one
transaction: issue 16). `Store`'s single-kind methods (`add_events`, `add_intervals`,
...) are the same writes, one kind in a transaction of its own.

`Ingest.write_batches` writes, in the caller's transaction:

- Per batch, in this order: events (and their job merge), inventory and lost GPUs,
  activity (replaced), summaries then the summarized jobs' activity forgotten. A later
  batch sees what an earlier one wrote, as it would one commit later. The activity rows
  of consecutive batches go in one executemany, in batch order, flushed before a
  summarized job's activity is forgotten: nothing else reads or writes `gpu_activity`.
- Heartbeats of every batch at once, after every activity row (`heartbeats.write_heartbeats`:
  each node's newest wins, so the order within the group does not matter). One
  transaction: a heartbeat is committed with the rows it vouches for.
- The bulk kinds, intervals and physical intervals, of every batch at once: nothing
  else in the group reads or writes those tables, so one statement per table stores
  exactly what one per batch would. PostgreSQL (psycopg): COPY into a temporary table,
  then `INSERT ... SELECT ... ON CONFLICT DO NOTHING`; elsewhere the dialect's
  insert-or-ignore, compiled once per table, in one executemany.
- The usage rollups of every job whose events or summaries the group wrote, refolded
  once at the end: `usage_rollup.refold` recomputes a job's rows from its `jobs` row and
  summaries only, so once after the last write equals once after each.

Idempotent keys: a batch or group written twice lands once.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

import sqlalchemy as sa

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
from slurm_gpu.store import convert, heartbeats, usage_rollup
from slurm_gpu.store.dialect import insert_ignore, upsert
from slurm_gpu.store.schema import (
    gpu_activity,
    gpu_intervals,
    gpu_inventory,
    gpu_physical_intervals,
    job_events,
    job_gpu_summaries,
    job_gpus,
    jobs,
)

Params = list[dict[str, Any]]


class ShippedBatch(Protocol):
    """What one node's agent shipped in one batch, decoded (node/shipper.py `DecodedBatch`).

    `inventory` holds (devices, seen_at, lost GPUs or None: not reported) per inventory row.
    """

    @property
    def events(self) -> Sequence[JobEvent]:
        """Prolog/epilog events."""
        ...

    @property
    def inventory(
        self,
    ) -> Sequence[tuple[Sequence[GpuDevice], float, Sequence[LostGpu] | None]]:
        """The node's GPUs as seen, and those its agent cannot read."""
        ...

    @property
    def activity(self) -> Sequence[GpuActivity]:
        """Running jobs' newest GPU activity."""
        ...

    @property
    def intervals(self) -> Sequence[GpuInterval]:
        """Per-period GPU rows of jobs' slots."""
        ...

    @property
    def physical(self) -> Sequence[GpuPhysicalInterval]:
        """Physical GPUs' own totals per period."""
        ...

    @property
    def summaries(self) -> Sequence[JobGpuSummary]:
        """Finished jobs' per-GPU summaries."""
        ...

    @property
    def heartbeats(self) -> Sequence[NodeHeartbeat]:
        """The agent's heartbeats."""
        ...


class Ingest:
    """The store's writes of shipped rows, each in the caller's transaction.

    Built once per store (`Store.ingest`): it keeps the statements it compiled.

    Args:
        dialect: the engine's dialect.
        cluster: the cluster written to `jobs`, `job_gpus`, `job_events`,
            `job_gpu_summaries` and `gpu_activity` rows.
    """

    def __init__(self, dialect: sa.Dialect, cluster: str) -> None:
        self.dialect = dialect
        self.cluster = cluster
        self._compiled: dict[str, tuple[str, tuple[str, ...] | None]] = {}

    # ------------------------------------------------------------------ batches

    def write_batches(
        self, conn: sa.Connection, batches: Sequence[tuple[str, ShippedBatch]]
    ) -> int:
        """Writes `(node, batch)` pairs in `conn`'s transaction; returns the rows written.

        The count: new events, intervals and physical intervals, plus activity rows and
        summaries written (upserts count every row) and nodes whose heartbeat was offered.
        """
        written = 0
        refold: set[int] = set()
        intervals: Params = []
        physical: Params = []
        activity: list[GpuActivity] = []  # of consecutive batches: one executemany
        beats: list[NodeHeartbeat] = []
        for node, batch in batches:
            if batch.events:
                written += self.events(conn, batch.events)
                refold.update(e.job_id for e in batch.events)
            for devices, seen_at, lost in batch.inventory:
                self.inventory(conn, node, devices, seen_at)
                if lost is not None:
                    self.lost_gpus(conn, node, lost)
            activity += batch.activity
            intervals += (convert.interval_to_row(r) for r in batch.intervals)
            physical += (convert.physical_to_row(r) for r in batch.physical)
            beats += batch.heartbeats
            if batch.summaries:
                written += self.summaries(conn, batch.summaries)
                written += self._flush(conn, activity)  # stored before any is forgotten
                job_ids = sorted({s.job_id for s in batch.summaries})
                self.forget_activity(conn, job_ids, node)
                refold.update(job_ids)
        written += self._flush(conn, activity)
        # After every activity row, as a batch's last kind; the newest of each node wins
        # whatever the order, so one statement for the group.
        written += self.heartbeats(conn, beats)
        for table, params in ((gpu_intervals, intervals), (gpu_physical_intervals, physical)):
            written += self._insert_bulk(conn, table, params)
        usage_rollup.refold(conn, self.cluster, sorted(refold))
        return written

    def _flush(self, conn: sa.Connection, activity: list[GpuActivity]) -> int:
        """Upserts the activity rows held back so far, in batch order; empties the list.

        Rows upserted in one executemany, in order, land as one call per batch would: only
        forgetting a summarized job's activity (or the end of the group) needs them stored.
        """
        written = self.activity(conn, activity)
        activity.clear()
        return written

    # ------------------------------------------------------------------ one kind each
    # None of these refolds the usage rollups: the caller does, once, at the end.

    def intervals(self, conn: sa.Connection, rows: Sequence[GpuInterval]) -> int:
        """Inserts GpuIntervals, skipping stored keys (node, slot_id, period_start).

        A whole GPU's slot id is its UUID: its key is as before slots; two jobs' shares
        of one GPU in one period are two rows. Returns the rows newly inserted (the
        drivers' affected-row counts on all three backends; duplicates count 0).
        """
        return self._insert_bulk(conn, gpu_intervals, [convert.interval_to_row(r) for r in rows])

    def physical_intervals(self, conn: sa.Connection, rows: Sequence[GpuPhysicalInterval]) -> int:
        """Inserts physical GPUs' own totals, skipping stored keys; the rows newly inserted.

        The key is (node, gpu_uuid, period_start).
        """
        params = [convert.physical_to_row(r) for r in rows]
        return self._insert_bulk(conn, gpu_physical_intervals, params)

    def events(self, conn: sa.Connection, events: Sequence[JobEvent]) -> int:
        """Stores prolog/epilog events (idempotent by `event.key`), folded into jobs.

        A started event fills the job's user, uid, account, partition, array/het ids and
        start time and adds one `job_gpus` row per GPU index; an ended event sets the end
        time and exit code (of the job, and of that node's `job_gpus` rows). Each run of
        a requeued job (its `restart`) has its own events and `job_gpus` rows. Returns
        the number of events newly stored.
        """
        if not events:
            return 0
        cluster = self.cluster
        e_ = job_events.c
        stored = conn.execute(
            sa.select(e_.job_id, e_.kind, e_.time, e_.restart).where(
                e_.cluster == cluster, e_.job_id.in_(sorted({e.job_id for e in events}))
            )
        ).all()
        events = convert.assign_runs([tuple(r) for r in stored], events)
        new = self._insert_ignore(
            conn, job_events, [convert.event_to_row(e, cluster) for e in events]
        )
        gpu_rows = [
            {
                "cluster": cluster,
                "job_id": e.job_id,
                "node": e.node,
                "slurm_index": i,
                "gpu_uuid": "",
                "slot_id": "",
                "start": e.time,
                "end": None,
                "restart": e.restart,
            }
            for e in events
            if e.kind is JobEventKind.STARTED
            for i in e.gpu_indices
        ]
        if gpu_rows:
            conn.execute(upsert(self.dialect.name, job_gpus, [], keep_min=["start"]), gpu_rows)
        self._set_gpu_ends(conn, {(e.job_id, e.node, e.restart) for e in events})
        self._merge_jobs(conn, events)
        return new

    def _set_gpu_ends(self, conn: sa.Connection, runs: set[tuple[int, str, int]]) -> None:
        # From the stored ended events, so an epilog event that arrived before the prolog's
        # still ends the GPUs the prolog's event adds; each run's GPUs by that run's epilog.
        e, g = job_events.c, job_gpus.c
        ended = (
            sa.select(sa.func.max(e.time))
            .where(e.cluster == g.cluster, e.job_id == g.job_id, e.node == g.node)
            .where(e.restart == g.restart, e.kind == JobEventKind.ENDED.value)
            .scalar_subquery()
        )
        for job_id, node, restart in sorted(runs):
            conn.execute(
                sa.update(job_gpus)
                .where(g.cluster == self.cluster, g.job_id == job_id, g.node == node)
                .where(g.restart == restart)
                .values(end=ended)
            )

    def _merge_jobs(self, conn: sa.Connection, events: Sequence[JobEvent]) -> None:
        job_ids = sorted({e.job_id for e in events})
        j, g = jobs.c, job_gpus.c
        rows: dict[int, dict[str, Any]] = {
            r["job_id"]: dict(r)
            for r in conn.execute(
                sa.select(jobs).where(j.cluster == self.cluster, j.job_id.in_(job_ids))
            ).mappings()
        }
        for event in sorted(events, key=lambda e: (e.time, e.kind.value)):
            rows[event.job_id] = convert.merge_job_event(rows.get(event.job_id), event)
        # GPUs held at once: the most of any one run (all nodes), not the sum over runs.
        gpus: dict[int, int] = {}
        for job_id, count in conn.execute(
            sa.select(g.job_id, sa.func.count())
            .where(g.cluster == self.cluster, g.job_id.in_(job_ids))
            .group_by(g.job_id, g.restart)
        ).all():
            gpus[job_id] = max(gpus.get(job_id, 0), int(count))
        params = []
        for job_id in job_ids:
            row = {name: rows[job_id].get(name) for name in convert.JOB_COLUMNS}
            row.update(cluster=self.cluster, job_id=job_id, gpus=int(gpus.get(job_id, 0)))
            params.append(row)
        conn.execute(upsert(self.dialect.name, jobs, convert.JOB_COLUMNS), params)

    def summaries(self, conn: sa.Connection, rows: Sequence[JobGpuSummary]) -> int:
        """Upserts job GPU summaries by (job, node, slot, run); returns the rows written.

        The slot is `effective_slot_id`: a whole GPU's UUID. A summary's run is that of
        the job's GPU rows on its node that started with it (the store told the runs
        apart where the node's agent could not).
        """
        if not rows:
            return 0
        key = ("job_id", "node", "slot_id", "restart")
        update = [n for n in convert.SUMMARY_FIELDS if n not in key]
        g = job_gpus.c
        runs = {
            (job_id, node, start): restart
            for job_id, node, start, restart in conn.execute(
                sa.select(g.job_id, g.node, g.start, g.restart).where(
                    g.cluster == self.cluster, g.job_id.in_(sorted({r.job_id for r in rows}))
                )
            ).all()
        }
        rows = [
            replace(r, restart=max(r.restart, runs.get((r.job_id, r.node, r.start), 0)))
            for r in rows
        ]
        conn.execute(
            upsert(self.dialect.name, job_gpu_summaries, update),
            [convert.summary_to_row(r, self.cluster) for r in rows],
        )
        return len(rows)

    def inventory(
        self, conn: sa.Connection, node: str, devices: Sequence[GpuDevice], seen_at: float
    ) -> None:
        """Records that `devices` were on `node` at `seen_at` (first_seen kept, last_seen max)."""
        if not devices:
            return
        update = [
            "model",
            "minor",
            "nvml_index",
            "pci_bus_id",
            "memory_total_bytes",
            "gpm_supported",
        ]
        stmt = upsert(
            self.dialect.name,
            gpu_inventory,
            update,
            keep_min=["first_seen"],
            keep_max=["last_seen"],
        )
        conn.execute(stmt, [convert.device_to_row(node, d, seen_at) for d in devices])

    def lost_gpus(self, conn: sa.Connection, node: str, lost: Sequence[LostGpu]) -> None:
        """Records which of `node`'s GPUs its agent cannot read; every other one can.

        A lost GPU is found by its UUID, or by its minor when the agent never learnt the
        UUID (a GPU gres.conf lists that NVML did not show at the agent's start).
        """
        i = gpu_inventory.c
        conn.execute(
            gpu_inventory.update()
            .where(i.node == node, i.lost_since.is_not(None))
            .values(lost_since=None, lost_reason=None)
        )
        for gpu in lost:
            which = i.uuid == gpu.uuid if gpu.uuid else i.minor == gpu.minor
            conn.execute(
                gpu_inventory.update()
                .where(i.node == node, which)
                .values(lost_since=gpu.since, lost_reason=gpu.reason[:255])
            )

    def activity(self, conn: sa.Connection, rows: Sequence[GpuActivity]) -> int:
        """Replaces the newest activity of running jobs' GPUs; returns the rows written.

        `last_active` and `last_sm_active` (GPM) never go back: a restarted agent that has
        not yet seen a busy sample does not erase the one the store already knows.
        """
        if not rows:
            return 0
        conn.execute(
            self._activity_upsert, [convert.activity_to_row(r, self.cluster) for r in rows]
        )
        return len(rows)

    @functools.cached_property
    def _activity_upsert(self) -> sa.Insert:
        # Built once: every tick of every node writes activity, and building the statement
        # costs more than executing it (~1 ms).
        fields = (
            "slurm_index",
            "start",
            "last_reading",
            "util_recent_percent",
            "mem_used_bytes",
            "process_count",
            "measured_since",
            "sm_active_recent_percent",
            "gpu_uuid",
            "slot_kind",
            "share",
            "mig_profile",
            "measured_by",
        )
        return upsert(
            self.dialect.name, gpu_activity, fields, keep_max=("last_active", "last_sm_active")
        )

    def forget_activity(
        self, conn: sa.Connection, job_ids: Sequence[int], node: str | None = None
    ) -> None:
        """Drops finished jobs' activity rows (their summaries now hold the record).

        node: only that node's rows (its agent summarized the jobs there). A job's rows on
        another node stay: that node's agent ships them only when they change.
        """
        if not job_ids:
            return
        a = gpu_activity.c
        where = [a.cluster == self.cluster, a.job_id.in_(list(job_ids))]
        if node is not None:
            where.append(a.node == node)
        conn.execute(gpu_activity.delete().where(*where))

    def heartbeats(self, conn: sa.Connection, rows: Sequence[NodeHeartbeat]) -> int:
        """Keeps each node's newest heartbeat (`heartbeats.write_heartbeats`); nodes written."""
        if not rows:
            return 0
        return heartbeats.write_heartbeats(conn, self.cluster, rows)

    # ------------------------------------------------------------------ insert-or-ignore

    def _insert_bulk(self, conn: sa.Connection, table: sa.Table, params: Params) -> int:
        """Inserts many rows into `table`, skipping stored keys; the number inserted.

        COPY on psycopg (PostgreSQL's fastest road in), the executemany elsewhere.
        """
        if not params:
            return 0
        if self.dialect.driver == "psycopg":
            return _copy_insert_ignore(conn, table, params)
        return self._insert_ignore(conn, table, params)

    def _insert_ignore(self, conn: sa.Connection, table: sa.Table, params: Params) -> int:
        """Inserts `params` into `table`, skipping stored keys; the number inserted.

        The Core statement is compiled once per table and handed with the rows straight to
        the driver's `executemany`, inside the connection's transaction: the columns here
        need no bind processing, and the drivers' own affected-row counts (which skip
        ignored duplicates) are exact, whereas SQLAlchemy reports -1 for psycopg's.
        """
        sql, order = self._compiled_insert_ignore(table)
        cursor = conn.connection.cursor()
        try:
            if order is None:
                cursor.executemany(sql, params)
            else:
                cursor.executemany(sql, [tuple(row[k] for k in order) for row in params])
            return max(int(cursor.rowcount), 0)
        except self.dialect.loaded_dbapi.Error as exc:
            raise sa.exc.DBAPIError.instance(
                sql, None, exc, Exception, hide_parameters=True
            ) from exc
        finally:
            cursor.close()

    def _compiled_insert_ignore(self, table: sa.Table) -> tuple[str, tuple[str, ...] | None]:
        """SQL text of the insert-or-ignore for `table`, and its positional key order."""
        cached = self._compiled.get(table.name)
        if cached is None:
            columns = [c.name for c in table.columns]
            compiled = insert_ignore(self.dialect.name, table).compile(
                dialect=self.dialect, column_keys=columns
            )
            positions = compiled.positiontup
            cached = (str(compiled), tuple(positions) if positions is not None else None)
            self._compiled[table.name] = cached
        return cached


def _copy_insert_ignore(conn: sa.Connection, table: sa.Table, params: Params) -> int:
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
