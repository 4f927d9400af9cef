"""The spool's row shapes and the SQL helpers every part of the spool builds on.

A `pieces` row (PieceRow, then its slot's columns, SlotRow), a `job_acc` row's totals
(JobAccRow), a `physical` row (PhysicalRow), the GPM figures both sum, and what turns
their sums back into a model's fields (gpm_means, slot_fields). spool_layout.py creates
these tables; every statement names its columns from here, in the tuples' order.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from slurm_gpu.models import Measurement, SlotKind

__all__ = [
    "GPM_COLUMNS",
    "GPM_FIGURES",
    "GPM_SUMS",
    "NO_JOB",
    "PHYSICAL_COLUMNS",
    "SLOT_COLUMNS",
    "SLOT_PIECE_COLUMNS",
    "JobAccRow",
    "PhysicalRow",
    "PieceRow",
    "SlotRow",
    "columns",
    "gpm_means",
    "known",
    "placeholders",
    "slot_fields",
    "summed",
]

NO_JOB = 0  # pieces.job_id for time a GPU was held by no job (Slurm job ids start at 1)


class PieceRow(NamedTuple):
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


class JobAccRow(NamedTuple):
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


# The GPM figures summed: GpuInterval/JobGpuSummary `<name>_mean_percent`, Piece `<name>_percent`.
GPM_FIGURES = ("sm_active", "sm_occupancy", "tensor_active", "dram_bw")
# The last columns of PieceRow and JobAccRow, in that order (spool_pieces.py's _gpm_terms).
GPM_COLUMNS = ("gpm_seconds", *(f"{n}_{s}" for n in GPM_FIGURES for s in ("psec", "sec")))
assert PieceRow._fields[-len(GPM_COLUMNS) :] == GPM_COLUMNS
assert JobAccRow._fields[-len(GPM_COLUMNS) :] == GPM_COLUMNS
# (model field, its psec column, its sec column) of each figure (gpm_means)
_GPM_MEANS = tuple((f"{n}_mean_percent", f"{n}_psec", f"{n}_sec") for n in GPM_FIGURES)

# A slot's columns of `pieces` and `job_acc` (layout 4), after PieceRow's / JobAccRow's
SLOT_COLUMNS = ("parent", "slot_kind", "share", "mig_profile", "measured_by")


class SlotRow(NamedTuple):
    """A row's slot columns (SLOT_COLUMNS); parent "" is a whole GPU."""

    parent: str
    slot_kind: str
    share: float
    mig_profile: str
    measured_by: str


PHYSICAL_COLUMNS = (
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


class PhysicalRow(NamedTuple):
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


assert PhysicalRow._fields == PHYSICAL_COLUMNS


def columns(names: tuple[str, ...]) -> str:
    """A statement's column list: `names`, in their order."""
    return ", ".join(names)


def placeholders(names: tuple[str, ...]) -> str:
    """A statement's VALUES list for `names`: one `?` each."""
    # Positional, bound from a tuple in the same order as `names` (a NamedTuple's
    # fields): cheaper per tick than named parameters bound from a dict.
    return ", ".join("?" for _ in names)


def known(how: str, column: str) -> str:
    """An upsert's SET term for `column`, where NULL means "not read" rather than unknown.

    Two known values are combined by `how` (`max`, `min`, or `+` for a sum), one known value
    is kept, and the column stays NULL only while neither side was read. SQLite's
    two-argument max()/min() and `+` give NULL when either side is NULL; coalesce then
    falls back to the side that is known.
    """
    ours, new = column, f"excluded.{column}"
    both = f"{ours} + {new}" if how == "+" else f"{how}({ours}, {new})"
    return f"{column} = coalesce({both}, {ours}, {new})"


def summed(column: str) -> str:
    """An upsert's SET term adding the new row's `column` to the kept one's."""
    return f"{column} = {column} + excluded.{column}"


# Plain sums (a coalesce per column costs the upsert a third more): `<name>_sec` = 0 says
# a figure was never measured, whatever its `_psec`.
GPM_SUMS = tuple(summed(column) for column in GPM_COLUMNS)

# A slot's piece (MIG slice, share): its period row's columns, then its slot's
SLOT_PIECE_COLUMNS = (*PieceRow._fields, *SLOT_COLUMNS)


def gpm_means(row: PieceRow | JobAccRow) -> dict[str, Any]:
    """The model's GPM fields from a row's sums: None where a figure was never measured."""
    means: dict[str, Any] = {"gpm_seconds": row.gpm_seconds}
    for mean, psec_column, sec_column in _GPM_MEANS:
        psec, sec = getattr(row, psec_column), getattr(row, sec_column)
        means[mean] = psec / sec if sec > 0 else None
    return means


def slot_fields(uuid: str, slot: SlotRow) -> dict[str, Any]:
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
