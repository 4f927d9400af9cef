"""The agent's local spool: SQLite in WAL mode, written before anything is shipped.

What the agent has seen lives here until the accounting store has committed it:
- `outbox`: rows ready to ship (intervals, events, summaries, inventory, activity), each
  with an idempotency key and its payload encoded by `outbox.py`; deleted only after the
  store committed them.
- `pieces`: the open shipping period of each GPU and job, merged tick by tick and sealed
  into an `interval` outbox row once the period is over.
- `spans`: the jobs holding GPUs on this node (from the hooks' events), per run: a
  requeued job runs again under its id, and each run (`restart`, Slurm's
  SLURM_RESTART_COUNT) has its own spans, totals and summaries.
- `job_acc`: running per-run-per-GPU totals, turned into summaries at the run's end.
  Both `pieces` and `job_acc` sum the GPM figures (issue #13) as percent-seconds with the
  seconds each was measured (`<metric>_psec`, `<metric>_sec`; sec 0: never measured, so
  its mean is None, never 0%), and `gpm_seconds`, the seconds any GPM window covered.
- GPU slots (issue 14, docs/design/gpu-slots.md): a `pieces` or `job_acc` row's `uuid` is
  its slot's id (a whole GPU's UUID, a MIG UUID, a share's "<GPU>/<kind>/<job>[.<run>]")
  and `parent` its physical GPU ("" for a whole GPU: rows of a whole GPU are those of
  before slots); `slot_kind`, `share`, `mig_profile` and `measured_by` travel with it.
- `physical`: each physical GPU's open shipping period of its own totals (power, energy,
  temperature, ECC, memory), sealed into a `physical` outbox row (GpuPhysicalInterval).
  A whole GPU's are its period rows' totals, merged when they are sealed (nothing more a
  tick); a GPU in MIG mode or shared by shares writes them a tick from its own read.
- `gpu_state`: per GPU, when it was last read, its newest sample and energy counter, so a
  restarted agent neither double counts nor invents the time it was down.
- `quarantine`: outbox rows that could not be decoded (a damaged payload, an unknown
  kind), kept whole with the reason for the admin instead of blocking the outbox.
Every tick is one transaction: a crash loses at most the tick in progress.


The spool outlives upgrades of the agent with rows still in it, so its layout carries a
version (`PRAGMA user_version`): an older spool is migrated in place at open (the steps
are in spool_layout.py), a newer one is refused untouched. Every statement names its
columns, so a column added by a migration (appended at the table's end) cannot shift the
others.

This module is the file: its connection, layout version and transactions, and `Spool`,
the one handle the agent and the shipper hold. What is written into it lives one concept
a module, as plain functions on a connection that `Spool` answers as its own methods:
spool_rows.py (the row shapes and SQL helpers), spool_pieces.py (pieces merged into the
open periods and the runs' totals: PieceBatch), spool_seal.py (periods sealed into
`interval` and `physical` outbox rows), spool_runs.py (job spans and the hooks' events),
spool_summary.py (summaries at a run's end), outbox_queue.py (the outbox queue and its
quarantine); outbox.py encodes the rows' payloads.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.node import outbox_queue, spool_pieces, spool_runs, spool_seal, spool_summary
from slurm_gpu.node.attribution import JobSpan
from slurm_gpu.node.outbox_queue import OutboxRow, QuarantinedRow
from slurm_gpu.node.spool_layout import MIGRATIONS, SCHEMA_VERSION
from slurm_gpu.node.spool_pieces import PieceBatch
from slurm_gpu.node.spool_rows import NO_JOB
from slurm_gpu.node.spool_summary import SlotOf

__all__ = [
    "NO_JOB",
    "SCHEMA_VERSION",
    "OutboxRow",
    "PieceBatch",
    "QuarantinedRow",
    "SlotOf",
    "Spool",
    "SpoolError",
]


class SpoolError(SlurmGpuError):
    """The spool database cannot be opened or written.

    Disk full, permissions, or a layout newer than this agent knows.
    """


class Spool:
    """One node's spool database.

    Args:
        path: the SQLite file (its directory is created). A spool of an older layout is
            migrated in place; one newer than SCHEMA_VERSION raises SpoolError and is
            left as it is.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
        except (sqlite3.Error, OSError) as exc:
            raise SpoolError(f"spool {path}: {exc}") from exc
        try:
            self._open()
        except sqlite3.Error as exc:
            self._db.close()
            raise SpoolError(f"spool {path}: {exc}") from exc
        except SpoolError:
            self._db.close()
            raise

    def _open(self) -> None:
        """Checks the layout's version, then migrates it to SCHEMA_VERSION (a new file from 0)."""
        self._refuse_newer(self._version())  # before anything writes to the file
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        if self._version() == SCHEMA_VERSION:
            return
        with self.transaction() as db:
            version = self._version()  # again: another connection may have migrated it
            self._refuse_newer(version)
            for step in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[step]:
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise SpoolError(
                f"spool {self.path}: layout version {version} is newer than this agent's"
                f" ({SCHEMA_VERSION}): a newer slurm-gpu wrote it. Run that release (or a"
                " newer one) to ship its rows; the file was left untouched."
            )

    def close(self) -> None:
        """Closes the connection."""
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT; rolls back on any error (SpoolError for SQLite's)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise SpoolError(f"spool {self.path}: {exc}") from exc
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException as exc:
            self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise SpoolError(f"spool {self.path}: {exc}") from exc
            raise

    # --- gpu state -----------------------------------------------------------------

    def gpu_state(self) -> dict[str, tuple[float | None, float | None, float | None]]:
        """{uuid: (last_read, last_sample, last_energy)}."""
        rows = self._db.execute("SELECT uuid, last_read, last_sample, last_energy FROM gpu_state")
        return {uuid: (read, sample, energy) for uuid, read, sample, energy in rows}

    @staticmethod
    def set_gpu_state(
        db: sqlite3.Connection,
        uuid: str,
        last_read: float,
        last_sample: float | None,
        last_energy: float | None,
    ) -> None:
        """Remembers where this GPU's next read starts."""
        Spool.set_gpu_states(db, {uuid: (last_read, last_sample, last_energy)})

    @staticmethod
    def set_gpu_states(
        db: sqlite3.Connection,
        states: dict[str, tuple[float | None, float | None, float | None]],
    ) -> None:
        """Remembers where each GPU's next read starts: {uuid: (read, sample, energy)}."""
        db.executemany(
            "INSERT INTO gpu_state (uuid, last_read, last_sample, last_energy)"
            " VALUES (?, ?, ?, ?) ON CONFLICT(uuid) DO UPDATE SET"
            " last_read=excluded.last_read, last_sample=excluded.last_sample,"
            " last_energy=excluded.last_energy",
            [(uuid, *state) for uuid, state in states.items()],
        )

    # --- spans and events (spool_runs.py) -------------------------------------------

    def spans(self) -> list[JobSpan]:
        """Every job span the agent knows (running, or ended but not yet summarized)."""
        return spool_runs.spans(self._db)

    apply_event = staticmethod(spool_runs.apply_event)
    add_span = staticmethod(spool_runs.add_span)

    # --- pieces (spool_pieces.py), sealing (spool_seal.py), summaries (spool_summary.py)

    add_piece = staticmethod(spool_pieces.add_piece)
    seal_periods = staticmethod(spool_seal.seal_periods)
    seal_job = staticmethod(spool_seal.seal_job)
    finish_job = staticmethod(spool_summary.finish_job)

    # --- outbox (outbox_queue.py) ------------------------------------------------------

    queue = staticmethod(outbox_queue.queue)

    def pending(self, limit: int) -> list[OutboxRow]:
        """The oldest `limit` outbox rows, in the order they were (last) queued."""
        return outbox_queue.pending(self._db, limit)

    def delete(self, ids: list[int]) -> None:
        """Forgets outbox rows the store has committed."""
        with self.transaction() as db:
            outbox_queue.delete(db, ids)

    def backlog(self) -> int:
        """Rows waiting to be shipped."""
        return outbox_queue.backlog(self._db)

    def quarantine(self, rows: list[tuple[int, str]], now: float) -> None:
        """Moves outbox rows that cannot be shipped into `quarantine`, whole.

        Args:
            rows: (outbox id, why it cannot be shipped).
            now: when, POSIX seconds.
        """
        with self.transaction() as db:
            outbox_queue.quarantine(db, rows, now)

    def quarantined(self) -> list[QuarantinedRow]:
        """Quarantined rows, oldest first."""
        return outbox_queue.quarantined(self._db)
