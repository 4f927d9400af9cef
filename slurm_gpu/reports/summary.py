"""`slurm-gpu report`: sreport-style totals per user, account, partition, node, GPU model.

Every figure is a sum over job GPU rows (reports/figures.py), each prorated to the part
of the job inside the period (a job that ran half inside counts half), as sreport
counts usage inside its period. Utilization is weighted by GPU-hours; queue wait is per
job (Start - Submit), its mean and 95th percentile (linear interpolation, pandas'
default) over the jobs that started.

GPU slots (issue 14): `report slots` groups by GPU model and slot ("H100 MIG 1g.10gb",
"A100 shard", a whole GPU by its model alone). GPUHours are slot-hours held; where any
row is a MIG slice or a share, PhysGPUHours adds the physical GPU-hours (`share x`
slot-hours), so seven 1g.10gb slices for an hour are 7 slot-hours and 1 GPU-hour.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from slurm_gpu.ledger import periods
from slurm_gpu.reports.render import Cell, Field, fixed, fmt_int, fmt_text
from slurm_gpu.reports.usage import Usage
from slurm_gpu.units import is_known

GroupBy = Literal["user", "account", "partition", "node", "gpu_model", "slot", "cluster"]
GROUP_KEYS: dict[str, str] = {
    "users": "user",
    "accounts": "account",
    "partitions": "partition",
    "nodes": "node",
    "gpu-models": "gpu_model",
    "slots": "slot",
    "cluster": "cluster",
}
GROUP_TITLES = {
    "user": "User",
    "account": "Account",
    "partition": "Partition",
    "node": "Node",
    "gpu_model": "GPUModel",
    "slot": "Slot",
    "cluster": "Cluster",
}
TOTAL = "TOTAL"


@dataclass
class Report:
    """One report: rows per group, the totals row, and the top users by idle GPU-hours."""

    group: str
    rows: list[dict[str, Any]]
    total: dict[str, Any]
    top_waste: list[dict[str, Any]]
    # How a figure was had where it is not exact (the usage rollups' queue wait p95).
    notes: list[str] = field(default_factory=list)
    # Whether a row summed is a MIG slice or a share (PhysGPUHours then shown).
    held_slots: bool = False


def prorated(usage: Usage, since: float, until: float, now: float) -> pd.DataFrame:
    """GPU rows joined with their job's facts, scaled to the part inside [since, until]."""
    gpus = usage.gpus
    if gpus.empty:
        return pd.DataFrame(
            columns=[*gpus.columns, "user", "account", "partition", "fraction", "queue_wait"]
        )
    facts = usage.jobs.set_index("job_id")[
        ["user", "account", "partition", "start_time", "end_time", "submit_time"]
    ]
    rows = gpus.join(facts, on="job_id")
    rows["fraction"] = periods.fractions(
        _seconds(rows["start_time"]), _seconds(rows["end_time"]), since, until, now
    )
    for column in (
        "gpu_seconds",
        "active_seconds",
        "missing_seconds",
        "mem_gib_seconds",
        "energy_joules",
        "cost",
        "gpm_seconds",
        "idle_held_cost",
    ):
        if column in rows:
            rows[column] = rows[column].astype(float) * rows["fraction"]
    start = _seconds(rows["start_time"])
    submit = _seconds(rows["submit_time"])
    rows["queue_wait"] = np.where(np.isnan(start) | np.isnan(submit), np.nan, start - submit)
    return rows


def _seconds(column: pd.Series) -> np.ndarray:
    """A time column as floats, NaN where unknown (None or NaN)."""
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def has_slots(rows: pd.DataFrame) -> bool:
    """Whether any GPU row is a MIG slice or a share (not a whole GPU)."""
    if "slot_kind" not in rows or not len(rows):
        return False
    kinds = rows["slot_kind"].astype(object)
    return bool((kinds.notna() & (kinds != "") & (kinds != "gpu")).any())


def slot_groups(rows: pd.DataFrame) -> pd.Series:
    """Each row's `report slots` group: "H100 MIG 1g.10gb", "A100 shard", "H100".

    The GPU model, and for a slot that is not a whole GPU its kind (and MIG profile).
    """
    kinds = (
        rows["slot_kind"].astype(object).fillna("gpu")
        if "slot_kind" in rows
        else pd.Series("gpu", index=rows.index)
    )
    profiles = (
        rows["mig_profile"].astype(object).fillna("")
        if "mig_profile" in rows
        else pd.Series("", index=rows.index)
    )
    models = rows["gpu_model"].astype(object).fillna("")
    names = {"mig": "MIG", "shard": "shard", "mps": "MPS"}
    out = []
    for model, kind, profile in zip(models, kinds, profiles, strict=True):
        label = names.get(str(kind), "")
        if label == "MIG" and profile:
            label = f"MIG {profile}"
        out.append(" ".join(part for part in (str(model), label) if part) or "?")
    return pd.Series(out, index=rows.index, dtype=object)


def sorted_rows(groups: list[dict[str, Any]], sort: str | None) -> list[dict[str, Any]]:
    """Report rows by --sort (default GPUHours), most first.

    Raises:
        ValueError: an unknown --sort field.
    """
    fields = report_fields("", charge="effective", slots=True)  # every field a report may have
    name = sort or "GPUHours"
    by_lower = {n.lower(): f for n, f in fields.items()}
    chosen = by_lower.get(name.lower())
    if chosen is None:
        raise ValueError(f"--sort: unknown field {name!r}; valid fields: {', '.join(fields)}")

    def numeric(g: Mapping[str, Any]) -> tuple[int, float, str]:
        value = chosen.get(g)
        if isinstance(value, int | float) and is_known(value):
            return (0, -float(value), str(g["key"]))
        return (1, 0.0, str(g["key"]))

    values = [chosen.get(g) for g in groups]
    if any(isinstance(v, str) for v in values):
        return sorted(groups, key=lambda g: str(chosen.get(g) or ""))
    return sorted(groups, key=numeric)


