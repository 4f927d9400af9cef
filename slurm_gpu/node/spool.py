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
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, NamedTuple

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.models import (
    GpuInterval,
    GpuPhysicalInterval,
    GpuSlot,
    JobEvent,
    JobEventKind,
    JobGpuSummary,
    Measurement,
    SlotKind,
)
from slurm_gpu.node.attribution import JobSpan, Piece
from slurm_gpu.node.outbox import encode, fields_of
from slurm_gpu.node.spool_layout import MIGRATIONS, SCHEMA_VERSION

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

NO_JOB = 0  # pieces.job_id for time a GPU was held by no job (Slurm job ids start at 1)

SlotOf = Callable[[int, int, str, int, int], tuple[GpuSlot, Measurement] | None]
"""(Slurm index, shards, shard_kind, job, restart) -> the slot held and how it is measured."""


class SpoolError(SlurmGpuError):
    """The spool database cannot be opened or written.

    Disk full, permissions, or a layout newer than this agent knows.
    """


class OutboxRow(NamedTuple):
    """One outbox row, as `pending` returns it."""

    id: int
    kind: str
    key: str
    payload: str


class QuarantinedRow(NamedTuple):
    """One quarantined outbox row, as `quarantined` returns it."""

    kind: str
    key: str
    payload: str
    error: str


class _PieceRow(NamedTuple):
    """A `pieces` row: one GPU's open shipping period for one job (or NO_JOB)."""

    uuid: str
    job_id: int
    period_start: float
    start: float
    end: float
    util_sum: float
    util_count: int
    util_max: float | None
    util_min: float | None
    active_seconds: float
    covered_seconds: float
    mem_max: int | None
    mem_total: int | None
    power_joules: float | None
    power_seconds: float
    energy: float | None
    temp_max: float | None
    ecc: int | None
    unallocated: str
    restart: int
    mem_gib_seconds: float | None  # None: a period of spool layout 4 (before it was summed)
    gpm_seconds: float = 0.0
    sm_active_psec: float = 0.0
    sm_active_sec: float = 0.0
    sm_occupancy_psec: float = 0.0
    sm_occupancy_sec: float = 0.0
    tensor_active_psec: float = 0.0
    tensor_active_sec: float = 0.0
    dram_bw_psec: float = 0.0
    dram_bw_sec: float = 0.0


class _JobAccRow(NamedTuple):
    """A `job_acc` row's totals: one job on one GPU so far."""

    model: str
    covered: float
    util_sum: float
    util_count: int
    util_max: float | None
    active_seconds: float
    mem_max: int | None
    mem_gib_seconds: float
    energy: float | None
    readings: int
    gpm_seconds: float = 0.0
    sm_active_psec: float = 0.0
    sm_active_sec: float = 0.0
    sm_occupancy_psec: float = 0.0
    sm_occupancy_sec: float = 0.0
    tensor_active_psec: float = 0.0
    tensor_active_sec: float = 0.0
    dram_bw_psec: float = 0.0
    dram_bw_sec: float = 0.0


_NO_ACC = _JobAccRow("", 0.0, 0.0, 0, None, 0.0, None, 0.0, None, 0)
# The GPM figures summed: GpuInterval/JobGpuSummary `<name>_mean_percent`, Piece `<name>_percent`.
_GPM_FIGURES = ("sm_active", "sm_occupancy", "tensor_active", "dram_bw")
# The last columns of _PieceRow and _JobAccRow, in that order (_gpm_terms).
_GPM_COLUMNS = ("gpm_seconds", *(f"{n}_{s}" for n in _GPM_FIGURES for s in ("psec", "sec")))
assert _PieceRow._fields[-len(_GPM_COLUMNS) :] == _GPM_COLUMNS
assert _JobAccRow._fields[-len(_GPM_COLUMNS) :] == _GPM_COLUMNS
# (model field, its psec column, its sec column) of each figure (_gpm_means)
_GPM_MEANS = tuple((f"{n}_mean_percent", f"{n}_psec", f"{n}_sec") for n in _GPM_FIGURES)
_SPAN_COLUMNS = (
    "job_id",
    "slurm_index",
    "start",
    "end",
    "user",
    "account",
    "partition",
    "restart",
    "shards",
    "shard_kind",
)
# A slot's columns of `pieces` and `job_acc` (layout 4), after _PieceRow's / _JobAccRow's
_SLOT_COLUMNS = ("parent", "slot_kind", "share", "mig_profile", "measured_by")


