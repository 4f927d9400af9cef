"""The monthly report's usage tables and each account's statement, from one set of rows.

The month's sums rows (monthly_rows.py: the rollups of folded jobs, the raw rows of the
others, the ledger's sums either way) are grouped by account, user and slot into the
ledger's figures (reports/grouped.py); idle cost is each row's (`ledger.pricing.charge`);
utilization bins, idle per account, the most wasteful jobs and queue waits come from the
same rows. `Tables.statement_of` gives an account's statement from them, so a statement
equals its account's row of the report mailed beside it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.reports import efficiency as gpm
from slurm_gpu.reports import grouped, monthly_rows
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.summary import has_slots, slot_groups
from slurm_gpu.reports.usage import JobFilter, Usage, overlay, with_job_listing
from slurm_gpu.store import monthly_reads

UTIL_BINS = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.0001]


@dataclass
class Tables:
    """What the report's usage tables are made of: the month's sums rows.

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
    filters: JobFilter


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
    env: ReportEnv, since: float, until: float, filters: JobFilter, waste_top: int
) -> Tables:
    """The month's tables, summed from the month's sums rows (monthly_rows.py).

    The monthly report and the account statements mailed with it both read these, so a
    statement's total is its account's row of the report. `filters`: -u/-A/-r only
    (the rows are sums per owner and place: a job id, node or state selects nothing
    in them).

    Raises:
        ValueError: `filters` selects by job id, node or state.
    """
    if filters.job_ids or filters.nodes or filters.states:
        raise ValueError("the monthly report selects by user, account and partition only")
    month = monthly_rows.month_rows(env, since, until, filters, UTIL_BINS)
    sums, members = month.sums, month.members
    held = env.config.cost.charge == "effective"
    matrix = grouped.jobs_matrix(sums)  # the sums as floats once: total, groups, statements
    total = _without_physical(grouped.figures_of(sums, members, held, matrix=matrix))
    spread = sums[["node", "start_time", "end_time"]] if len(sums) else pd.DataFrame()
    full = sums["full_seconds"] if len(sums) else pd.Series(dtype=float)
    slots: list[dict[str, Any]] = []
    if has_slots(sums):
        slots = _groups(
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
        accounts=_groups(sums, members, "account", held, matrix),
        users=_groups(sums, members, "user", held, matrix),
        utilization=_utilization(month.bins, sums),
        idle=_idle(sums),
        waste_jobs=_waste_jobs(sums, members, waste_top, env, filters, held),
        queue=_queue(Usage(month.jobs, pd.DataFrame(columns=["job_id"])), since, until),
        efficiency_note=gpm.unmeasured_note(sums, total),
        slots=slots,
        jobs_of=lambda ids: monthly_rows.job_facts(env, ids, filters, since, until),
        statement_of=_statements(sums, members, held, matrix),
        filters=filters,
    )


def _statements(
    sums: pd.DataFrame, members: pd.DataFrame, held: bool, matrix: np.ndarray
) -> Callable[[str], AccountPart]:
    """`Tables.statement_of` from the month's sums rows (`matrix`: `grouped.jobs_matrix`).

    An account's part is its rows, in the order of the month's. Its users are the
    `users` table's groups of its rows alone: grouped once for every account, by account
    and user (each group sums the same rows in the same order as the account's rows
    grouped by user would). Its total is the figures of its rows. Nothing is grouped
    before the first statement (a report mailed without statements pays nothing).
    """
    owners = sums[["user", "account", "idle_cost"]] if len(sums) else sums
    no_rows = np.zeros(0, dtype=np.intp)

    @functools.cache
    def prepared() -> tuple[
        dict[str, np.ndarray], dict[str, np.ndarray], dict[str, list[dict[str, Any]]]
    ]:
        """Each account's rows, counted rows and users."""
        users_of: dict[str, list[dict[str, Any]]] = {}
        by_pair = _groups(
            owners.assign(account_user=_account_user(owners)) if len(sums) else sums,
            members.assign(account_user=_account_user(members) if len(members) else []),
            "account_user",
            held,
            matrix,
        )
        for record in by_pair:
            account, user = str(record.pop("key")).split(_SEPARATOR, 1)
            idle_cost = record.pop("idle_cost")
            users_of.setdefault(account, []).append(
                {"key": user, **record, "account": account, "idle_cost": idle_cost}
            )
        return _positions_by_account(sums), _positions_by_account(members), users_of

    def statement_of(account: str) -> AccountPart:
        rows, counted_rows, users_of = prepared()
        taken = rows.get(account, no_rows)
        part = owners.take(taken) if len(sums) else sums
        counted = members.take(counted_rows.get(account, no_rows)) if len(members) else members
        # The part's rows of `matrix` laid out as `grouped.jobs_matrix(part)` lays them
        # (by column), so that numpy sums each column of the part as it would that one's.
        part_matrix = np.asfortranarray(matrix[taken]) if len(sums) else None
        total = _without_physical(grouped.figures_of(part, counted, held, matrix=part_matrix))
        if not len(part):
            return AccountPart([], total, 0.0)
        return AccountPart(users_of.get(account, []), total, float(part["idle_cost"].sum()))

    return statement_of


