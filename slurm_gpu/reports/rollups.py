"""`slurm-gpu report` from the usage rollups (revision 0010, issue 16).

The same figures as reports/summary.py `build_report` over the GPU frame, summed from:

- `usage_monthly` for the whole UTC months inside the period and `usage_daily` for its
  other whole UTC days (each row already prorated, as `prorated` prorates a job: by the
  part of the job inside the period), summed by the database per owner and place (per
  node only for `report node`, which reads days only): what is read grows with users
  and places, not with jobs;
- `job_usage` rows of the jobs across the period's ends only, prorated to the parts of
  the period that cut a day (its first and last hours when it does not start or end at
  a UTC midnight); at an end at a midnight, the counts of the jobs running across it
  from `usage_across` instead (revision 0013), so that a month's report reads no job
  one by one;
- raw rows, the old way (reports/usage.py), for the jobs of the period that are not
  folded: running, no summary yet, no start or no end time.

Jobs are counted once per group: the rollups count each job on the last UTC day it has
usage in, with weights that add up to one in any group holding its rows (schema.py
MEMBER_WEIGHTS); the jobs whose last day is not a whole day of the period are counted one
by one from their `job_usage` rows, or, across an end at a midnight, from `usage_across`.
Users are the distinct users of the rows summed.
Queue wait: the mean is exact (sums of waits x weight); the 95th percentile comes from
the folded log2 histogram (within one bucket of numpy's, placed evenly inside its bucket)
wherever folded jobs are counted, exact where all are counted one by one.

Every other figure is a sum of per-row sums (store/usage_rollup.py `row_sums`), so it
equals the old computation up to the order floats are added in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.ledger import figures as ledger_figures
from slurm_gpu.ledger import periods, time
from slurm_gpu.reports.frames import (
    GPU_COLUMNS,
    Unsummarized,
    fill_models,
    gpu_rows,
    stored_jobs,
)
from slurm_gpu.reports.summary import TOTAL, Report, _sorted, prorated, slot_groups
from slurm_gpu.reports.sums import PRICED, gpu_sums, priced, prorate
from slurm_gpu.reports.usage import JobFilter, Usage, _alloc_or_counted, _select, load_usage
from slurm_gpu.store import Store, queries, rollup_reads, usage_rollup
from slurm_gpu.store.schema import (
    MEMBER_WEIGHTS,
    USAGE_COUNTS,
    USAGE_PLACE,
    USAGE_SUMS,
    WAIT_BUCKETS,
    WAIT_HISTOGRAMS,
)

DAY = periods.DAY
FIGURE_SUMS = (*USAGE_SUMS, *USAGE_COUNTS, "cost", "idle_held_cost")
NO_FILTER = JobFilter()
MEMBER_COLUMNS = ("job_id", "user", "account", "partition", *USAGE_PLACE, "queue_wait")


def counted_figures(weights: Sequence[str]) -> tuple[str, ...]:
    """The `usage_daily` count columns of these weights (schema.py MEMBER_WEIGHTS)."""
    return tuple(
        c
        for w in dict.fromkeys(weights)
        for c in (w, f"{w}_waited", f"{w}_wait_seconds", *WAIT_HISTOGRAMS[w])
    )


# The `usage_daily` count weight that counts a job once in a group of this report
# (schema.py MEMBER_WEIGHTS); groups by owner, the cluster and the totals: "jobs".
WEIGHT_OF = {"node": "node_jobs", "gpu_model": "model_jobs", "slot": "slot_jobs"}
BUCKET_NOTE = (
    "QueueWaitP95 is read from the usage rollups' log2 histogram of queue waits "
    "(within one bucket, a factor of 2, of the exact 95th percentile); QueueWaitMean is exact."
)


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
    weight = WEIGHT_OF.get(group, "jobs")
    sums, members = period_usage(
        store,
        since,
        until,
        now,
        scope,
        filters,
        cost,
        lag,
        by_node=group == "node",
        weights=("jobs", weight),
    )
    sums = sums.assign(cluster=cluster or "cluster")
    members = members.assign(cluster=cluster or "cluster")
    if group == "slot":
        sums = sums.assign(slot=_slot_labels(sums))
        members = members.assign(slot=_slot_labels(members))
    held_cost = cost is not None and cost.charge == "effective"
    # One float matrix of the sums for the totals, the waste and groups counted by "jobs".
    by_jobs = _matrix(sums, summed_columns("jobs"))
    shared = by_jobs if weight == "jobs" else None
    groups = [
        {"key": key, **f}
        for key, f in _grouped(sums, members, group, held_cost, weight, matrix=shared)
    ]
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
    total = {"key": TOTAL, **_figures(sums, members, held_cost, matrix=by_jobs)}
    if group == "node":
        total["share_percent"] = 100.0 if groups else 0.0
        total["busy"] = ""
    if group == "user":  # the users' figures are those just computed
        wasted = [{**g} for g in groups if (g["idle_gpu_hours"] or 0.0) > 0]
        waste = sorted(wasted, key=lambda g: (-g["idle_gpu_hours"], g["key"]))[:waste_top]
    else:
        waste = [
            {"key": key, **f}
            for key, f in _grouped(
                sums, members, "user", held_cost, "jobs", top_idle=waste_top, matrix=by_jobs
            )
        ]
    groups = _sorted(groups, sort)
    if top is not None:
        groups = groups[:top]
    notes = []
    if len(sums) and float(sums[list(WAIT_HISTOGRAMS[weight])].to_numpy(dtype=float).sum()) > 0:
        notes.append(BUCKET_NOTE)
    return Report(group, groups, total, waste, notes)


def period_usage(
    store: Store,
    since: float,
    until: float,
    now: float,
    scope: Scope,
    filters: JobFilter = NO_FILTER,
    cost: CostSettings | None = None,
    lag: float | None = None,
    *,
    by_node: bool = False,
    weights: Sequence[str] = ("jobs",),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(sums, members) of the period that `scope` may see and -u/-A/-r select.

    sums: rows of owner, place and FIGURE_SUMS plus the jobs counted by `weights`
    (`counted_figures`), from
    `usage_daily` summed in the database per owner and place (per node only `by_node`,
    else the node is blank but where the GPU model is blank), the cut days' `job_usage`
    rows and the unfolded jobs' raw rows. members: the jobs not counted in `usage_daily`
    (those whose last day with usage is not a whole day of the period), one row per job
    row: job id, owner, place, queue wait.
    """
    first = math.ceil(since / DAY) * DAY
    last = math.floor(until / DAY) * DAY
    whole = first < last
    # A period ending at a midnight: the counts of the jobs across it are in usage_across
    # (by owner and place but the node: `report node` reads those jobs one by one).
    across = whole and last == until and not by_node and rollup_reads.counts_across(store)
    parts: list[pd.DataFrame] = []
    if whole:
        parts.append(rollup_sums(store, first, last, by_node=by_node, weights=weights))
        edges = [(since, first), (last, until)]
    else:
        edges = [(since, until)]
    if across:
        parts.append(across_counts(store, last, weights=weights))
    cells = _models_filled(
        boundary_cells(store, since, until, first if whole else None, last, counted_across=across),
        store,
    )
    for a, b in edges:
        if b > a or (b == a == until):
            edge = _edge(cells, a, b, closed=b == until)
            parts.append(edge.drop(columns=list(MEMBER_WEIGHTS)))
    parts = [p for p in parts if len(p)]
    sums = pd.concat(parts, ignore_index=True) if parts else _empty_sums()
    sums = priced(_models_filled(sums, store), cost)
    members = _members(cells, since, until, (first, last) if whole else None, counted_across=across)
    raw_sums, raw_members = _raw_part(store, since, until, now, scope, filters, cost, lag)
    sums = pd.concat([sums, raw_sums], ignore_index=True) if len(raw_sums) else sums
    counted = list(counted_figures(weights))
    present = [n for n in counted if n in sums]
    counts = np.zeros((len(sums), len(counted)))
    if present:  # the edges' and raw rows' counts are none (NaN): 0
        where = [counted.index(n) for n in present]
        counts[:, where] = np.nan_to_num(sums[present].to_numpy(dtype=float), nan=0.0)
    sums = pd.concat(
        [sums.drop(columns=present), pd.DataFrame(counts, index=sums.index, columns=counted)],
        axis=1,
    )
    if len(raw_members):
        members = pd.concat([members, raw_members], ignore_index=True)
    return _visible(sums, scope, filters), _visible(members, scope, filters)


