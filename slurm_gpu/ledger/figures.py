"""A group's report figures from its summed sums (`sums.SUMS`), one definition.

Every report row (`slurm-gpu report`, the monthly tables, a statement, the exporter) is
`figures` of the sums of its rows plus the group's job counts and queue waits.

- GPU-hours are held hours (missing included: the job held the GPU; suspended time
  not, as Slurm charges); active, idle and missing GPU-hours split them (`time`); idle
  and active are unknown where none of the held time was measured. Suspended GPU-hours
  are shown apart.
- Utilization is weighted by held seconds over the rows with a mean; each GPM mean by
  the GPM-measured seconds of the rows that have it; unknown (None) where nothing was
  measured, never 0 %. Effective GPU-hours: GPM-measured GPU-hours x SM activity.
- Energy is unknown where no row knew it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from slurm_gpu.ledger import time
from slurm_gpu.ledger.sums import GPM_METRICS
from slurm_gpu.units import is_known

FIGURE_KEYS = (
    "jobs",
    "users",
    "gpu_hours",
    "gpu_mem_hours",
    "util_mean_percent",
    "active_gpu_hours",
    "idle_gpu_hours",
    "idle_percent",
    "missing_gpu_hours",
    "missing_percent",
    "suspended_gpu_hours",
    "energy_kwh",
    "cost",
    "queue_wait_mean",
    "queue_wait_p95",
    "gpm_gpu_hours",
    "gpm_percent",
    "sm_active_mean_percent",
    "sm_occupancy_mean_percent",
    "tensor_active_mean_percent",
    "dram_bw_mean_percent",
    "effective_gpu_hours",
    "idle_held_cost",
)
"""What a report row shows (`slurm-gpu report`, the monthly tables), in this order."""

GPM_MEANS = tuple(f"{m}_mean_percent" for m in GPM_METRICS)
"""The GPM means of a row, each over its `gpm_seconds`."""


class Counted(NamedTuple):
    """A group's jobs, users and queue waits (counted, not summed)."""

    jobs: int = 0
    users: int = 0
    queue_wait_mean: float | None = None
    queue_wait_p95: float | None = None


def gpm_means(total: Mapping[str, Any]) -> dict[str, float | None]:
    """Each GPM mean of summed sums: weighted sum / its GPM seconds (None where none)."""
    out: dict[str, float | None] = {}
    for m in GPM_METRICS:
        weight = float(total[f"{m}_gpm_seconds"])
        out[f"{m}_mean_percent"] = (
            float(total[f"{m}_weighted_sum"]) / weight if weight > 0 else None
        )
    return out


def effective_seconds(total: Mapping[str, Any]) -> float | None:
    """GPM-measured seconds x SM activity (None where SM activity is unknown)."""
    if float(total["sm_active_gpm_seconds"]) <= 0:
        return None
    return float(total["sm_active_weighted_sum"]) / 100.0


def energy_joules(total: Mapping[str, Any]) -> float | None:
    """Summed GPU energy; None (unknown) where no row knew its energy, never 0."""
    return float(total["energy_joules"]) if float(total["energy_rows"]) > 0 else None


def util_mean(total: Mapping[str, Any]) -> float | None:
    """Utilization weighted by held seconds over the rows with a mean (None: none had)."""
    seconds = float(total["util_seconds"])
    return float(total["util_weighted_sum"]) / seconds if seconds > 0 else None


def figures(total: Mapping[str, Any], counted: Counted, held_cost: bool) -> dict[str, Any]:
    """The report figures (`FIGURE_KEYS`, and physical GPU-hours) of one group.

    Args:
        total: the group's summed sums, with `cost` and `idle_held_cost`
            (pricing.priced) added.
        counted: its jobs, users and queue waits.
        held_cost: [cost] charge is "effective" (IdleHeldCost is shown).
    """
    gpu, missing = float(total["gpu_seconds"]), float(total["missing_seconds"])
    active = float(time.active(gpu, float(total["active_seconds"]), missing))
    idle = float(time.idle(gpu, float(total["active_seconds"]), missing))
    gpm = float(total["gpm_seconds"])
    energy = energy_joules(total)
    effective = effective_seconds(total)
    return {
        "jobs": counted.jobs,
        "users": counted.users,
        "gpu_hours": gpu / 3600.0,
        "gpu_mem_hours": float(total["mem_gib_seconds"]) / 3600.0,
        "util_mean_percent": util_mean(total),
        "active_gpu_hours": _hours(active),
        "idle_gpu_hours": _hours(idle),
        "idle_percent": share_percent(idle, gpu),
        "missing_gpu_hours": missing / 3600.0,
        "missing_percent": share_percent(missing, gpu),
        "suspended_gpu_hours": float(total["suspended_seconds"]) / 3600.0,
        "energy_kwh": None if energy is None else energy / 3.6e6,
        "cost": float(total["cost"]),
        "queue_wait_mean": counted.queue_wait_mean,
        "queue_wait_p95": counted.queue_wait_p95,
        "gpm_gpu_hours": gpm / 3600.0,
        "gpm_percent": share_percent(gpm, gpu),
        **gpm_means(total),
        "effective_gpu_hours": _hours(effective),
        "idle_held_cost": float(total["idle_held_cost"]) if held_cost else None,
        "physical_gpu_hours": float(total["physical_seconds"]) / 3600.0,
    }


def share_percent(part: float | None, whole: float) -> float | None:
    """`part` as a percentage of `whole`; None when either is unknown or whole is 0."""
    return 100.0 * float(part) / whole if is_known(part) and whole > 0 else None


def _hours(seconds: float | None) -> float | None:
    return float(seconds) / 3600.0 if is_known(seconds) else None
