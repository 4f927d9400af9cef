"""The monthly report's "Efficiency beyond utilization": the NVML GPM figures per account.

GPU utilization is a duty cycle (the share of time any kernel ran); on GPUs with NVML GPM
(Hopper and newer) SM activity, tensor activity and DRAM bandwidth say how much of the GPU
the kernels used. Per account, and for the users with the most GPM-measured GPU-hours
among the jobs the reader may see (the month's scope): GPU-hours, utilization, the GPM
means over the GPU-hours GPM measured, effective GPU-hours (measured GPU-hours x SM
activity) and the share of the GPU-hours GPM measured. Where GPM measured nothing (a
cluster of A100s) the figures are blank and the section says so, never 0 %.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

KEYS = (
    "gpu_hours",
    "util_mean_percent",
    "sm_active_mean_percent",
    "sm_occupancy_mean_percent",
    "tensor_active_mean_percent",
    "dram_bw_mean_percent",
    "effective_gpu_hours",
    "gpm_gpu_hours",
    "gpm_percent",
    "cost",
    "idle_held_cost",
)
"""A row's figures (reports/figures.py's keys), in the CSV's order after its name."""


def efficiency(grouped: Sequence[Mapping[str, Any]], users: bool = False) -> list[dict[str, Any]]:
    """The figures of the monthly report's account (or user) rows, most GPM-measured first.

    `grouped`: those rows (monthly.py `_grouped`: every figure, computed once). Users:
    only those GPM measured anything, each with their accounts.
    """
    out = []
    for row in grouped:
        if users and not row["gpm_gpu_hours"]:
            continue
        record = {"key": row["key"], **{k: row[k] for k in KEYS}}
        if users:
            record["account"] = row.get("account", "")
        out.append(record)
    out.sort(key=lambda r: (-r["gpm_gpu_hours"], -r["gpu_hours"], r["key"]))
    return out


def unmeasured_note(rows: pd.DataFrame, total: dict[str, Any]) -> str | None:
    """The section's plain word where GPM measured nothing or part; None when it measured all."""
    share = total.get("gpm_percent")
    if not len(rows) or not total.get("gpu_hours"):
        return None
    models = _models(rows)
    if not share:
        return (
            "No GPU-hour of this month was measured by NVML GPM: SM activity, tensor activity "
            "and DRAM bandwidth need Hopper or newer GPUs"
            + (f" (this month's GPUs: {models})" if models else "")
            + ". The figures below are blank, not 0 %; utilization is a duty cycle only."
        )
    if share < 99.5:
        return (
            f"GPM measured {share:.0f} % of the GPU-hours; the GPM figures cover those only "
            "(GPUs older than Hopper, or time with no GPM readings, are not measured)."
        )
    return None


def _models(rows: pd.DataFrame) -> str:
    if "gpu_model" not in rows:
        return ""
    names = rows["gpu_model"].dropna().unique().tolist()
    return ", ".join(sorted({str(n) for n in names if str(n)}))
