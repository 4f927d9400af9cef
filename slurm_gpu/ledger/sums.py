"""The sums a GPU row adds to every group it is in: the currency of every figure.

A GPU row is a job's use of one GPU slot (a finished job's summary, or a running job's
interval totals), prorated to a period where a report asks for one. Its sums add: the
sums of a group of rows are the sums of their sums, whatever the source (the rollups
fold them at ingest, the reports add raw rows' sums to them), so a figure computed from
summed sums (`figures`) is the same whichever road the rows came by.

- held, active, missing and suspended seconds, clipped per row (`time.row_time`; held
  excludes suspended time, as Slurm's charge does);
- GiB-seconds of GPU memory, energy (and how many rows knew it: none means unknown);
- utilization x held seconds over the rows with a mean, and those held seconds;
- physical GPU-seconds (held x the slot's share of its GPU);
- GPM-measured seconds, and each GPM mean x its GPM seconds where known;
- the units of every [cost] unit (GPU-seconds, GiB-seconds, the job's elapsed share),
  their parts that GPM measured SM-inactive (`unused_share`: [cost] charge "effective"),
  and their parts in the row's measured idle time (idle cost: a row's units x its idle
  share; GPU-seconds' is the idle time itself). Summed, idle cost is a sum like the others,
  so the rollups keep it under every [cost] unit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from slurm_gpu.ledger import time

Floats = npt.NDArray[np.float64]

GPM_METRICS = ("sm_active", "sm_occupancy", "tensor_active", "dram_bw")
"""NVML GPM metrics a row has a mean of, `<metric>_mean_percent`."""

SUMS = (
    "gpu_seconds",
    "active_seconds",
    "missing_seconds",
    "mem_gib_seconds",
    "energy_joules",
    "util_weighted_sum",
    "util_seconds",
    "physical_seconds",
    "gpm_seconds",
    *(f"{m}_{part}" for m in GPM_METRICS for part in ("weighted_sum", "gpm_seconds")),
    "job_hour_seconds",
    "gpu_unused_seconds",
    "mem_unused_gib_seconds",
    "job_hour_unused_seconds",
    "mem_idle_gib_seconds",
    "job_hour_idle_seconds",
    "suspended_seconds",
    "job_hour_suspended_seconds",
)
"""The prorated sums of a row (store/schema.py's rollup columns have these names)."""

COUNTS = ("energy_rows", "summary_rows")
"""Counts of rows (not prorated): with an energy figure, and all."""

ROW_COLUMNS = (
    "gpu_seconds",
    "active_seconds",
    "missing_seconds",
    "mem_gib_seconds",
    "energy_joules",
    "util_mean_percent",
    "share",
    "gpm_seconds",
    *(f"{m}_mean_percent" for m in GPM_METRICS),
    "suspended_seconds",
)
"""What `row_sums` reads of a GPU row (`suspended_seconds`: its job's, sacct's Suspended)."""


def unused_share(held: Any, gpm_seconds: Any, sm_active_percent: Any) -> Any:
    """The share of a row's held time that GPM measured and found the SMs not active.

    measured share (gpm_seconds / held, within [0, 1]) x (1 - SM activity); 0 where GPM
    measured nothing or SM activity is unknown (unknown is never unused).
    """
    gpu = np.asarray(held, dtype=float)
    gpm = np.asarray(gpm_seconds, dtype=float)
    sm = np.asarray(sm_active_percent, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # tiny held
        measured = np.clip(np.where(gpu > 0, gpm / gpu, 0.0), 0.0, 1.0)
    inactive = 1.0 - np.clip(sm / 100.0, 0.0, 1.0)
    share = np.where(np.isnan(measured) | np.isnan(inactive), 0.0, measured * inactive)
    return float(share) if np.ndim(share) == 0 else share


def row_sums(rows: Mapping[str, Any], job_hour_seconds: Any) -> dict[str, Floats]:
    """The `SUMS` and `COUNTS` of GPU rows, one element per row.

    Args:
        rows: column name -> values (arrays or sequences, NaN or None where unknown):
            gpu_seconds (the span the slot was held), active_seconds, missing_seconds,
            mem_gib_seconds, energy_joules, util_mean_percent, share, gpm_seconds,
            `<metric>_mean_percent`, suspended_seconds (the job's); a column a row
            source lacks may be left out (unknown; suspended: none).
        job_hour_seconds: each row's part of its job's elapsed seconds ([cost] unit
            job_hour: the job's elapsed time, suspended time excluded, shared equally
            by its GPU rows).
    """
    n = len(next(iter(rows.values()))) if rows else 0

    def column(name: str) -> Floats:
        values = rows.get(name)
        if values is None:
            return np.full(n, np.nan)
        return np.asarray(
            [np.nan if v is None else v for v in values]
            if not isinstance(values, np.ndarray)
            else values,
            dtype=float,
        )

    held, busy, lost, paused = time.row_time(
        column("gpu_seconds"),
        column("active_seconds"),
        column("missing_seconds"),
        column("suspended_seconds"),
    )
    gpu = np.asarray(held, dtype=float)
    suspended = np.asarray(paused, dtype=float)
    util, energy, share = column("util_mean_percent"), column("energy_joules"), column("share")
    gpm_raw = column("gpm_seconds")
    gpm = np.nan_to_num(gpm_raw)
    mem = np.nan_to_num(column("mem_gib_seconds"))
    job_hours = np.nan_to_num(np.broadcast_to(np.asarray(job_hour_seconds, dtype=float), (n,)))
    unused = np.asarray(unused_share(gpu, gpm_raw, column("sm_active_mean_percent")), dtype=float)
    idle_share = _idle_share(gpu, busy, lost)
    out: dict[str, Floats] = {
        "gpu_seconds": gpu,
        "active_seconds": np.asarray(busy, dtype=float),
        "missing_seconds": np.asarray(lost, dtype=float),
        "mem_gib_seconds": mem,
        "energy_joules": np.nan_to_num(energy),
        "util_weighted_sum": np.nan_to_num(util) * gpu,
        "util_seconds": np.where(np.isnan(util), 0.0, gpu),
        "physical_seconds": gpu * np.where(np.isnan(share), 1.0, share),
        "gpm_seconds": gpm,
        "job_hour_seconds": job_hours,
        "gpu_unused_seconds": gpu * unused,
        "mem_unused_gib_seconds": mem * unused,
        "job_hour_unused_seconds": job_hours * unused,
        "mem_idle_gib_seconds": mem * idle_share,
        "job_hour_idle_seconds": job_hours * idle_share,
        "suspended_seconds": suspended,
        # The row's part of its job's suspended time, as job_hour_seconds is of its run
        # time ([cost] charge_suspended under unit job_hour).
        "job_hour_suspended_seconds": np.divide(
            job_hours * suspended, gpu, out=np.zeros(n), where=gpu > 0
        ),
        "energy_rows": np.where(np.isnan(energy), 0.0, 1.0),
        "summary_rows": np.ones(n),
    }
    for m in GPM_METRICS:
        mean = column(f"{m}_mean_percent")
        out[f"{m}_weighted_sum"] = np.nan_to_num(mean) * gpm
        out[f"{m}_gpm_seconds"] = np.where(np.isnan(mean), 0.0, gpm)
    return out


def _idle_share(held: Any, busy: Any, lost: Any) -> Floats:
    """A row's measured idle time over its held time (0 where unknown or nothing held)."""
    gpu = np.asarray(held, dtype=float)
    idle = np.nan_to_num(np.asarray(time.idle(gpu, busy, lost), dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(gpu > 0, idle / np.where(gpu > 0, gpu, 1.0), 0.0)