def _empty_sums() -> pd.DataFrame:
    return pd.DataFrame(columns=[*usage_rollup.OWNER, *USAGE_PLACE, *FIGURE_SUMS])


def has_slot_rows(store: Store, since: float, until: float) -> bool:
    """Whether any job of the period held a MIG slice or a share (PhysGPUHours shown)."""
    return rollup_reads.slot_rows_exist(store, since, until)


def whole_months(first: float, last: float) -> tuple[float, float]:
    """[a, b): the whole UTC months inside the whole days [first, last) (a == b: none)."""
    month = periods.month_of(first)
    a = month if month == first else periods.next_month(month)
    b = a
    while periods.next_month(b) <= last:
        b = periods.next_month(b)
    return a, b


def rollup_sums(
    store: Store, first: float, last: float, *, by_node: bool, weights: Sequence[str]
) -> pd.DataFrame:
    """The rollups of the whole days [first, last), summed by the database per owner and place.

    Whole UTC months from `usage_monthly` (not `by_node`), the other days from
    `usage_daily`. Without `by_node`, rows of a known GPU model are summed over nodes
    (the node blank).
    """
    a, b = (first, first) if by_node else whole_months(first, last)
    spans: list[rollup_reads.Span] = [("daily", first, a), ("monthly", a, b), ("daily", b, last)]
    if a == b:
        spans = [("daily", first, last)]
    figures = (*USAGE_SUMS, *USAGE_COUNTS, *counted_figures(weights))
    names = [*usage_rollup.OWNER, *USAGE_PLACE, *figures]
    rows = rollup_reads.summed_usage(store, spans, by_node=by_node, figures=figures)
    return _frame(rows, names, figures)


