"""A report's jobs and their GPU use as two pandas frames: the one source of every figure.

Job facts: the store's `jobs` table, with sacct's live rows laid over it (submit, start,
end, state, name, node list, allocated GPUs, time limit), so a report is right even when
`slurm-gpu sync` has not run. GPU facts: one row per job and GPU, from the job's
summaries (finished jobs) or, when it has none yet (running jobs, summary not shipped),
from the totals of its stored per-minute intervals (reports/frames.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.access import Scope
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.ledger import time as ledger_time
from slurm_gpu.reports.frames import (
    GPU_COLUMNS,
    JOB_COLUMNS,
    Unsummarized,
    categorical,
    fill_models,
    gpu_rows,
    job_id_text,
    stored_jobs,
    window_summaries,
)
from slurm_gpu.reports.pricing import add_cost
from slurm_gpu.slurm.sacct import SacctJob
from slurm_gpu.store import Store, queries


@dataclass(frozen=True)
class JobFilter:
    """sacct's selection options (empty tuple: no restriction)."""

    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    job_ids: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    states: tuple[str, ...] = ()


@dataclass
class Usage:
    """The two frames: `jobs` (one row per job) and `gpus` (one row per job and GPU)."""

    jobs: pd.DataFrame
    gpus: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def load_usage(
    store: Store,
    *,
    since: float | None,
    until: float | None,
    now: float,
    sacct_jobs: Sequence[SacctJob] | None,
    scope: Scope,
    filters: JobFilter = JobFilter(),
    cost: CostSettings | None = None,
    lag: float | None = None,
) -> Usage:
    """Jobs overlapping [since, until] (or `filters.job_ids`) that `scope` may see.

    Args:
        store: the accounting store.
        since: the period's start (POSIX seconds; None: open).
        until: the period's end (POSIX seconds; None: open).
        now: the current time (elapsed time of running jobs).
        sacct_jobs: sacct's rows for the same selection, or None to use the store only.
        scope: what the caller may see (applied before anything is computed).
        filters: sacct's -u/-A/-r/-j/-N/-s.
        cost: prices; None leaves cost columns at 0.
        lag: how far behind `now` a reporting agent's newest interval may be (see
            `frames.Unsummarized`): jobs with no summary are then counted from their
            start, their time with no readings missing. None: their intervals only.
    """
    numeric = [int(j) for j in filters.job_ids if j.isdigit()]
    if filters.job_ids:
        since = until = None  # like sacct -j: the jobs, whenever they ran
    read = queries.JOB_ROW_COLUMNS
    stored: list[tuple[Any, ...]]
    if numeric or not filters.job_ids:
        stored = queries.job_rows_in_window(
            store, since, until, numeric, columns=read, ordered=False, het_components=True
        )
    else:
        stored = []
    if sacct_jobs:
        rows: dict[int, dict[str, Any]] = {}
        for record in stored:
            row = dict(zip(read, record, strict=True))
            rows[int(row["job_id"])] = _from_store(row)
        for job in sacct_jobs:
            rows[job.job_id] = overlay(rows.get(job.job_id), job)
        jobs = pd.DataFrame([_finish(r, now) for r in rows.values()], columns=JOB_COLUMNS)
    else:
        jobs = stored_jobs(stored, read, now)
    jobs = select(jobs, filters, scope)
    wanted = jobs["job_id"].to_numpy(dtype="int64")
    if numeric or filters.job_ids or not len(wanted):
        summary_rows = queries.summary_rows_for(store, wanted.tolist(), columns=GPU_COLUMNS)
    else:
        summary_rows = window_summaries(store, since, until, stored, wanted, GPU_COLUMNS)
    unsummarized = None if lag is None else Unsummarized(jobs, now, lag)
    gpus = gpu_rows(store, wanted, summary_rows, GPU_COLUMNS, unsummarized)
    if not gpus.empty:
        jobs["alloc_gpus"] = alloc_or_counted(jobs, gpus["job_id"].to_numpy())
    gres = {j.job_id: ",".join(t for t, _ in j.gpu_types) for j in sacct_jobs or () if j.gpu_types}
    gpus = ledger_rows(gpus, jobs, store, cost, gres)
    for name in ("user", "account", "partition"):
        jobs[name] = categorical(jobs[name])
    return Usage(jobs.reset_index(drop=True), gpus.reset_index(drop=True))


