"""Usage rows as the ledger's sums rows (slurm_gpu/ledger), and their price.

Every road to a figure goes through here: a raw GPU row (a finished job's summary, a
running job's interval totals) becomes the same sums row as the rollups fold at ingest
(`ledger.sums.row_sums`), is priced by its place (`priced`, `ledger.pricing`) and
prorated to the period (`ledger.periods.fractions`). A group's figures are then
`ledger.figures.figures` of the group's summed sums, whatever the source of its rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.config.reports import CostSettings
from slurm_gpu.ledger import pricing
from slurm_gpu.ledger.sums import COUNTS, ROW_COLUMNS, SUMS, row_sums

CHARGES = ("cost", "idle_held_cost", "idle_cost")
"""A sums row's charge (ledger.pricing.Charge), prorated with its sums."""
PRICED = (*SUMS, *COUNTS, *CHARGES)
"""The columns of a priced sums frame besides its owner and place."""
OWNER = ("user", "account", "partition")
"""Whose usage a sums row is (store/usage_rollup.py OWNER)."""
PLACE = ("node", "gpu_model", "slot_kind", "mig_profile", "share")
"""Where it was (store/schema.py USAGE_PLACE)."""


def gpu_sums(gpus: pd.DataFrame, elapsed: pd.Series | None = None) -> pd.DataFrame:
    """The ledger's sums of each GPU row (same index), unprorated.

    Args:
        gpus: GPU rows (reports/frames.py), `job_id` and the ledger's ROW_COLUMNS (those
            a source lacks are unknown).
        elapsed: each job's elapsed seconds by job id ([cost] unit job_hour: shared
            equally by the job's GPU rows); None: 0.
    """
    columns = {
        name: pd.to_numeric(gpus[name], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        for name in ROW_COLUMNS
        if name in gpus
    }
    if not columns:
        columns = {"gpu_seconds": np.zeros(len(gpus))}
    job_hours: Any = 0.0
    if elapsed is not None and len(gpus):
        per_job = gpus.groupby("job_id")["job_id"].transform("count").to_numpy(dtype=float)
        job_hours = gpus["job_id"].map(elapsed).to_numpy(dtype=float, na_value=np.nan) / per_job
    summed = row_sums(columns, job_hours)
    return pd.DataFrame(summed, index=gpus.index)


def priced(sums: pd.DataFrame, cost: CostSettings | None) -> pd.DataFrame:
    """Sums rows with their charge: `cost`, `idle_held_cost` and `idle_cost`.

    The ledger's `pricing.charge`; `idle_held_cost` is NaN unless charged "effective".

    Each row is priced by its place (`gpu_model`, `mig_profile`, `share`); without
    [cost] every charge is 0.
    """
    sums = sums.copy()
    if cost is None or not len(sums):
        sums["cost"] = 0.0
        sums["idle_held_cost"] = 0.0 if cost is not None and cost.charge == "effective" else np.nan
        sums["idle_cost"] = 0.0
        return sums
    charged = pricing.charge(place_prices(sums, cost), sums, cost)
    sums["cost"] = charged.cost
    sums["idle_held_cost"] = charged.idle_held_cost
    sums["idle_cost"] = charged.idle_cost
    return sums


def place_prices(frame: pd.DataFrame, cost: CostSettings) -> np.ndarray:
    """Each row's price per [cost] unit, by its GPU model, MIG profile and share.

    Rows without slot columns (from before slots) are whole GPUs.
    """
    n = len(frame)

    def texts(name: str) -> np.ndarray:
        if name not in frame:
            return np.full(n, "", dtype=object)
        return frame[name].astype(object).where(frame[name].notna(), "").to_numpy(dtype=object)

    share = (
        pd.to_numeric(frame["share"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        if "share" in frame
        else np.ones(n)
    )
    share = np.where(np.isnan(share), 1.0, share)
    keys = list(zip(texts("gpu_model"), texts("mig_profile"), share.tolist(), strict=True))
    prices = {k: pricing.slot_price_for(str(k[0]), cost, float(k[2]), str(k[1])) for k in set(keys)}
    return np.array([prices[k] for k in keys], dtype=float)


def prorate(sums: pd.DataFrame, fraction: np.ndarray) -> pd.DataFrame:
    """Sums rows scaled to the part of their job inside a period (counts are not)."""
    scaled = [c for c in (*SUMS, *CHARGES) if c in sums]
    out = sums.copy()
    out[scaled] = sums[scaled].to_numpy(dtype=float) * np.asarray(fraction, dtype=float)[:, None]
    return out


def job_sums(gpus: pd.DataFrame) -> pd.DataFrame:
    """Per job id: held and active seconds (the ledger's, per row) and cost of its GPU rows.

    Columns gpu_seconds, active_seconds, cost, indexed by job_id (the exporter's per-job
    counters: active clipped to the measured time, as every report has it).
    """
    columns = ["gpu_seconds", "active_seconds", "cost"]
    if gpus.empty:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="job_id", dtype="int64"))
    sums = gpu_sums(gpus)
    cost = (
        pd.to_numeric(gpus["cost"], errors="coerce").fillna(0.0).to_numpy(dtype=float)
        if "cost" in gpus
        else np.zeros(len(gpus))
    )
    frame = pd.DataFrame(
        {
            "job_id": gpus["job_id"].astype("int64").to_numpy(),
            "gpu_seconds": sums["gpu_seconds"].to_numpy(dtype=float),
            "active_seconds": sums["active_seconds"].to_numpy(dtype=float),
            "cost": cost,
        }
    )
    return frame.groupby("job_id")[columns].sum()