def across_counts(store: Store, midnight: float, *, weights: Sequence[str]) -> pd.DataFrame:
    """The counts of the jobs running across `midnight` (`usage_across`), as sums rows.

    Per owner and place (the node blank as `rollup_sums` blanks it without `by_node`),
    their usage 0: it is in the days before and after the midnight.
    """
    figures = counted_figures(weights)
    names = [*usage_rollup.OWNER, *USAGE_PLACE, *figures]
    span: list[rollup_reads.Span] = [("across", midnight, midnight + DAY)]
    rows = rollup_reads.summed_usage(store, span, by_node=False, figures=figures)
    counts = _frame(rows, names, figures)
    zeros = np.zeros((len(counts), len(USAGE_SUMS) + len(USAGE_COUNTS)))
    return pd.concat([counts, pd.DataFrame(zeros, columns=[*USAGE_SUMS, *USAGE_COUNTS])], axis=1)


def boundary_cells(
    store: Store,
    since: float,
    until: float,
    first: float | None,
    last: float,
    *,
    counted_across: bool = False,
) -> pd.DataFrame:
    """`job_usage` rows of jobs overlapping [since, until] that `usage_daily` does not cover.

    `first` None: every job of the period; else those with a part outside the whole days
    [first, last): started before `first` (where the period cuts its first day: else
    `usage_daily` holds and counts them) or ending at or after `last` (the jobs that run
    across the period's ends, and those of its cut days). One query or two, each a range
    of start times no wider than the period and the cluster's longest job before it
    (`rollup_reads.boundary_rows`). `counted_across`: the period ends at the midnight
    `last` and the counts of the jobs across it come from `across_counts`: of those
    ending after it, only the instant jobs at `last` are read.
    """
    rows, parts = rollup_reads.boundary_rows(
        store, since, until, first, last, counted_across=counted_across
    )
    cells = _frame(rows, queries.JOB_USAGE_COLUMNS, (*usage_rollup.FIGURES, *MEMBER_WEIGHTS))
    if parts > 1 and len(cells):
        cells = cells.drop_duplicates(["job_id", "restart", *USAGE_PLACE], ignore_index=True)
    return cells


def _frame(
    rows: Sequence[tuple[Any, ...]], columns: Sequence[str], numbers: Sequence[str]
) -> pd.DataFrame:
    """Database rows as a frame, the `numbers` columns as floats.

    Built by column: pandas reading a list of tuples infers every value's type, which
    cost more than the query.
    """
    if not rows:
        return pd.DataFrame(columns=list(columns))
    floats = set(numbers)
    values = zip(*rows, strict=True)
    return pd.DataFrame(
        {
            c: np.array(v, dtype=float) if c in floats else v
            for c, v in zip(columns, values, strict=True)
        }
    )


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
    fraction = periods.fractions(cells["start_time"], cells["end_time"], a, b, b)
    instant = end - start <= 0
    if not closed:  # an instant job at a day's midnight belongs to that day only
        fraction = np.where(instant & (start >= b), 0.0, fraction)
    keep = fraction > 0
    sums = list(USAGE_SUMS)
    scaled = cells[sums].to_numpy(dtype=float)[keep] * fraction[keep][:, None]
    others = cells.loc[keep, [c for c in cells.columns if c not in USAGE_SUMS]]
    return pd.concat([others.reset_index(drop=True), pd.DataFrame(scaled, columns=sums)], axis=1)


