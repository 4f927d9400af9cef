"""`slurm-gpu report monthly`: one month's usage, waste and enforcement as HTML + CSV.

Where the store is at the usage rollups' revision (0010) and the selection is -u/-A/-r
only, under [cost] unit gpu_hour, the tables are summed from the rollups
(reports/monthly_rollups.py: the month's `job_usage` rows, the unfolded jobs from raw
rows), with the same figures as from raw rows. Otherwise, as before 0010: figures come
from the same place as every report (reports/usage.py `load_usage` through
`ReportEnv.usage`, so the caller's scope applies), prorated to the month like
`slurm-gpu report` (reports/summary.py `prorated`) and summed by reports/figures.py
(GPU-hours, cost, utilization weighted by GPU-hours, measured idle and missing
GPU-hours: time with no readings is never idle, nor idle cost). Controller actions
come from the audit log (`ControlStore.audit_entries`), enforced entries only.

GPU-hours returned by a cancellation: the job's GPUs x the time left until its time limit
(Start + Timelimit, from sacct) at the moment it was cancelled. A job whose limit is
unknown (no sacct, or UNLIMITED) is counted in `cancelled_unknown_limit`, not in the sum.
"""

from __future__ import annotations

import csv
import datetime as dt
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.reports import efficiency as gpm
from slurm_gpu.reports import grouped, monthly_rollups
from slurm_gpu.reports.figures import Groups, idle_seconds, physical_seconds
from slurm_gpu.reports.monthly_model import MonthlyReport as MonthlyReport
from slurm_gpu.reports.monthly_page import render_page
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.summary import has_slots, prorated, slot_groups
from slurm_gpu.reports.usage import JobFilter, Usage, _overlay, with_job_listing
from slurm_gpu.store import monthly_reads, queries
from slurm_gpu.store.control import AuditEntry
from slurm_gpu.units import is_known

UTIL_BINS = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.0001]
QUOTA_ACTIONS = frozenset({"hold", "release", "block", "unblock", "set_qos", "set_fairshare"})


