"""Sealing: a shipping period that is over, moved from the spool's tables to the outbox.

A GPU's (or its slots') `pieces` rows whose period ended become `interval` outbox rows
(GpuInterval), and its `physical` totals of those periods `physical` rows
(GpuPhysicalInterval); an ended run's open rows are sealed ahead of its summaries. A
whole GPU's physical totals are its period rows' totals, merged here as they are sealed.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from slurm_gpu.models import GpuInterval, GpuPhysicalInterval
from slurm_gpu.node.outbox import encode, fields_of
from slurm_gpu.node.spool_pieces import PHYSICAL_UPSERT
from slurm_gpu.node.spool_rows import (
    NO_JOB,
    PHYSICAL_COLUMNS,
    SLOT_PIECE_COLUMNS,
    PhysicalRow,
    PieceRow,
    SlotRow,
    columns,
    gpm_means,
    slot_fields,
)

__all__ = ["seal_job", "seal_periods"]

# Sealing: a GPU's periods that ended, an ended run's periods (built once: a statement
# is looked up in the connection's cache by its text)
_GPU_PERIODS = "uuid = ? AND period_start <= ?"
# A GPU with slots (MIG, shares): its own rows and its slots'
_SLOTTED_PERIODS = "(uuid = ?1 OR parent = ?1) AND period_start <= ?2"
_RUN_PERIODS = "job_id = ? AND restart = ?"
_SELECT_PIECES = f"SELECT {columns(SLOT_PIECE_COLUMNS)} FROM pieces WHERE "
_SELECT_GPU_PERIODS = f"{_SELECT_PIECES}{_GPU_PERIODS} ORDER BY period_start"
_SELECT_SLOTTED_PERIODS = f"{_SELECT_PIECES}{_SLOTTED_PERIODS} ORDER BY uuid, period_start"
_SELECT_RUN_PERIODS = f"{_SELECT_PIECES}{_RUN_PERIODS} ORDER BY uuid, period_start"
_DELETE_GPU_PERIODS = f"DELETE FROM pieces WHERE {_GPU_PERIODS}"
_DELETE_SLOTTED_PERIODS = f"DELETE FROM pieces WHERE {_SLOTTED_PERIODS}"
_DELETE_RUN_PERIODS = f"DELETE FROM pieces WHERE {_RUN_PERIODS}"
_SELECT_PHYSICAL = (
    f"SELECT {columns(PHYSICAL_COLUMNS)} FROM physical"
    " WHERE uuid = ? AND period_start <= ? ORDER BY period_start"
)
_DELETE_PHYSICAL = "DELETE FROM physical WHERE uuid = ? AND period_start <= ?"
_PIECE_WIDTH = len(PieceRow._fields)


def _mean_power(row: PieceRow) -> float | None:
    # power_seconds counts only the pieces whose power was read, so they are both known
    # or both absent (0 seconds).
    if row.power_joules is None or not row.power_seconds:
        return None
    return row.power_joules / row.power_seconds


def seal_periods(
    db: sqlite3.Connection, node: str, uuid: str, before: float, slotted: bool = False
) -> int:
    """Moves this GPU's period rows that ended by `before` to the outbox.

    With `slotted`, also the rows of its slots (MIG slices, shares: their `parent` is
    this GPU). Its physical totals of those periods follow them (`physical` rows).
    Returns the interval rows queued.
    """
    if slotted:
        rows = db.execute(_SELECT_SLOTTED_PERIODS, (uuid, before)).fetchall()
        _seal(db, node, rows)
        db.execute(_DELETE_SLOTTED_PERIODS, (uuid, before))
    else:
        rows = db.execute(_SELECT_GPU_PERIODS, (uuid, before)).fetchall()
        _seal(db, node, rows)
        db.execute(_DELETE_GPU_PERIODS, (uuid, before))  # the rows sealed
    _seal_physical(db, node, uuid, before)
    return len(rows)


def _seal_physical(db: sqlite3.Connection, node: str, uuid: str, before: float) -> None:
    """Queues this GPU's physical totals of the periods that ended by `before`."""
    found = db.execute(_SELECT_PHYSICAL, (uuid, before)).fetchall()
    if not found:
        return
    queued = []
    for r in map(PhysicalRow._make, found):
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


def seal_job(db: sqlite3.Connection, node: str, job_id: int, restart: int = 0) -> int:
    """Moves an ended run's open period rows to the outbox, ahead of its summaries.

    Without this a job's last period would reach the store after its summary, and a
    reader who trusts the summary would see intervals short of it.
    """
    rows = db.execute(_SELECT_RUN_PERIODS, (job_id, restart)).fetchall()
    _seal(db, node, rows)
    db.execute(_DELETE_RUN_PERIODS, (job_id, restart))  # the rows sealed
    return len(rows)


def _seal(db: sqlite3.Connection, node: str, rows: list[tuple[Any, ...]]) -> None:
    """Queues period rows (SLOT_PIECE_COLUMNS) as intervals; the caller deletes them.

    A whole GPU's rows are also merged into its physical totals (`physical`), which
    its own seal queues once the period is over.
    """
    queued = []
    physical = []
    for row in rows:
        r = PieceRow._make(row[:_PIECE_WIDTH])
        slot = SlotRow._make(row[_PIECE_WIDTH:])
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
            **gpm_means(r),
            **slot_fields(r.uuid, slot),
        )
        # keyed by its slot: two shares of one GPU in one period are two rows
        key = f"{node}:{interval.effective_slot_id}:{r.start!r}"
        queued.append((key, encode(fields_of(interval))))
    db.executemany(
        "INSERT OR IGNORE INTO outbox (kind, key, payload) VALUES ('interval', ?, ?)", queued
    )
    if physical:
        db.executemany(PHYSICAL_UPSERT, physical)