def _members(
    cells: pd.DataFrame,
    since: float,
    until: float,
    whole: tuple[float, float] | None,
    *,
    counted_across: bool = False,
) -> pd.DataFrame:
    """The jobs of `cells` with usage inside [since, until] not counted by `usage_daily`.

    `whole`: the period's whole days [first, last), where `usage_daily` counts each job
    on the last day it has usage in (None: no whole day, every job is counted here).
    `counted_across`: nor those across the midnight `last` (`across_counts` has them).
    """
    if not len(cells):
        return pd.DataFrame(columns=MEMBER_COLUMNS)
    fraction = periods.fractions(cells["start_time"], cells["end_time"], since, until, until)
    keep = fraction > 0
    if whole is not None:
        start = cells["start_time"].to_numpy(dtype=float)
        end = cells["end_time"].to_numpy(dtype=float)
        final = np.where(
            end - start > 0, np.ceil(end / DAY) * DAY - DAY, np.floor(start / DAY) * DAY
        )
        keep &= ~((final >= whole[0]) & (final < whole[1]))
        if counted_across:
            keep &= ~((start < whole[1]) & (final >= whole[1]))
    part = cells[keep]
    wait = part["start_time"].to_numpy(dtype=float) - pd.to_numeric(part["submit_time"]).to_numpy(
        dtype=float, na_value=np.nan
    )
    return part.assign(queue_wait=wait)[list(MEMBER_COLUMNS)]


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
    ids = rollup_reads.unfolded_job_ids(store, since, until)
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
    usage = Usage(jobs.reset_index(drop=True), fill_models(gpus, store).reset_index(drop=True))
    raw, rows = raw_sums(usage, since, until, now, cost)
    if not len(raw):
        return empty, pd.DataFrame(columns=MEMBER_COLUMNS)
    members = raw.assign(job_id=rows["job_id"].to_numpy(), queue_wait=rows["queue_wait"].to_numpy())
    return raw, members[list(MEMBER_COLUMNS)]