def ledger_rows(
    gpus: pd.DataFrame,
    jobs: pd.DataFrame,
    store: Store,
    cost: CostSettings | None,
    gres: Mapping[int, str] | None = None,
) -> pd.DataFrame:
    """A job frame's GPU rows as the ledger sums them, whoever read them.

    Blank GPU models filled (`gres`: sacct's gres types by job), each row's job's
    suspended seconds (`with_suspended`), and each row's charge (`add_cost`).
    """
    return add_cost(with_suspended(fill_models(gpus, store, gres), jobs), jobs, cost)


def with_suspended(gpus: pd.DataFrame, jobs: pd.DataFrame) -> pd.DataFrame:
    """`gpus` with each row's `suspended_seconds`: its job's.

    Slurm records a job's suspended time, not a GPU's; each GPU row spans it. The ledger
    takes it out of the row's held time (ledger/time.py).
    """
    if gpus.empty:
        return gpus.assign(suspended_seconds=pd.Series(dtype=float))
    by_job = jobs.drop_duplicates("job_id").set_index("job_id")["suspended_seconds"]
    suspended = gpus["job_id"].map(pd.to_numeric(by_job, errors="coerce"))
    return gpus.assign(suspended_seconds=suspended.to_numpy(dtype=float, na_value=np.nan))


def with_job_listing(store: Store, jobs: pd.DataFrame, now: float) -> pd.DataFrame:
    """`jobs` with all JOB_COLUMNS.

    What a job frame lacks (name, state, ...) is read from the store, for these (few)
    jobs; a whole job frame (`load_usage`'s) is returned as it is.
    """
    missing = [name for name in JOB_COLUMNS if name not in jobs.columns]
    if not missing:
        return jobs
    stored = queries.job_rows_in_window(store, None, None, jobs["job_id"].tolist())
    listing = stored_jobs(stored, queries.JOB_ROW_COLUMNS, now).set_index("job_id")
    return jobs.join(listing[missing], on="job_id")[JOB_COLUMNS]


def alloc_or_counted(jobs: pd.DataFrame, gpu_job_ids: np.ndarray) -> list[int] | np.ndarray:
    """Each job's allocated GPUs, or where unknown (None, 0) the number of its GPU rows."""
    ids, counts = np.unique(gpu_job_ids, return_counts=True)
    alloc = jobs["alloc_gpus"]
    if alloc.dtype == np.int64 and len(ids):  # store rows: no None, in numpy (~10^5 jobs)
        job_ids = jobs["job_id"].to_numpy(dtype=np.int64)
        at = np.minimum(np.searchsorted(ids, job_ids), len(ids) - 1)
        counted_at = np.where(ids[at] == job_ids, counts[at], 0)
        known = alloc.to_numpy()
        return np.where(known > 0, known, counted_at)
    counted = dict(zip(ids.tolist(), counts.tolist(), strict=True))
    return [
        a if a and a > 0 else counted.get(j, 0)
        for j, a in zip(jobs["job_id"].tolist(), jobs["alloc_gpus"].tolist(), strict=True)
    ]


def _from_store(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "job_id": int(row["job_id"]),
        "job_id_text": job_id_text(row),
        "name": row.get("job_name") or "",
        "user": row.get("user") or "",
        "account": row.get("account") or "",
        "partition": row.get("partition") or "",
        "qos": "",
        "state": row.get("state") or "",
        "submit_time": row.get("submit_time"),
        "start_time": row.get("start_time"),
        "end_time": row.get("end_time"),
        "time_limit_seconds": None,
        "nodes": row.get("nodes") or "",
        "alloc_gpus": int(row.get("gpus") or 0),
        "exit_code": row.get("exit_code"),
        "suspended_seconds": row.get("suspended_seconds"),
    }


