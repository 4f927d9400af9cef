"""The agent's local spool: SQLite in WAL mode, written before anything is shipped.

What the agent has seen lives here until the accounting store has committed it:
- `outbox`: rows ready to ship (intervals, events, summaries, inventory), each with an
  idempotency key; deleted only after the store committed them.
- `pieces`: the open shipping period of each GPU and job, merged tick by tick and sealed
  into an `interval` outbox row once the period is over.
- `spans`: the jobs holding GPUs on this node (from the hooks' events).
- `job_acc`: running per-job-per-GPU totals, turned into summaries at the job's end.
- `gpu_state`: per GPU, when it was last read, its newest sample and energy counter, so a
  restarted agent neither double counts nor invents the time it was down.
- `quarantine`: outbox rows that could not be decoded (a damaged payload, an unknown
  kind), kept whole with the reason for the admin instead of blocking the outbox.
Every tick is one transaction: a crash loses at most the tick in progress.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.models import (
    GpuActivity,
    GpuDevice,
    GpuInterval,
    JobEvent,
    JobEventKind,
    JobGpuSummary,
)
from slurm_gpu.node.attribution import JobSpan, Piece

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    key TEXT NOT NULL UNIQUE,
    payload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pieces (
    uuid TEXT NOT NULL, job_id INTEGER NOT NULL, period_start REAL NOT NULL,
    start REAL NOT NULL, end REAL NOT NULL,
    util_sum REAL NOT NULL, util_count INTEGER NOT NULL,
    util_max REAL, util_min REAL, active_seconds REAL NOT NULL,
    covered_seconds REAL NOT NULL, mem_max INTEGER, mem_total INTEGER,
    power_joules REAL, power_seconds REAL NOT NULL, energy REAL,
    temp_max REAL, ecc INTEGER, unallocated TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (uuid, job_id, period_start)
);
CREATE TABLE IF NOT EXISTS spans (
    job_id INTEGER NOT NULL, slurm_index INTEGER NOT NULL,
    start REAL NOT NULL, end REAL, user TEXT, account TEXT, partition TEXT,
    PRIMARY KEY (job_id, slurm_index)
);
CREATE TABLE IF NOT EXISTS job_acc (
    job_id INTEGER NOT NULL, uuid TEXT NOT NULL, model TEXT NOT NULL,
    covered REAL NOT NULL DEFAULT 0, util_sum REAL NOT NULL DEFAULT 0,
    util_count INTEGER NOT NULL DEFAULT 0, util_max REAL,
    active_seconds REAL NOT NULL DEFAULT 0, mem_max INTEGER,
    mem_gib_seconds REAL NOT NULL DEFAULT 0, energy REAL, readings INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, uuid)
);
CREATE TABLE IF NOT EXISTS gpu_state (
    uuid TEXT PRIMARY KEY, last_read REAL, last_sample REAL, last_energy REAL
);
CREATE TABLE IF NOT EXISTS quarantine (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    error TEXT NOT NULL,
    quarantined_at REAL NOT NULL
);
"""

NO_JOB = 0  # pieces.job_id for time a GPU was held by no job (Slurm job ids start at 1)


class SpoolError(SlurmGpuError):
    """The spool database cannot be opened or written (disk full, permissions), or an
    outbox payload does not decode into its model."""


