"""What a job's GPUs cost: [cost] prices per GPU model, in the [cost] unit."""

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
    gpus["cost"] = (prices * units).astype(float)
    return gpus
