"""Hourly rollups: per-minute intervals folded into one row per (GPU slot, hour, job).

Every column is a sum, a max, a min or a count, so rollups merge by addition and the
means survive: mean util = util_weighted_sum / util_covered_seconds (util weighted by the
seconds each interval covered), mean power likewise, energy and active seconds are sums.
The NVML GPM means (revision 0006) likewise: `<metric>_weighted_sum` is the metric's
percent-seconds over `<metric>_gpm_seconds`, the GPM seconds of the intervals that had it,
so an hour's `sm_active_mean_percent` is that of the GPM-measured time only (None when
none was measured: never 0%). A row is one slot's (revision 0009: a whole GPU's slot id is
its UUID); it keeps the slot's parent GPU, kind, share, MIG profile and measurement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from slurm_gpu.models import Measurement, SlotKind
from slurm_gpu.store import convert
from slurm_gpu.store.dialect import hour_floor, upsert
from slurm_gpu.store.gpm_means import GpmMeans
from slurm_gpu.store.schema import GPM_METRICS, gpu_intervals, gpu_intervals_hourly

KEY = ("node", "slot_id", "hour_start", "job_id")
# What a slot is (revision 0009): the same on each of its intervals, kept as it is.
SLOT_COLUMNS = ("gpu_uuid", "slot_kind", "share", "mig_profile", "measured_by")
SUMS = (
    "interval_count",
    "period_seconds",
    "covered_seconds",
    "active_seconds",
    "util_weighted_sum",
    "util_covered_seconds",
    "util_sample_count",
    "power_weighted_sum",
    "power_covered_seconds",
    "gpm_seconds",
    *(f"{m}_{part}" for m in GPM_METRICS for part in ("weighted_sum", "gpm_seconds")),
)
NULLABLE_SUMS = ("energy_joules",)
MAXES = (
    "last_period_end",
    "util_max_percent",
    "mem_used_max_bytes",
    "mem_total_bytes",
    "temperature_max_celsius",
    "ecc_errors_total",
)
MINS = ("first_period_start", "util_min_percent")
INTS = ("interval_count", "util_sample_count", "mem_used_max_bytes", "mem_total_bytes")
INTS_NULLABLE = ("mem_used_max_bytes", "mem_total_bytes", "ecc_errors_total")


@dataclass(frozen=True)
class GpuHourly(GpmMeans):
    """One GPU slot over one hour for one job (job_id None: time not attributed to a job).

    `gpu_uuid` is the physical GPU; `slot_id` "" the whole GPU (as `GpuInterval`'s).
    """

    node: str
    gpu_uuid: str
    hour_start: float
    job_id: int | None
    interval_count: int
    first_period_start: float
    last_period_end: float
    period_seconds: float
    covered_seconds: float
    active_seconds: float
    util_weighted_sum: float
    util_covered_seconds: float
    util_max_percent: float | None
    util_min_percent: float | None
    util_sample_count: int
    mem_used_max_bytes: int | None
    mem_total_bytes: int | None
    energy_joules: float | None
    power_weighted_sum: float
    power_covered_seconds: float
    temperature_max_celsius: float | None
    ecc_errors_total: int | None
    # NVML GPM (revision 0006): seconds measured, and per metric its percent-seconds over
    # the GPM seconds that had it; the `*_mean_percent` properties are the means.
    gpm_seconds: float = 0.0
    sm_active_weighted_sum: float = 0.0
    sm_active_gpm_seconds: float = 0.0
    sm_occupancy_weighted_sum: float = 0.0
    sm_occupancy_gpm_seconds: float = 0.0
    tensor_active_weighted_sum: float = 0.0
    tensor_active_gpm_seconds: float = 0.0
    dram_bw_weighted_sum: float = 0.0
    dram_bw_gpm_seconds: float = 0.0
    # The slot (revision 0009), as GpuInterval's fields.
    slot_id: str = ""
    slot_kind: SlotKind = SlotKind.GPU
    share: float = 1.0
    mig_profile: str = ""
    measured_by: Measurement = Measurement.NVML

    @property
    def effective_slot_id(self) -> str:
        """The slot's id: `slot_id`, or the GPU's UUID for a whole GPU ("")."""
        return self.slot_id or self.gpu_uuid

    @property
    def util_mean_percent(self) -> float | None:
        """Mean utilization over the covered seconds that had a utilization reading."""
        if self.util_covered_seconds <= 0:
            return None
        return self.util_weighted_sum / self.util_covered_seconds

    @property
    def power_mean_watts(self) -> float | None:
        """Mean power over the covered seconds that had a power reading."""
        if self.power_covered_seconds <= 0:
            return None
        return self.power_weighted_sum / self.power_covered_seconds


def aggregate_query(older_than: float) -> sa.Select[Any]:
    """Intervals with period_start < older_than, grouped into hourly rows (SQL side)."""
    t = gpu_intervals.c
    hour = hour_floor(t.period_start)
    job = sa.func.coalesce(t.job_id, 0)
    covered_if = sa.case  # readability below

    def covered_where(col: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        return sa.func.sum(covered_if((col.is_not(None), t.covered_seconds), else_=0.0))

    return (
        sa.select(
            t.node,
            t.slot_id,
            # One value per slot; max() only satisfies GROUP BY on every backend.
            *(sa.func.max(t[name]).label(name) for name in SLOT_COLUMNS),
            hour.label("hour_start"),
            job.label("job_id"),
            sa.func.count().label("interval_count"),
            sa.func.min(t.period_start).label("first_period_start"),
            sa.func.max(t.period_end).label("last_period_end"),
            sa.func.sum(t.period_end - t.period_start).label("period_seconds"),
            sa.func.sum(t.covered_seconds).label("covered_seconds"),
            sa.func.sum(t.active_seconds).label("active_seconds"),
            sa.func.coalesce(sa.func.sum(t.util_mean_percent * t.covered_seconds), 0.0).label(
                "util_weighted_sum"
            ),
            covered_where(t.util_mean_percent).label("util_covered_seconds"),
            sa.func.max(t.util_max_percent).label("util_max_percent"),
            sa.func.min(t.util_min_percent).label("util_min_percent"),
            sa.func.sum(t.util_sample_count).label("util_sample_count"),
            sa.func.max(t.mem_used_max_bytes).label("mem_used_max_bytes"),
            sa.func.max(t.mem_total_bytes).label("mem_total_bytes"),
            sa.func.sum(t.energy_joules).label("energy_joules"),
            sa.func.coalesce(sa.func.sum(t.power_mean_watts * t.covered_seconds), 0.0).label(
                "power_weighted_sum"
            ),
            covered_where(t.power_mean_watts).label("power_covered_seconds"),
            sa.func.max(t.temperature_max_celsius).label("temperature_max_celsius"),
            sa.func.max(t.ecc_errors_total).label("ecc_errors_total"),
            sa.func.coalesce(sa.func.sum(t.gpm_seconds), 0.0).label("gpm_seconds"),
            *_gpm_sums(),
        )
        .where(t.period_start < older_than)
        .group_by(t.node, t.slot_id, hour, job)
    )


def _gpm_sums() -> list[sa.ColumnElement[Any]]:
    """Per GPM metric: its percent-seconds, and the GPM seconds that had it (SQL side)."""
    t = gpu_intervals.c
    out: list[sa.ColumnElement[Any]] = []
    for m in GPM_METRICS:
        mean = t[f"{m}_mean_percent"]
        out.append(
            sa.func.coalesce(sa.func.sum(mean * t.gpm_seconds), 0.0).label(f"{m}_weighted_sum")
        )
        seconds = sa.case((mean.is_not(None), t.gpm_seconds), else_=0.0)
        out.append(sa.func.coalesce(sa.func.sum(seconds), 0.0).label(f"{m}_gpm_seconds"))
    return out


def normalize(row: Mapping[Any, Any]) -> dict[str, Any]:
    """Plain Python numbers: SUM() comes back as Decimal on PostgreSQL and MySQL."""
    out = dict(row)
    for name in (*SUMS, *NULLABLE_SUMS, *MAXES, *MINS, "hour_start"):
        value = out[name]
        if value is None:
            continue
        out[name] = int(value) if name in INTS or name in INTS_NULLABLE else float(value)
    out["job_id"] = int(out["job_id"])
    if out.get("share") is not None:
        out["share"] = float(out["share"])
    return out


def merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two hourly rows of the same key as one (sums add, maxes max, mins min)."""
    out = dict(a)
    for name in SUMS:
        out[name] = a[name] + b[name]
    for name in NULLABLE_SUMS:
        out[name] = (
            b[name] if a[name] is None else a[name] if b[name] is None else a[name] + b[name]
        )
    for name in MAXES:
        out[name] = (
            b[name] if a[name] is None else a[name] if b[name] is None else max(a[name], b[name])
        )
    for name in MINS:
        out[name] = (
            b[name] if a[name] is None else a[name] if b[name] is None else min(a[name], b[name])
        )
    return out


def row_to_hourly(row: Mapping[Any, Any]) -> GpuHourly:
    """A `gpu_intervals_hourly` row as a GpuHourly (job_id 0 becomes None)."""
    values = normalize(row)
    values = {name: values[name] for name in GpuHourly.__dataclass_fields__}
    values["job_id"] = values["job_id"] or None
    values["slot_id"] = convert.slot_of_row(values["gpu_uuid"], values["slot_id"])
    values["slot_kind"] = SlotKind(values["slot_kind"])
    values["measured_by"] = Measurement(values["measured_by"])
    return GpuHourly(**values)


HOURLY_COLUMNS = tuple(c.name for c in gpu_intervals_hourly.columns)


def fold(conn: sa.Connection, dialect: str, older_than: float) -> tuple[int, int, int]:
    """Fold the intervals with period_start < older_than into hourly rows, then delete them.

    In the caller's transaction: `Store.rollup_and_prune` retries it when the counts
    differ (an interval arrived between the fold and the delete).

    Returns:
        (hourly rows written, intervals deleted, intervals folded).
    """
    groups = [normalize(r) for r in conn.execute(aggregate_query(older_than)).mappings()]
    if not groups:
        return 0, 0, 0
    h = gpu_intervals_hourly.c
    first = min(g["hour_start"] for g in groups)
    last = max(g["hour_start"] for g in groups)
    existing = {
        tuple(r[k] for k in KEY): r
        for r in (
            normalize(m)
            for m in conn.execute(
                sa.select(gpu_intervals_hourly).where(h.hour_start.between(first, last))
            ).mappings()
        )
    }
    merged = []
    for group in groups:
        key = tuple(group[k] for k in KEY)
        old = existing.get(key)
        merged.append(merge(old, group) if old is not None else group)
    update = [c for c in HOURLY_COLUMNS if c not in KEY]
    conn.execute(upsert(dialect, gpu_intervals_hourly, update), merged)
    deleted = conn.execute(
        sa.delete(gpu_intervals).where(gpu_intervals.c.period_start < older_than)
    ).rowcount
    return len(merged), int(deleted), sum(g["interval_count"] for g in groups)