class Spool:
    """One node's spool database.

    Args:
        path: the SQLite file (its directory is created).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise SpoolError(f"spool {path}: {exc}") from exc

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
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    @staticmethod
    def set_gpu_state(
        db: sqlite3.Connection,
        uuid: str,
        last_read: float,
        last_sample: float | None,
        last_energy: float | None,
    ) -> None:
        """Remembers where this GPU's next read starts."""
        db.execute(
            "INSERT INTO gpu_state VALUES (?, ?, ?, ?) ON CONFLICT(uuid) DO UPDATE SET"
            " last_read=excluded.last_read, last_sample=excluded.last_sample,"
            " last_energy=excluded.last_energy",
            (uuid, last_read, last_sample, last_energy),
        )

    # --- spans -----------------------------------------------------------------------

    def spans(self) -> list[JobSpan]:
        """Every job span the agent knows (running, or ended but not yet summarized)."""
        rows = self._db.execute(
            "SELECT job_id, slurm_index, start, end, user, account, partition FROM spans"
        )
        return [JobSpan(r[0], r[1], r[2], r[3], r[4] or "", r[5] or "", r[6] or "") for r in rows]

    @staticmethod
    def apply_event(db: sqlite3.Connection, event: JobEvent) -> None:
        """Records an event: queues it for the store and opens or closes its spans."""
        payload = json.dumps(asdict(event), default=_jsonable)
        db.execute(
            "INSERT OR IGNORE INTO outbox (kind, key, payload) VALUES ('event', ?, ?)",
            (event.key, payload),
        )
        if event.kind is JobEventKind.STARTED:
            for index in event.gpu_indices:
                db.execute(
                    "INSERT OR IGNORE INTO spans VALUES (?, ?, ?, NULL, ?, ?, ?)",
                    (event.job_id, index, event.time, event.user, event.account, event.partition),
                )
        else:
            db.execute(
                "UPDATE spans SET end = ? WHERE job_id = ? AND end IS NULL",
                (event.time, event.job_id),
            )

    @staticmethod
    def add_span(db: sqlite3.Connection, span: JobSpan) -> None:
        """Adds a span found only as a binding (its started event was lost)."""
        db.execute(
            "INSERT OR IGNORE INTO spans VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                span.job_id,
                span.slurm_index,
                span.start,
                span.end,
                span.user,
                span.account,
                span.partition,
            ),
        )

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
        job = piece.job_id if piece.job_id is not None else NO_JOB
        seconds = piece.seconds
        active = seconds * piece.active_count / piece.util_count if piece.util_count else 0.0
        power_joules = None if piece.power_watts is None else piece.power_watts * seconds
        pids = ",".join(str(p) for p in sorted(unallocated))
        db.execute(
            """INSERT INTO pieces VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
            ON CONFLICT(uuid, job_id, period_start) DO UPDATE SET
              start = min(start, excluded.start), end = max(end, excluded.end),
              util_sum = util_sum + excluded.util_sum,
              util_count = util_count + excluded.util_count,
              util_max = CASE WHEN util_max IS NULL THEN excluded.util_max
                WHEN excluded.util_max IS NULL THEN util_max
                ELSE max(util_max, excluded.util_max) END,
              util_min = CASE WHEN util_min IS NULL THEN excluded.util_min
                WHEN excluded.util_min IS NULL THEN util_min
                ELSE min(util_min, excluded.util_min) END,
              active_seconds = active_seconds + excluded.active_seconds,
              covered_seconds = covered_seconds + excluded.covered_seconds,
              mem_max = CASE WHEN mem_max IS NULL THEN excluded.mem_max
                WHEN excluded.mem_max IS NULL THEN mem_max
                ELSE max(mem_max, excluded.mem_max) END,
              mem_total = coalesce(excluded.mem_total, mem_total),
              power_joules = CASE WHEN excluded.power_joules IS NULL THEN power_joules
                ELSE coalesce(power_joules, 0) + excluded.power_joules END,
              power_seconds = power_seconds + excluded.power_seconds,
              energy = CASE WHEN excluded.energy IS NULL THEN energy
                ELSE coalesce(energy, 0) + excluded.energy END,
              temp_max = CASE WHEN temp_max IS NULL THEN excluded.temp_max
                WHEN excluded.temp_max IS NULL THEN temp_max
                ELSE max(temp_max, excluded.temp_max) END,
              ecc = coalesce(excluded.ecc, ecc),
              unallocated = CASE WHEN excluded.unallocated = '' THEN unallocated
                ELSE excluded.unallocated END""",
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
                seconds,
                piece.mem_used_bytes,
                mem_total,
                power_joules,
                seconds if power_joules is not None else 0.0,
                piece.energy_joules,
                temperature,
                ecc,
                pids,
            ),
        )
        if job == NO_JOB:
            return
        mem_gib_seconds = (piece.mem_used_bytes or 0) / 2**30 * seconds
        db.execute(
            """INSERT INTO job_acc VALUES (?,?,?,?,?,?,?,?,?,?,?,1)
            ON CONFLICT(job_id, uuid) DO UPDATE SET
              covered = covered + excluded.covered,
              util_sum = util_sum + excluded.util_sum,
              util_count = util_count + excluded.util_count,
              util_max = CASE WHEN util_max IS NULL THEN excluded.util_max
                WHEN excluded.util_max IS NULL THEN util_max
                ELSE max(util_max, excluded.util_max) END,
              active_seconds = active_seconds + excluded.active_seconds,
              mem_max = CASE WHEN mem_max IS NULL THEN excluded.mem_max
                WHEN excluded.mem_max IS NULL THEN mem_max
                ELSE max(mem_max, excluded.mem_max) END,
              mem_gib_seconds = mem_gib_seconds + excluded.mem_gib_seconds,
              energy = CASE WHEN excluded.energy IS NULL THEN energy
                ELSE coalesce(energy, 0) + excluded.energy END,
              readings = readings + 1""",
            (
                job,
                uuid,
                model,
                seconds,
                piece.util_sum,
                piece.util_count,
                piece.util_max,
                active,
                piece.mem_used_bytes,
                mem_gib_seconds,
                piece.energy_joules,
            ),
        )

    @classmethod
    def seal_periods(cls, db: sqlite3.Connection, node: str, uuid: str, before: float) -> int:
        """Moves this GPU's period rows that ended by `before` to the outbox."""
        rows = db.execute(
            "SELECT * FROM pieces WHERE uuid = ? AND period_start <= ? ORDER BY period_start",
            (uuid, before),
        ).fetchall()
        return cls._seal(db, node, rows)

    @classmethod
    def seal_job(cls, db: sqlite3.Connection, node: str, job_id: int) -> int:
        """Moves an ended job's open period rows to the outbox, ahead of its summaries.

        Without this a job's last period would reach the store after its summary, and a
        reader who trusts the summary would see intervals short of it.
        """
        rows = db.execute(
            "SELECT * FROM pieces WHERE job_id = ? ORDER BY uuid, period_start", (job_id,)
        ).fetchall()
        return cls._seal(db, node, rows)

    @staticmethod
    def _seal(db: sqlite3.Connection, node: str, rows: list[Any]) -> int:
        sealed = 0
        for r in rows:
            (
                uuid,
                job,
                period,
                start,
                end,
                util_sum,
                util_count,
                util_max,
                util_min,
                active,
                covered,
                mem_max,
                mem_total,
                power_joules,
                power_seconds,
                energy,
                temp_max,
                ecc,
                pids,
            ) = r
            interval = GpuInterval(
                node=node,
                gpu_uuid=uuid,
                period_start=start,
                period_end=end,
                job_id=None if job == NO_JOB else job,
                util_mean_percent=util_sum / util_count if util_count else None,
                util_max_percent=util_max,
                util_min_percent=util_min,
                util_sample_count=util_count,
                active_seconds=active,
                covered_seconds=covered,
                mem_used_max_bytes=mem_max,
                mem_total_bytes=mem_total,
                power_mean_watts=power_joules / power_seconds if power_seconds else None,
                energy_joules=energy,
                temperature_max_celsius=temp_max,
                ecc_errors_total=ecc,
                unallocated_pids=tuple(int(p) for p in pids.split(",") if p),
            )
            db.execute(
                "INSERT OR IGNORE INTO outbox (kind, key, payload) VALUES ('interval', ?, ?)",
                (f"{node}:{uuid}:{start!r}", json.dumps(asdict(interval))),
            )
            db.execute(
                "DELETE FROM pieces WHERE uuid = ? AND job_id = ? AND period_start = ?",
                (uuid, job, period),
            )
            sealed += 1
        return sealed

    @staticmethod
    def finish_job(
        db: sqlite3.Connection, node: str, job_id: int, uuids: dict[int, str]
    ) -> list[JobGpuSummary]:
        """Turns an ended job's totals into summaries in the outbox; forgets the job.

        Args:
            uuids: {Slurm GPU index: uuid} on this node.
        """
        Spool.seal_job(db, node, job_id)
        spans = db.execute(
            "SELECT slurm_index, start, end, user, account, partition FROM spans WHERE job_id = ?",
            (job_id,),
        ).fetchall()
        summaries: list[JobGpuSummary] = []
        for index, start, end, user, account, partition in spans:
            uuid = uuids.get(index, f"unresolved-index-{index}")
            acc = db.execute(
                "SELECT model, covered, util_sum, util_count, util_max, active_seconds,"
                " mem_max, mem_gib_seconds, energy, readings FROM job_acc"
                " WHERE job_id = ? AND uuid = ?",
                (job_id, uuid),
            ).fetchone()
            model, covered, util_sum, util_count, util_max, active, mem_max, mem_gs, energy, n = (
                acc or ("", 0.0, 0.0, 0, None, 0.0, None, 0.0, None, 0)
            )
            gpu_seconds = max(0.0, end - start)
            # Less than a second unaccounted is clock granularity, not missing data.
            missing = gpu_seconds - covered
            summary = JobGpuSummary(
                job_id=job_id,
                node=node,
                gpu_uuid=uuid,
                gpu_model=model,
                start=start,
                end=end,
                gpu_seconds=gpu_seconds,
                util_mean_percent=util_sum / util_count if util_count else None,
                util_max_percent=util_max,
                active_seconds=active,
                mem_max_bytes=mem_max,
                mem_gib_seconds=mem_gs,
                energy_joules=energy,
                reading_count=n,
                missing_seconds=missing if missing >= 1.0 else 0.0,
                user=user or "",
                account=account or "",
                partition=partition or "",
            )
            summaries.append(summary)
            db.execute(
                "INSERT OR IGNORE INTO outbox (kind, key, payload) VALUES ('summary', ?, ?)",
                (f"{job_id}:{node}:{uuid}", json.dumps(asdict(summary))),
            )
        db.execute("DELETE FROM job_acc WHERE job_id = ?", (job_id,))
        db.execute("DELETE FROM spans WHERE job_id = ?", (job_id,))
        return summaries

    @staticmethod
    def queue(db: sqlite3.Connection, kind: str, key: str, payload: Any) -> None:
        """Queues any JSON-able payload for shipping under an idempotency key."""
        db.execute(
            "INSERT OR REPLACE INTO outbox (kind, key, payload) VALUES (?, ?, ?)",
            (kind, key, json.dumps(payload, default=_jsonable)),
        )

    # --- outbox ------------------------------------------------------------------------

    def pending(self, limit: int) -> list[tuple[int, str, str, str]]:
        """The oldest `limit` outbox rows: (id, kind, key, payload JSON)."""
        return self._db.execute(
            "SELECT id, kind, key, payload FROM outbox ORDER BY id LIMIT ?", (limit,)
        ).fetchall()

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

    def quarantined(self) -> list[tuple[str, str, str, str]]:
        """Quarantined rows, oldest first: (kind, key, payload, error)."""
        return self._db.execute(
            "SELECT kind, key, payload, error FROM quarantine ORDER BY id"
        ).fetchall()


