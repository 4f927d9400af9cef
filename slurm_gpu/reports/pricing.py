"""What a job's GPUs cost: [cost] prices per GPU model, in the [cost] unit.

`[cost] charge = "held"` (the default) charges every unit held. `"effective"` splits each
GPU row's charge by what NVML GPM measured: of the share of its GPU-seconds GPM measured
(`gpm_seconds`), the SM-active part is charged (`cost`) and the rest, held but unused, is
priced apart (`idle_held_cost`, not in `cost`); the share GPM did not measure (a GPU
without GPM, readings missing) is charged as held. Unknown is never idle, nor free:
`cost + idle_held_cost` is always what "held" charges.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from slurm_gpu.config.reports import CostSettings


def price_for(model: str, cost: CostSettings) -> float:
    """Price per unit of a GPU model: the longest [cost] prices key the model contains."""
    lowered = model.lower()
    matches = [k for k in cost.prices if k.lower() in lowered]
    if not matches:
        return cost.default_price
    return cost.prices[max(matches, key=len)]


def add_cost(gpus: pd.DataFrame, jobs: pd.DataFrame, cost: CostSettings | None) -> pd.DataFrame:
    """`gpus` with a `cost` column: price(model) x units of [cost] unit.

    gpu_hour: GPU-seconds / 3600. gpu_mem_hour: GiB-seconds / 3600. job_hour: the job's
    elapsed hours, shared equally by its GPU rows (so a job is charged its runtime once,
    at its GPUs' prices).
    """
    gpus = gpus.copy()
    if gpus.empty or cost is None:
        gpus["cost"] = pd.Series(dtype=float) if gpus.empty else 0.0
        if cost is not None and cost.charge == "effective":
            gpus["idle_held_cost"] = gpus["cost"]
        return gpus
    codes, models = pd.factorize(gpus["gpu_model"], use_na_sentinel=False)
    by_model = np.array([price_for(str(m), cost) for m in models], dtype=float)
    prices = pd.Series(by_model[codes], index=gpus.index)
    if cost.unit == "gpu_hour":
        units = gpus["gpu_seconds"] / 3600.0
    elif cost.unit == "gpu_mem_hour":
        units = gpus["mem_gib_seconds"] / 3600.0
    else:
        elapsed = jobs.set_index("job_id")["elapsed_seconds"]
        per_job = gpus.groupby("job_id")["gpu_uuid"].transform("count")
        units = gpus["job_id"].map(elapsed).astype(float) / 3600.0 / per_job
    held = (prices * units).astype(float)
    if cost.charge == "effective":
        unused = held * unused_share(gpus)
        gpus["cost"] = held - unused
        gpus["idle_held_cost"] = unused
    else:
        gpus["cost"] = held
    return gpus


def unused_share(gpus: pd.DataFrame) -> np.ndarray:
    """Each row's share of its GPU-seconds that GPM measured and found SMs not active.

    measured share (gpm_seconds / gpu_seconds, at most 1) x (1 - SM activity); 0 where
    GPM measured nothing or SM activity is unknown.
    """

    def numbers(name: str) -> np.ndarray:
        if name not in gpus:
            return np.full(len(gpus), np.nan)
        return pd.to_numeric(gpus[name]).to_numpy(dtype=float, na_value=np.nan)

    gpu, gpm, sm = numbers("gpu_seconds"), numbers("gpm_seconds"), numbers("sm_active_mean_percent")
    with np.errstate(divide="ignore", invalid="ignore"):
        measured = np.clip(np.where(gpu > 0, gpm / gpu, 0.0), 0.0, 1.0)
    idle = 1.0 - np.clip(sm / 100.0, 0.0, 1.0)
    share: np.ndarray = np.where(np.isnan(measured) | np.isnan(idle), 0.0, measured * idle)
    return share
