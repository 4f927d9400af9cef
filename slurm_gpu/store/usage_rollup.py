"""Usage rollups written at ingest (revision 0010, issue 16): per job, day and month.

What a report figure is summed from (reports/figures.py over the GPU frame of
reports/usage.py) is folded here, in the transaction that stores the rows it summarizes:

- `job_usage`: one row per job, run and place (node, GPU model, slot kind, MIG profile,
  share): the job's summaries there, summed row by row as the reports sum them (missing
  at most the GPU-seconds, active at most the measured rest; utilization weighted by the
  GPU-seconds of the rows with a mean; GPM means by the GPM seconds that had them; the
  cost units of every [cost] unit and their unused share), with the job's owner and
  times as folded, and its count weights (schema.py MEMBER_WEIGHTS: 1 / the job's rows,
  overall and on one node, model, slot group).
- `usage_daily`: per UTC day, owner and place, the sums of the `job_usage` rows prorated
  as the reports prorate a job: by the part of the job [start, end] inside the day (an
  instant job: the day it starts in); and the jobs counted on the last day they have
  usage in (their weights), with their queue waits (weights of the known ones, waits x
  weight, a log2 histogram per weight).
- `usage_monthly`: per UTC month, owner and place but the node (kept only where the GPU
  model is blank), the sums of that month's `usage_daily` rows, summed by the database.
- `usage_across` (revision 0013): per UTC midnight, owner and place but the node (as
  `usage_monthly`), the counts of the jobs running across it (started before it, counted
  on it or after), as `usage_daily` counts them: a report of whole days adds those of
  its end (`across_days`).

Only finished jobs are folded: a job with summaries and both a start and an end time. A
job with no summary yet (running), no start or no end is read from raw rows by the
reports, as before. Whenever a job's summaries or facts change (`Store.add_summaries`,
`add_events`, `upsert_jobs`, the bulk path), `refold` recomputes its `job_usage` rows and
every `usage_daily` and `usage_across` slice (day, user) it touched before or touches
now, from the `job_usage` rows of that slice, then those users' months: sums are
recomputed, never patched by subtraction. `rebuild` recomputes the tables from the raw
rows (`slurm-gpu db rebuild-rollups`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from slurm_gpu.ledger import periods
from slurm_gpu.ledger import time as ledger_time
from slurm_gpu.ledger.periods import day_fractions, day_of, month_of, next_month
from slurm_gpu.ledger.sums import ROW_COLUMNS, row_sums
from slurm_gpu.store.dialect import upsert
from slurm_gpu.store.schema import (
    MEMBER_WEIGHTS,
    USAGE_COUNTS,
    USAGE_PLACE,
    USAGE_SUMS,
    WAIT_BUCKETS,
    WAIT_HISTOGRAM,
    WAIT_HISTOGRAMS,
    WAIT_SUMS,
    job_gpu_summaries,
    job_usage,
    jobs,
    usage_across,
    usage_daily,
    usage_extent,
    usage_monthly,
    usage_unfolded,
)
from slurm_gpu.units import is_known

DAY = periods.DAY
CHUNK = 500
OWNER = ("user", "account", "partition")
JOB_KEY = ("cluster", "job_id", "restart", *USAGE_PLACE)
DAILY_KEY = ("cluster", "day", *OWNER, *USAGE_PLACE)
FIGURES = (*USAGE_SUMS, *USAGE_COUNTS)
MEMBERS = (*MEMBER_WEIGHTS, *WAIT_SUMS, *WAIT_HISTOGRAM)
_NO_MEMBERS = dict.fromkeys(MEMBERS, 0.0)


def _add(into: dict[str, Any], sums: Mapping[str, float], weight: float = 1.0) -> None:
    for name in USAGE_SUMS:
        into[name] = into.get(name, 0.0) + sums[name] * weight
    for name in USAGE_COUNTS:
        into[name] = into.get(name, 0) + int(sums[name])


def _summed_rows(
    folded: Sequence[tuple[int, Mapping[Any, Any], Sequence[Mapping[Any, Any]]]],
) -> dict[str, list[float]]:
    """The ledger's sums (`row_sums`) of every summary row of these jobs, in order.

    Computed for all rows at once; each row's job_hour share is its job's elapsed
    seconds over its rows.
    """
    rows = [row for _, _, job_rows in folded for row in job_rows]
    job_hours = [
        float(ledger_time.elapsed(job["start_time"], job["end_time"], _suspended(job)))
        / len(job_rows)
        for _, job, job_rows in folded
        for _ in job_rows
    ]
    if not rows:
        return {}
    columns = {name: [row.get(name) for row in rows] for name in ROW_COLUMNS}
    # Slurm records a job's suspended time, not a GPU's: each of its rows spans it.
    columns["suspended_seconds"] = [
        _suspended(job) for _, job, job_rows in folded for _ in job_rows
    ]
    return {name: v.tolist() for name, v in row_sums(columns, job_hours).items()}


def _suspended(job: Mapping[Any, Any]) -> float:
    """The job's suspended seconds (sacct's Suspended); 0 where none is recorded."""
    value = job.get("suspended_seconds")
    return 0.0 if value is None else float(value)


def _chunks(values: Sequence[int]) -> Iterable[list[int]]:
    unique = sorted(set(values))
    for i in range(0, len(unique), CHUNK):
        yield unique[i : i + CHUNK]


def job_cells(conn: sa.Connection, cluster: str, job_ids: Sequence[int]) -> list[dict[str, Any]]:
    """The `job_usage` rows of these jobs, from their `jobs` row and summaries.

    None for a job with no summary, no start or no end (not folded: raw rows).
    """
    j, s = jobs.c, job_gpu_summaries.c
    out: list[dict[str, Any]] = []
    for chunk in _chunks(job_ids):
        facts = {
            int(r["job_id"]): r
            for r in conn.execute(
                sa.select(jobs).where(j.cluster == cluster, j.job_id.in_(chunk))
            ).mappings()
        }
        summaries: dict[int, list[Mapping[Any, Any]]] = defaultdict(list)
        for r in conn.execute(
            sa.select(job_gpu_summaries)
            .where(s.cluster == cluster, s.job_id.in_(chunk))
            .order_by(s.job_id, s.node, s.gpu_uuid, s.slot_id, s.restart)
        ).mappings():
            summaries[int(r["job_id"])].append(r)
        folded = [
            (job_id, facts[job_id], rows)
            for job_id, rows in summaries.items()
            if job_id in facts
            and facts[job_id]["start_time"] is not None
            and facts[job_id]["end_time"] is not None
        ]
        summed = _summed_rows(folded)
        at = 0
        for job_id, job, rows in folded:
            start, end = float(job["start_time"]), float(job["end_time"])
            cells: dict[tuple[Any, ...], dict[str, Any]] = {}
            for row in rows:
                place = (
                    row["node"] or "",
                    row["gpu_model"] or "",  # blank: filled by the report (by node)
                    row["slot_kind"] or "gpu",
                    row["mig_profile"] or "",
                    float(row["share"]) if row["share"] is not None else 1.0,
                )
                key = (int(row["restart"]), *place)
                cell = cells.get(key)
                if cell is None:
                    cell = cells[key] = {
                        "cluster": cluster,
                        "job_id": job_id,
                        "restart": key[0],
                        **dict(zip(USAGE_PLACE, place, strict=True)),
                        **{name: job[name] or "" for name in OWNER},
                        "submit_time": job["submit_time"],
                        "start_time": start,
                        "end_time": end,
                    }
                _add(cell, {name: values[at] for name, values in summed.items()})
                at += 1
            _weigh(list(cells.values()))
            out.extend(cells.values())
    return out


def _weigh(cells: list[dict[str, Any]]) -> None:
    """One job's `MEMBER_WEIGHTS`: 1 / its rows (overall, on a node, of a model, a slot).

    Summed over a group that holds all of the job's rows of that kind, the job counts once.
    The rows of a blank GPU model (the report fills it from the node's one model) are one
    model: a job whose blank rows are on nodes of two models counts half in each.
    """
    kinds: dict[str, tuple[str, ...]] = {
        "jobs": (),
        "node_jobs": ("node",),
        "model_jobs": ("gpu_model",),
        "slot_jobs": ("gpu_model", "slot_kind", "mig_profile"),
    }
    for name, columns in kinds.items():
        counts: dict[tuple[Any, ...], int] = defaultdict(int)
        for cell in cells:
            counts[tuple(cell[c] for c in columns)] += 1
        for cell in cells:
            cell[name] = 1.0 / counts[tuple(cell[c] for c in columns)]


def wait_bucket(wait: float) -> int:
    """The `WAIT_HISTOGRAM` bucket of a queue wait in seconds (log2; below 1 s: 0)."""
    if wait < 1.0:
        return 0
    return min(math.floor(math.log2(wait)) + 1, WAIT_BUCKETS - 1)


def bucket_bounds(bucket: int) -> tuple[float, float]:
    """[low, high) seconds of a `WAIT_HISTOGRAM` bucket (the last one: high = inf)."""
    if bucket == 0:
        return 0.0, 1.0
    return 2.0 ** (bucket - 1), (math.inf if bucket == WAIT_BUCKETS - 1 else 2.0**bucket)


def last_day(start: float, end: float) -> float:
    """The last UTC day with a part of [start, end] (an instant: the day it is in)."""
    return day_fractions(start, end)[-1][0]


def _count(row: dict[str, Any], cell: Mapping[str, Any]) -> None:
    """Counts the job of `cell` in `row` (its last day's), with its queue wait."""
    submit = cell.get("submit_time")
    wait = float(cell["start_time"]) - float(submit) if is_known(submit) else None
    for name in MEMBER_WEIGHTS:
        weight = float(cell.get(name) or 0.0)
        row[name] = row.get(name, 0.0) + weight
        if wait is not None:
            row[f"{name}_waited"] = row.get(f"{name}_waited", 0.0) + weight
            row[f"{name}_wait_seconds"] = row.get(f"{name}_wait_seconds", 0.0) + weight * wait
            bucket = WAIT_HISTOGRAMS[name][wait_bucket(wait)]
            row[bucket] = row.get(bucket, 0.0) + weight


def daily_of(
    cells: Iterable[Mapping[str, Any]], days: set[float] | None = None
) -> list[dict[str, Any]]:
    """`usage_daily` rows of `job_usage` rows (only `days`, when given)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    fold_daily(out, cells, days)
    return list(out.values())


def fold_daily(
    out: dict[tuple[Any, ...], dict[str, Any]],
    cells: Iterable[Mapping[str, Any]],
    days: set[float] | None = None,
) -> None:
    """Adds `job_usage` rows into the `usage_daily` rows of `out` (by their key)."""
    for cell in cells:
        fractions = day_fractions(cell["start_time"], cell["end_time"])
        for day, fraction in fractions:
            if days is not None and day not in days:
                continue
            key = (cell["cluster"], day, *(cell[n] for n in OWNER), *(cell[n] for n in USAGE_PLACE))
            row = out.get(key)
            if row is None:
                row = out[key] = {**dict(zip(DAILY_KEY, key, strict=True)), **_NO_MEMBERS}
            _add(row, cell, fraction)
            if day == fractions[-1][0]:
                _count(row, cell)


def across_days(start: float, end: float) -> list[float]:
    """The UTC midnights a job runs across: after its start, up to its last day with usage.

    A report of whole days ending at one of them counts the job (its last day is not
    among the report's days) from `usage_across`; a job ending at a midnight has no usage
    after it, so that midnight is not one of them.
    """
    return [day for day, _ in day_fractions(start, end) if day > start]


def fold_across(
    out: dict[tuple[Any, ...], dict[str, Any]],
    cells: Iterable[Mapping[str, Any]],
    days: set[float] | None = None,
) -> None:
    """Counts `job_usage` rows into the `usage_across` rows of `out` (by their key).

    The node is blank but where the GPU model is (`blank_model_node`): a report by node
    reads the jobs across its end one by one instead.
    """
    for cell in cells:
        for day in across_days(float(cell["start_time"]), float(cell["end_time"])):
            if days is not None and day not in days:
                continue
            node = cell["node"] if cell["gpu_model"] == "" else ""  # USAGE_PLACE[0]
            place = (node, *(cell[n] for n in USAGE_PLACE[1:]))
            key = (cell["cluster"], day, *(cell[n] for n in OWNER), *place)
            row = out.get(key)
            if row is None:
                row = out[key] = {**dict(zip(DAILY_KEY, key, strict=True)), **_NO_MEMBERS}
            _count(row, cell)


def _slices(cells: Iterable[Mapping[str, Any]]) -> dict[str, set[float]]:
    """{user: the days} that these `job_usage` rows touch."""
    out: dict[str, set[float]] = defaultdict(set)
    for cell in cells:
        for day, _ in day_fractions(cell["start_time"], cell["end_time"]):
            out[cell["user"]].add(day)
    return out


def _stored_cells(conn: sa.Connection, query: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(query).mappings()]


def refold(conn: sa.Connection, cluster: str, job_ids: Sequence[int]) -> int:
    """Recompute these jobs' `job_usage` rows and the `usage_daily` slices they touch.

    In the caller's transaction. Returns the number of `job_usage` rows written.
    """
    if not job_ids:
        return 0
    u = job_usage.c
    old: list[dict[str, Any]] = []
    for chunk in _chunks(job_ids):
        where = sa.and_(u.cluster == cluster, u.job_id.in_(chunk))
        old += _stored_cells(conn, sa.select(job_usage).where(where))
        conn.execute(sa.delete(job_usage).where(where))
    new = job_cells(conn, cluster, job_ids)
    if new:
        conn.execute(sa.insert(job_usage), new)
    _mark_unfolded(conn, cluster, job_ids, {int(c["job_id"]) for c in new})
    raise_extent(conn, cluster, new)
    affected = _slices(old)
    for user, days in _slices(new).items():
        affected[user] |= days
    _recompute(conn, cluster, affected)
    return len(new)


def raise_extent(conn: sa.Connection, cluster: str, cells: Sequence[Mapping[str, Any]]) -> None:
    """Raise the cluster's `usage_extent` to the longest of these `job_usage` rows.

    Read first, written only when longer: the upsert locks the row, and every writer of
    the collector's pool would then wait on the others' commits for nothing.
    """
    if not cells:
        return
    longest = max(max(float(c["end_time"]) - float(c["start_time"]), 0.0) for c in cells)
    e = usage_extent.c
    stored = conn.execute(sa.select(e.longest_job_seconds).where(e.cluster == cluster)).scalar()
    if stored is not None and float(stored) >= longest:
        return
    grow = upsert(conn.dialect.name, usage_extent, (), keep_max=("longest_job_seconds",))
    conn.execute(grow, {"cluster": cluster, "longest_job_seconds": longest})


def reset_extent(conn: sa.Connection) -> None:
    """Recompute `usage_extent` of every cluster from its `job_usage` rows (after a rebuild).

    Not part of `rebuild`: revision 0010's upgrade runs that, before this table exists
    (revision 0012 computes it the same way).
    """
    u = job_usage.c
    conn.execute(sa.delete(usage_extent))
    longest = sa.func.max(u.end_time - u.start_time)
    query = sa.select(u.cluster, sa.case((longest > 0, longest), else_=0.0)).group_by(u.cluster)
    conn.execute(sa.insert(usage_extent).from_select(["cluster", "longest_job_seconds"], query))


def _mark_unfolded(
    conn: sa.Connection, cluster: str, job_ids: Sequence[int], folded: set[int]
) -> None:
    """Keep `usage_unfolded` for these jobs: those of `jobs` not in `folded` are listed."""
    j, f = jobs.c, usage_unfolded.c
    for chunk in _chunks(job_ids):
        conn.execute(sa.delete(usage_unfolded).where(f.cluster == cluster, f.job_id.in_(chunk)))
        rest = [i for i in chunk if i not in folded]
        if not rest:
            continue
        query = sa.select(
            sa.literal(cluster), j.job_id, sa.func.coalesce(j.start_time, j.submit_time), j.end_time
        ).where(j.cluster == cluster, j.job_id.in_(rest))
        conn.execute(
            sa.insert(usage_unfolded).from_select(["cluster", "job_id", "began", "end_time"], query)
        )


def _recompute(conn: sa.Connection, cluster: str, slices: Mapping[str, set[float]]) -> None:
    """Rewrite the `usage_daily` and `usage_monthly` rows of these (user, days).

    The days from their `job_usage` rows, then those users' months from their days.
    """
    u, d, a = job_usage.c, usage_daily.c, usage_across.c
    for user, days in slices.items():
        if not days:
            continue
        first, last = min(days), max(days)
        cells = _stored_cells(
            conn,
            sa.select(job_usage).where(
                u.cluster == cluster,
                u.user == user,
                u.start_time < last + DAY,
                u.end_time >= first,
            ),
        )
        stale = sorted(days)
        conn.execute(
            sa.delete(usage_daily).where(d.cluster == cluster, d.user == user, d.day.in_(stale))
        )
        conn.execute(
            sa.delete(usage_across).where(a.cluster == cluster, a.user == user, a.day.in_(stale))
        )
        rows = daily_of(cells, days)
        if rows:
            conn.execute(sa.insert(usage_daily), rows)
        across: dict[tuple[Any, ...], dict[str, Any]] = {}
        fold_across(across, cells, days)
        if across:
            conn.execute(sa.insert(usage_across), list(across.values()))
    # Then their months: one query per month for all of its users (a bulk batch touches
    # many users, few months).
    months: dict[float, set[str]] = defaultdict(set)
    for user, days in slices.items():
        for day in days:
            months[month_of(day)].add(user)
    for month, users in sorted(months.items()):
        for at in range(0, len(users), CHUNK):
            _sum_month(conn, cluster, month, sorted(users)[at : at + CHUNK])


def blank_model_node(d: Any) -> Any:
    """The node of a row of blank GPU model, else "": the node column of `usage_monthly`.

    Inline SQL literals, so that the same expression in SELECT and GROUP BY is one to
    PostgreSQL (bound parameters would be two).
    """
    blank: sa.ColumnElement[str] = sa.literal_column("''")
    return sa.case((d.gpu_model == blank, d.node), else_=blank)


def _sum_month(
    conn: sa.Connection, cluster: str, month: float, users: Sequence[str] | None
) -> None:
    """Rewrite the `usage_monthly` rows of a month (of these users, or all) from its days."""
    d, m = usage_daily.c, usage_monthly.c
    stale = sa.delete(usage_monthly).where(m.cluster == cluster, m.month == month)
    days = sa.and_(d.cluster == cluster, d.day >= month, d.day < next_month(month))
    if users is not None:
        stale = stale.where(m.user.in_(users))
        days = sa.and_(days, d.user.in_(users))
    conn.execute(stale)
    node = blank_model_node(d)
    dims = [d.user, d.account, d.partition, node, d.gpu_model, d.slot_kind, d.mig_profile, d.share]
    query = (
        sa.select(
            sa.literal(cluster),
            sa.literal(month),
            *dims,
            *(sa.func.sum(d[n]) for n in (*FIGURES, *MEMBERS)),
        )
        .where(days)
        .group_by(*dims)
    )
    names = ["cluster", "month", *OWNER, *USAGE_PLACE, *FIGURES, *MEMBERS]
    conn.execute(sa.insert(usage_monthly).from_select(names, query))


def rebuild(
    conn: sa.Connection,
    cluster: str | None = None,
    since: float | None = None,
) -> int:
    """Recompute the rollups from raw rows: of every job ending at or after `since`.

    `cluster` None: every cluster in the store. In the caller's transaction (a store
    upgrade's: migrations/env.py). Returns the number of `job_usage` rows written.
    """
    j, s, u, d, m = jobs.c, job_gpu_summaries.c, job_usage.c, usage_daily.c, usage_monthly.c
    a = usage_across.c
    if since is not None:
        since = day_of(since)  # every job touching the first rebuilt day is refolded
    clusters = (
        [cluster]
        if cluster is not None
        else [c for (c,) in conn.execute(sa.select(s.cluster).distinct())]
    )
    written = 0
    j_clusters = (
        [cluster]
        if cluster is not None
        else [c for (c,) in conn.execute(sa.select(j.cluster).distinct())]
    )
    for name in clusters:
        # In order of start: a job touches no day before its start's, so once the jobs
        # started on a day are folded, the days before it are whole (`_flush_days`).
        query = (
            sa.select(s.job_id, j.start_time)
            .distinct()
            .select_from(
                job_gpu_summaries.join(jobs, sa.and_(j.cluster == s.cluster, j.job_id == s.job_id))
            )
            .where(s.cluster == name)
            .order_by(j.start_time, s.job_id)
        )
        stale = sa.delete(job_usage).where(u.cluster == name)
        days = sa.delete(usage_daily).where(d.cluster == name)
        months = sa.delete(usage_monthly).where(m.cluster == name)
        if since is not None:
            query = query.where(sa.or_(j.end_time.is_(None), j.end_time >= since))
            stale = stale.where(u.end_time >= since)
            days = days.where(d.day >= day_of(since))
            months = months.where(m.month >= month_of(since))
        conn.execute(stale)
        conn.execute(days)
        conn.execute(months)
        crossed = sa.delete(usage_across).where(a.cluster == name)
        conn.execute(crossed if since is None else crossed.where(a.day >= since))
        ids = [int(i) for (i, _) in conn.execute(query)]
        # Each chunk's rows are folded into the days and let go, and the whole days are
        # written as they close: memory grows with the days a job spans, not with the
        # store (a rebuild or the 0010 upgrade of a store of millions of jobs).
        daily: dict[tuple[Any, ...], dict[str, Any]] = {}
        crossing: dict[tuple[Any, ...], dict[str, Any]] = {}
        closed = -math.inf  # the days before it are written
        for at in range(0, len(ids), CHUNK):  # not `_chunks`: that sorts by id
            part = job_cells(conn, name, ids[at : at + CHUNK])
            if part:
                conn.execute(sa.insert(job_usage), part)
                fold_daily(daily, part)
                fold_across(crossing, part)
                written += len(part)
                today = day_of(max(float(c["start_time"]) for c in part))
                if today > closed:
                    _flush_days(conn, usage_daily, daily, today, since)
                    _flush_days(conn, usage_across, crossing, today, since)
                    closed = today
        _flush_days(conn, usage_daily, daily, math.inf, since)
        _flush_days(conn, usage_across, crossing, math.inf, since)
        first = month_of(since) if since is not None else None
        stored = sa.select(d.day).distinct().where(d.cluster == name)
        if first is not None:
            stored = stored.where(d.day >= first)
        for month in sorted({month_of(float(day)) for (day,) in conn.execute(stored)}):
            _sum_month(conn, name, month, None)
    for name in j_clusters:
        _list_unfolded(conn, name)
    return written


def _flush_days(
    conn: sa.Connection,
    table: sa.Table,
    daily: dict[tuple[Any, ...], dict[str, Any]],
    before: float,
    since: float | None,
) -> None:
    """Writes and forgets the rows of `daily` (of `table`) whose day is before `before`.

    Days before `since` touched by a job spanning it are dropped, not written: they stay
    as they were, since every other job of those days was not rebuilt and their rows
    still sum them all.
    """
    done = [key for key, row in daily.items() if row["day"] < before]
    rows = [daily.pop(key) for key in done]
    rows = [r for r in rows if since is None or r["day"] >= since]
    for at in range(0, len(rows), CHUNK):
        conn.execute(sa.insert(table), rows[at : at + CHUNK])


def _list_unfolded(conn: sa.Connection, cluster: str) -> None:
    """Rewrite `usage_unfolded` of a cluster: its jobs with no `job_usage` row."""
    j, u, f = jobs.c, job_usage.c, usage_unfolded.c
    conn.execute(sa.delete(usage_unfolded).where(f.cluster == cluster))
    folded = sa.select(u.job_id).where(u.cluster == j.cluster, u.job_id == j.job_id).exists()
    query = sa.select(
        sa.literal(cluster), j.job_id, sa.func.coalesce(j.start_time, j.submit_time), j.end_time
    ).where(j.cluster == cluster, ~folded)
    conn.execute(
        sa.insert(usage_unfolded).from_select(["cluster", "job_id", "began", "end_time"], query)
    )