class _Slot(NamedTuple):
    """A row's slot columns (_SLOT_COLUMNS); parent "" is a whole GPU."""

    parent: str
    slot_kind: str
    share: float
    mig_profile: str
    measured_by: str


_PHYSICAL_COLUMNS = (
    "uuid",
    "period_start",
    "start",
    "end",
    "covered_seconds",
    "power_joules",
    "power_seconds",
    "energy",
    "temp_max",
    "ecc",
    "mem_max",
    "mem_total",
)


class _PhysicalRow(NamedTuple):
    """A `physical` row: one GPU's own totals of one open shipping period."""

    uuid: str
    period_start: float
    start: float
    end: float
    covered_seconds: float
    power_joules: float | None
    power_seconds: float
    energy: float | None
    temp_max: float | None
    ecc: int | None
    mem_max: int | None
    mem_total: int | None


assert _PhysicalRow._fields == _PHYSICAL_COLUMNS


def _columns(names: tuple[str, ...]) -> str:
    return ", ".join(names)


def _placeholders(names: tuple[str, ...]) -> str:
    # Positional, bound from a tuple in the same order as `names` (a NamedTuple's
    # fields): cheaper per tick than named parameters bound from a dict.
    return ", ".join("?" for _ in names)


def _known(how: str, column: str) -> str:
    """An upsert's SET term for `column`, where NULL means "not read" rather than unknown.

    Two known values are combined by `how` (`max`, `min`, or `+` for a sum), one known value
    is kept, and the column stays NULL only while neither side was read. SQLite's
    two-argument max()/min() and `+` give NULL when either side is NULL; coalesce then
    falls back to the side that is known.
    """
    ours, new = column, f"excluded.{column}"
    both = f"{ours} + {new}" if how == "+" else f"{how}({ours}, {new})"
    return f"{column} = coalesce({both}, {ours}, {new})"


def _summed(column: str) -> str:
    return f"{column} = {column} + excluded.{column}"


# Plain sums (a coalesce per column costs the upsert a third more): `<name>_sec` = 0 says
# a figure was never measured, whatever its `_psec`.
_GPM_SUMS = tuple(_summed(column) for column in _GPM_COLUMNS)


_PIECE_SET = " ON CONFLICT(uuid, job_id, restart, period_start) DO UPDATE SET " + ", ".join(
    (
        "start = min(start, excluded.start)",
        "end = max(end, excluded.end)",
        _summed("util_sum"),
        _summed("util_count"),
        _known("max", "util_max"),
        _known("min", "util_min"),
        _summed("active_seconds"),
        _summed("covered_seconds"),
        _known("max", "mem_max"),
        "mem_total = coalesce(excluded.mem_total, mem_total)",  # the newest known
        # Unknown (NULL) stays unknown: a period of layout 4 missed the reads before it.
        _summed("mem_gib_seconds"),
        _known("+", "power_joules"),
        _summed("power_seconds"),
        _known("+", "energy"),
        _known("max", "temp_max"),
        "ecc = coalesce(excluded.ecc, ecc)",  # a running total: the newest known
        "unallocated = CASE WHEN excluded.unallocated = '' THEN unallocated"
        " ELSE excluded.unallocated END",
        *_GPM_SUMS,
    )
)
_PIECE_UPSERT = (
    f"INSERT INTO pieces ({_columns(_PieceRow._fields)})"
    f" VALUES ({_placeholders(_PieceRow._fields)})" + _PIECE_SET
)
# A slot's piece (MIG slice, share): its slot columns too, which do not change in a row,
# but a MIG slice first read before its first GPM window (memory only so far) is GPM's
# once any part of the row was measured by GPM.
_GPM_WINS = ", measured_by = CASE WHEN excluded.measured_by = 'gpm' THEN 'gpm' ELSE measured_by END"
_SLOT_PIECE_COLUMNS = (*_PieceRow._fields, *_SLOT_COLUMNS)
_SLOT_PIECE_UPSERT = (
    f"INSERT INTO pieces ({_columns(_SLOT_PIECE_COLUMNS)})"
    f" VALUES ({_placeholders(_SLOT_PIECE_COLUMNS)})" + _PIECE_SET + _GPM_WINS
)

