"""What a job's GPU rows cost: each row priced by the ledger (slurm_gpu/ledger/pricing.py).

The prices, units and charges ([cost] unit, charge, slot_price) are defined there once;
this module only puts them on the GPU frame of sacct and the job view.
"""

from __future__ import annotations

import pandas as pd

from slurm_gpu.config.reports import CostSettings
from slurm_gpu.reports.sums import gpu_sums, priced


def add_cost(gpus: pd.DataFrame, jobs: pd.DataFrame, cost: CostSettings | None) -> pd.DataFrame:
    """`gpus` with `cost`, `idle_cost` (and `idle_held_cost` under charge "effective").

    Each row's charge is the ledger's of its sums (`reports.sums`): job_hour shares the
    job's elapsed time equally among its GPU rows.
    """
    gpus = gpus.copy()
    if gpus.empty or cost is None:
        gpus["cost"] = pd.Series(dtype=float) if gpus.empty else 0.0
        gpus["idle_cost"] = gpus["cost"]
        if cost is not None and cost.charge == "effective":
            gpus["idle_held_cost"] = gpus["cost"]
        return gpus
    elapsed = jobs.drop_duplicates("job_id").set_index("job_id")["elapsed_seconds"]
    place = [c for c in ("gpu_model", "mig_profile", "share") if c in gpus]
    charged = priced(gpu_sums(gpus, elapsed).join(gpus[place]), cost)
    gpus["cost"] = charged["cost"].to_numpy(dtype=float)
    gpus["idle_cost"] = charged["idle_cost"].to_numpy(dtype=float)
    if cost.charge == "effective":
        gpus["idle_held_cost"] = charged["idle_held_cost"].to_numpy(dtype=float)
    return gpus
