"""`slurm-gpu report` from the usage rollups (revision 0010, issue 16).

The same figures as reports/summary.py `build_report` over the GPU frame, summed from:

- `usage_daily` for the whole UTC days inside the period (each row already prorated to
  its day, as `prorated` prorates a job: by the part of the job inside the period);
- `job_usage` rows prorated to the parts of the period that cut a day (its first and
  last hours when it does not start or end at a UTC midnight);
- raw rows, the old way (reports/usage.py), for the jobs of the period that are not
  folded: running, no summary yet, no start or no end time;
- and, for what is no sum (jobs and users counted once, queue wait mean and p95 over
  jobs), the period's `job_usage` rows' job ids, owners, places and times.

Every figure is a sum of per-row sums (store/usage_rollup.py `row_sums`), so it equals the
old computation up to the order floats are added in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.access import Scope
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.reports.frames import (
    GPU_COLUMNS,
    Unsummarized,
    fill_models,
    gpu_rows,
    stored_jobs,
)
from slurm_gpu.reports.pricing import add_cost, slot_price_for
from slurm_gpu.reports.summary import TOTAL, Report, _fractions, _sorted, prorated, slot_groups
from slurm_gpu.reports.usage import JobFilter, Usage, _alloc_or_counted, _select
from slurm_gpu.store import Store, queries, usage_rollup
from slurm_gpu.store.schema import GPM_METRICS, USAGE_COUNTS, USAGE_PLACE, USAGE_SUMS

DAY = usage_rollup.DAY
FIGURE_SUMS = (*USAGE_SUMS, *USAGE_COUNTS, "cost", "idle_held_cost")
NO_FILTER = JobFilter()
MEMBER_COLUMNS = ("job_id", "user", "account", "partition", *USAGE_PLACE, "queue_wait")


def usable(filters: JobFilter) -> bool:
    """Whether a report with these filters can read the rollups (-u/-A/-r only)."""
    return not (filters.job_ids or filters.nodes or filters.states)


def build_report_from_rollups(
    store: Store,
    group: str,
    *,
    since: float,
    until: float,
    now: float,
    scope: Scope,
    filters: JobFilter = NO_FILTER,
    cost: CostSettings | None = None,
    lag: float | None = None,
    cluster: str = "",
    all_nodes: Sequence[str] = (),
    busy_factor: float = 1.5,
    top: int | None = None,
    sort: str | None = None,
    waste_top: int = 5,
) -> Report:
    """`build_report` of the period's usage, read from the rollups (module docstring).

    Arguments as `load_usage` and `build_report` take them; `filters` only -u/-A/-r.
    """
    first = math.ceil(since / DAY) * DAY
    last = math.floor(until / DAY) * DAY
    parts: list[pd.DataFrame] = []
    if first < last:
        parts.append(store_daily(store, first, last))
        edges = [(since, first), (last, until)]
    else:
        edges = [(since, until)]
    cells = job_usage_frame(store, since, until)
    for a, b in edges:
        if b > a or (b == a == until):
            parts.append(_edge(cells, a, b, closed=b == until))
    sums = pd.concat([p for p in parts if len(p)], ignore_index=True) if parts else None
    if sums is None or sums.empty:
        sums = pd.DataFrame(columns=[*usage_rollup.OWNER, *USAGE_PLACE, *FIGURE_SUMS])
    sums = _priced(_models_filled(sums, store), cost)
    members = _members(_models_filled(cells, store), since, until)
    raw_sums, raw_members = _raw_part(store, since, until, now, scope, filters, cost, lag)
    sums = _visible(pd.concat([sums, raw_sums], ignore_index=True), scope, filters)
    members = _visible(pd.concat([members, raw_members], ignore_index=True), scope, filters)
    sums = sums.assign(cluster=cluster or "cluster")
    members = members.assign(cluster=cluster or "cluster")
    if group == "slot":
        sums = sums.assign(slot=_slot_labels(sums))
        members = members.assign(slot=_slot_labels(members))
    held_cost = cost is not None and cost.charge == "effective"
    groups = [{"key": key, **f} for key, f in _grouped(sums, members, group, held_cost)]
    if group == "node":
        seen = {g["key"] for g in groups}
        empty = _figures(sums.iloc[0:0], members.iloc[0:0], held_cost)
        for node in all_nodes:
            if node not in seen:
                groups.append({"key": node, **empty})
        total_hours = sum(g["gpu_hours"] for g in groups)
        mean_share = 1.0 / len(groups) if groups else 0.0
        for g in groups:
            g["share_percent"] = 100.0 * g["gpu_hours"] / total_hours if total_hours else 0.0
            g["busy"] = (
                "busy"
                if total_hours and g["gpu_hours"] / total_hours > busy_factor * mean_share
                else ""
            )
    total = {"key": TOTAL, **_figures(sums, members, held_cost)}
    if group == "node":
        total["share_percent"] = 100.0 if groups else 0.0
        total["busy"] = ""
    groups = _sorted(groups, sort)
    if top is not None:
        groups = groups[:top]
    waste = [
        {"key": key, **f}
        for key, f in _grouped(sums, members, "user", held_cost)
        if (f["idle_gpu_hours"] or 0.0) > 0
    ]
    waste.sort(key=lambda g: (-g["idle_gpu_hours"], g["key"]))
    return Report(group, groups, total, waste[:waste_top])


def has_slot_rows(store: Store, since: float, until: float) -> bool:
    """Whether any job of the period held a MIG slice or a share (PhysGPUHours shown)."""
    cells = job_usage_frame(store, since, until)
    return bool(len(cells) and (cells["slot_kind"].astype(str) != "gpu").any())


def store_daily(store: Store, first: float, last: float) -> pd.DataFrame:
    """The `usage_daily` rows of the days in [first, last) of the store's cluster."""
    rows = queries.usage_daily_rows(store, first, last)
    return pd.DataFrame(rows, columns=queries.USAGE_DAILY_COLUMNS)


