"""`slurm-gpu report monthly`: one month's usage, waste and enforcement as HTML + CSV.

The usage tables are those of monthly_tables.py: one road under every [cost] unit and
charge, the month's sums rows (the rollups of folded jobs, the raw rows of the others),
figures by the ledger; the statements mailed beside the report read the same tables.
The days and the node heat map spread each row's GPU-seconds over the local days it
touches. Controller actions come from the audit log (`ControlStore.audit_entries`),
enforced entries only.

GPU-hours returned by a cancellation: the job's GPUs x the time left until its time limit
(Start + Timelimit, from sacct) at the moment it was cancelled. A job whose limit is
unknown (no sacct, or UNLIMITED) is counted in `cancelled_unknown_limit`, not in the sum.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.reports import efficiency as gpm
from slurm_gpu.reports.monthly_model import MonthlyReport as MonthlyReport
from slurm_gpu.reports.monthly_page import render_page
from slurm_gpu.reports.monthly_tables import AccountPart as AccountPart
from slurm_gpu.reports.monthly_tables import Tables, month_tables
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.usage import JobFilter, Usage
from slurm_gpu.store import queries
from slurm_gpu.store.control import AuditEntry
from slurm_gpu.units import is_known

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
) -> MonthlyReport:
    """The month's report for what `env.scope` may see.

    Args:
        env: the report environment (store, sacct, scope, clock, prices).
        month: YYYY-MM (local time).
        waste_top: jobs listed under "top wasteful jobs".
        filters: -u/-A/-r (default: every visible job).
    """
    report, _ = build_monthly_with_tables(env, month, waste_top=waste_top, filters=filters)
    return report


def build_monthly_with_tables(
    env: ReportEnv,
    month: str,
    *,
    waste_top: int = 20,
    filters: JobFilter | None = None,
) -> tuple[MonthlyReport, Tables]:
    """`build_monthly`, and the tables the report was made of.

    `report monthly --deliver` builds the account statements from these tables
    (reports/statements.py `build_statements`): the month's rows are read and summed
    once, and each statement is its account's part of the report's rows.
    """
    selection = filters or JobFilter()
    since, until = month_bounds(month, env.tz)
    now = env.now_seconds
    tables = month_tables(env, since, until, selection, waste_top)
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
    return report, tables


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
                                   "missing_gpu_hours", "missing_percent", "suspended_gpu_hours",
                                   "gpu_mem_hours", "energy_kwh"]),
    "users.csv": ("users", ["key", "account", "jobs", "gpu_hours", "cost", "util_mean_percent",
                             "idle_gpu_hours", "idle_percent", "idle_cost", "missing_gpu_hours",
                             "missing_percent", "suspended_gpu_hours", "gpu_mem_hours",
                             "energy_kwh"]),
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