def _get(name: str) -> Any:
    def get(record: Mapping[str, Any]) -> Cell:
        value = record.get(name)
        return value if is_known(value) else None

    return get


def report_fields(
    currency: str, group: str = "user", charge: str = "held", slots: bool = False
) -> dict[str, Field]:
    """The columns of a report; the first is the group's name.

    IdleHeldCost only where `charge` ([cost] charge) is "effective"; PhysGPUHours only
    where `slots` (a row is a MIG slice or a share, or the report is by slot).
    """
    cost_unit = f" ({currency})" if currency else ""
    h4 = fixed(4)
    fields = [
        Field(GROUP_TITLES.get(group, "Key"), -22, "What the row is about", _get("key"), fmt_text),
        Field("Jobs", 6, "GPU jobs", _get("jobs"), fmt_int),
        Field("Users", 5, "Distinct users", _get("users"), fmt_int),
        Field("GPUHours", 10, "GPU-hours in the period (slot-hours held)", _get("gpu_hours"), h4),
        *(
            [
                Field(
                    "PhysGPUHours",
                    12,
                    "Physical GPU-hours: share of its GPU x slot-hours (a 1g.10gb slice: 1/7)",
                    _get("physical_gpu_hours"),
                    h4,
                )
            ]
            if slots
            else []
        ),
        Field("GPUMemHours", 11, "GPU memory in use x hours, GiB-hours", _get("gpu_mem_hours"), h4),
        Field(
            "GPUUtilAvg",
            10,
            "Mean utilization %, weighted by GPU-hours",
            _get("util_mean_percent"),
            fixed(1),
        ),
        Field(
            "ActiveGPUHours",
            14,
            "GPU-hours above the active threshold",
            _get("active_gpu_hours"),
            h4,
        ),
        Field(
            "IdleGPUHours",
            12,
            "Measured GPU-hours below the active threshold (never missing time)",
            _get("idle_gpu_hours"),
            h4,
        ),
        Field("IdlePct", 7, "Idle share of the GPU-hours, %", _get("idle_percent"), fixed(1)),
        Field(
            "MissingGPUHours",
            15,
            "GPU-hours held with no readings (agent down, GPU lost): neither active nor idle",
            _get("missing_gpu_hours"),
            h4,
        ),
        Field(
            "MissingPct", 10, "Missing share of the GPU-hours, %", _get("missing_percent"), fixed(1)
        ),
        Field(
            "SuspendedGPUHours",
            17,
            "GPU-hours suspended (not in GPUHours, as Slurm charges)",
            _get("suspended_gpu_hours"),
            h4,
        ),
        Field("EnergyKWh", 9, "GPU energy, kWh", _get("energy_kwh"), fixed(5)),
        Field("Cost", 10, f"Cost by [cost] prices{cost_unit}", _get("cost"), fixed(2)),
        *(
            [
                Field(
                    "IdleHeldCost",
                    12,
                    f"Measured GPU time held with SMs not active, priced apart{cost_unit}",
                    _get("idle_held_cost"),
                    fixed(2),
                )
            ]
            if charge == "effective"
            else []
        ),
        Field(
            "QueueWaitMean", 13, "Mean Start - Submit, seconds", _get("queue_wait_mean"), fixed(1)
        ),
        Field(
            "QueueWaitP95",
            12,
            "95th percentile Start - Submit, seconds",
            _get("queue_wait_p95"),
            fixed(1),
        ),
        # NVML GPM (Hopper and newer): blank where nothing was measured, never 0.
        Field(
            "SMActiveAvg",
            11,
            "Mean SM activity %, over the GPM-measured GPU-hours",
            _get("sm_active_mean_percent"),
            fixed(1),
        ),
        Field(
            "SMOccupancyAvg",
            14,
            "Mean SM occupancy %, over the GPM-measured GPU-hours",
            _get("sm_occupancy_mean_percent"),
            fixed(1),
        ),
        Field(
            "TensorActiveAvg",
            15,
            "Mean tensor-core activity %, over the GPM-measured GPU-hours",
            _get("tensor_active_mean_percent"),
            fixed(1),
        ),
        Field(
            "DRAMBWAvg",
            9,
            "Mean DRAM bandwidth used, % of peak, over the GPM-measured GPU-hours",
            _get("dram_bw_mean_percent"),
            fixed(1),
        ),
        Field(
            "EffectiveGPUHours",
            17,
            "GPM-measured GPU-hours x SM activity",
            _get("effective_gpu_hours"),
            h4,
        ),
        Field(
            "GPMPct",
            6,
            "Share of the GPU-hours GPM measured, % (the rest: not measured)",
            _get("gpm_percent"),
            fixed(1),
        ),
    ]
    if group == "node":
        fields += [
            Field("SharePct", 8, "Share of all GPU-hours, %", _get("share_percent"), fixed(1)),
            Field(
                "Busy",
                4,
                "busy: share above [reports] busy_node_factor x the mean",
                _get("busy"),
                fmt_text,
            ),
        ]
    return {f.name: f for f in fields}
