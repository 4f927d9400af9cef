"""The controller's local audit spool: decisions made while the store is unavailable.

"Every decision is audited before it is acted on" holds through a store outage: the
controller appends each decision to this file (one JSON line, flushed and fsync'd) before
it acts, then appends what came of it, and writes every spooled row to the store's audit
log, in order, once the store answers again; only then is the file emptied. If the file
cannot be written either, the decision is not acted on.

A controller killed between the store's commit and the emptying writes those rows again
at its next start (a duplicate row, never a missing one).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


class AuditSpool:
    """Audit rows kept on the head node's disk until the store takes them.

    Args:
        path: the spool file ([controller] audit_spool); its directory is created on
            first use.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, rows: list[dict[str, Any]]) -> list[str]:
        """Spools audit rows (as `store.control.audit_row` builds them); returns their ids.

        Raises:
            OSError: the file could not be written and synced: nothing was spooled.
        """
        ids = [uuid.uuid4().hex for _ in rows]
        if rows:
            self._append([{"id": i, "row": row} for i, row in zip(ids, rows, strict=True)])
        return ids

    def update(self, spool_id: str, *, outcome: str | None = None, **details: object) -> None:
        """Records what came of a spooled row: its outcome, figures added to its details.

        Raises:
            OSError: the file could not be written.
        """
        record: dict[str, Any] = {"id": spool_id, "details": details}
        if outcome is not None:
            record["outcome"] = outcome
        self._append([record])

    def rows(self) -> list[dict[str, Any]]:
        """The spooled rows in order, each with its latest outcome and details merged in.

        A line cut short by a crash mid-write is skipped (it was never acted on: the
        controller acts only after the write returned).

        Raises:
            OSError: the file exists but cannot be read.
        """
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        rows: dict[str, dict[str, Any]] = {}
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "row" in record:
                rows[record["id"]] = dict(record["row"])
                continue
            row = rows.get(record.get("id", ""))
            if row is None:
                continue
            if "outcome" in record:
                row["outcome"] = record["outcome"]
            if record.get("details"):
                merged = {**json.loads(row.get("details") or "{}"), **record["details"]}
                row["details"] = json.dumps(merged, default=str, sort_keys=True)
        return list(rows.values())

    def clear(self) -> None:
        """Empties the spool (its rows are in the store)."""
        self.path.unlink(missing_ok=True)

    def _append(self, records: list[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        text = "".join(json.dumps(r, default=str, sort_keys=True) + "\n" for r in records)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        with os.fdopen(fd, "a") as spool:
            spool.write(text)
            spool.flush()
            os.fsync(spool.fileno())
