"""What a job's GPUs cost: [cost] prices per GPU model, in the [cost] unit.

`[cost] charge = "held"` (the default) charges every unit held. `"effective"` splits each
GPU row's charge by what NVML GPM measured: of the share of its GPU-seconds GPM measured
(`gpm_seconds`), the SM-active part is charged (`cost`) and the rest, held but unused, is
priced apart (`idle_held_cost`, not in `cost`); the share GPM did not measure (a GPU
without GPM, readings missing) is charged as held. Unknown is never idle, nor free:
`cost + idle_held_cost` is always what "held" charges.

GPU slots (issue 14): a `[cost] prices` key "model:profile" ("h100:1g.10gb") prices a MIG
slice of that profile per slot-hour. Without one, a MIG slice costs its share of its
GPU's price (`share x` the model's price; 1g.10gb of an H100: 1/7), and a shard or MPS
share its share, so seven 1g slices held for a month bill as one GPU-month
(`[cost] slot_price = "whole"` charges every slot its GPU's full price instead). A whole
GPU's share is 1: its price is as before. GPU-memory-hours are priced by the model (or
"model:profile") alone: a GiB-hour is one whatever holds it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from slurm_gpu.config.reports import CostSettings


def price_for(model: str, cost: CostSettings) -> float:
    """Price per unit of a GPU model: the longest [cost] prices key the model contains.

    Keys naming a MIG profile ("h100:1g.10gb") price slices only (`slot_price_for`).
    """
    lowered = model.lower()
    matches = [k for k in cost.prices if ":" not in k and k.lower() in lowered]
    if not matches:
        return cost.default_price
    return cost.prices[max(matches, key=len)]


def profile_price_for(model: str, profile: str, cost: CostSettings) -> float | None:
    """The [cost] prices "model:profile" key's price of a MIG slice; None without one.

    The profile must be the slice's ("1g.10gb", case-insensitive); of the keys whose
    model part the model contains, the longest wins, as for models.
    """
    if not profile:
        return None
    lowered, wanted = model.lower(), profile.lower()
    matches = []
    for key in cost.prices:
        name, colon, key_profile = key.lower().rpartition(":")
        if colon and key_profile.strip() == wanted and name.strip() in lowered:
            matches.append(key)
    return cost.prices[max(matches, key=len)] if matches else None


def slot_price_for(
    model: str, cost: CostSettings, share: float = 1.0, profile: str = "", *, per_gpu: bool = True
) -> float:
    """Price per unit of one GPU slot (module docstring).

    Args:
        model: the physical GPU's model.
        cost: [cost].
        share: the slot's part of its GPU (1: a whole GPU).
        profile: a MIG slice's profile ("" otherwise).
        per_gpu: the unit is GPU time (gpu_hour, job_hour), so the share applies; False
            for GPU-memory-hours.
    """
    explicit = profile_price_for(model, profile, cost)
    if explicit is not None:
        return explicit
    price = price_for(model, cost)
    if per_gpu and cost.slot_price == "share" and 0.0 <= share < 1.0:
        return price * share
    return price


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
    prices = _slot_prices(gpus, cost)
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


def _slot_prices(gpus: pd.DataFrame, cost: CostSettings) -> pd.Series:
    """Each GPU row's price per unit: by model, and for a slot by its profile and share.

    Rows from before slots (no slot columns) are whole GPUs.
    """
    slotted = "share" in gpus and "mig_profile" in gpus
    if not slotted:
        codes, models = pd.factorize(gpus["gpu_model"], use_na_sentinel=False)
        by_model = np.array([price_for(str(m), cost) for m in models], dtype=float)
        return pd.Series(by_model[codes], index=gpus.index)
    share = pd.to_numeric(gpus["share"]).to_numpy(dtype=float, na_value=np.nan)
    share = np.where(np.isnan(share), 1.0, share)
    keys = pd.DataFrame(
        {
            "model": gpus["gpu_model"].astype(object).to_numpy(),
            "profile": gpus["mig_profile"].astype(object).to_numpy(),
            "share": share,
        }
    )
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(keys.fillna("")))
    per_gpu = cost.unit != "gpu_mem_hour"
    by_slot = np.array(
        [
            slot_price_for(str(m or ""), cost, float(f), str(p or ""), per_gpu=per_gpu)
            for m, p, f in uniques
        ],
        dtype=float,
    )
    return pd.Series(by_slot[codes], index=gpus.index)


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
