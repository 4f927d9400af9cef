"""The spool's pieces: a tick's readings merged into the open periods and the runs' totals.

Each piece is merged into its GPU's (or slot's) open shipping period in `pieces`, and,
when a job held it, into that run's totals in `job_acc`; a physical GPU read apart from
its slots (MIG mode, shares) merges its own totals into `physical`. One upsert per table
and tick (PieceBatch), in the order the pieces were added.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from slurm_gpu.models import GpuSlot, Measurement
from slurm_gpu.node.attribution import Piece
from slurm_gpu.node.spool_rows import (
    GPM_COLUMNS,
    GPM_SUMS,
    NO_JOB,
    PHYSICAL_COLUMNS,
    SLOT_COLUMNS,
    SLOT_PIECE_COLUMNS,
    JobAccRow,
    PieceRow,
    columns,
    known,
    placeholders,
    summed,
)

__all__ = ["PHYSICAL_UPSERT", "PieceBatch", "add_piece"]

_PIECE_SET = " ON CONFLICT(uuid, job_id, restart, period_start) DO UPDATE SET " + ", ".join(
    (
        "start = min(start, excluded.start)",
        "end = max(end, excluded.end)",
        summed("util_sum"),
        summed("util_count"),
        known("max", "util_max"),
        known("min", "util_min"),
        summed("active_seconds"),
        summed("covered_seconds"),
        known("max", "mem_max"),
        "mem_total = coalesce(excluded.mem_total, mem_total)",  # the newest known
        # Unknown (NULL) stays unknown: a period of layout 4 missed the reads before it.
        summed("mem_gib_seconds"),
        known("+", "power_joules"),
        summed("power_seconds"),
        known("+", "energy"),
        known("max", "temp_max"),
        "ecc = coalesce(excluded.ecc, ecc)",  # a running total: the newest known
        "unallocated = CASE WHEN excluded.unallocated = '' THEN unallocated"
        " ELSE excluded.unallocated END",
        *GPM_SUMS,
    )
)
_PIECE_UPSERT = (
    f"INSERT INTO pieces ({columns(PieceRow._fields)})"
    f" VALUES ({placeholders(PieceRow._fields)})" + _PIECE_SET
)
# A slot's piece (MIG slice, share): its slot columns too, which do not change in a row,
# but a MIG slice first read before its first GPM window (memory only so far) is GPM's
# once any part of the row was measured by GPM.
_GPM_WINS = ", measured_by = CASE WHEN excluded.measured_by = 'gpm' THEN 'gpm' ELSE measured_by END"
_SLOT_PIECE_UPSERT = (
    f"INSERT INTO pieces ({columns(SLOT_PIECE_COLUMNS)})"
    f" VALUES ({placeholders(SLOT_PIECE_COLUMNS)})" + _PIECE_SET + _GPM_WINS
)

_JOB_ACC_COLUMNS = ("job_id", "restart", "uuid", *JobAccRow._fields)
_JOB_ACC_SET = " ON CONFLICT(job_id, restart, uuid) DO UPDATE SET " + ", ".join(
    (
        summed("covered"),
        summed("util_sum"),
        summed("util_count"),
        known("max", "util_max"),
        summed("active_seconds"),
        known("max", "mem_max"),
        summed("mem_gib_seconds"),
        known("+", "energy"),
        summed("readings"),
        *GPM_SUMS,
    )
)
_JOB_ACC_UPSERT = (
    f"INSERT INTO job_acc ({columns(_JOB_ACC_COLUMNS)})"
    f" VALUES ({placeholders(_JOB_ACC_COLUMNS)})" + _JOB_ACC_SET
)
_SLOT_JOB_ACC_COLUMNS = (*_JOB_ACC_COLUMNS, *SLOT_COLUMNS)
_SLOT_JOB_ACC_UPSERT = (
    f"INSERT INTO job_acc ({columns(_SLOT_JOB_ACC_COLUMNS)})"
    f" VALUES ({placeholders(_SLOT_JOB_ACC_COLUMNS)})" + _JOB_ACC_SET + _GPM_WINS
)

PHYSICAL_UPSERT = (
    f"INSERT INTO physical ({columns(PHYSICAL_COLUMNS)})"
    f" VALUES ({placeholders(PHYSICAL_COLUMNS)})"
    " ON CONFLICT(uuid, period_start) DO UPDATE SET "
    + ", ".join(
        (
            "start = min(start, excluded.start)",
            "end = max(end, excluded.end)",
            summed("covered_seconds"),
            known("+", "power_joules"),
            summed("power_seconds"),
            known("+", "energy"),
            known("max", "temp_max"),
            known("max", "ecc"),  # a running total: merged out of order, its largest
            known("max", "mem_max"),
            "mem_total = coalesce(excluded.mem_total, mem_total)",
        )
    )
)

_NO_GPM = (0.0,) * len(GPM_COLUMNS)  # GPM_COLUMNS of a piece GPM did not measure


def _gpm_terms(piece: Piece) -> tuple[float, ...]:
    """One piece's values of GPM_COLUMNS: gpm_seconds, then each figure's psec and sec."""
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
        """One piece: its period row's terms (PieceRow order) and its job's (_JOB_ACC_COLUMNS)."""
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
        for sql, rows in (
            (_PIECE_UPSERT, self._pieces),
            (_JOB_ACC_UPSERT, self._totals),
            (_SLOT_PIECE_UPSERT, self._slot_pieces),
            (_SLOT_JOB_ACC_UPSERT, self._slot_totals),
            (PHYSICAL_UPSERT, self._physical),
        ):
            if rows:
                db.executemany(sql, rows)
                rows.clear()


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
