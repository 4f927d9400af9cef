"""What a [[quota]] rule has used: the GPU-hours the bill charges, read as the bill reads them.

Quota use is the same sums the reports and the monthly bill are made of (the usage
rollups of folded jobs, raw rows of running and not-yet-folded ones: reports/rollups.py
`period_usage`), prorated to the rule's period as a report of that period prorates
them, so what counts against a quota is what the account is billed:

- gpu_hours: held GPU-hours, missing time included (the job held the GPUs; the bill
  charges it);
- gpu_mem_hours: GiB-hours of GPU memory, as the bill's GPU-memory-hours;
- job_hours: the jobs' elapsed hours inside the period ([cost] unit job_hour's units).

The rollups outlive `slurm-gpu db prune` (which deletes raw intervals after the
retention), so a rolling window longer than the raw retention still counts every job.
"""

from __future__ import annotations

from slurm_gpu.access import Caller, Scope
from slurm_gpu.reports.rollups import period_usage
from slurm_gpu.reports.usage import JobFilter
from slurm_gpu.store import Store

UNIT_SUMS = {
    "gpu_hours": "gpu_seconds",
    "gpu_mem_hours": "mem_gib_seconds",
    "job_hours": "job_hour_seconds",
}
"""[[quota]] unit -> the ledger sum it counts (in unit-seconds)."""

_CONTROLLER = Scope(Caller(0, "controller"), all=True, reason="quota")


def quota_used(
    store: Store, scope: str, unit: str, since: float, until: float, *, now: float, lag: float
) -> float:
    """Use of "account:NAME" or "user:NAME" in [since, until], in `unit` (hours).

    Args:
        store: the accounting store.
        scope: the rule's scope.
        unit: gpu_hours, gpu_mem_hours or job_hours.
        since: the period's start (POSIX seconds).
        until: its end so far (at most `now`).
        now: the current time (running jobs' elapsed time).
        lag: how far behind `now` a reporting agent's newest interval may be (a running
            job's time with no readings is missing, and counted, as the bill counts it).

    Raises:
        ValueError: a scope or unit the rules do not know.
    """
    kind, _, name = scope.partition(":")
    if kind not in ("account", "user") or not name:
        raise ValueError(f"quota scope must be account:NAME or user:NAME, not {scope!r}")
    if unit not in UNIT_SUMS:
        raise ValueError(f"quota unit must be one of {', '.join(UNIT_SUMS)}, not {unit!r}")
    owner = JobFilter(accounts=(name,)) if kind == "account" else JobFilter(users=(name,))
    sums, _ = period_usage(store, since, until, now, _CONTROLLER, owner, None, lag)
    return float(sums[UNIT_SUMS[unit]].sum()) / 3600.0 if len(sums) else 0.0