def _jsonable(value: Any) -> Any:
    if isinstance(value, JobEventKind):
        return value.value
    raise TypeError(f"cannot serialise {type(value).__name__}")


# --- decoding outbox payloads ------------------------------------------------------------
# The outbox is written by this program, but it is a file on a node's disk that outlives
# upgrades and can be damaged; a payload is checked field by field, so a bad row is a
# SpoolError naming the row kind and field, never a TypeError deep in the store.

_M = TypeVar("_M")
_INT_RANGE = 2**63  # the store's BIGINT


def decode_interval(payload: str) -> GpuInterval:
    """An outbox `interval` payload back into its model. Raises SpoolError."""
    return _decode_model("interval", GpuInterval, _load("interval", payload))


def decode_event(payload: str) -> JobEvent:
    """An outbox `event` payload back into its model. Raises SpoolError."""
    return _decode_model("event", JobEvent, _load("event", payload))


def decode_summary(payload: str) -> JobGpuSummary:
    """An outbox `summary` payload back into its model. Raises SpoolError."""
    return _decode_model("summary", JobGpuSummary, _load("summary", payload))


def decode_activity(payload: str) -> GpuActivity:
    """An outbox `activity` payload back into its model. Raises SpoolError."""
    return _decode_model("activity", GpuActivity, _load("activity", payload))


