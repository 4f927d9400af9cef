"""sacct's rows: one record per job (or per job and GPU), its facts and its GPU totals.

The totals are `reports/figures.py`'s `JOB_TOTAL_KEYS`, summed over the job's GPU rows
(or over the one GPU row, for `sacct --gpus`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from slurm_gpu.reports.figures import Groups, empty_job_totals, physical_seconds
from slurm_gpu.reports.usage import Usage
from slurm_gpu.store.queries import SLOT_SUMMARY_COLUMNS
from slurm_gpu.units import is_known

RUNNING_STATES = frozenset({"RUNNING", "REQUEUED", "SUSPENDED", "COMPLETING"})


def job_records(usage: Usage) -> list[dict[str, Any]]:
    """One record per job: its facts and the sums of its GPU rows (the sacct rows)."""
    totals = dict(Groups(usage.gpus, "job_id").job_totals()) if len(usage.gpus) else {}
    physical = physical_seconds(usage.gpus, "job_id") if len(usage.gpus) else {}
    out = []
    for job in usage.jobs.to_dict("records"):
        record = dict(job)
        record.update(totals.get(job["job_id"]) or empty_job_totals())
        # share x slot-seconds (issue 14): a whole GPU's are its GPU-seconds
        record["physical_gpu_seconds"] = physical.get(job["job_id"], 0.0)
        out.append(_with_queue_wait({str(k): v for k, v in record.items()}))
    return out


def gpu_records(usage: Usage) -> list[dict[str, Any]]:
    """One record per job and GPU slot (sacct --gpus), with the slot's kind, share..."""
    jobs = {j["job_id"]: j for j in usage.jobs.to_dict("records")}
    gpus = usage.gpus.sort_values(["job_id", "node", "gpu_uuid"])
    each = Groups(gpus.assign(gpu_row=np.arange(len(gpus))), "gpu_row").job_totals()
    out = []
    for gpu, (_, totals) in zip(gpus.to_dict("records"), each, strict=True):
        record = dict(jobs[gpu["job_id"]])
        record.update(totals)
        record["node"] = gpu["node"]
        record["gpu_uuid"] = gpu["gpu_uuid"]
        for name in SLOT_SUMMARY_COLUMNS:  # the GPU slot (revision 0009), where read
            if name in gpu:
                record[name] = gpu[name]
        share = gpu.get("share")
        share = float(share) if is_known(share) else 1.0
        record["physical_gpu_seconds"] = float(totals["gpu_seconds"] or 0.0) * share
        record["alloc_gpus"] = 1
        record["nodes"] = gpu["node"]
        out.append(_with_queue_wait({str(k): v for k, v in record.items()}))
    return out


def _with_queue_wait(record: dict[str, Any]) -> dict[str, Any]:
    start: Any = record.get("start_time")
    submit: Any = record.get("submit_time")
    record["queue_wait_seconds"] = (
        max(float(start) - float(submit), 0.0) if is_known(start) and is_known(submit) else None
    )
    return record


def is_running(state: str | None) -> bool:
    """True for a state in which the job still holds its GPUs."""
    return (state or "").upper() in RUNNING_STATES