def raw_sums(
    usage: Usage, since: float, until: float, now: float, cost: CostSettings | None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(sums, rows): raw GPU rows as priced sums rows prorated to [since, until].

    sums: owner, place, PRICED; rows: the prorated GPU rows they came from (same order,
    those with a part inside the period), with their job's facts and queue wait.
    """
    rows = prorated(usage, since, until, now)
    if len(rows):
        rows = rows[rows["fraction"] > 0]
    if not len(rows):
        return pd.DataFrame(columns=[*usage_rollup.OWNER, *USAGE_PLACE, *PRICED]), rows
    elapsed = usage.jobs.drop_duplicates("job_id").set_index("job_id")["elapsed_seconds"]
    # The ledger's sums of the whole rows (as the fold has them), priced, then prorated.
    whole = gpu_sums(usage.gpus.loc[rows.index], elapsed).reset_index(drop=True)
    rows = rows.reset_index(drop=True)
    place = pd.DataFrame(
        {
            **{name: rows[name].astype(object).to_numpy() for name in usage_rollup.OWNER},
            "node": rows["node"].astype(object).to_numpy(),
            "gpu_model": rows["gpu_model"].astype(object).fillna("").to_numpy(),
            "slot_kind": rows["slot_kind"].astype(object).fillna("gpu").to_numpy()
            if "slot_kind" in rows
            else "gpu",
            "mig_profile": rows["mig_profile"].astype(object).fillna("").to_numpy()
            if "mig_profile" in rows
            else "",
            "share": pd.to_numeric(rows["share"], errors="coerce").fillna(1.0).to_numpy()
            if "share" in rows
            else 1.0,
        }
    )
    sums = prorate(priced(pd.concat([place, whole], axis=1), cost), rows["fraction"].to_numpy())
    return sums, rows


def _visible(frame: pd.DataFrame, scope: Scope, filters: JobFilter) -> pd.DataFrame:
    """The rows `scope` may see that pass -u/-A/-r."""
    if not len(frame):
        return frame
    for name in usage_rollup.OWNER:
        frame[name] = frame[name].astype(str)
    keep = np.ones(len(frame), dtype=bool)
    if not scope.all:
        pairs = list(
            zip(*(frame[n].to_numpy(dtype=object) for n in ("user", "account")), strict=True)
        )
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
    sums: pd.DataFrame,
    members: pd.DataFrame,
    key: str,
    held_cost: bool,
    weight: str,
    *,
    top_idle: int | None = None,
    matrix: np.ndarray | None = None,
) -> list[tuple[Any, dict[str, Any]]]:
    """`(value, figures)` per distinct value of `key`, in sorted order (numpy, no groupby).

    `weight`: the count weight of this grouping (WEIGHT_OF). `top_idle`: only that many
    groups with idle GPU-hours, most idle first (the top waste): the figures of the other
    groups are not computed. `matrix`: `_matrix` of sums' `summed_columns(weight)`,
    where the caller has it.
    """
    if not len(sums) and not len(members):
        return []
    names = [*FIGURE_SUMS, weight, f"{weight}_waited", f"{weight}_wait_seconds"]
    column = {n: i for i, n in enumerate(names)}
    histogram = list(WAIT_HISTOGRAMS[weight])
    exact = _exact(members.assign(_key=members[key].astype(str)))
    values = sums[key].astype(str).to_numpy(dtype=object)
    keys = sorted(set(values) | set(exact))
    index = {k: i for i, k in enumerate(keys)}
    codes = np.array([index[v] for v in values], dtype=np.intp)
    if matrix is None:
        matrix = _matrix(sums, [*names, *histogram])
    summed = _sum_by(codes, matrix, len(keys))
    user_codes, users_seen = pd.factorize(sums["user"].to_numpy(dtype=object))
    pairs = np.unique(codes * max(len(users_seen), 1) + user_codes)
    users = np.bincount(pairs // max(len(users_seen), 1), minlength=len(keys))
    chosen = np.arange(len(keys))
    if top_idle is not None:
        idle = _idle_hours(summed, column)
        wasted = [int(i) for i in np.flatnonzero(idle > 0)]  # unknown (NaN): never
        wasted.sort(key=lambda i: (-idle[i], keys[i]))
        chosen = np.array(wasted[:top_idle], dtype=np.intp)
    summed = summed[chosen]
    counted = _counts(
        summed[:, [column[weight], column[f"{weight}_waited"], column[f"{weight}_wait_seconds"]]],
        np.rint(summed[:, len(names) :]),
        [exact.get(keys[i]) for i in chosen],
        users[chosen],
    )
    totals = summed[:, : len(names)].tolist()
    return [
        (keys[i], _from_totals(dict(zip(names, row, strict=True)), c, held_cost))
        for i, row, c in zip(chosen.tolist(), totals, counted, strict=True)
    ]


def _sum_by(codes: np.ndarray, matrix: np.ndarray, n: int) -> np.ndarray:
    """The rows of `matrix` summed per code (0..n-1), in row order within a code."""
    out = np.zeros((n, matrix.shape[1]))
    if not len(codes):
        return out
    order = np.argsort(codes, kind="stable")
    ordered = codes[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    out[ordered[starts]] = np.add.reduceat(matrix[order], starts, axis=0)
    return out


def _idle_hours(summed: np.ndarray, column: dict[str, int]) -> np.ndarray:
    """The ledger's idle GPU-hours of each row of sums (NaN where unknown)."""
    idle = time.idle(
        summed[:, column["gpu_seconds"]],
        summed[:, column["active_seconds"]],
        summed[:, column["missing_seconds"]],
    )
    return np.asarray(idle, dtype=float) / 3600.0


def summed_columns(weight: str) -> list[str]:
    """The columns a group's figures are summed from, its jobs counted by `weight`."""
    return [
        *FIGURE_SUMS,
        weight,
        f"{weight}_waited",
        f"{weight}_wait_seconds",
        *WAIT_HISTOGRAMS[weight],
    ]


def _matrix(frame: pd.DataFrame, names: Sequence[str]) -> np.ndarray:
    """These columns of `frame` as one float matrix, NaN as 0 (pandas' sum skips NaN)."""
    if not len(frame):
        return np.zeros((0, len(names)))
    matrix: np.ndarray = np.nan_to_num(frame[list(names)].to_numpy(dtype=float), nan=0.0)
    return matrix


_NOBODY: tuple[int, int, float | None, float | None] = (0, 0, None, None)


def _exact(members: pd.DataFrame) -> dict[str, tuple[int, np.ndarray]]:
    """{group: (jobs, their known queue waits)} of the jobs counted one by one."""
    if not len(members):
        return {}
    jobs = members.drop_duplicates(["_key", "job_id"])
    codes, names = pd.factorize(jobs["_key"].to_numpy(dtype=object))
    waits = pd.to_numeric(jobs["queue_wait"]).to_numpy(dtype=float, na_value=np.nan)
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=len(names))
    parts = np.split(waits[order], np.cumsum(counts)[:-1])
    return {
        str(name): (int(counts[c]), part[~np.isnan(part)])
        for c, (name, part) in enumerate(zip(names, parts, strict=True))
    }