def decode_inventory(payload: str) -> tuple[list[GpuDevice], float]:
    """An outbox `inventory` payload: (devices, seen_at). Raises SpoolError."""
    data = _load("inventory", payload)
    if not isinstance(data, dict) or set(data) != {"devices", "seen_at"}:
        raise SpoolError(
            f"outbox inventory row: expected an object with devices and seen_at, got {_brief(data)}"
        )
    devices = data["devices"]
    if not isinstance(devices, list):
        raise SpoolError(f"outbox inventory row: devices: expected a list, got {_brief(devices)}")
    seen_at = _decode_value("inventory", "seen_at", float, data["seen_at"])
    assert isinstance(seen_at, float)
    return [_decode_model("inventory", GpuDevice, d) for d in devices], seen_at


def _load(kind: str, payload: str) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, too-long integers
        raise SpoolError(f"outbox {kind} row: payload is not JSON ({exc})") from None


def _decode_model(kind: str, model: type[_M], data: Any) -> _M:
    if not isinstance(data, dict):
        raise SpoolError(f"outbox {kind} row: expected a JSON object, got {_brief(data)}")
    fields = {f.name: f for f in dataclasses.fields(model) if f.init}  # type: ignore[arg-type]
    unknown = sorted(str(name) for name in data if name not in fields)
    if unknown:
        raise SpoolError(f"outbox {kind} row: unknown field {_brief(unknown[0])}")
    hints = _hints(model)
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name in data:
            values[name] = _decode_value(kind, name, hints[name], data[name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise SpoolError(f"outbox {kind} row: field {name} is missing")
    return model(**values)


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(model: type[Any]) -> dict[str, Any]:
    if model not in _HINTS:  # resolving the string annotations is slow: once per model
        _HINTS[model] = typing.get_type_hints(model)
    return _HINTS[model]


def _decode_value(kind: str, name: str, hint: Any, value: Any) -> Any:
    """One field, checked against its annotation (str, int, float, enum, X | None,
    tuple[int, ...]: all the models' fields use)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        what = _EXPECTED.get(hint, "a value") + " or null"
    else:
        what = _EXPECTED.get(hint, "a list of integers")
    if hint is str and isinstance(value, str):
        return value
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int and number and isinstance(value, int) and -_INT_RANGE < value < _INT_RANGE:
        return value
    if hint is float and number:
        try:
            result = float(value)
        except OverflowError:  # an integer beyond a float's range
            result = math.inf
        if math.isfinite(result):
            return result
    if isinstance(hint, type) and issubclass(hint, JobEventKind) and value in list(hint):
        return hint(value)
    if typing.get_origin(hint) is tuple and isinstance(value, list):
        return tuple(_decode_value(kind, f"{name}[{i}]", int, v) for i, v in enumerate(value))
    if isinstance(hint, type) and issubclass(hint, JobEventKind):
        what = "one of " + ", ".join(k.value for k in hint)
    raise SpoolError(f"outbox {kind} row: field {name}: expected {what}, got {_brief(value)}")


_EXPECTED = {str: "a string", int: "an integer", float: "a finite number"}


def _brief(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
