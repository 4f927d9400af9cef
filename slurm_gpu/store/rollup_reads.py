"""The SQL behind `slurm-gpu report` and the exporter from the usage rollups (issue 16).

reports/rollups.py builds the report's figures; the queries it needs live here, in the
store (sqlalchemy's one home): each returns plain rows, summed by the database wherever
the figure is a sum, so what crosses into Python grows with owners and places, not jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import sqlalchemy as sa

from slurm_gpu.ledger import periods
from slurm_gpu.store import usage_rollup
from slurm_gpu.store.queries import JOB_USAGE_COLUMNS
from slurm_gpu.store.schema import (
    USAGE_PLACE,
    job_usage,
    usage_across,
    usage_daily,
    usage_extent,
    usage_monthly,
    usage_unfolded,
)
from slurm_gpu.store.store import Store

Span = tuple[Literal["daily", "monthly", "across"], float, float]
# The owners a report selects (-u/-A/-r): {"user"|"account"|"partition": values}; an
# empty selection selects every owner. Read in the database, so that a report of one
# account reads that account's rows, not the cluster's.
Owners = Mapping[str, Sequence[str]]
TABLES = {"daily": usage_daily, "monthly": usage_monthly, "across": usage_across}


def owned(table: sa.Table, owners: Owners) -> list[Any]:
    """The conditions selecting `owners` in a table of owner columns."""
    return [table.c[name].in_(list(values)) for name, values in owners.items() if values]


def summed_usage(
    store: Store,
    spans: Sequence[Span],
    *,
    by_node: bool,
    figures: Sequence[str],
    owners: Owners | None = None,
) -> list[tuple[Any, ...]]:
    """Rows (owner, place, figures...) of `usage_daily` / `usage_monthly` over the spans.

    Each span is a table and [low, high) of its day or month column ("across":
    `usage_across`, its midnights; its figures are counts only). Without `by_node`, rows
    of a known GPU model are summed over nodes (the node blank); `usage_monthly` and
    `usage_across` keep them so (never `by_node`).
    """
    store.require_head("reading the usage rollups")
    rows: list[tuple[Any, ...]] = []
    with store.reading("reading the usage rollups") as conn:
        for kind, low, high in spans:
            if high <= low:
                continue
            table = TABLES[kind]
            t = table.c
            when = t.month if table is usage_monthly else t.day
            node = (
                t.node
                if by_node or table is not usage_daily
                else usage_rollup.blank_model_node(t).label("node")
            )
            dims = [t.user, t.account, t.partition, node, *(t[n] for n in USAGE_PLACE[1:])]
            where = (
                t.cluster == store.cluster,
                when >= low,
                when < high,
                *owned(table, owners or {}),
            )
            if (table is usage_monthly and periods.next_month(low) == high) or (
                table is usage_across and high - low <= periods.DAY
            ):
                # One month or midnight: its rows are one per owner and place already (and
                # summing them over partitions in SQL would cost more than it saves:
                # SQLite sorts).
                query = sa.select(*dims, *(t[n] for n in figures)).where(*where)
            else:
                query = (
                    sa.select(*dims, *(sa.func.sum(t[n]).label(n) for n in figures))
                    .where(*where)
                    .group_by(*dims)
                )
            rows += [tuple(r) for r in conn.execute(query).all()]
    return rows


def longest_job(store: Store) -> float:
    """Seconds of the cluster's longest folded job.

    0 when nothing is folded: no job can be across a period's end then.
    """
    e = usage_extent.c
    query = sa.select(e.longest_job_seconds).where(e.cluster == store.cluster)
    with store.reading("reading the longest folded job") as conn:
        stored = conn.execute(query).scalar()
    return float(stored) if stored is not None else 0.0


def boundary_rows(
    store: Store,
    since: float,
    until: float,
    first: float | None,
    last: float,
    *,
    counted_across: bool = False,
    owners: Owners | None = None,
) -> tuple[list[tuple[Any, ...]], int]:
    """`job_usage` rows of jobs of [since, until] that the whole days [first, last) miss.

    Returns the rows (JOB_USAGE_COLUMNS) and how many queries found them (2: a job across
    both ends is there twice).

    `first` None: every job of the period; else those started before `first` (only
    where `first` > `since`) or ending at or after `last`; `counted_across` (a period
    ending at the midnight `last`, its counts there read from `usage_across`): of the
    latter, those started at `last` only (an instant job there). Each query is a range of start
    times, the period's and the cluster's longest job before it (`longest_job`; the
    (cluster, start_time, end_time) index), not of every job ended after it.
    """
    store.require_head("reading the usage rollups")
    longest = longest_job(store)
    u = job_usage.c
    base = sa.select(*(u[n] for n in JOB_USAGE_COLUMNS)).where(
        u.cluster == store.cluster,
        u.end_time >= since,
        u.start_time <= until,
        *owned(job_usage, owners or {}),
    )

    def started_after(t: float) -> Any:
        """A job that ends at or after `t` started at most `longest` before it.

        (A second more: `longest` is a difference of stored floats.)
        """
        return u.start_time >= t - longest - 1.0

    if first is None:
        parts = [base.where(started_after(since))]
    else:
        # Without `longest`, a test of start_time >= first here would lead PostgreSQL to
        # the start_time index and the period's every job.
        parts = [
            base.where(u.start_time >= last)
            if counted_across
            else base.where(u.end_time >= last, started_after(last))
        ]
        if first > since:
            # Only a period that cuts its first day needs the jobs started before it: the
            # others' usage in the whole days is in `usage_daily`, and a job ended in them
            # is counted there. (Without `longest`, this range holds every job ended after
            # `since`.)
            parts.insert(0, base.where(u.start_time < first, started_after(since)))
    rows: list[tuple[Any, ...]] = []
    with store.reading("reading job usage rollups") as conn:
        for query in parts:
            rows += [tuple(r) for r in conn.execute(query).all()]
    return rows, len(parts)


def settled_usage(
    store: Store, before: float, figures: Sequence[str]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The summed usage of the folded jobs ended before `before` (the exporter's counters).

    Returns (every month, later): `usage_monthly` summed over every month per owner and
    place (every folded job, whole), and the `job_usage` of the folded jobs that ended at
    or after `before`, summed the same way; the settled usage is the first less the
    second. Read so, what is summed grows with months, owners and the jobs of the settling
    window, not with every job the cluster ran (the whole `job_usage` was read here).

    Rows (user, account, node, gpu_model, mig_profile, share, figures...).
    """
    rows: list[list[tuple[Any, ...]]] = []
    with store.reading("reading the settled usage rollups") as conn:
        for table, where in (
            (usage_monthly, ()),
            (job_usage, (job_usage.c.end_time >= before,)),
        ):
            t = table.c
            node = usage_rollup.blank_model_node(t).label("node")
            dims = [t.user, t.account, node, t.gpu_model, t.mig_profile, t.share]
            query = (
                sa.select(*dims, *(sa.func.sum(t[n]).label(n) for n in figures))
                .where(t.cluster == store.cluster, *where)
                .group_by(*dims)
            )
            rows.append([tuple(r) for r in conn.execute(query)])
    return rows[0], rows[1]


def unfolded_job_ids(store: Store, since: float, until: float) -> list[int]:
    """Jobs of the window (`jobs_in_window`'s test) that have no `job_usage` row.

    From `usage_unfolded` (kept by every refold): what is read grows with the jobs not
    folded (running, no summary yet), not with every job of the window.
    """
    f = usage_unfolded.c
    query = sa.select(f.job_id).where(
        f.cluster == store.cluster,
        f.began.is_not(None),
        f.began <= until,
        sa.or_(f.end_time.is_(None), f.end_time >= since),
    )
    with store.reading("reading the jobs not in the usage rollups") as conn:
        return sorted(int(i) for (i,) in conn.execute(query))
