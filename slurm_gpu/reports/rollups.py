"""`slurm-gpu report`: the period's sums, the one road to every group's figures.

The period's usage is a set of sums rows (the ledger's, reports/sums.py) whatever their
source, summed from:

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
- raw rows (reports/usage.py), as the ledger's sums of each GPU row, for the jobs of the
  period that are not folded: running, no summary yet, no start or no end time.

Jobs are counted once per group: the rollups count each job on the last UTC day it has
usage in, with weights that add up to one in any group holding its rows (schema.py
MEMBER_WEIGHTS); the jobs whose last day is not a whole day of the period are counted one
by one from their `job_usage` rows, or, across an end at a midnight, from `usage_across`.
Users are the distinct users of the rows summed.
Queue wait: the mean is exact (sums of waits x weight); the 95th percentile comes from
the folded log2 histogram (within one bucket of numpy's, placed evenly inside its bucket)
wherever folded jobs are counted, exact where all are counted one by one.

Every other figure is the ledger's of summed per-row sums (`ledger.sums.row_sums`), so a
job's figures are the same whether it is folded or read raw, up to the order floats are
added in (tests/usage_sources.py runs the report tests over each source).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.ledger import periods, pricing
from slurm_gpu.reports.frames import (
    GPU_COLUMNS,
    Unsummarized,
    gpu_rows,
    stored_jobs,
)
from slurm_gpu.reports.grouped import (
    FIGURE_SUMS,
    MEMBER_COLUMNS,
    WEIGHT_OF,
    counted_figures,
    raw_sums,
    report_of,
    with_counts,
)
from slurm_gpu.reports.summary import Report
from slurm_gpu.reports.sums import priced
from slurm_gpu.reports.usage import (
    JobFilter,
    Usage,
    alloc_or_counted,
    ledger_rows,
    load_usage,
    select,
)
from slurm_gpu.store import Store, queries, rollup_reads, usage_rollup
from slurm_gpu.store.schema import (
    MEMBER_WEIGHTS,
    USAGE_COUNTS,
    USAGE_PLACE,
    USAGE_SUMS,
)

DAY = periods.DAY
NO_FILTER = JobFilter()


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
    """The report of the period's usage by `group` (module docstring).

    Arguments as `load_usage` and `report_of` take them; `filters` only -u/-A/-r.
    """
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
        weights=("jobs", WEIGHT_OF.get(group, "jobs")),
    )
    return report_of(
        sums,
        members,
        group,
        held_cost=cost is not None and cost.charge == "effective",
        cluster=cluster,
        all_nodes=all_nodes,
        busy_factor=busy_factor,
        top=top,
        sort=sort,
        waste_top=waste_top,
    )


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
    across = whole and last == until and not by_node
    parts: list[pd.DataFrame] = []
    owners = selected_owners(filters)
    if whole:
        parts.append(
            rollup_sums(store, first, last, by_node=by_node, weights=weights, owners=owners)
        )
        edges = [(since, first), (last, until)]
    else:
        edges = [(since, until)]
    if across:
        parts.append(across_counts(store, last, weights=weights, owners=owners))
    first_cut = first if whole else None
    cells = models_filled(
        boundary_cells(store, since, until, first_cut, last, counted_across=across, owners=owners),
        store,
    )
    for a, b in edges:
        if b > a or (b == a == until):
            edge = edge_part(cells, a, b, closed=b == until)
            parts.append(edge.drop(columns=list(MEMBER_WEIGHTS)))
    parts = [p for p in parts if len(p)]
    sums = pd.concat(parts, ignore_index=True) if parts else _empty_sums()
    sums = priced(models_filled(sums, store), cost)
    members = _members(cells, since, until, (first, last) if whole else None, counted_across=across)
    raw_sums, raw_members = _raw_part(store, since, until, now, scope, filters, cost, lag)
    sums = pd.concat([sums, raw_sums], ignore_index=True) if len(raw_sums) else sums
    sums = with_counts(sums, weights)
    if len(raw_members):
        members = pd.concat([members, raw_members], ignore_index=True)
    return visible(sums, scope, filters), visible(members, scope, filters)


def _empty_sums() -> pd.DataFrame:
    return pd.DataFrame(columns=[*usage_rollup.OWNER, *USAGE_PLACE, *FIGURE_SUMS])


def selected_owners(filters: JobFilter) -> rollup_reads.Owners:
    """The owners -u/-A/-r select, for the database to select (`visible` checks again)."""
    return {"user": filters.users, "account": filters.accounts, "partition": filters.partitions}


def whole_months(first: float, last: float) -> tuple[float, float]:
    """[a, b): the whole UTC months inside the whole days [first, last) (a == b: none)."""
    month = periods.month_of(first)
    a = month if month == first else periods.next_month(month)
    b = a
    while periods.next_month(b) <= last:
        b = periods.next_month(b)
    return a, b


def rollup_sums(
    store: Store,
    first: float,
    last: float,
    *,
    by_node: bool,
    weights: Sequence[str],
    owners: rollup_reads.Owners | None = None,
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
    rows = rollup_reads.summed_usage(store, spans, by_node=by_node, figures=figures, owners=owners)
    return _frame(rows, names, figures)


def across_counts(
    store: Store,
    midnight: float,
    *,
    weights: Sequence[str],
    owners: rollup_reads.Owners | None = None,
) -> pd.DataFrame:
    """The counts of the jobs running across `midnight` (`usage_across`), as sums rows.

    Per owner and place (the node blank as `rollup_sums` blanks it without `by_node`),
    their usage 0: it is in the days before and after the midnight.
    """
    figures = counted_figures(weights)
    names = [*usage_rollup.OWNER, *USAGE_PLACE, *figures]
    span: list[rollup_reads.Span] = [("across", midnight, midnight + DAY)]
    rows = rollup_reads.summed_usage(store, span, by_node=False, figures=figures, owners=owners)
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
    owners: rollup_reads.Owners | None = None,
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
        store, since, until, first, last, counted_across=counted_across, owners=owners
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


def models_filled(frame: pd.DataFrame, store: Store) -> pd.DataFrame:
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


def edge_part(cells: pd.DataFrame, a: float, b: float, *, closed: bool) -> pd.DataFrame:
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
    jobs = select(stored_jobs(stored, queries.JOB_ROW_COLUMNS, now), filters, scope)
    wanted = jobs["job_id"].to_numpy(dtype="int64")
    read = GPU_COLUMNS  # with the GPU UUID ([cost] unit job_hour counts GPU rows)
    summary_rows = queries.summary_rows_for(store, wanted.tolist(), columns=read)
    unsummarized = None if lag is None else Unsummarized(jobs, now, lag)
    gpus = gpu_rows(store, wanted, summary_rows, read, unsummarized)
    if not gpus.empty:
        jobs["alloc_gpus"] = alloc_or_counted(jobs, gpus["job_id"].to_numpy())
    gpus = ledger_rows(gpus, jobs, store, cost)
    usage = Usage(jobs.reset_index(drop=True), gpus.reset_index(drop=True))
    raw, rows = raw_sums(usage, since, until, now)
    if not len(raw):
        return empty, pd.DataFrame(columns=MEMBER_COLUMNS)
    members = raw.assign(job_id=rows["job_id"].to_numpy(), queue_wait=rows["queue_wait"].to_numpy())
    return raw, members[list(MEMBER_COLUMNS)]


def visible(frame: pd.DataFrame, scope: Scope, filters: JobFilter) -> pd.DataFrame:
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


def usage_before(store: Store, before: float, cost: CostSettings | None) -> pd.DataFrame:
    """GPU-seconds, active seconds and cost per (user, account): folded jobs ended before.

    The usage rollups of every month less the folded jobs ended at or after `before`
    (`rollup_reads.settled_usage`), summed by the database (the exporter's settled
    counters); active seconds clipped as the reports clip them.
    Only the sums returned and those the ledger's charge reads under `cost` are summed.
    """
    charged = pricing.charged_sums(cost) if cost is not None else ()
    figures = tuple(dict.fromkeys(("gpu_seconds", "active_seconds", *charged)))
    every, later = rollup_reads.settled_usage(store, before, figures)
    dims = ["user", "account", "node", "gpu_model", "mig_profile", "share"]
    names = [*dims, *figures]
    whole = pd.DataFrame(every, columns=names)
    ended_later = pd.DataFrame(later, columns=names)
    if len(ended_later):  # the sums less the later jobs', then priced as summed sums are
        ended_later[list(figures)] = -ended_later[list(figures)].astype(float)
        whole = (
            pd.concat([whole, ended_later], ignore_index=True)
            .groupby(dims, sort=False, dropna=False)[list(figures)]
            .sum()
            .reset_index()
        )
    frame = priced(models_filled(whole, store), cost)
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