def job_usage_frame(store: Store, since: float, until: float) -> pd.DataFrame:
    """The `job_usage` rows of jobs overlapping [since, until]."""
    rows = queries.job_usage_rows(store, since, until)
    return pd.DataFrame(rows, columns=queries.JOB_USAGE_COLUMNS)


def _models_filled(frame: pd.DataFrame, store: Store) -> pd.DataFrame:
    """Blank GPU models filled with their node's one model (reports/frames.py fill_models).

    The rollups keep a summary's blank model blank (what the inventory knows changes
    after ingest); it is filled here from the inventory now, by node. The raw reports
    fill by the GPU's UUID first: on a node of several models that the summary did not
    name, the rollups leave it blank.
    """
    if not len(frame):
        return frame
    blank = (frame["gpu_model"].astype(str) == "").to_numpy()
    if not blank.any():
        return frame
    by_node: dict[str, set[str]] = {}
    for entry in store.inventory():
        by_node.setdefault(entry.node, set()).add(entry.device.name)
    models = frame["gpu_model"].astype(object).to_numpy().copy()
    nodes = frame["node"].astype(object).to_numpy()
    for i in np.flatnonzero(blank):
        found = by_node.get(str(nodes[i]), set())
        models[i] = next(iter(found)) if len(found) == 1 else ""
    return frame.assign(gpu_model=models)


def _edge(cells: pd.DataFrame, a: float, b: float, *, closed: bool) -> pd.DataFrame:
    """`job_usage` rows prorated to [a, b) (closed: [a, b]), as the reports prorate them."""
    if not len(cells):
        return cells.iloc[0:0]
    start = cells["start_time"].to_numpy(dtype=float)
    end = cells["end_time"].to_numpy(dtype=float)
    fraction = _fractions(cells["start_time"], cells["end_time"], a, b, b)
    instant = end - start <= 0
    if not closed:  # an instant job at a day's midnight belongs to that day only
        fraction = np.where(instant & (start >= b), 0.0, fraction)
    keep = fraction > 0
    part = cells[keep].copy()
    for name in USAGE_SUMS:
        part[name] = part[name].to_numpy(dtype=float) * fraction[keep]
    return part


def _members(cells: pd.DataFrame, since: float, until: float) -> pd.DataFrame:
    """Who had usage inside [since, until]: (job, owner, place, queue wait) per row."""
    if not len(cells):
        return pd.DataFrame(columns=MEMBER_COLUMNS)
    fraction = _fractions(cells["start_time"], cells["end_time"], since, until, until)
    part = cells[fraction > 0]
    wait = part["start_time"].to_numpy(dtype=float) - pd.to_numeric(part["submit_time"]).to_numpy(
        dtype=float, na_value=np.nan
    )
    return part.assign(queue_wait=wait)[list(MEMBER_COLUMNS)]


def _priced(sums: pd.DataFrame, cost: CostSettings | None) -> pd.DataFrame:
    """Rollup sums with `cost` (and `idle_held_cost` under charge "effective")."""
    sums = sums.copy()
    if cost is None or not len(sums):
        sums["cost"] = 0.0
        sums["idle_held_cost"] = 0.0 if cost is not None and cost.charge == "effective" else np.nan
        return sums
    keys = list(zip(sums["gpu_model"], sums["mig_profile"], sums["share"], strict=True))
    per_gpu = cost.unit != "gpu_mem_hour"
    prices = {
        k: slot_price_for(str(k[0]), cost, float(k[2]), str(k[1]), per_gpu=per_gpu)
        for k in set(keys)
    }
    price = np.array([prices[k] for k in keys], dtype=float)
    units, unused = {
        "gpu_hour": ("gpu_seconds", "gpu_unused_seconds"),
        "gpu_mem_hour": ("mem_gib_seconds", "mem_unused_gib_seconds"),
    }.get(cost.unit, ("job_hour_seconds", "job_hour_unused_seconds"))
    held = price * sums[units].to_numpy(dtype=float) / 3600.0
    if cost.charge == "effective":
        idle = price * sums[unused].to_numpy(dtype=float) / 3600.0
        sums["cost"] = held - idle
        sums["idle_held_cost"] = idle
    else:
        sums["cost"] = held
        sums["idle_held_cost"] = np.nan
    return sums