def overlay(base: dict[str, Any] | None, job: SacctJob) -> dict[str, Any]:
    """sacct's facts win over the store's; the store keeps what sacct lacks."""
    row = dict(base or {})
    facts = {
        "job_id": job.job_id,
        "job_id_text": job.job_id_text,
        "name": job.name,
        "user": job.user,
        "account": job.account,
        "partition": job.partition,
        "qos": job.qos,
        "state": job.state_text,  # "CANCELLED by 1002", as sacct shows it
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "time_limit_seconds": job.time_limit_seconds,
        "nodes": ",".join(job.nodes),
        "alloc_gpus": job.alloc_gpus,
        "exit_code": job.exit_code,
        "suspended_seconds": job.suspended_seconds,
    }
    for key, value in facts.items():
        if (value is not None and value != "") or key not in row:
            row[key] = value
    # sacct's Start/End are whole seconds; prefer them (Elapsed and QueueWait then
    # match sacct's exactly).
    return row


def _finish(row: dict[str, Any], now: float) -> dict[str, Any]:
    start, end = row.get("start_time"), row.get("end_time")
    suspended = row.get("suspended_seconds")
    elapsed = (
        0.0
        if start is None
        else float(
            ledger_time.elapsed(
                start, end if end is not None else now, math.nan if suspended is None else suspended
            )
        )
    )
    out = {name: row.get(name) for name in JOB_COLUMNS}
    out["elapsed_seconds"] = elapsed
    return out


def select(jobs: pd.DataFrame, f: JobFilter, scope: Scope) -> pd.DataFrame:
    """The jobs `scope` may see that the filters select, in job id order."""

    def keep(mask: list[bool]) -> pd.DataFrame:
        # A boolean Series on the frame's index: a plain empty list would select columns.
        return jobs[pd.Series(mask, index=jobs.index, dtype=bool)]

    # scope.sees once per distinct (user, account): a month has ~10^5 jobs, ~10^2 pairs.
    if not scope.all:
        pairs = list(zip(jobs["user"], jobs["account"], strict=True))
        seen = {pair: scope.sees(*pair) for pair in set(pairs)}
        jobs = keep([seen[pair] for pair in pairs])
    if f.users:
        jobs = keep(list(jobs["user"].isin(f.users)))
    if f.accounts:
        jobs = keep(list(jobs["account"].isin(f.accounts)))
    if f.partitions:
        jobs = keep(list(jobs["partition"].isin(f.partitions)))
    if f.job_ids:
        jobs = keep(
            [
                _id_matches(i, t, f.job_ids)
                for i, t in zip(jobs["job_id"], jobs["job_id_text"], strict=True)
            ]
        )
    if f.states:
        wanted = {s.upper() for s in f.states}
        # By the state's name: "CANCELLED by 1002" is CANCELLED (sacct -s CA).
        jobs = keep([str(s).split(" ")[0].upper() in wanted for s in jobs["state"]])
    if f.nodes:
        wanted_nodes = set(f.nodes)
        jobs = keep([bool(wanted_nodes & set(str(n).split(","))) for n in jobs["nodes"]])
    return jobs if jobs["job_id"].is_monotonic_increasing else jobs.sort_values("job_id")


def _id_matches(job_id: Any, text: Any, wanted: tuple[str, ...]) -> bool:
    """-j 150 selects job 150 and every task of array 150 (150_1...), like sacct."""
    text = str(text)
    return any(
        w == str(job_id) or w == text or text.startswith(w + "_") or text.startswith(w + "+")
        for w in wanted
    )