_JOB_ACC_COLUMNS = ("job_id", "restart", "uuid", *_JobAccRow._fields)
_JOB_ACC_SET = " ON CONFLICT(job_id, restart, uuid) DO UPDATE SET " + ", ".join(
    (
        _summed("covered"),
        _summed("util_sum"),
        _summed("util_count"),
        _known("max", "util_max"),
        _summed("active_seconds"),
        _known("max", "mem_max"),
        _summed("mem_gib_seconds"),
        _known("+", "energy"),
        _summed("readings"),
        *_GPM_SUMS,
    )
)
_JOB_ACC_UPSERT = (
    f"INSERT INTO job_acc ({_columns(_JOB_ACC_COLUMNS)})"
    f" VALUES ({_placeholders(_JOB_ACC_COLUMNS)})" + _JOB_ACC_SET
)
_SLOT_JOB_ACC_COLUMNS = (*_JOB_ACC_COLUMNS, *_SLOT_COLUMNS)
_SLOT_JOB_ACC_UPSERT = (
    f"INSERT INTO job_acc ({_columns(_SLOT_JOB_ACC_COLUMNS)})"
    f" VALUES ({_placeholders(_SLOT_JOB_ACC_COLUMNS)})" + _JOB_ACC_SET + _GPM_WINS
)

_PHYSICAL_UPSERT = (
    f"INSERT INTO physical ({_columns(_PHYSICAL_COLUMNS)})"
    f" VALUES ({_placeholders(_PHYSICAL_COLUMNS)})"
    " ON CONFLICT(uuid, period_start) DO UPDATE SET "
    + ", ".join(
        (
            "start = min(start, excluded.start)",
            "end = max(end, excluded.end)",
            _summed("covered_seconds"),
            _known("+", "power_joules"),
            _summed("power_seconds"),
            _known("+", "energy"),
            _known("max", "temp_max"),
            _known("max", "ecc"),  # a running total: merged out of order, its largest
            _known("max", "mem_max"),
            "mem_total = coalesce(excluded.mem_total, mem_total)",
        )
    )
)

_SPAN_INSERT = (
    f"INSERT OR IGNORE INTO spans ({_columns(_SPAN_COLUMNS)})"
    f" VALUES ({_placeholders(_SPAN_COLUMNS)})"
)


# Sealing: a GPU's periods that ended, an ended run's periods (built once: a statement
# is looked up in the connection's cache by its text)
_GPU_PERIODS = "uuid = ? AND period_start <= ?"
# A GPU with slots (MIG, shares): its own rows and its slots'
_SLOTTED_PERIODS = "(uuid = ?1 OR parent = ?1) AND period_start <= ?2"
_RUN_PERIODS = "job_id = ? AND restart = ?"
_SELECT_PIECES = f"SELECT {_columns(_SLOT_PIECE_COLUMNS)} FROM pieces WHERE "
_SELECT_GPU_PERIODS = f"{_SELECT_PIECES}{_GPU_PERIODS} ORDER BY period_start"
_SELECT_SLOTTED_PERIODS = f"{_SELECT_PIECES}{_SLOTTED_PERIODS} ORDER BY uuid, period_start"
_SELECT_RUN_PERIODS = f"{_SELECT_PIECES}{_RUN_PERIODS} ORDER BY uuid, period_start"
_DELETE_GPU_PERIODS = f"DELETE FROM pieces WHERE {_GPU_PERIODS}"
_DELETE_SLOTTED_PERIODS = f"DELETE FROM pieces WHERE {_SLOTTED_PERIODS}"
_DELETE_RUN_PERIODS = f"DELETE FROM pieces WHERE {_RUN_PERIODS}"
_SELECT_PHYSICAL = (
    f"SELECT {_columns(_PHYSICAL_COLUMNS)} FROM physical"
    " WHERE uuid = ? AND period_start <= ? ORDER BY period_start"
)
_DELETE_PHYSICAL = "DELETE FROM physical WHERE uuid = ? AND period_start <= ?"
_PIECE_WIDTH = len(_PieceRow._fields)

_NO_GPM = (0.0,) * len(_GPM_COLUMNS)  # _GPM_COLUMNS of a piece GPM did not measure


def _gpm_terms(piece: Piece) -> tuple[float, ...]:
    """One piece's values of _GPM_COLUMNS: gpm_seconds, then each figure's psec and sec."""
    seconds = piece.gpm_seconds
    if seconds <= 0:
        return _NO_GPM
    terms = [seconds]
    for value in (
        piece.sm_active_percent,
        piece.sm_occupancy_percent,
        piece.tensor_active_percent,
        piece.dram_bw_percent,
    ):
        terms += (0.0, 0.0) if value is None else (value * seconds, seconds)
    return tuple(terms)


