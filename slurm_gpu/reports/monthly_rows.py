"""The month's rows for `slurm-gpu report monthly` and the statements: sums rows.

What monthly_tables.py sums, the same sums rows whatever their source:

- the month's `job_usage` rows (one per folded job, run and place), prorated to the
  month by the part of the job inside it, priced by place (the ledger's charge, idle
  cost included), scoped like reports/rollups.py;
- per folded job, the GPU-seconds and rows of each utilization bin, summed by the
  database from the summaries (store/monthly_reads.py): a `job_usage` row sums its GPU
  rows, the bins need each row's mean;
- the unfolded jobs of the month (running, no summary yet, no start or end) from raw
  rows, as the ledger's sums of each GPU row (reports/grouped.py `raw_sums`).

Every job is counted one by one from its rows (the month's jobs are read anyway, for the
daily and node tables in local time and the top waste jobs), so job counts and queue
waits are exact: no figure here comes from the rollups' wait buckets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from slurm_gpu.ledger import periods, time
from slurm_gpu.reports import grouped, rollups
from slurm_gpu.reports.frames import GPU_COLUMNS, Unsummarized, gpu_rows, stored_jobs
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.sums import priced
from slurm_gpu.reports.usage import JobFilter, Usage, alloc_or_counted, ledger_rows, select
from slurm_gpu.store import monthly_reads, queries, rollup_reads, usage_rollup

JOB_FACTS = ("job_id", "partition", "start_time", "submit_time")
# What the controller's table takes from sacct where live sacct answers (`job_facts`).
SACCT_FACTS = ("start_time", "time_limit_seconds", "alloc_gpus")


@dataclass
class MonthRows:
    """The month's usage as sums rows (reports/rollups.py's frames) and the jobs.

    sums: one row per `job_usage` row or unfolded GPU row, prorated: owner, place,
    FIGURE_SUMS, the zero count columns, job_id, start_time, end_time, full_seconds (the
    row's GPU-seconds before proration), idle_seconds and idle_cost. members: the jobs
    of `sums` (reports/rollups.py MEMBER_COLUMNS), each counted one by one.
    bins: (job_id, bin, GPU-seconds prorated, rows) of every GPU row's utilization.
    jobs: the month's visible jobs (JOB_FACTS), for the queue waits.
    """

    sums: pd.DataFrame
    members: pd.DataFrame
    bins: pd.DataFrame
    jobs: pd.DataFrame


def month_rows(
    env: ReportEnv, since: float, until: float, filters: JobFilter, edges: Sequence[float]
) -> MonthRows:
    """The month [since, until)'s rows that `env.scope` may see and `filters` select.

    `edges`: the utilization bins' (monthly_tables.py UTIL_BINS).
    """
    store, cost = env.store, env.config.cost
    owners = rollups.selected_owners(filters)
    cells = rollups.boundary_cells(store, since, until, None, until, owners=owners)
    cells = rollups.visible(cells, env.scope, filters)
    cells = rollups.models_filled(cells, store).reset_index(drop=True)
    part = rollups.edge_part(cells, since, until, closed=True)
    folded = priced(part, cost)
    if len(folded):
        folded = folded.assign(
            full_seconds=cells.loc[part.index, "gpu_seconds"].to_numpy(dtype=float),
            job_id=folded["job_id"].astype("int64"),
        )
    members = _members(folded)
    bins = _folded_bins(env, since, until, folded, edges)
    jobs = cells[list(JOB_FACTS)].drop_duplicates("job_id") if len(cells) else _no_jobs()
    raw = _unfolded(env, since, until, filters, edges)
    sums = folded
    if raw is not None:
        raw_sums, raw_members, raw_bins, raw_jobs = raw
        sums = pd.concat([p for p in (folded, raw_sums) if len(p)] or [folded], ignore_index=True)
        members = pd.concat([members, raw_members], ignore_index=True)
        bins = pd.concat([bins, raw_bins], ignore_index=True)
        jobs = pd.concat([jobs, raw_jobs], ignore_index=True)
    sums = _with_counts(sums)
    if len(sums):
        sums = sums.reset_index(drop=True)
        gpu = sums["gpu_seconds"].to_numpy(dtype=float)
        idle = np.nan_to_num(
            time.idle(
                gpu,
                sums["active_seconds"].to_numpy(dtype=float),
                sums["missing_seconds"].to_numpy(dtype=float),
            )
        )
        sums = sums.assign(idle_seconds=idle)
    return MonthRows(sums, members, bins, jobs)


def _no_jobs() -> pd.DataFrame:
    return pd.DataFrame(columns=list(JOB_FACTS))


def _members(sums: pd.DataFrame) -> pd.DataFrame:
    """Each job row of `sums` with its queue wait (Start - Submit; NaN: unknown)."""
    if not len(sums):
        return pd.DataFrame(columns=grouped.MEMBER_COLUMNS)
    submit = pd.to_numeric(sums["submit_time"]).to_numpy(dtype=float, na_value=np.nan)
    wait = sums["start_time"].to_numpy(dtype=float) - submit
    return sums.assign(queue_wait=wait)[list(grouped.MEMBER_COLUMNS)]


def _with_counts(sums: pd.DataFrame) -> pd.DataFrame:
    """`sums` with the rollups' count columns at 0: every job is a member (counted exactly)."""
    counted = grouped.counted_figures(("jobs",))
    zeros = pd.DataFrame(
        np.zeros((len(sums), len(counted))), columns=list(counted), index=sums.index
    )
    return pd.concat([sums.drop(columns=[c for c in counted if c in sums]), zeros], axis=1)


def _folded_bins(
    env: ReportEnv, since: float, until: float, folded: pd.DataFrame, edges: Sequence[float]
) -> pd.DataFrame:
    """The utilization bins of the visible folded jobs, prorated by their part in the month."""
    columns = ["job_id", "bin", "gpu_seconds", "rows"]
    if not len(folded):
        return pd.DataFrame(columns=columns)
    rows = pd.DataFrame(
        monthly_reads.utilization_bins(env.store, since, until, edges), columns=columns
    )
    jobs = folded.drop_duplicates("job_id").set_index("job_id")
    rows = rows[rows["job_id"].astype("int64").isin(jobs.index)]
    ids = rows["job_id"].astype("int64")
    # One fraction per job: each of its GPU rows is prorated by the job's times.
    fraction = _job_fraction(jobs, since, until).reindex(ids).to_numpy(dtype=float)
    # The bins sum the summaries' spans; a job's held GPU-seconds (the ledger's, folded)
    # leave out its suspended time, which each of its GPU rows spans alike.
    per_job = folded.groupby("job_id")[["gpu_seconds", "suspended_seconds"]].sum()
    span = per_job["gpu_seconds"] + per_job["suspended_seconds"]
    held = (per_job["gpu_seconds"] / span.where(span > 0)).fillna(1.0)
    return rows.assign(
        job_id=ids.to_numpy(),
        gpu_seconds=rows["gpu_seconds"].to_numpy(dtype=float)
        * fraction
        * held.reindex(ids).to_numpy(dtype=float),
        rows=rows["rows"].astype("int64"),
    )


def _job_fraction(jobs: pd.DataFrame, since: float, until: float) -> pd.Series:
    values = periods.fractions(
        pd.to_numeric(jobs["start_time"], errors="coerce").to_numpy(dtype=float, na_value=np.nan),
        pd.to_numeric(jobs["end_time"], errors="coerce").to_numpy(dtype=float, na_value=np.nan),
        since,
        until,
        until,
    )
    return pd.Series(np.asarray(values, dtype=float), index=jobs.index)


def _unfolded(
    env: ReportEnv, since: float, until: float, filters: JobFilter, edges: Sequence[float]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame] | None:
    """(sums, members, bins, jobs) of the month's jobs the rollups do not hold, from raw rows."""
    ids = rollup_reads.unfolded_job_ids(env.store, since, until)
    if not ids:
        return None
    usage = jobs_usage(env, ids, filters)
    jobs = usage.jobs[list(JOB_FACTS)].assign(job_id=usage.jobs["job_id"].astype("int64"))
    raw, rows = grouped.raw_sums(usage, since, until, env.now_seconds)
    if not len(rows):
        empty = pd.DataFrame(columns=["job_id", "bin", "gpu_seconds", "rows"])
        return raw, pd.DataFrame(columns=grouped.MEMBER_COLUMNS), empty, jobs
    fraction = rows["fraction"].to_numpy(dtype=float)
    raw = raw.assign(
        job_id=rows["job_id"].to_numpy(dtype="int64"),
        start_time=pd.to_numeric(rows["start_time"], errors="coerce").to_numpy(dtype=float),
        end_time=pd.to_numeric(rows["end_time"], errors="coerce").to_numpy(dtype=float),
        submit_time=pd.to_numeric(rows["submit_time"], errors="coerce").to_numpy(dtype=float),
        # The ledger's held GPU-seconds (suspended time out), as the folded rows' are.
        full_seconds=raw["gpu_seconds"].to_numpy(dtype=float)
        / np.where(fraction > 0, fraction, 1.0),
    )
    for name in usage_rollup.OWNER:
        raw[name] = raw[name].astype(str)
    members = raw.assign(queue_wait=rows["queue_wait"].to_numpy(dtype=float))[
        list(grouped.MEMBER_COLUMNS)
    ]
    util = pd.to_numeric(rows["util_mean_percent"], errors="coerce").to_numpy(dtype=float)
    bounds = np.asarray(edges, dtype=float)
    found = np.searchsorted(bounds, util, side="right") - 1
    binned = np.where(
        np.isnan(util),
        monthly_reads.NO_READINGS,
        np.where((util >= bounds[0]) & (util < bounds[-1]), found, monthly_reads.OUTSIDE),
    )
    bins = pd.DataFrame(
        {
            "job_id": raw["job_id"].to_numpy(),
            "bin": binned.astype("int64"),
            "gpu_seconds": raw["gpu_seconds"].to_numpy(dtype=float),  # the ledger's held
            "rows": np.ones(len(rows), dtype="int64"),
        }
    )
    return raw, members, bins, jobs


def jobs_usage(env: ReportEnv, ids: Sequence[int], filters: JobFilter) -> Usage:
    """These jobs (by job id) as `load_usage` reads them, where scope and -u/-A/-r allow.

    The unfolded jobs of the month, and the top waste and cancelled jobs' facts (name,
    state, GPUs, time limit). Read by job id exactly (not as `sacct -j`, which takes the
    tasks of an array of that id too), as reports/rollups.py reads the unfolded jobs.
    """
    if not ids:
        facts = ["job_id", "alloc_gpus", "start_time", "time_limit_seconds"]
        return Usage(pd.DataFrame(columns=facts), pd.DataFrame(columns=["job_id"]))
    store, now = env.store, env.now_seconds
    jobs = _stored(env, ids, filters)
    wanted = jobs["job_id"].to_numpy(dtype="int64")
    summary_rows = queries.summary_rows_for(store, wanted.tolist(), columns=GPU_COLUMNS)
    lag = env.freshness.interval_lag
    unsummarized = None if lag is None else Unsummarized(jobs, now, lag)
    gpus = gpu_rows(store, wanted, summary_rows, GPU_COLUMNS, unsummarized)
    if not gpus.empty:
        jobs["alloc_gpus"] = alloc_or_counted(jobs, gpus["job_id"].to_numpy())
    gpus = ledger_rows(gpus, jobs, store, env.config.cost)
    return Usage(jobs.reset_index(drop=True), gpus.reset_index(drop=True))


def job_facts(
    env: ReportEnv, ids: Sequence[int], filters: JobFilter, since: float, until: float
) -> Usage:
    """`jobs_usage(...).jobs` of these jobs without their GPU rows (the controller's).

    A job's GPUs are its allocation; only where that is unknown are its GPU rows read
    and counted, as `load_usage` counts them. Time limits are sacct's only (the store
    keeps none): with live sacct, the month's rows (the raw path's one sacct call) give
    these jobs their start, time limit and allocation, as `load_usage` overlays them.
    """
    if not ids:
        return jobs_usage(env, ids, filters)
    jobs = _stored(env, ids, filters).reset_index(drop=True)
    sacct = {j.job_id: j for j in env.sacct(since, until, filters) or ()}
    if sacct and len(jobs):
        overlaid = {n: jobs[n].astype(object).to_numpy().copy() for n in SACCT_FACTS}
        for i, job_id in enumerate(jobs["job_id"].to_numpy(dtype="int64").tolist()):
            row = sacct.get(job_id)
            for name in SACCT_FACTS if row is not None else ():
                value = getattr(row, name)
                if value is not None and value != "":
                    overlaid[name][i] = value
        jobs = jobs.assign(**{n: pd.Series(v, index=jobs.index) for n, v in overlaid.items()})
    alloc = pd.to_numeric(jobs["alloc_gpus"], errors="coerce").fillna(0).to_numpy()
    unknown = alloc <= 0
    if unknown.any():
        counted = jobs_usage(env, jobs["job_id"][unknown].tolist(), filters).jobs
        by_id = dict(zip(counted["job_id"].tolist(), counted["alloc_gpus"].tolist(), strict=True))
        values = jobs["alloc_gpus"].astype(object).to_numpy().copy()
        job_ids = jobs["job_id"].to_numpy(dtype="int64")
        for i in np.flatnonzero(unknown).tolist():
            values[i] = by_id.get(int(job_ids[i]), values[i])
        jobs["alloc_gpus"] = values
    return Usage(jobs, pd.DataFrame(columns=["job_id"]))


def _stored(env: ReportEnv, ids: Sequence[int], filters: JobFilter) -> pd.DataFrame:
    """The stored rows of these jobs (by exact job id) that scope and -u/-A/-r allow."""
    stored = queries.job_rows_in_window(env.store, None, None, sorted({int(i) for i in ids}))
    jobs = stored_jobs(stored, queries.JOB_ROW_COLUMNS, env.now_seconds)
    return select(jobs, filters, env.scope)