def month_bounds(text: str, tz: dt.tzinfo | None) -> tuple[float, float]:
    """`2026-11` -> POSIX seconds of [Nov 1 00:00, Dec 1 00:00) in `tz`.

    Raises:
        ValueError: not YYYY-MM.
    """
    first = dt.datetime.strptime(text, "%Y-%m").replace(tzinfo=tz)
    following = (first.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
    return first.timestamp(), following.timestamp()


def build_monthly(
    env: ReportEnv,
    month: str,
    *,
    waste_top: int = 20,
    filters: JobFilter | None = None,
    from_rollups: bool | None = None,
) -> MonthlyReport:
    """The month's report for what `env.scope` may see.

    Args:
        env: the report environment (store, sacct, scope, clock, prices).
        month: YYYY-MM (local time).
        waste_top: jobs listed under "top wasteful jobs".
        filters: sacct's selection options (default: every visible job).
        from_rollups: read the usage rollups (reports/monthly_rollups.py) or raw rows;
            None: the rollups wherever `monthly_rollups.usable`.
    """
    selection = filters or JobFilter()
    since, until = month_bounds(month, env.tz)
    now = env.now_seconds
    tables = month_tables(env, since, until, selection, waste_top, from_rollups=from_rollups)
    days, day_starts = _days(since, until, env.tz)
    gpus_per_node = queries.gpus_per_node(env.store)
    shares = _day_shares(tables.spread, tables.full_seconds, day_starts, until, now)
    nodes = _nodes(
        tables.spread,
        shares,
        gpus_per_node,
        lambda unlisted: queries.gpus_used_on(env.store, unlisted, since, until),
        len(days),
        env.config.reports.busy_node_factor,
    )
    end = min(until, max(now, since))
    total = tables.total
    visible_gpus = sum(gpus_per_node.values()) if env.scope.all else 0
    capacity_hours = visible_gpus * (end - since) / 3600.0
    overview = {
        **total,
        "accounts": tables.accounts_seen,
        "idle_cost": tables.idle_cost,
        "gpus": visible_gpus,
        "nodes": len(gpus_per_node) if env.scope.all else 0,
        "capacity_gpu_hours": capacity_hours,
        "occupancy_percent": 100.0 * total["gpu_hours"] / capacity_hours
        if capacity_hours > 0
        else None,
    }
    entries = [
        e
        for e in env.store.control.audit_entries(since=since, until=until, dry_run=False)
        if e.action != "none" and env.scope.sees(e.user, e.account)
    ]
    actions = _actions(entries, tables.jobs_of([e.job_id for e in entries if e.job_id is not None]))
    controller = _controller(actions)
    overview["gpu_hours_returned"] = sum(a["gpu_hours_returned"] or 0.0 for a in actions)
    overview["cancellations"] = sum(1 for a in actions if a["kind"] == "cancellation")
    report = MonthlyReport(
        month=month,
        since=since,
        until=until,
        cluster=env.config.cluster.name,
        scope=env.scope.describe(),
        currency=env.config.cost.currency,
        unit=env.config.cost.unit,
        generated=now,
        overview=overview,
        days=days,
        daily_gpu_hours=[float(v) / 3600.0 for v in shares.per_day()],
        accounts=tables.accounts,
        users=tables.users,
        utilization=tables.utilization,
        idle=tables.idle,
        waste_jobs=tables.waste_jobs,
        queue=tables.queue,
        nodes=nodes,
        controller=controller,
        actions=actions,
        notes=list(env.warnings),
        efficiency=gpm.efficiency(tables.accounts),
        efficiency_users=gpm.efficiency(tables.users, users=True),
        efficiency_note=tables.efficiency_note,
        charge=env.config.cost.charge,
        slots=tables.slots,
    )
    if not env.scope.all:
        report.notes.append(
            f"Only the jobs you may see ({env.scope.describe()}); cluster capacity, "
            "occupancy and node totals need an admin."
        )
    return report


@dataclass
class Tables:
    """What the report's usage tables are made of, from raw rows or from the rollups.

    spread: a row per usage row with its node, start and end time (the daily and node
    tables spread `full_seconds`, its GPU-seconds before proration, over the days it
    touches). jobs_of: the month's facts of these jobs (the controller's actions).
    """

    spread: pd.DataFrame
    full_seconds: pd.Series
    total: dict[str, Any]
    accounts_seen: int
    idle_cost: float
    accounts: list[dict[str, Any]]
    users: list[dict[str, Any]]
    utilization: list[dict[str, Any]]
    idle: list[dict[str, Any]]
    waste_jobs: list[dict[str, Any]]
    queue: list[dict[str, Any]]
    efficiency_note: str | None
    slots: list[dict[str, Any]]
    jobs_of: Callable[[Sequence[int]], Usage]
    statement_of: Callable[[str], AccountPart]


@dataclass
class AccountPart:
    """One account's part of the month's tables: what its statement says.

    users: the `users` table's records of the account's rows alone (a user of two
    accounts shows this account's part); total: the account's figures, as its row of
    the `accounts` table; idle_cost: its idle cost.
    """

    users: list[dict[str, Any]]
    total: dict[str, Any]
    idle_cost: float


def month_tables(
    env: ReportEnv,
    since: float,
    until: float,
    filters: JobFilter,
    waste_top: int,
    *,
    from_rollups: bool | None = None,
) -> Tables:
    """The month's tables, from the usage rollups wherever `monthly_rollups.usable`.

    The monthly report and the account statements mailed with it both read these, so a
    statement's total is its account's row of the report.
    """
    if from_rollups is None:
        from_rollups = monthly_rollups.usable(env, filters)
    if from_rollups:
        return _tables_from_rollups(env, since, until, filters, waste_top)
    return _tables_from_raw(env, since, until, filters, waste_top)


def _tables_from_raw(
    env: ReportEnv, since: float, until: float, filters: JobFilter, waste_top: int
) -> Tables:
    """The tables from raw rows (`env.usage`: `load_usage`, with sacct), as before 0010."""
    now = env.now_seconds
    usage = env.usage(since, until, filters, figures_only=True)
    rows = prorated(usage, since, until, now)
    full_seconds = (
        rows["gpu_seconds"].astype(float) / rows["fraction"].where(rows["fraction"] > 0, 1.0)
        if len(rows)
        else pd.Series(dtype=float)
    )
    keep = rows["fraction"] > 0 if len(rows) else pd.Series(dtype=bool)
    if not keep.all():  # usually every row is kept: no copy then
        rows, full_seconds = rows[keep], full_seconds[keep]
    if len(rows):
        # Measured idle only (reports/figures.py): time nobody measured is missing, so
        # neither idle cost nor a place among the wasteful jobs.
        rows = rows.assign(idle_seconds=idle_seconds(rows))
        # What the idle hours cost at the held price ([cost] charge = "effective" bills
        # part of it as IdleHeldCost, apart from Cost).
        held = rows["cost"] + rows["idle_held_cost"] if "idle_held_cost" in rows else rows["cost"]
        rows = rows.assign(
            idle_cost=held
            * (rows["idle_seconds"] / rows["gpu_seconds"].where(rows["gpu_seconds"] > 0)).fillna(
                0.0
            )
        )
    whole = Groups(rows)  # the month's totals
    total = whole.figures()[0][1]
    accounts = _grouped(rows, "account")
    return Tables(
        spread=rows,
        full_seconds=full_seconds,
        total=total,
        accounts_seen=int(rows["account"].nunique()) if len(rows) else 0,
        idle_cost=whole.sum("idle_cost", 0, len(rows)) if len(rows) else 0.0,
        accounts=accounts,
        users=_grouped(rows, "user"),
        utilization=_utilization(rows),
        idle=_idle(rows),
        waste_jobs=_waste_jobs(rows, usage, waste_top, env),
        queue=_queue(usage, since, until),
        efficiency_note=gpm.unmeasured_note(rows, total),
        slots=_slots(rows) if has_slots(rows) else [],
        jobs_of=lambda ids: usage,
        statement_of=lambda account: _raw_statement(rows, account),
    )


def _raw_statement(rows: pd.DataFrame, account: str) -> AccountPart:
    """`Tables.statement_of` from prorated GPU rows."""
    part = rows[rows["account"].astype(str) == account] if len(rows) else rows
    if not len(part):
        return AccountPart([], Groups(part).figures()[0][1], 0.0)
    whole = Groups(part)
    return AccountPart(
        _grouped(part, "user"), whole.figures()[0][1], whole.sum("idle_cost", 0, len(part))
    )


def _tables_from_rollups(
    env: ReportEnv, since: float, until: float, filters: JobFilter, waste_top: int
) -> Tables:
    """The tables from the usage rollups (reports/monthly_rollups.py), same figures."""
    month = monthly_rollups.month_rows(env, since, until, filters, UTIL_BINS)
    sums, members = month.sums, month.members
    held = env.config.cost.charge == "effective"
    total = _without_physical(grouped.figures_of(sums, members, held))
    spread = sums[["node", "start_time", "end_time"]] if len(sums) else pd.DataFrame()
    full = sums["full_seconds"] if len(sums) else pd.Series(dtype=float)
    slots: list[dict[str, Any]] = []
    if has_slots(sums):
        slots = _summed_groups(
            sums.assign(slot=slot_groups(sums)),
            members.assign(slot=slot_groups(members) if len(members) else []),
            "slot",
            held,
        )
    return Tables(
        spread=spread,
        full_seconds=full,
        total=total,
        accounts_seen=int(sums["account"].nunique()) if len(sums) else 0,
        idle_cost=float(sums["idle_cost"].sum()) if len(sums) else 0.0,
        accounts=_summed_groups(sums, members, "account", held),
        users=_summed_groups(sums, members, "user", held),
        utilization=_binned_utilization(month.bins, sums),
        idle=_idle(sums),
        waste_jobs=_summed_waste_jobs(sums, members, waste_top, env, filters, held),
        queue=_queue(Usage(month.jobs, pd.DataFrame(columns=["job_id"])), since, until),
        efficiency_note=gpm.unmeasured_note(sums, total),
        slots=slots,
        jobs_of=lambda ids: monthly_rollups.job_facts(env, ids, filters, since, until),
        statement_of=lambda account: _summed_statement(sums, members, account, held),
    )


def _summed_statement(
    sums: pd.DataFrame, members: pd.DataFrame, account: str, held: bool
) -> AccountPart:
    """`Tables.statement_of` from the month's sums rows."""
    part = sums[sums["account"].astype(str) == account] if len(sums) else sums
    counted = members[members["account"].astype(str) == account] if len(members) else members
    total = _without_physical(grouped.figures_of(part, counted, held))
    if not len(part):
        return AccountPart([], total, 0.0)
    users = _summed_groups(part, counted, "user", held)
    return AccountPart(users, total, float(part["idle_cost"].sum()))


def _days(since: float, until: float, tz: dt.tzinfo | None) -> tuple[list[str], list[float]]:
    first = dt.datetime.fromtimestamp(since, tz)
    labels, starts = [], []
    day = first
    while day.timestamp() < until:
        labels.append(f"{day.day:02d}")
        starts.append(day.timestamp())
        day = day + dt.timedelta(days=1)
    return labels, starts


@dataclass
class DayShares:
    """Each row's GPU-seconds on each day it touches.

    Its whole GPU-seconds x its share of that day, as (row, day, seconds) entries in row
    order (a row touches a few days of the month, so a rows x days matrix would be
    mostly zeros).
    """

    rows: np.ndarray
    days: np.ndarray
    seconds: np.ndarray
    n_days: int

    def per_day(self) -> np.ndarray:
        """GPU-seconds per day, each day's rows added in row order."""
        return np.bincount(self.days, weights=self.seconds, minlength=self.n_days)

    def per_group(self, codes: np.ndarray, groups: int) -> np.ndarray:
        """GPU-seconds per group and day (groups x days).

        Rows are grouped by `codes` (a code per row, -1: in no group).
        """
        code = codes[self.rows]
        grouped = code >= 0
        flat = code[grouped] * self.n_days + self.days[grouped]
        summed = np.bincount(flat, weights=self.seconds[grouped], minlength=groups * self.n_days)
        return summed.reshape(groups, self.n_days)


def _day_shares(
    rows: pd.DataFrame, full: pd.Series, starts: Sequence[float], until: float, now: float
) -> DayShares:
    """Which days each row touches and its GPU-seconds on each."""
    edges = np.array([*starts, until], dtype=float)
    if not len(rows):
        empty = np.zeros(0, dtype=np.intp)
        return DayShares(empty, empty, np.zeros(0), len(starts))
    start = pd.to_numeric(rows["start_time"], errors="coerce").to_numpy(dtype=float)
    stop = pd.to_numeric(rows["end_time"], errors="coerce").to_numpy(dtype=float)
    stop = np.where(np.isnan(stop), now, stop)
    length = stop - start
    positive = length > 0
    # A row that lasts touches the days from the one it starts in (first end after its
    # start) to the one it stops in (last start before its stop); an instant (or a row
    # of unknown length) touches the day its start is in; a row of no start touches none.
    first = np.where(
        positive,
        np.searchsorted(edges[1:], start, side="right"),
        np.searchsorted(edges, start, side="right") - 1,
    )
    last = np.where(positive, np.searchsorted(edges[:-1], stop, side="left") - 1, first)
    inside_month = (start < until) & (positive | (start >= edges[0]))
    counts = np.where(inside_month, np.maximum(last - first + 1, 0), 0)
    row = np.repeat(np.arange(len(rows)), counts)
    day = (
        np.repeat(first, counts)
        + np.arange(len(row))
        - np.repeat(np.cumsum(counts) - counts, counts)
    )
    a, b, n = start[row], stop[row], length[row]
    low, high = edges[day], edges[day + 1]
    inside = np.minimum(b, high) - np.maximum(a, low)
    share = np.where(n > 0, np.clip(inside, 0, None) / np.where(n > 0, n, 1), 0)
    instant = (n <= 0) & (a >= low) & (a < high)
    total = full.to_numpy(dtype=float)[row]
    seconds = np.nan_to_num(total * np.where(instant, 1.0, share))
    return DayShares(row, day, seconds, len(starts))


def _nodes(
    rows: pd.DataFrame,
    shares: DayShares,
    gpus_per_node: Mapping[str, int],
    gpus_used_on: Callable[[list[str]], dict[str, int]],
    days: int,
    busy_factor: float,
) -> list[dict[str, Any]]:
    """Per node: GPUs, GPU-hours, occupancy % per day and over the month, busy flag.

    GPUs: the inventory's, or for a node it lacks, those `gpus_used_on` it.
    """
    by_node: dict[str, np.ndarray] = {}
    seen_gpus: dict[str, int] = {}
    if len(rows):
        codes, uniques = pd.factorize(rows["node"], sort=True)
        per_node = shares.per_group(codes, len(uniques))  # rows without a node: left out
        by_node = {str(name): per_node[c] for c, name in enumerate(uniques)}
        unlisted = sorted(set(by_node) - set(gpus_per_node))
        if unlisted:  # nodes the GPU inventory lacks: the GPUs jobs used there
            seen_gpus = gpus_used_on(unlisted)
    names = sorted(set(gpus_per_node) | set(by_node))
    total = sum(float(v.sum()) for v in by_node.values())
    out = []
    for name in names:
        seconds = by_node.get(name, np.zeros(days))
        gpus = gpus_per_node.get(name) or seen_gpus.get(name, 0)
        day_capacity = gpus * 86400.0
        share = float(seconds.sum()) / total if total else 0.0
        out.append(
            {
                "node": name,
                "gpus": gpus,
                "gpu_hours": float(seconds.sum()) / 3600.0,
                "occupancy_percent": 100.0 * float(seconds.sum()) / (day_capacity * days)
                if day_capacity and days
                else None,
                "share_percent": 100.0 * share,
                "busy": bool(names) and share > busy_factor / len(names),
                "daily_percent": (100.0 * seconds / day_capacity).tolist()
                if day_capacity
                else [0.0] * len(seconds),
            }
        )
    return out


def _grouped(rows: pd.DataFrame, key: str) -> list[dict[str, Any]]:
    """`report accounts/users` figures per group, most GPU-hours first."""
    out = []
    if len(rows):
        groups = Groups(rows, key)
        account_codes, accounts = None, None
        if key == "user":  # a user's accounts: codes in group order, names once per group
            codes, uniques = pd.factorize(rows["account"], use_na_sentinel=False)
            accounts = list(uniques)
            account_codes = codes[groups.positions()]
        for (value, group_figures), (a, b) in zip(groups.figures(), groups.bounds, strict=True):
            record = {"key": str(value), **group_figures}
            if account_codes is not None and accounts is not None:
                names = {str(accounts[c]) for c in np.unique(account_codes[a:b])}
                record["account"] = ",".join(sorted(names))
            record["idle_cost"] = groups.sum("idle_cost", a, b)
            out.append(record)
    out.sort(key=lambda r: (-r["gpu_hours"], r["key"]))
    return out


def _slots(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """GPU-hours (slot-hours held), physical GPU-hours and cost per model and slot."""
    rows = rows.assign(slot=slot_groups(rows))
    physical = physical_seconds(rows, "slot")
    out = _grouped(rows, "slot")
    for record in out:
        record["physical_gpu_hours"] = physical.get(record["key"], 0.0) / 3600.0
    return out


def _utilization(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """GPU-hours by the job-GPU's mean utilization, in 10-point bins, plus "no readings"."""
    util = pd.to_numeric(rows["util_mean_percent"], errors="coerce") if len(rows) else None
    hours = rows["gpu_seconds"].astype(float) / 3600.0 if len(rows) else None
    total = float(hours.sum()) if hours is not None else 0.0
    out = []
    for low, high in itertools.pairwise(UTIL_BINS):
        if util is None or hours is None:
            part, count = 0.0, 0
        else:
            mask = (util >= low) & (util < high)
            part, count = float(hours[mask].sum()), int(mask.sum())
        label = f"{low:.0f}-{min(high, 100):.0f}%"
        out.append(
            {"bin": label, "gpu_hours": part, "gpus": count, "share_percent": _pct(part, total)}
        )
    if util is not None and hours is not None and bool(util.isna().any()):
        part = float(hours[util.isna()].sum())
        out.append(
            {"bin": "no readings", "gpu_hours": part, "gpus": int(util.isna().sum()),
             "share_percent": _pct(part, total)}
        )  # fmt: skip
    return out


def _pct(part: float, total: float) -> float | None:
    return 100.0 * part / total if total > 0 else None


def _idle(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Idle GPU-hours and their cost per account, most idle first, with a total row."""
    if not len(rows):
        return []
    grouped = rows.groupby("account")[["idle_seconds", "gpu_seconds", "idle_cost"]].sum()
    out: list[dict[str, Any]] = [
        {
            "key": str(account),
            "idle_gpu_hours": float(r.idle_seconds) / 3600.0,
            "gpu_hours": float(r.gpu_seconds) / 3600.0,
            "idle_percent": _pct(float(r.idle_seconds), float(r.gpu_seconds)),
            "idle_cost": float(r.idle_cost),
        }
        for account, r in grouped.iterrows()
    ]
    out.sort(key=lambda r: (-r["idle_gpu_hours"], r["key"]))
    return out


def _waste_jobs(rows: pd.DataFrame, usage: Usage, top: int, env: ReportEnv) -> list[dict[str, Any]]:
    """The jobs with the most idle GPU-hours in the month.

    They are named from the store when the month's job frame holds figures only.
    """
    if not len(rows):
        return []
    # Idle seconds per job: one bincount over job codes (job ids ascending, as a
    # groupby orders them), then the most idle first, ties in job order.
    codes, job_ids = pd.factorize(rows["job_id"], sort=True)
    idle = pd.Series(
        np.bincount(codes, weights=rows["idle_seconds"].to_numpy(), minlength=len(job_ids)),
        index=job_ids,
    )
    idle = idle[idle > 0].sort_values(ascending=False, kind="stable").head(top)
    listed = usage.jobs[usage.jobs["job_id"].isin(idle.index)]
    facts = with_job_listing(env.store, listed, env.now_seconds).set_index("job_id")
    # The listed jobs' figures in one pass over their rows.
    listed_rows = rows.iloc[np.flatnonzero(np.isin(rows["job_id"].to_numpy(), idle.index))]
    per_job = dict(Groups(listed_rows, "job_id").figures())
    out = []
    for job_id in idle.index:
        job = facts.loc[job_id]
        job_figures = per_job[job_id]
        out.append(_waste_record(job, job_figures))
    return out


def _waste_record(job: Mapping[str, Any], figures: Mapping[str, Any]) -> dict[str, Any]:
    """One row of the top waste jobs: the job's facts and its figures in the month."""
    return {
        "job_id": str(job["job_id_text"]),
        "name": str(job["name"]),
        "user": str(job["user"]),
        "account": str(job["account"]),
        "partition": str(job["partition"]),
        "state": str(job["state"]),
        "gpus": int(job["alloc_gpus"] or 0),
        **{k: figures[k] for k in ("gpu_hours", "idle_gpu_hours", "util_mean_percent")},
        "idle_percent": figures["idle_percent"],
        "cost": figures["cost"],
    }


def _queue(usage: Usage, since: float, until: float) -> list[dict[str, Any]]:
    """Start - Submit of the jobs that started in the month, per partition and overall."""
    jobs = usage.jobs
    start = pd.to_numeric(jobs["start_time"], errors="coerce")
    submit = pd.to_numeric(jobs["submit_time"], errors="coerce")
    began = jobs[(start >= since) & (start < until) & submit.notna()]
    wait = (start - submit)[began.index].clip(lower=0.0)
    out = []
    groups = [(str(p), wait[began["partition"] == p]) for p in sorted(set(began["partition"]))]
    for name, part in [*groups, ("ALL", wait)]:
        out.append(
            {
                "key": name,
                "jobs": len(part),
                "mean_seconds": float(part.mean()) if len(part) else None,
                "median_seconds": float(part.median()) if len(part) else None,
                "p95_seconds": float(part.quantile(0.95)) if len(part) else None,
                "max_seconds": float(part.max()) if len(part) else None,
                "_total": name == "ALL",
            }
        )
    return out


def _summed_groups(
    sums: pd.DataFrame, members: pd.DataFrame, key: str, held: bool
) -> list[dict[str, Any]]:
    """`_grouped` from sums rows (reports/rollups.py `_grouped`), most GPU-hours first."""
    if not len(sums):
        return []
    names = sums[key].astype(str)
    idle_cost = sums["idle_cost"].groupby(names.to_numpy()).sum()
    accounts: dict[str, set[str]] = {}
    if key == "user":
        for user, account in set(zip(names, sums["account"].astype(str), strict=True)):
            accounts.setdefault(user, set()).add(account)
    out = []
    for value, figures in grouped.grouped(sums, members, key, held, "jobs"):
        record = {"key": str(value), **(figures if key == "slot" else _without_physical(figures))}
        if key == "user":
            record["account"] = ",".join(sorted(accounts.get(str(value), set())))
        record["idle_cost"] = float(idle_cost.get(str(value), 0.0))
        out.append(record)
    out.sort(key=lambda r: (-r["gpu_hours"], r["key"]))
    return out


def _without_physical(figures: dict[str, Any]) -> dict[str, Any]:
    """reports/rollups.py figures as `Groups.figures` gives them: no physical GPU-hours.

    The slots table shows those (`_slots`).
    """
    return {k: v for k, v in figures.items() if k != "physical_gpu_hours"}


def _binned_utilization(bins: pd.DataFrame, sums: pd.DataFrame) -> list[dict[str, Any]]:
    """`_utilization` from the GPU-seconds and rows per bin (reports/monthly_rollups.py)."""
    total = float(sums["gpu_seconds"].astype(float).sum()) / 3600.0 if len(sums) else 0.0
    seconds: dict[int, float] = {}
    counts: dict[int, int] = {}
    if len(bins):
        summed = bins.groupby("bin")[["gpu_seconds", "rows"]].sum()
        names = [int(b) for b in summed.index.to_numpy()]
        seconds = dict(zip(names, summed["gpu_seconds"].astype(float).tolist(), strict=True))
        counts = dict(zip(names, summed["rows"].astype("int64").tolist(), strict=True))
    out = []
    for i, (low, high) in enumerate(itertools.pairwise(UTIL_BINS)):
        part = seconds.get(i, 0.0) / 3600.0
        out.append(
            {"bin": f"{low:.0f}-{min(high, 100):.0f}%", "gpu_hours": part,
             "gpus": counts.get(i, 0), "share_percent": _pct(part, total)}
        )  # fmt: skip
    if counts.get(monthly_reads.NO_READINGS, 0):
        part = seconds[monthly_reads.NO_READINGS] / 3600.0
        out.append(
            {"bin": "no readings", "gpu_hours": part, "gpus": counts[monthly_reads.NO_READINGS],
             "share_percent": _pct(part, total)}
        )  # fmt: skip
    return out


def _summed_waste_jobs(
    sums: pd.DataFrame,
    members: pd.DataFrame,
    top: int,
    env: ReportEnv,
    filters: JobFilter,
    held: bool,
) -> list[dict[str, Any]]:
    """`_waste_jobs` from sums rows: the jobs' facts read for the listed ones only."""
    if not len(sums):
        return []
    idle = sums.groupby(sums["job_id"].astype("int64"))["idle_seconds"].sum().sort_index()
    idle = idle[idle > 0].sort_values(ascending=False, kind="stable").head(top)
    listed = monthly_rollups.jobs_usage(env, idle.index.tolist(), filters)
    facts = with_job_listing(env.store, listed.jobs, env.now_seconds).set_index("job_id")
    # The store's jobs hold only what the hooks and `slurm-gpu sync` wrote (no name before
    # a sync): sacct's facts of the listed jobs win, as load_usage lays them over the raw
    # path's rows (one `sacct -j` of these few jobs).
    asked = JobFilter(job_ids=tuple(str(i) for i in idle.index))
    answered = env.sacct(None, None, asked) if len(idle) else None  # none: every job
    sacct = {j.job_id: j for j in answered or ()}
    chosen = sums["job_id"].astype("int64").isin(idle.index).to_numpy()
    chosen_members = members["job_id"].astype("int64").isin(idle.index).to_numpy()
    per_job = dict(grouped.grouped(sums[chosen], members[chosen_members], "job_id", held, "jobs"))
    out = []
    for job_id in idle.index:
        job = facts.loc[job_id].to_dict() | {"job_id": int(job_id)}
        if int(job_id) in sacct:
            job = _overlay(job, sacct[int(job_id)])
        job_figures = per_job[str(job_id)]
        out.append(_waste_record(job, job_figures))
    return out


def _kind(entry: AuditEntry) -> str:
    if entry.action == "warn":
        return "warning"
    if entry.action == "cancel":
        return "cancellation"
    if entry.policy == "gpu_quota" and entry.action in QUOTA_ACTIONS:
        return "quota action"
    return "other"


def _actions(entries: Sequence[AuditEntry], usage: Usage) -> list[dict[str, Any]]:
    """One record per enforced audit entry, with GPU-hours returned for done cancellations."""
    ids = {e.job_id for e in entries if e.job_id is not None}
    jobs = usage.jobs[usage.jobs["job_id"].isin(ids)] if ids else usage.jobs.iloc[0:0]
    jobs = jobs[["job_id", "alloc_gpus", "start_time", "time_limit_seconds"]]  # what's used
    facts: dict[int, dict[str, Any]] = {
        int(j["job_id"]): {str(k): v for k, v in j.items()} for j in jobs.to_dict("records")
    }
    out = []
    for e in entries:
        returned: float | None = None
        job = facts.get(e.job_id) if e.job_id is not None else None
        done = e.outcome in ("done", "recorded")
        if e.action == "cancel" and e.outcome == "done":
            returned = _returned(job, e.time)
        out.append(
            {
                "time": e.time,
                "kind": _kind(e),
                "policy": e.policy,
                "action": e.action,
                "target": e.target,
                "job_id": e.job_id,
                "user": e.user,
                "account": e.account,
                "outcome": e.outcome,
                "done": done,
                "gpus": int(job["alloc_gpus"] or 0) if job else None,
                "gpu_hours_returned": returned,
                "reason": e.reason,
            }
        )
    return out


def _returned(job: Mapping[str, Any] | None, at: float) -> float | None:
    """GPUs x (Start + Timelimit - cancel time), hours; None when the limit is unknown."""
    if job is None:
        return None
    start: Any = job.get("start_time")
    limit: Any = job.get("time_limit_seconds")
    if not is_known(start) or not is_known(limit):
        return None
    return int(job.get("alloc_gpus") or 0) * max(float(start) + float(limit) - at, 0.0) / 3600.0


def _controller(actions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Counts per kind, policy and action: entries, done, failed, jobs, GPU-hours returned."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for a in actions:
        groups.setdefault((a["kind"], a["policy"], a["action"]), []).append(a)
    out = []
    for (kind, policy, action), part in sorted(groups.items()):
        returned = [a["gpu_hours_returned"] for a in part if a["gpu_hours_returned"] is not None]
        out.append(
            {
                "kind": kind,
                "policy": policy,
                "action": action,
                "entries": len(part),
                "done": sum(1 for a in part if a["done"]),
                "failed": sum(1 for a in part if str(a["outcome"]).startswith("failed")),
                "jobs": len({a["job_id"] for a in part if a["job_id"] is not None}),
                "gpu_hours_returned": sum(returned) if returned else None,
                "unknown_limit": sum(
                    1 for a in part if a["outcome"] == "done" and a["gpu_hours_returned"] is None
                )
                if kind == "cancellation"
                else None,
            }
        )
    return out


# ---- output --------------------------------------------------------------------------

CSV_FILES: dict[str, tuple[str, list[str]]] = {
    "overview.csv": ("overview", []),
    "accounts.csv": ("accounts", ["key", "jobs", "users", "gpu_hours", "cost", "util_mean_percent",
                                   "idle_gpu_hours", "idle_percent", "idle_cost",
                                   "missing_gpu_hours", "missing_percent", "gpu_mem_hours",
                                   "energy_kwh"]),
    "users.csv": ("users", ["key", "account", "jobs", "gpu_hours", "cost", "util_mean_percent",
                             "idle_gpu_hours", "idle_percent", "idle_cost", "missing_gpu_hours",
                             "missing_percent", "gpu_mem_hours", "energy_kwh"]),
    "utilization.csv": ("utilization", ["bin", "gpu_hours", "gpus", "share_percent"]),
    "idle_waste.csv": ("idle", ["key", "idle_gpu_hours", "gpu_hours", "idle_percent",
                                "idle_cost"]),
    "top_waste_jobs.csv": ("waste_jobs", ["job_id", "name", "user", "account", "partition",
                                          "state", "gpus", "gpu_hours", "idle_gpu_hours",
                                          "idle_percent", "util_mean_percent", "cost"]),
    "efficiency_accounts.csv": ("efficiency", ["key", *gpm.KEYS]),
    "efficiency_users.csv": ("efficiency_users", ["key", "account", *gpm.KEYS]),
    "queue_wait.csv": ("queue", ["key", "jobs", "mean_seconds", "median_seconds", "p95_seconds",
                                 "max_seconds"]),
    "node_heatmap.csv": ("nodes", []),
    "controller_actions.csv": ("actions", ["time", "kind", "policy", "action", "target",
                                           "job_id", "user", "account", "outcome", "gpus",
                                           "gpu_hours_returned", "reason"]),
}  # fmt: skip
HEADERS = {"key": "name"}
# Written only where a job held a MIG slice or a share (so whole-GPU months are unchanged).
SLOT_CSV: dict[str, tuple[str, list[str]]] = {
    "slots.csv": ("slots", ["key", "jobs", "users", "gpu_hours", "physical_gpu_hours", "cost",
                            "util_mean_percent", "idle_gpu_hours", "idle_cost"]),
}  # fmt: skip


def write_monthly(report: MonthlyReport, out: Path) -> list[Path]:
    """index.html and one CSV per section into `out` (created); returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    files = {**CSV_FILES, **(SLOT_CSV if report.slots else {})}
    for name, (attribute, columns) in files.items():
        path = out / name
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            if attribute == "overview":
                writer.writerow(["figure", "value"])
                for key, value in report.overview.items():
                    writer.writerow([key, _cell(value)])
            elif attribute == "nodes":
                # The column and its cell keep the old word "hot" (now "busy") until the
                # monthly format's next version: the output stays byte-identical till then.
                writer.writerow(["node", "gpus", "gpu_hours", "occupancy_percent", "hot",
                                 *[f"day_{d}_percent" for d in report.days]])  # fmt: skip
                for n in report.nodes:
                    # daily_percent: floats (~10^4 cells a month): `_cell` without its checks
                    writer.writerow(
                        [n["node"], n["gpus"], _cell(n["gpu_hours"]),
                         _cell(n["occupancy_percent"]), "hot" if n["busy"] else "",
                         *[round(v, 6) if v == v else "" for v in n["daily_percent"]]]
                    )  # fmt: skip
            else:
                writer.writerow([HEADERS.get(c, c) for c in columns])
                for record in getattr(report, attribute):
                    writer.writerow([_cell(record.get(c)) for c in columns])
        written.append(path)
    page = out / "index.html"
    page.write_text(render_page(report), encoding="utf-8")
    return [page, *written]


def _cell(value: Any) -> Any:
    if not is_known(value):
        return ""
    if isinstance(value, float):
        return round(value, 6)
    return value