def _gpm_means(row: _PieceRow | _JobAccRow) -> dict[str, Any]:
    """The model's GPM fields from a row's sums: None where a figure was never measured."""
    means: dict[str, Any] = {"gpm_seconds": row.gpm_seconds}
    for mean, psec_column, sec_column in _GPM_MEANS:
        psec, sec = getattr(row, psec_column), getattr(row, sec_column)
        means[mean] = psec / sec if sec > 0 else None
    return means


def _slot_fields(uuid: str, slot: _Slot) -> dict[str, Any]:
    """A model's slot fields from a row's slot columns (a whole GPU's: the defaults)."""
    if not slot.parent:
        return {}
    return {
        "slot_id": uuid,
        "slot_kind": SlotKind(slot.slot_kind),
        "share": slot.share,
        "mig_profile": slot.mig_profile,
        "measured_by": Measurement(slot.measured_by),
    }


def _mean_power(row: _PieceRow) -> float | None:
    # power_seconds counts only the pieces whose power was read, so they are both known
    # or both absent (0 seconds).
    if row.power_joules is None or not row.power_seconds:
        return None
    return row.power_joules / row.power_seconds


class PieceBatch:
    """A tick's pieces, merged into `pieces` and `job_acc` by one executemany per table.

    The rows are merged in the order added, so the result is the one of an upsert per
    piece; what reads those tables (sealing, a job's end) must come after `flush`.
    """

    __slots__ = ("_physical", "_pieces", "_slot_pieces", "_slot_totals", "_totals")

    def __init__(self) -> None:
        self._pieces: list[tuple[Any, ...]] = []
        self._totals: list[tuple[Any, ...]] = []
        self._slot_pieces: list[tuple[Any, ...]] = []
        self._slot_totals: list[tuple[Any, ...]] = []
        self._physical: list[tuple[Any, ...]] = []

    def add(
        self,
        uuid: str,
        model: str,
        piece: Piece,
        mem_total: int | None,
        temperature: float | None,
        ecc: int | None,
        unallocated: tuple[int, ...],
    ) -> None:
        """One piece: its period row's terms (_PieceRow order) and its job's (_JOB_ACC_COLUMNS)."""
        job = piece.job_id if piece.job_id is not None else NO_JOB
        seconds = piece.end - piece.start
        active = seconds * piece.active_count / piece.util_count if piece.util_count else 0.0
        power = piece.power_watts
        power_joules = None if power is None else power * seconds
        gpm = _gpm_terms(piece)
        mem_gib_seconds = piece.mem_gib_seconds  # the period's and the run's: one value
        self._pieces.append(
            (
                uuid,
                job,
                piece.period_start,
                piece.start,
                piece.end,
                piece.util_sum,
                piece.util_count,
                piece.util_max,
                piece.util_min,
                active,
                seconds,  # covered_seconds
                piece.mem_used_bytes,  # mem_max
                mem_total,
                power_joules,
                seconds if power_joules is not None else 0.0,  # power_seconds
                piece.energy_joules,
                temperature,  # temp_max
                ecc,
                ",".join(map(str, sorted(unallocated))) if unallocated else "",
                piece.restart,
                mem_gib_seconds,
                *gpm,
            )
        )
        if job == NO_JOB:
            return
        self._totals.append(
            (
                job,
                piece.restart,
                uuid,
                model,
                seconds,  # covered
                piece.util_sum,
                piece.util_count,
                piece.util_max,
                active,
                piece.mem_used_bytes,  # mem_max
                mem_gib_seconds,
                piece.energy_joules,
                1,  # readings
                *gpm,
            )
        )

    def add_slot(
        self,
        slot: GpuSlot,
        model: str,
        piece: Piece,
        mem_total: int | None,
        measured_by: Measurement,
        unallocated: tuple[int, ...] = (),
    ) -> None:
        """One piece of a MIG slice or a share: as `add`, with the slot's columns.

        The physical GPU's figures (power, energy, temperature, ECC) are not a slot's:
        they are None in its rows (`add_physical` keeps them per GPU).
        """
        n_pieces, n_totals = len(self._pieces), len(self._totals)
        bare = piece._replace(power_watts=None, energy_joules=None)
        self.add(slot.slot_id, model, bare, mem_total, None, None, unallocated)
        columns = (
            slot.parent_uuid,
            slot.kind.value,
            slot.share,
            slot.mig_profile,
            measured_by.value,
        )
        # moved to the slot lists (the whole-GPU ones stay as they were)
        self._slot_pieces += [(*row, *columns) for row in self._pieces[n_pieces:]]
        self._slot_totals += [(*row, *columns) for row in self._totals[n_totals:]]
        del self._pieces[n_pieces:], self._totals[n_totals:]

    def add_physical(
        self,
        uuid: str,
        piece: Piece,
        mem_total: int | None,
        temperature: float | None,
        ecc: int | None,
    ) -> None:
        """One piece of a physical GPU's own totals (a GPU in MIG mode or shared)."""
        seconds = piece.end - piece.start
        power = piece.power_watts
        self._physical.append(
            (
                uuid,
                piece.period_start,
                piece.start,
                piece.end,
                seconds,
                None if power is None else power * seconds,
                seconds if power is not None else 0.0,
                piece.energy_joules,
                temperature,
                ecc,
                piece.mem_used_bytes,
                mem_total,
            )
        )

    def flush(self, db: sqlite3.Connection) -> None:
        """Writes the pieces added since the last flush."""
        if self._pieces:
            db.executemany(_PIECE_UPSERT, self._pieces)
            self._pieces.clear()
        if self._totals:
            db.executemany(_JOB_ACC_UPSERT, self._totals)
            self._totals.clear()
        if self._slot_pieces:
            db.executemany(_SLOT_PIECE_UPSERT, self._slot_pieces)
            self._slot_pieces.clear()
        if self._slot_totals:
            db.executemany(_SLOT_JOB_ACC_UPSERT, self._slot_totals)
            self._slot_totals.clear()
        if self._physical:
            db.executemany(_PHYSICAL_UPSERT, self._physical)
            self._physical.clear()


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

    # --- spans -----------------------------------------------------------------------

    def spans(self) -> list[JobSpan]:
        """Every job span the agent knows (running, or ended but not yet summarized)."""
        rows = self._db.execute(f"SELECT {_columns(_SPAN_COLUMNS)} FROM spans")
        return [
            JobSpan(job, index, start, end, user or "", account or "", partition or "", *rest)
            for job, index, start, end, user, account, partition, *rest in rows
        ]

    @staticmethod
    def apply_event(db: sqlite3.Connection, event: JobEvent) -> None:
        """Records an event: queues it for the store and opens or closes its spans.

        The run (`restart`) is the hooks' SLURM_RESTART_COUNT where slurmd gives it. Where
        it does not (Slurm's prolog environment lacks it on some releases), a prolog after
        an epilog of the same job on this node starts the next run; an epilog ends the
        job's open run. So a requeued job's second run never merges into its first.
        """
        event = replace(event, restart=Spool._run_of(db, event))
        payload = asdict(event)
        if not event.sluid:
            # The payload of a job without a SLUID (Slurm before 25.11) stays the one an
            # agent before SLUIDs wrote, which that agent can still read back.
            del payload["sluid"]
        if not event.shards and not event.shard_kind:
            del payload["shards"], payload["shard_kind"]  # likewise, without shares
        if not event.state:
            del payload["state"]  # likewise, for an epilog's event
        db.execute(
            "INSERT OR IGNORE INTO outbox (kind, key, payload) VALUES ('event', ?, ?)",
            (event.key, encode(payload)),
        )
        if event.kind is JobEventKind.STARTED:
            for index in event.gpu_indices:
                Spool.add_span(
                    db,
                    JobSpan(
                        event.job_id,
                        index,
                        event.time,
                        None,
                        event.user,
                        event.account,
                        event.partition,
                        event.restart,
                        event.shards,
                        event.shard_kind,
                    ),
                )
        else:
            db.execute(
                "UPDATE spans SET end = ? WHERE job_id = ? AND restart = ? AND end IS NULL",
                (event.time, event.job_id, event.restart),
            )

    @staticmethod
    def _run_of(db: sqlite3.Connection, event: JobEvent) -> int:
        """The run an event belongs to: the hooks' count, or what this node saw of the job."""
        if event.kind is JobEventKind.ENDED:
            # An epilog ends the run open on this node, whatever count it carries: Slurm
            # counts a requeue before the requeued run's epilog runs (22.05: that epilog
            # has SLURM_JOB_RESTART_COUNT=1 for run 0), so its count names the next run.
            open_run = db.execute(
                "SELECT max(restart) FROM spans WHERE job_id = ? AND end IS NULL", (event.job_id,)
            ).fetchone()[0]
            return int(open_run) if open_run is not None else event.restart
        ended = db.execute(
            "SELECT max(restart) FROM spans WHERE job_id = ? AND end IS NOT NULL AND end <= ?",
            (event.job_id, event.time),
        ).fetchone()[0]
        restart = max(event.restart, ended + 1) if ended is not None else event.restart
        # A started event of an earlier run still waiting in the outbox (the store was
        # down while that run was summarized): this prolog is a later run's.
        while True:
            key = replace(event, restart=restart).key
            found = db.execute("SELECT payload FROM outbox WHERE key = ?", (key,)).fetchone()
            if found is None or json.loads(found[0]).get("time") == event.time:
                return restart
            restart += 1

    @staticmethod
    def add_span(db: sqlite3.Connection, span: JobSpan) -> None:
        """Adds a span (kept as it is when that run of the job already holds the index)."""
        db.execute(_SPAN_INSERT, tuple(getattr(span, name) for name in _SPAN_COLUMNS))

    # --- pieces and accumulators -------------------------------------------------------

    @staticmethod
    def add_piece(
        db: sqlite3.Connection,
        uuid: str,
        model: str,
        piece: Piece,
        mem_total: int | None,
        temperature: float | None,
        ecc: int | None,
        unallocated: tuple[int, ...],
    ) -> None:
        """Merges one piece into its open period row and into its job's totals."""
        batch = PieceBatch()
        batch.add(uuid, model, piece, mem_total, temperature, ecc, unallocated)
        batch.flush(db)

    @classmethod
    def seal_periods(
        cls, db: sqlite3.Connection, node: str, uuid: str, before: float, slotted: bool = False
    ) -> int:
        """Moves this GPU's period rows that ended by `before` to the outbox.

        With `slotted`, also the rows of its slots (MIG slices, shares: their `parent` is
        this GPU). Its physical totals of those periods follow them (`physical` rows).
        Returns the interval rows queued.
        """
        if slotted:
            rows = db.execute(_SELECT_SLOTTED_PERIODS, (uuid, before)).fetchall()
            cls._seal(db, node, rows)
            db.execute(_DELETE_SLOTTED_PERIODS, (uuid, before))
        else:
            rows = db.execute(_SELECT_GPU_PERIODS, (uuid, before)).fetchall()
            cls._seal(db, node, rows)
            db.execute(_DELETE_GPU_PERIODS, (uuid, before))  # the rows sealed
        cls._seal_physical(db, node, uuid, before)
        return len(rows)

    @staticmethod
    def _seal_physical(db: sqlite3.Connection, node: str, uuid: str, before: float) -> None:
        """Queues this GPU's physical totals of the periods that ended by `before`."""
        found = db.execute(_SELECT_PHYSICAL, (uuid, before)).fetchall()
        if not found:
            return
        queued = []
        for r in map(_PhysicalRow._make, found):
            physical = GpuPhysicalInterval(
                node=node,
                gpu_uuid=r.uuid,
                period_start=r.start,
                period_end=r.end,
                covered_seconds=r.covered_seconds,
                power_mean_watts=(
                    r.power_joules / r.power_seconds
                    if r.power_joules is not None and r.power_seconds
                    else None
                ),
                energy_joules=r.energy,
                temperature_max_celsius=r.temp_max,
                ecc_errors_total=r.ecc,
                mem_used_max_bytes=r.mem_max,
                mem_total_bytes=r.mem_total,
            )
            key = f"physical:{node}:{r.uuid}:{r.start!r}"
            queued.append((key, encode(fields_of(physical))))
        db.executemany(
            "INSERT OR IGNORE INTO outbox (kind, key, payload) VALUES ('physical', ?, ?)", queued
        )
        db.execute(_DELETE_PHYSICAL, (uuid, before))

    @classmethod
    def seal_job(cls, db: sqlite3.Connection, node: str, job_id: int, restart: int = 0) -> int:
        """Moves an ended run's open period rows to the outbox, ahead of its summaries.

        Without this a job's last period would reach the store after its summary, and a
        reader who trusts the summary would see intervals short of it.
        """
        rows = db.execute(_SELECT_RUN_PERIODS, (job_id, restart)).fetchall()
        cls._seal(db, node, rows)
        db.execute(_DELETE_RUN_PERIODS, (job_id, restart))  # the rows sealed
        return len(rows)

    @staticmethod
    def _seal(db: sqlite3.Connection, node: str, rows: list[tuple[Any, ...]]) -> None:
        """Queues period rows (_SLOT_PIECE_COLUMNS) as intervals; the caller deletes them.

        A whole GPU's rows are also merged into its physical totals (`physical`), which
        its own seal queues once the period is over.
        """
        queued = []
        physical = []
        for row in rows:
            r = _PieceRow._make(row[:_PIECE_WIDTH])
            slot = _Slot._make(row[_PIECE_WIDTH:])
            if not slot.parent:
                physical.append(
                    (
                        r.uuid,
                        r.period_start,
                        r.start,
                        r.end,
                        r.covered_seconds,
                        r.power_joules,
                        r.power_seconds,
                        r.energy,
                        r.temp_max,
                        r.ecc,
                        r.mem_max,
                        r.mem_total,
                    )
                )
            interval = GpuInterval(
                node=node,
                gpu_uuid=slot.parent or r.uuid,
                period_start=r.start,
                period_end=r.end,
                job_id=None if r.job_id == NO_JOB else r.job_id,
                util_mean_percent=r.util_sum / r.util_count if r.util_count else None,
                util_max_percent=r.util_max,
                util_min_percent=r.util_min,
                util_sample_count=r.util_count,
                active_seconds=r.active_seconds,
                covered_seconds=r.covered_seconds,
                mem_used_max_bytes=r.mem_max,
                mem_total_bytes=r.mem_total,
                mem_gib_seconds=r.mem_gib_seconds,
                power_mean_watts=_mean_power(r),
                energy_joules=r.energy,
                temperature_max_celsius=r.temp_max,
                ecc_errors_total=r.ecc,
                unallocated_pids=tuple(map(int, r.unallocated.split(","))) if r.unallocated else (),
                **_gpm_means(r),
                **_slot_fields(r.uuid, slot),
            )
            # keyed by its slot: two shares of one GPU in one period are two rows
            key = f"{node}:{interval.effective_slot_id}:{r.start!r}"
            queued.append((key, encode(fields_of(interval))))
        db.executemany(
            "INSERT OR IGNORE INTO outbox (kind, key, payload) VALUES ('interval', ?, ?)", queued
        )
        if physical:
            db.executemany(_PHYSICAL_UPSERT, physical)

    @staticmethod
    def finish_job(
        db: sqlite3.Connection,
        node: str,
        job_id: int,
        uuids: Mapping[int, str],
        restart: int = 0,
        slot_of: SlotOf | None = None,
    ) -> list[JobGpuSummary]:
        """Turns an ended run's totals into summaries in the outbox; forgets the run.

        Args:
            db: the open transaction.
            node: this node's name.
            job_id: the ended job.
            uuids: {Slurm GPU index: slot id (GPU or MIG UUID)} on this node.
            restart: which run of the job ended (0: the first; Slurm's restart count).
            slot_of: the slot a span held and how it is measured, from (Slurm index,
                shards, shard_kind, job, restart); None for the index's whole GPU. A slot's
                totals, where it has any, say its slot themselves.

        Returns:
            One summary per slot (whole GPU, MIG slice, share) the run held here; its
            GPU-seconds are the slot's held time (the share is recorded beside them).
        """
        Spool.seal_job(db, node, job_id, restart)
        spans = db.execute(
            "SELECT slurm_index, start, end, user, account, partition, shards, shard_kind"
            " FROM spans WHERE job_id = ? AND restart = ? AND end IS NOT NULL",
            (job_id, restart),
        ).fetchall()
        summaries: list[JobGpuSummary] = []
        for index, start, end, user, account, partition, shards, shard_kind in spans:
            held = slot_of(index, shards, shard_kind, job_id, restart) if slot_of else None
            uuid = held[0].slot_id if held else uuids.get(index, f"unresolved-index-{index}")
            found = db.execute(
                f"SELECT {_columns((*_JobAccRow._fields, *_SLOT_COLUMNS))} FROM job_acc"
                " WHERE job_id = ? AND restart = ? AND uuid = ?",
                (job_id, restart, uuid),
            ).fetchone()
            acc = _JobAccRow(*found[: len(_JobAccRow._fields)]) if found else _NO_ACC
            if found and found[len(_JobAccRow._fields)]:  # a slot's totals (parent set)
                slot = _Slot._make(found[len(_JobAccRow._fields) :])
            elif held and held[0].kind is not SlotKind.GPU:
                kept = held[0]
                slot = _Slot(
                    kept.parent_uuid, kept.kind.value, kept.share, kept.mig_profile, held[1].value
                )
            else:
                slot = _Slot("", SlotKind.GPU.value, 1.0, "", Measurement.NVML.value)
            gpu_seconds = max(0.0, end - start)
            # Less than a second unaccounted is clock granularity, not missing data.
            missing = gpu_seconds - acc.covered
            summary = JobGpuSummary(
                job_id=job_id,
                node=node,
                gpu_uuid=slot.parent or uuid,
                gpu_model=acc.model,
                start=start,
                end=end,
                gpu_seconds=gpu_seconds,
                util_mean_percent=acc.util_sum / acc.util_count if acc.util_count else None,
                util_max_percent=acc.util_max,
                active_seconds=acc.active_seconds,
                mem_max_bytes=acc.mem_max,
                mem_gib_seconds=acc.mem_gib_seconds,
                energy_joules=acc.energy,
                reading_count=acc.readings,
                missing_seconds=missing if missing >= 1.0 else 0.0,
                user=user or "",
                account=account or "",
                partition=partition or "",
                restart=restart,
                **_gpm_means(acc),
                **_slot_fields(uuid, slot),
            )
            summaries.append(summary)
            db.execute(
                "INSERT OR IGNORE INTO outbox (kind, key, payload) VALUES ('summary', ?, ?)",
                (summary.key, encode(fields_of(summary))),
            )
        db.execute("DELETE FROM job_acc WHERE job_id = ? AND restart = ?", (job_id, restart))
        db.execute(
            "DELETE FROM spans WHERE job_id = ? AND restart = ? AND end IS NOT NULL",
            (job_id, restart),
        )
        return summaries

    @staticmethod
    def queue(db: sqlite3.Connection, kind: str, key: str, payload: Any) -> None:
        """Queues any JSON-able payload for shipping under an idempotency key.

        A payload queued again under its key replaces the row queued before and takes the
        newest place in the outbox: REPLACE deletes the old row and inserts anew, and
        AUTOINCREMENT never reuses an id. Rows ship in that order (`pending`), so a tick's
        heartbeat ships behind every row queued before it (issue 16, ship_less.py).
        """
        db.execute(
            "INSERT OR REPLACE INTO outbox (kind, key, payload) VALUES (?, ?, ?)",
            (kind, key, encode(payload)),
        )

    # --- outbox ------------------------------------------------------------------------

    def pending(self, limit: int) -> list[OutboxRow]:
        """The oldest `limit` outbox rows, in the order they were (last) queued."""
        rows = self._db.execute(
            "SELECT id, kind, key, payload FROM outbox ORDER BY id LIMIT ?", (limit,)
        )
        return [OutboxRow(*r) for r in rows]

    def delete(self, ids: list[int]) -> None:
        """Forgets outbox rows the store has committed."""
        with self.transaction() as db:
            db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])

    def backlog(self) -> int:
        """Rows waiting to be shipped."""
        return int(self._db.execute("SELECT count(*) FROM outbox").fetchone()[0])

    def quarantine(self, rows: list[tuple[int, str]], now: float) -> None:
        """Moves outbox rows that cannot be shipped into `quarantine`, whole.

        Args:
            rows: (outbox id, why it cannot be shipped).
            now: when, POSIX seconds.
        """
        with self.transaction() as db:
            for row_id, error in rows:
                db.execute(
                    "INSERT INTO quarantine (kind, key, payload, error, quarantined_at)"
                    " SELECT kind, key, payload, ?, ? FROM outbox WHERE id = ?",
                    (error, now, row_id),
                )
                db.execute("DELETE FROM outbox WHERE id = ?", (row_id,))

    def quarantined(self) -> list[QuarantinedRow]:
        """Quarantined rows, oldest first."""
        rows = self._db.execute("SELECT kind, key, payload, error FROM quarantine ORDER BY id")
        return [QuarantinedRow(*r) for r in rows]