def _counts(
    folded_sums: np.ndarray,
    folded: np.ndarray,
    exact: Sequence[tuple[int, np.ndarray] | None],
    users: np.ndarray,
) -> list[tuple[int, int, float | None, float | None]]:
    """(jobs, users, queue wait mean, p95) per group: its folded counts plus `exact`.

    `folded_sums`: per group the folded jobs' weight, waited weight and wait seconds;
    `folded`: their waits, known by their histogram only (WAIT_HISTOGRAMS, rounded counts):
    where a group holds any, its 95th percentile is read from the buckets (within one
    bucket of numpy's); else it is numpy's of the exact waits.
    """
    waits = [e[1] if e is not None else np.zeros(0) for e in exact]
    n_exact = np.array([e[0] if e is not None else 0 for e in exact], dtype=np.int64)
    jobs = np.rint(folded_sums[:, 0]).astype(np.int64) + n_exact
    waited = folded_sums[:, 1] + np.array([len(w) for w in waits], dtype=float)
    known = waited > 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = (folded_sums[:, 2] + np.array([float(w.sum()) for w in waits])) / waited
    by_buckets = known & (folded.sum(axis=1) > 0)
    counts = folded[by_buckets]
    buckets: list[int] = np.flatnonzero(by_buckets).tolist()
    for row, i in enumerate(buckets):
        if len(waits[i]):
            counts[row] += np.bincount(wait_buckets(waits[i]), minlength=WAIT_BUCKETS)
    p95: list[float | None] = [None] * len(exact)
    for i, value in zip(buckets, histogram_percentiles(counts, 95.0).tolist(), strict=True):
        p95[i] = value
    exactly: list[int] = np.flatnonzero(known & ~by_buckets).tolist()
    for i in exactly:
        p95[i] = float(np.percentile(waits[i], 95.0))
    return [
        (int(j), int(u), float(m) if k else None, p)
        for j, u, m, k, p in zip(
            jobs.tolist(), users.tolist(), mean.tolist(), known.tolist(), p95, strict=True
        )
    ]


def _count_of(
    row: dict[str, Any],
    weight: str,
    folded: np.ndarray,
    exact: tuple[int, np.ndarray] | None,
    users: int,
) -> tuple[int, int, float | None, float | None]:
    """`_counts` of one group, its sums in `row`."""
    sums = np.array([[row[weight], row[f"{weight}_waited"], row[f"{weight}_wait_seconds"]]])
    return _counts(sums.astype(float), folded.reshape(1, -1), [exact], np.array([users]))[0]


def wait_buckets(waits: np.ndarray) -> np.ndarray:
    """`usage_rollup.wait_bucket` of every wait."""
    with np.errstate(divide="ignore", invalid="ignore"):
        bucket = np.floor(np.log2(np.maximum(waits, 1.0))).astype(np.int64) + 1
    return np.where(waits < 1.0, 0, np.minimum(bucket, WAIT_BUCKETS - 1))


def histogram_percentile(counts: np.ndarray, q: float) -> float:
    """numpy's (linear) percentile `q` of values known by their bucket counts only.

    The value of each rank is placed evenly inside its bucket (the last bucket, with no
    upper bound: its lower bound), then interpolated between ranks as numpy does.
    """
    return float(histogram_percentiles(np.asarray(counts, dtype=float).reshape(1, -1), q)[0])


