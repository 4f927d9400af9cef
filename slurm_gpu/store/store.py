"""`Store`: the accounting store behind one SQLAlchemy engine (SQLite, PostgreSQL, MariaDB).

Every write is one transaction (`Database.writing`); every SQLAlchemy/DBAPI failure
becomes a StoreError that names the database (`postgresql://127.0.0.1:5432/slurm_gpu`)
and the operation, never the password. Ingest is idempotent: re-sending a batch stores
nothing twice; what it writes is `ingest.Ingest`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import alembic.command
import alembic.config
import alembic.script
import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext

from slurm_gpu.errors import StoreError
from slurm_gpu.models import (
    GpuActivity,
    GpuDevice,
    GpuInterval,
    GpuPhysicalInterval,
    JobEvent,
    JobGpuSummary,
    LostGpu,
    NodeHeartbeat,
)
from slurm_gpu.store import convert, heartbeats, rollup, usage_rollup
from slurm_gpu.store.control import ControlStore
from slurm_gpu.store.database import Database
from slurm_gpu.store.deliveries import DeliveryLog
from slurm_gpu.store.dialect import upsert
from slurm_gpu.store.ingest import Ingest, ShippedBatch
from slurm_gpu.store.rollup import GpuHourly
from slurm_gpu.store.schema import (
    gpu_activity,
    gpu_intervals,
    gpu_intervals_hourly,
    gpu_inventory,
    gpu_physical_intervals,
    job_gpu_summaries,
    job_gpus,
    jobs,
)

MIGRATIONS = "slurm_gpu.store:migrations"
VERSION_TABLE = "slurm_gpu_alembic_version"
ROLLUP_ATTEMPTS = 3


@dataclass(frozen=True)
class InventoryEntry:
    """A GPU the store has seen on a node, and when."""

    node: str
    device: GpuDevice
    first_seen: float
    last_seen: float
    lost_since: float | None = None
    lost_reason: str | None = None


class Store(Database):
    """The accounting store.

    Its methods are the accounting operations, each one transaction. Code beside it in
    this package (`queries`, `control`) runs its own SQL through `reading()` and
    `writing()` (`Database`'s), which give the same transactions and error messages;
    `control` is the controller's bookkeeping in the same database, `deliveries` what
    the monthly delivery mailed, `ingest` what the shipped rows write.

    Args:
        url: SQLAlchemy URL: `sqlite:///PATH`, `postgresql[+psycopg]://...`,
            `mysql|mariadb[+pymysql]://...`.
        cluster: cluster name written to `jobs`, `job_gpus`, `job_events` and
            `job_gpu_summaries` rows, and the one every job query is scoped to.
        echo: log every SQL statement.
        pool_size: the most connections the store opens at once (a server backend's pool
            holds exactly that many, none beyond; None: SQLAlchemy's default pool).
            SQLite keeps its own pool either way.

    Raises:
        StoreError: the URL is malformed, its backend unsupported or its driver missing.
    """

    def __init__(
        self, url: str, cluster: str = "", echo: bool = False, pool_size: int | None = None
    ) -> None:
        super().__init__(url, cluster, echo, pool_size)
        self.ingest = Ingest(self.engine.dialect, cluster)
        self._at_head = False

    @functools.cached_property
    def control(self) -> ControlStore:
        """The controller's records in this store (audit log, exemptions, lease...), built once."""
        return ControlStore(self)

    @functools.cached_property
    def deliveries(self) -> DeliveryLog:
        """What the monthly delivery mailed (`report monthly --deliver`), built once."""
        return DeliveryLog(self)

    def _sqlite_file(self) -> bool:
        database = self.engine.url.database
        return self.dialect == "sqlite" and bool(database) and database != ":memory:"

    # ------------------------------------------------------------------ schema

    def _alembic_config(self, conn: sa.Connection) -> alembic.config.Config:
        cfg = alembic.config.Config()
        cfg.set_main_option("script_location", MIGRATIONS)
        cfg.attributes["connection"] = conn
        return cfg

    def upgrade(self, revision: str = "head") -> None:
        """Create or migrate the schema to `revision` (idempotent: at head, a no-op).

        For a SQLite file, its directory is created first.
        """
        database = self.engine.url.database
        if self._sqlite_file() and database:
            try:
                Path(database).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"store {self.where}: cannot create its directory: {exc}"
                ) from None
        with self.writing(f"schema upgrade to {revision}") as conn:
            alembic.command.upgrade(self._alembic_config(conn), revision)

    def current_revision(self) -> str | None:
        """The schema revision the database is at (None: no schema yet)."""
        database = self.engine.url.database
        if self._sqlite_file() and not Path(database or "").exists():
            return None  # not created yet; connecting would create an empty file
        with self.reading("reading the schema revision") as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()

    @staticmethod
    @functools.cache
    def head_revision() -> str | None:
        """The newest schema revision this slurm-gpu knows."""
        cfg = alembic.config.Config()
        cfg.set_main_option("script_location", MIGRATIONS)
        return alembic.script.ScriptDirectory.from_config(cfg).get_current_head()

    def require_head(self, doing: str) -> None:
        """Refuse to read a store whose schema is behind this slurm-gpu's.

        The usage rollups hold the sums of the newest revision; a report of an older
        store would read columns that are not there. Checked once per Store: a schema
        does not go back.

        Raises:
            StoreError: the store is not at the newest revision, naming the fix.
        """
        if self._at_head:
            return
        revision, head = self.current_revision(), self.head_revision()
        if revision != head:
            raise StoreError(
                f"store {self.where} is at schema revision {revision or '(none)'}; "
                f"{doing} needs revision {head}: run `slurm-gpu db upgrade`"
            )
        self._at_head = True

    # ------------------------------------------------------------------ intervals

    def add_intervals(self, rows: Sequence[GpuInterval]) -> int:
        """Store GpuIntervals, one transaction; rows already stored are skipped.

        Insert-or-ignore on the key (node, slot_id, period_start): COPY through a
        temporary table on PostgreSQL, the dialect's native insert-or-ignore in one
        executemany elsewhere (`Ingest.intervals`; a whole GPU's slot id is its UUID: its
        key is as before slots; two jobs' shares of one GPU in one period are two rows).

        Returns:
            The number of rows newly inserted (the drivers' affected-row counts on all
            three backends; duplicates count 0).
        """
        if not rows:
            return 0
        with self.writing(f"adding {len(rows)} GPU intervals") as conn:
            return self.ingest.intervals(conn, rows)

    def write_batches(self, batches: Sequence[tuple[str, ShippedBatch]]) -> int:
        """Write nodes' shipped batches in one transaction (`Ingest.write_batches`).

        Both ship modes come here: the agent's direct mode with one batch, the
        collector with a group. Idempotent keys: a group shipped twice lands once.

        Returns:
            The rows written (new events, intervals and physical intervals; activity rows
            and summaries written; nodes whose heartbeat was offered).
        """
        if not batches:
            return 0
        with self.writing(f"writing {len(batches)} batches") as conn:
            return self.ingest.write_batches(conn, batches)

    def intervals(
        self,
        *,
        node: str | None = None,
        gpu_uuid: str | None = None,
        job_id: int | None = None,
        since: float | None = None,
        until: float | None = None,
        slot_id: str | None = None,
    ) -> list[GpuInterval]:
        """Stored per-interval rows, ordered by node, GPU, slot, period_start.

        Only rows not yet rolled up: hourly rollups (see `hourly`) are never mixed in.
        `since`/`until` select intervals overlapping [since, until):
        period_end > since and period_start < until. `gpu_uuid` selects every slot of
        that physical GPU, `slot_id` one slot (a whole GPU's is its UUID).
        """
        t = gpu_intervals.c
        query = sa.select(gpu_intervals).order_by(t.node, t.gpu_uuid, t.slot_id, t.period_start)
        if node is not None:
            query = query.where(t.node == node)
        if gpu_uuid is not None:
            query = query.where(t.gpu_uuid == gpu_uuid)
        if slot_id is not None:
            query = query.where(t.slot_id == slot_id)
        if job_id is not None:
            query = query.where(t.job_id == job_id)
        if since is not None:
            query = query.where(t.period_end > since)
        if until is not None:
            query = query.where(t.period_start < until)
        with self.reading("reading GPU intervals") as conn:
            return [convert.row_to_interval(r) for r in conn.execute(query).mappings()]

    def hourly(
        self,
        *,
        node: str | None = None,
        gpu_uuid: str | None = None,
        job_id: int | None = None,
        since: float | None = None,
        until: float | None = None,
        slot_id: str | None = None,
    ) -> list[GpuHourly]:
        """Hourly rollups, ordered by node, GPU, slot, hour, job; hours in [since, until).

        `gpu_uuid` selects every slot of that physical GPU, `slot_id` one slot.
        """
        t = gpu_intervals_hourly.c
        query = sa.select(gpu_intervals_hourly).order_by(
            t.node, t.gpu_uuid, t.slot_id, t.hour_start, t.job_id
        )
        if node is not None:
            query = query.where(t.node == node)
        if gpu_uuid is not None:
            query = query.where(t.gpu_uuid == gpu_uuid)
        if slot_id is not None:
            query = query.where(t.slot_id == slot_id)
        if job_id is not None:
            query = query.where(t.job_id == job_id)
        if since is not None:
            query = query.where(t.hour_start >= since)
        if until is not None:
            query = query.where(t.hour_start < until)
        with self.reading("reading hourly rollups") as conn:
            return [rollup.row_to_hourly(r) for r in conn.execute(query).mappings()]

    def rollup_and_prune(self, older_than: float) -> tuple[int, int]:
        """Fold intervals with period_start < older_than into hourly rows, then delete them.

        One transaction. Folding merges into existing hourly rows (sums add, maxes max), and
        the folded intervals are deleted, so running it again changes nothing. If a late
        interval lands between the fold and the delete (the counts differ), the transaction
        is rolled back and retried.

        Caveat: an interval re-shipped after its hour was pruned is stored again and would
        be folded twice; the agent deletes from its spool on commit, so only a retention
        shorter than the agent's outage can cause that.

        Returns:
            (hourly rows written, intervals deleted).
        """
        for _ in range(ROLLUP_ATTEMPTS):
            with self.writing("rolling up GPU intervals") as conn:
                written, deleted, folded = rollup.fold(conn, self.dialect, older_than)
                if deleted == folded:
                    return written, deleted
                conn.rollback()
        raise StoreError(
            f"store {self.where}: rolling up GPU intervals failed: intervals kept arriving "
            f"for the pruned range ({ROLLUP_ATTEMPTS} attempts)"
        )

    def add_physical_intervals(self, rows: Sequence[GpuPhysicalInterval]) -> int:
        """Store physical GPUs' own totals, one transaction; rows already stored are skipped.

        Insert-or-ignore on (node, gpu_uuid, period_start), as `add_intervals`.

        Returns:
            The number of rows newly inserted.
        """
        if not rows:
            return 0
        with self.writing(f"adding {len(rows)} physical GPU intervals") as conn:
            return self.ingest.physical_intervals(conn, rows)

    def physical_intervals(
        self,
        *,
        node: str | None = None,
        gpu_uuid: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[GpuPhysicalInterval]:
        """Stored physical GPU totals, by node, GPU, period_start; overlapping [since, until)."""
        t = gpu_physical_intervals.c
        query = sa.select(gpu_physical_intervals).order_by(t.node, t.gpu_uuid, t.period_start)
        if node is not None:
            query = query.where(t.node == node)
        if gpu_uuid is not None:
            query = query.where(t.gpu_uuid == gpu_uuid)
        if since is not None:
            query = query.where(t.period_end > since)
        if until is not None:
            query = query.where(t.period_start < until)
        with self.reading("reading physical GPU intervals") as conn:
            return [convert.row_to_physical(r) for r in conn.execute(query).mappings()]

    # ------------------------------------------------------------------ jobs

    def add_events(self, events: Sequence[JobEvent]) -> int:
        """Store prolog/epilog events (idempotent by `event.key`) and fold them into jobs.

        A started event fills the job's user, uid, account, partition, array/het ids and
        start time and adds one `job_gpus` row per GPU index; an ended event sets the end
        time and exit code (of the job, and of that node's `job_gpus` rows). Events may
        arrive in any order, and more than once. Each run of a requeued job (its
        `restart`) has its own events and `job_gpus` rows; the job's `gpus` is the most
        GPUs one run held, and its times are the newest run's (`convert.merge_job_event`).

        Returns:
            The number of events newly stored.
        """
        if not events:
            return 0
        with self.writing(f"adding {len(events)} job events") as conn:
            new = self.ingest.events(conn, events)
            # The jobs' facts changed: their usage rollups follow (revision 0010).
            usage_rollup.refold(conn, self.cluster, sorted({e.job_id for e in events}))
            return new

    def upsert_jobs(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Merge job facts (e.g. from sacct) into `jobs`: non-null, non-empty values win.

        Args:
            rows: mappings with `job_id` and any of `convert.JOB_COLUMNS`.
        """
        if not rows:
            return
        j = jobs.c
        with self.writing(f"upserting {len(rows)} jobs") as conn:
            ids = sorted({int(r["job_id"]) for r in rows})
            stored = {
                r["job_id"]: dict(r)
                for r in conn.execute(
                    sa.select(jobs).where(j.cluster == self.cluster, j.job_id.in_(ids))
                ).mappings()
            }
            for row in rows:
                update = {k: v for k, v in row.items() if k in convert.JOB_COLUMNS}
                job_id = int(row["job_id"])
                stored[job_id] = convert.merge_fields(stored.get(job_id), update)
            params = []
            for job_id in ids:
                values = {name: stored[job_id].get(name) for name in convert.JOB_COLUMNS}
                values.update(cluster=self.cluster, job_id=job_id)
                params.append(values)
            conn.execute(upsert(self.dialect, jobs, convert.JOB_COLUMNS), params)
            usage_rollup.refold(conn, self.cluster, ids)  # revision 0010

    def rebuild_rollups(self, since: float | None = None) -> int:
        """Recompute the usage rollups (revision 0010) from raw rows, one transaction.

        Of every job that ended on or after the UTC day of `since` (None: all); every
        cluster in the store. Returns the number of `job_usage` rows written.
        """
        with self.writing("rebuilding the usage rollups") as conn:
            written = usage_rollup.rebuild(conn, None, since)
            usage_rollup.reset_extent(conn)  # revision 0012
            return written

    def job(self, job_id: int) -> dict[str, Any] | None:
        """The `jobs` row of `job_id` in this store's cluster, or None."""
        j = jobs.c
        with self.reading(f"reading job {job_id}") as conn:
            row = (
                conn.execute(sa.select(jobs).where(j.cluster == self.cluster, j.job_id == job_id))
                .mappings()
                .first()
            )
            return dict(row) if row is not None else None

    def sluids(self, job_ids: Sequence[int]) -> dict[int, str]:
        """{job id: Slurm's SLUID} of those of `job_ids` that have one (Slurm 25.11+)."""
        j = jobs.c
        found: dict[int, str] = {}
        ids = sorted({int(i) for i in job_ids})
        with self.reading("reading SLUIDs of jobs") as conn:
            for at in range(0, len(ids), 500):  # bounded IN lists on every backend
                query = sa.select(j.job_id, j.sluid).where(
                    j.cluster == self.cluster,
                    j.job_id.in_(ids[at : at + 500]),
                    j.sluid.is_not(None),
                )
                found.update({int(job): str(sluid) for job, sluid in conn.execute(query).all()})
        return found

    def job_gpus(self, job_id: int) -> list[dict[str, Any]]:
        """The `job_gpus` rows of `job_id`, by run, node and Slurm index."""
        g = job_gpus.c
        query = (
            sa.select(job_gpus)
            .where(g.cluster == self.cluster, g.job_id == job_id)
            .order_by(g.restart, g.node, g.slurm_index)
        )
        with self.reading(f"reading GPUs of job {job_id}") as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    # ------------------------------------------------------------------ summaries

    def add_summaries(self, rows: Sequence[JobGpuSummary]) -> int:
        """Store job GPU summaries; one with a stored key (job, node, slot, run) replaces it.

        The slot is `effective_slot_id`: a whole GPU's UUID, so its key is as before slots.

        Returns:
            The number of summaries written (an upsert: new and replaced alike).
        """
        if not rows:
            return 0
        with self.writing(f"adding {len(rows)} job GPU summaries") as conn:
            self.ingest.summaries(conn, rows)
            # Folded into the usage rollups in the same transaction (revision 0010).
            usage_rollup.refold(conn, self.cluster, sorted({r.job_id for r in rows}))
        return len(rows)

    def job_summaries(self, job_id: int) -> list[JobGpuSummary]:
        """The summaries of `job_id` in this store's cluster, by run, node, GPU and slot."""
        s = job_gpu_summaries.c
        query = (
            sa.select(job_gpu_summaries)
            .where(s.cluster == self.cluster, s.job_id == job_id)
            .order_by(s.restart, s.node, s.gpu_uuid, s.slot_id)
        )
        with self.reading(f"reading summaries of job {job_id}") as conn:
            return [convert.row_to_summary(r) for r in conn.execute(query).mappings()]

    # ------------------------------------------------------------------ inventory

    def upsert_inventory(self, node: str, devices: Sequence[GpuDevice], seen_at: float) -> None:
        """Record that `devices` were on `node` at `seen_at` (first_seen kept, last_seen max)."""
        if not devices:
            return
        with self.writing(f"updating the GPU inventory of {node}") as conn:
            self.ingest.inventory(conn, node, devices, seen_at)

    def set_lost_gpus(self, node: str, lost: Sequence[LostGpu]) -> None:
        """Record which of `node`'s GPUs its agent cannot read; every other one can.

        A lost GPU is found by its UUID, or by its minor when the agent never learnt
        the UUID (a GPU gres.conf lists that NVML did not show at the agent's start).
        """
        with self.writing(f"recording the lost GPUs of {node}") as conn:
            self.ingest.lost_gpus(conn, node, lost)

    def inventory(self, node: str | None = None) -> list[InventoryEntry]:
        """GPUs seen, ordered by node and NVML index."""
        i = gpu_inventory.c
        query = sa.select(gpu_inventory).order_by(i.node, i.nvml_index, i.uuid)
        if node is not None:
            query = query.where(i.node == node)
        with self.reading("reading the GPU inventory") as conn:
            return [
                InventoryEntry(
                    r["node"],
                    convert.row_to_device(r),
                    r["first_seen"],
                    r["last_seen"],
                    r["lost_since"],
                    r["lost_reason"],
                )
                for r in conn.execute(query).mappings()
            ]

    # ------------------------------------------------------------------ activity

    def add_activity(self, rows: Sequence[GpuActivity]) -> int:
        """Replace the newest activity of running jobs' GPUs (the controller's input).

        `last_active` and `last_sm_active` (GPM) never go back: a restarted agent that
        has not yet seen a busy sample does not erase the one the store already knows.
        """
        if not rows:
            return 0
        with self.writing(f"adding {len(rows)} GPU activity rows") as conn:
            return self.ingest.activity(conn, rows)

    def activity(self, job_ids: Sequence[int] | None = None) -> list[GpuActivity]:
        """Newest activity per job and GPU slot (of `job_ids`, or of every job).

        Each row is carried forward to its node's newest heartbeat where that vouches for
        its slot (`heartbeats.extended`): the agent ships a row only when it changed.
        """
        a = gpu_activity.c
        query = sa.select(gpu_activity).where(a.cluster == self.cluster)
        if job_ids is not None:
            if not job_ids:
                return []
            query = query.where(a.job_id.in_(list(job_ids)))
        with self.reading("reading GPU activity") as conn:
            ordered = query.order_by(a.job_id, a.node, a.slurm_index, a.slot_id)
            rows = [convert.row_to_activity(r) for r in conn.execute(ordered).mappings()]
            beats = heartbeats.read_heartbeats(conn, self.cluster, {r.node for r in rows})
        return heartbeats.extended(rows, beats)

    def add_heartbeats(self, rows: Sequence[NodeHeartbeat]) -> int:
        """Keep each node's newest agent heartbeat (`heartbeats.write_heartbeats`).

        `activity()` extends a node's activity rows to it; an older heartbeat (a batch
        shipped twice, or late) never moves a node's back. Returns the nodes written.
        """
        if not rows:
            return 0
        with self.writing(f"adding {len(rows)} node heartbeats") as conn:
            return self.ingest.heartbeats(conn, rows)

    def forget_activity(self, job_ids: Sequence[int], node: str | None = None) -> None:
        """Drop finished jobs' activity rows (their summaries now hold the record).

        node: only that node's rows (its agent summarized the jobs there). A job's rows on
        another node stay: that node's agent ships them only when they change, so deleting
        them would leave its still-running part unknown until its next change.
        """
        if job_ids:
            with self.writing("removing finished jobs' activity") as conn:
                self.ingest.forget_activity(conn, job_ids, node)
