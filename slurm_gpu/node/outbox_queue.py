"""The outbox queue: rows waiting in the spool until the store has committed them.

Each row is a kind, an idempotency key and a payload encoded by outbox.py; rows ship in
the order they were (last) queued and are deleted only after the store committed them.
A row that cannot be decoded is moved, whole, to `quarantine` for the admin instead of
blocking the rows behind it. The functions here work in the caller's connection (a
`Spool.transaction()` where they write).
"""

from __future__ import annotations

import sqlite3
from typing import Any, NamedTuple

from slurm_gpu.node.outbox import encode

__all__ = [
    "OutboxRow",
    "QuarantinedRow",
    "backlog",
    "delete",
    "pending",
    "quarantine",
    "quarantined",
    "queue",
]


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


def pending(db: sqlite3.Connection, limit: int) -> list[OutboxRow]:
    """The oldest `limit` outbox rows, in the order they were (last) queued."""
    rows = db.execute("SELECT id, kind, key, payload FROM outbox ORDER BY id LIMIT ?", (limit,))
    return [OutboxRow(*r) for r in rows]


def delete(db: sqlite3.Connection, ids: list[int]) -> None:
    """Forgets outbox rows the store has committed (in the caller's transaction)."""
    db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])


def backlog(db: sqlite3.Connection) -> int:
    """Rows waiting to be shipped."""
    return int(db.execute("SELECT count(*) FROM outbox").fetchone()[0])


def quarantine(db: sqlite3.Connection, rows: list[tuple[int, str]], now: float) -> None:
    """Moves outbox rows that cannot be shipped into `quarantine`, whole.

    Args:
        db: the open transaction.
        rows: (outbox id, why it cannot be shipped).
        now: when, POSIX seconds.
    """
    for row_id, error in rows:
        db.execute(
            "INSERT INTO quarantine (kind, key, payload, error, quarantined_at)"
            " SELECT kind, key, payload, ?, ? FROM outbox WHERE id = ?",
            (error, now, row_id),
        )
        db.execute("DELETE FROM outbox WHERE id = ?", (row_id,))


def quarantined(db: sqlite3.Connection) -> list[QuarantinedRow]:
    """Quarantined rows, oldest first."""
    rows = db.execute("SELECT kind, key, payload, error FROM quarantine ORDER BY id")
    return [QuarantinedRow(*r) for r in rows]