def histogram_percentiles(counts: np.ndarray, q: float) -> np.ndarray:
    """`histogram_percentile` of each row of bucket counts (each row holding some)."""
    if not len(counts):
        return np.zeros(0)
    total = counts.sum(axis=1)
    cumulative = np.cumsum(counts, axis=1)
    rows = np.arange(len(counts))
    last = WAIT_BUCKETS - 1

    def value(rank: np.ndarray) -> np.ndarray:
        bucket = (cumulative <= rank[:, None]).sum(axis=1)
        low = np.where(bucket == 0, 0.0, 2.0 ** (bucket - 1.0))
        high = np.where(bucket == 0, 1.0, 2.0 ** bucket.astype(float))
        here = counts[rows, bucket]
        before = cumulative[rows, bucket] - here
        inside = low + (rank - before + 0.5) / here * (high - low)
        return np.where(bucket == last, low, inside)

    h = (total - 1) * q / 100.0
    lo = np.floor(h)
    a, b = value(lo), value(np.minimum(lo + 1, total - 1))
    result: np.ndarray = a + (h - lo) * (b - a)
    return result


def _figures(
    sums: pd.DataFrame,
    members: pd.DataFrame,
    held_cost: bool,
    *,
    matrix: np.ndarray | None = None,
) -> dict[str, Any]:
    """The figures of every row together (the totals row); `matrix` as `_grouped` takes it."""
    names = [*FIGURE_SUMS, "jobs", "jobs_waited", "jobs_wait_seconds"]
    histogram = list(WAIT_HISTOGRAMS["jobs"])
    if matrix is None:
        matrix = _matrix(sums, [*names, *histogram])
    summed = matrix.sum(axis=0)
    totals = dict(zip(names, summed[: len(names)].tolist(), strict=True))
    exact = _exact(members.assign(_key="")) if len(members) else {}
    users = int(sums["user"].nunique()) if len(sums) else 0
    counted = _count_of(totals, "jobs", np.rint(summed[len(names) :]), exact.get(""), users)
    return _from_totals(totals, counted, held_cost)


def _from_totals(
    total: dict[str, Any], counted: tuple[int, int, float | None, float | None], held_cost: bool
) -> dict[str, Any]:
    """The ledger's figures of one group, from its sums and counts (FIGURE_KEYS)."""
    return ledger_figures.figures(total, ledger_figures.Counted(*counted), held_cost)


def usage_before(store: Store, before: float, cost: CostSettings | None) -> pd.DataFrame:
    """GPU-seconds, active seconds and cost per (user, account): folded jobs ended before.

    Of the `job_usage` rows of jobs that ended before `before`, summed by the database
    (the exporter's settled counters); active seconds clipped as the reports clip them.
    """
    figures = (
        *("gpu_seconds", "active_seconds", "mem_gib_seconds", "job_hour_seconds"),
        *("gpu_unused_seconds", "mem_unused_gib_seconds", "job_hour_unused_seconds"),
    )
    rows = rollup_reads.settled_usage(store, before, figures)
    names = ["user", "account", "node", "gpu_model", "mig_profile", "share", *figures]
    frame = priced(_models_filled(pd.DataFrame(rows, columns=names), store), cost)
    if not len(frame):
        return pd.DataFrame(columns=["user", "account", "gpu_seconds", "active_seconds", "cost"])
    return (
        frame.assign(user=frame["user"].astype(str), account=frame["account"].astype(str))
        .groupby(["user", "account"], sort=True)[["gpu_seconds", "active_seconds", "cost"]]
        .sum()
        .reset_index()
    )


def unfolded_before(store: Store, before: float, cost: CostSettings | None) -> Usage:
    """The jobs that ended before `before` and are not folded (no summary), from raw rows."""
    ids = rollup_reads.unfolded_job_ids(store, 0.0, before)
    if not ids:
        return Usage(pd.DataFrame(columns=["job_id", "end_time"]), pd.DataFrame(columns=["job_id"]))
    usage = load_usage(
        store,
        since=None,
        until=None,
        now=before,
        sacct_jobs=None,
        scope=Scope(Caller(0, "rollups"), all=True, reason="exporter"),
        filters=JobFilter(job_ids=tuple(str(i) for i in ids)),
        cost=cost,
    )
    ended = pd.to_numeric(usage.jobs["end_time"], errors="coerce") < before
    jobs = usage.jobs[ended]
    return Usage(jobs, usage.gpus[usage.gpus["job_id"].isin(jobs["job_id"])])