_SEPARATOR = "\x1f"  # between an account and a user (ASCII unit separator): in no Slurm name


def _account_user(frame: pd.DataFrame) -> np.ndarray:
    """Each row's account and user, as one text."""
    accounts = frame["account"].astype(str).to_numpy(dtype=object)
    users = frame["user"].astype(str).to_numpy(dtype=object)
    joined: np.ndarray = accounts + _SEPARATOR + users
    return joined


def _positions_by_account(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """The positions of each account's rows in `frame`, in frame order."""
    if not len(frame):
        return {}
    names = frame["account"].astype(str).to_numpy()
    indices = frame.groupby(names, sort=False).indices
    return {str(k): np.asarray(v, dtype=np.intp) for k, v in indices.items()}


def _groups(
    sums: pd.DataFrame,
    members: pd.DataFrame,
    key: str,
    held: bool,
    matrix: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """`report accounts/users` figures per group, most GPU-hours first, with idle cost.

    `matrix`: `grouped.jobs_matrix(sums)`, where the caller has it.
    """
    if not len(sums):
        return []
    names = sums[key].astype(str)
    idle_cost = sums["idle_cost"].groupby(names.to_numpy()).sum()
    accounts: dict[str, set[str]] = {}
    if key == "user":
        pairs = pd.DataFrame({"user": names.to_numpy(), "account": sums["account"].astype(str)})
        for user, account in pairs.drop_duplicates().itertuples(index=False, name=None):
            accounts.setdefault(user, set()).add(account)
    out = []
    for value, figures in grouped.grouped(sums, members, key, held, "jobs", matrix=matrix):
        record = {"key": str(value), **(figures if key == "slot" else _without_physical(figures))}
        if key == "user":
            record["account"] = ",".join(sorted(accounts.get(str(value), set())))
        record["idle_cost"] = float(idle_cost.get(str(value), 0.0))
        out.append(record)
    out.sort(key=lambda r: (-r["gpu_hours"], r["key"]))
    return out


def _without_physical(figures: dict[str, Any]) -> dict[str, Any]:
    """Figures without physical GPU-hours: only the slots table shows those."""
    return {k: v for k, v in figures.items() if k != "physical_gpu_hours"}


def _utilization(bins: pd.DataFrame, sums: pd.DataFrame) -> list[dict[str, Any]]:
    """`_utilization` from the GPU-seconds and rows per bin (reports/monthly_rows.py)."""
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


def _waste_jobs(
    sums: pd.DataFrame,
    members: pd.DataFrame,
    top: int,
    env: ReportEnv,
    filters: JobFilter,
    held: bool,
) -> list[dict[str, Any]]:
    """The jobs with the most idle GPU-hours in the month (their facts read for those only)."""
    if not len(sums):
        return []
    idle = sums.groupby(sums["job_id"].astype("int64"))["idle_seconds"].sum().sort_index()
    idle = idle[idle > 0].sort_values(ascending=False, kind="stable").head(top)
    listed = monthly_rows.jobs_usage(env, idle.index.tolist(), filters)
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
            job = overlay(job, sacct[int(job_id)])
        job_figures = per_job[str(job_id)]
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