def _raw_part(
    store: Store,
    since: float,
    until: float,
    now: float,
    scope: Scope,
    filters: JobFilter,
    cost: CostSettings | None,
    lag: float | None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Sums and members of the period's jobs the rollups do not hold, the old way."""
    ids = queries.unfolded_job_ids(store, since, until)
    empty = pd.DataFrame(columns=[*usage_rollup.OWNER, *USAGE_PLACE, *FIGURE_SUMS])
    if not ids:
        return empty, pd.DataFrame(columns=MEMBER_COLUMNS)
    stored = queries.job_rows_in_window(store, None, None, ids)
    jobs = _select(stored_jobs(stored, queries.JOB_ROW_COLUMNS, now), filters, scope)
    wanted = jobs["job_id"].to_numpy(dtype="int64")
    read = GPU_COLUMNS  # with the GPU UUID ([cost] unit job_hour counts GPU rows)
    summary_rows = queries.summary_rows_for(store, wanted.tolist(), columns=read)
    unsummarized = None if lag is None else Unsummarized(jobs, now, lag)
    gpus = gpu_rows(store, wanted, summary_rows, read, unsummarized)
    if not gpus.empty:
        jobs["alloc_gpus"] = _alloc_or_counted(jobs, gpus["job_id"].to_numpy())
    gpus = add_cost(fill_models(gpus, store), jobs, cost)
    rows = prorated(
        Usage(jobs.reset_index(drop=True), gpus.reset_index(drop=True)), since, until, now
    )
    rows = rows[rows["fraction"] > 0] if len(rows) else rows
    if not len(rows):
        return empty, pd.DataFrame(columns=MEMBER_COLUMNS)
    records = rows.to_dict("records")
    out = []
    for r in records:
        sums: dict[str, Any] = usage_rollup.row_sums(r, 0.0)  # prorated already
        sums["cost"] = float(r.get("cost") or 0.0)
        sums["idle_held_cost"] = float(r["idle_held_cost"]) if "idle_held_cost" in r else np.nan
        for name in (*usage_rollup.OWNER, *USAGE_PLACE):
            value = r.get(name)
            sums[name] = value if name != "share" else (1.0 if value is None else float(value))
        sums["slot_kind"] = str(r.get("slot_kind") or "gpu")
        sums["mig_profile"] = str(r.get("mig_profile") or "")
        out.append(sums)
    raw = pd.DataFrame(out)
    members = raw.assign(job_id=rows["job_id"].to_numpy(), queue_wait=rows["queue_wait"].to_numpy())
    return raw, members[list(MEMBER_COLUMNS)]


def _visible(frame: pd.DataFrame, scope: Scope, filters: JobFilter) -> pd.DataFrame:
    """The rows `scope` may see that pass -u/-A/-r."""
    if not len(frame):
        return frame
    for name in usage_rollup.OWNER:
        frame[name] = frame[name].astype(str)
    keep = np.ones(len(frame), dtype=bool)
    if not scope.all:
        pairs = list(zip(frame["user"], frame["account"], strict=True))
        seen = {pair: scope.sees(*pair) for pair in set(pairs)}
        keep &= np.array([seen[p] for p in pairs], dtype=bool)
    for name, wanted in (
        ("user", filters.users),
        ("account", filters.accounts),
        ("partition", filters.partitions),
    ):
        if wanted:
            keep &= frame[name].isin(wanted).to_numpy()
    return frame[keep]


def _slot_labels(frame: pd.DataFrame) -> pd.Series:
    return slot_groups(frame) if len(frame) else pd.Series([], dtype=object)


def _grouped(
    sums: pd.DataFrame, members: pd.DataFrame, key: str, held_cost: bool
) -> list[tuple[Any, dict[str, Any]]]:
    """`(value, figures)` per distinct value of `key`, in sorted order (vectorized)."""
    if not len(sums) and not len(members):
        return []
    summed = (
        sums.assign(_key=sums[key].astype(str))
        .groupby("_key", sort=True)[list(FIGURE_SUMS)]
        .sum(min_count=0)
    )
    counted = _counted(members.assign(_key=members[key].astype(str)))
    keys = sorted(set(summed.index) | set(counted))
    zeros: dict[str, Any] = dict.fromkeys(FIGURE_SUMS, 0.0)
    rows: dict[Any, dict[str, Any]] = {
        str(k): {str(n): v for n, v in r.items()} for k, r in summed.to_dict("index").items()
    }
    return [(k, _from_totals(rows.get(k, zeros), counted.get(k, _NOBODY), held_cost)) for k in keys]


_NOBODY: tuple[int, int, float | None, float | None] = (0, 0, None, None)


def _counted(members: pd.DataFrame) -> dict[str, tuple[int, int, float | None, float | None]]:
    """{group: (jobs, users, queue wait mean, p95)}: each job and user counted once.

    The 95th percentile interpolates linearly between the sorted waits, as numpy's does.
    """
    if not len(members):
        return {}
    jobs = members.drop_duplicates(["_key", "job_id"])
    users = members.drop_duplicates(["_key", "user"]).groupby("_key", sort=False).size()
    counts = jobs.groupby("_key", sort=False).size()
    waits = pd.to_numeric(jobs["queue_wait"]).to_numpy(dtype=float, na_value=np.nan)
    known = ~np.isnan(waits)
    keys = jobs["_key"].to_numpy(dtype=object)[known]
    codes, names = pd.factorize(keys, sort=True)
    values = waits[known]
    order = np.lexsort((values, codes))
    codes, values = codes[order], values[order]
    n = np.bincount(codes, minlength=len(names))
    starts = np.cumsum(n) - n
    sums = np.bincount(codes, weights=values, minlength=len(names))
    h = (n - 1) * 0.95
    low = np.floor(h).astype(np.int64)
    high = np.minimum(low + 1, n - 1)
    a, b = values[starts + low], values[starts + high]
    p95 = a + (h - low) * (b - a)
    stats = {str(k): (float(sums[c] / n[c]), float(p95[c])) for c, k in enumerate(names)}
    return {
        str(k): (int(count), int(users.get(k, 0)), *stats.get(str(k), (None, None)))
        for k, count in counts.items()
    }


def _figures(sums: pd.DataFrame, members: pd.DataFrame, held_cost: bool) -> dict[str, Any]:
    """The figures of every row together (the totals row)."""
    totals = {n: float(pd.to_numeric(sums[n]).sum()) if len(sums) else 0.0 for n in FIGURE_SUMS}
    counted = _counted(members.assign(_key="")) if len(members) else {}
    return _from_totals(totals, counted.get("", _NOBODY), held_cost)


def _from_totals(
    total: dict[str, Any], counted: tuple[int, int, float | None, float | None], held_cost: bool
) -> dict[str, Any]:
    """reports/figures.py `Groups.figures` of one group, from its sums (FIGURE_KEYS)."""
    jobs, users, wait_mean, wait_p95 = counted
    gpu, missing = float(total["gpu_seconds"]), float(total["missing_seconds"])
    measured = gpu - missing
    active: float | None
    idle: float | None
    if gpu > 0 and measured <= 0:
        active = idle = None
    else:
        active = float(total["active_seconds"])
        idle = max(measured - active, 0.0)
    gpm = float(total["gpm_seconds"])
    means = {}
    for m in GPM_METRICS:
        weight = total[f"{m}_gpm_seconds"]
        means[f"{m}_mean_percent"] = total[f"{m}_weighted_sum"] / weight if weight > 0 else None
    sm_weight = total["sm_active_gpm_seconds"]
    effective = total["sm_active_weighted_sum"] / 100.0 if sm_weight > 0 else None
    return {
        "jobs": jobs,
        "users": users,
        "gpu_hours": gpu / 3600.0,
        "gpu_mem_hours": total["mem_gib_seconds"] / 3600.0,
        "util_mean_percent": total["util_weighted_sum"] / total["util_seconds"]
        if total["util_seconds"] > 0
        else None,
        "active_gpu_hours": None if active is None else active / 3600.0,
        "idle_gpu_hours": None if idle is None else idle / 3600.0,
        "idle_percent": 100.0 * idle / gpu if idle is not None and gpu > 0 else None,
        "missing_gpu_hours": missing / 3600.0,
        "missing_percent": 100.0 * missing / gpu if gpu > 0 else None,
        "energy_kwh": total["energy_joules"] / 3.6e6 if total["energy_rows"] > 0 else None,
        "cost": float(total["cost"]),
        "queue_wait_mean": wait_mean,
        "queue_wait_p95": wait_p95,
        "gpm_gpu_hours": gpm / 3600.0,
        "gpm_percent": 100.0 * gpm / gpu if gpu > 0 else None,
        **means,
        "effective_gpu_hours": None if effective is None else effective / 3600.0,
        "idle_held_cost": float(total["idle_held_cost"]) if held_cost else None,
        "physical_gpu_hours": total["physical_seconds"] / 3600.0,
    }
