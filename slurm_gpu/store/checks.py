"""Read-only checks of the store's invariants, the SQL behind `slurm-gpu db check`.

Each check is one query that streams its rows (`yield_per`: a store of millions of
intervals is never read into memory) and keeps the first `limit` findings with a count of
all of them. The SQL is the same on SQLite (3.25+), PostgreSQL and MariaDB (10.2+): the
window functions `LAG` and `MAX ... OVER (... ROWS BETWEEN UNBOUNDED PRECEDING AND 1
PRECEDING)`, `NOT EXISTS`, `GROUP BY`.

What is checked here (issue 25):
- `interval_overlaps`: no two `gpu_intervals` rows of one slot (node, slot_id) overlap
  in time: every interval [period_start, period_end) starts at or after the end of every
  interval that started before it on its slot. Two overlapping rows count their slot's
  time twice in every figure made of raw rows.
- `negative_intervals`: no interval ends before it starts.
- `orphan_summaries`: every `job_gpu_summaries` row has its job's `jobs` row (same
  cluster and job id): the usage rollups fold a job only from its `jobs` row
  (usage_rollup.job_cells), so the reports never count a summary without one.
- `open_jobs`: the jobs the store holds as not ended (`end_time` NULL: reports count them
  up to now), a page at a time, for the caller to ask Slurm about (the store does not
  run Slurm commands).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from slurm_gpu.store.database import Database
from slurm_gpu.store.schema import gpu_intervals, job_gpu_summaries, jobs

__all__ = [
    "LIMIT",
    "OPEN_JOBS_PAGE",
    "Interval",
    "Listing",
    "OpenJob",
    "OrphanSummaries",
    "Overlap",
    "OverlapReport",
    "SlotOverlaps",
    "all_open_jobs",
    "interval_overlaps",
    "negative_intervals",
    "open_jobs",
    "orphan_summaries",
]

LIMIT = 20  # findings listed per check by default; the others are only counted
OPEN_JOBS_PAGE = 500  # open jobs per page (one `sacct -j` each): a short command line
STREAM_ROWS = 1000  # rows fetched at a time from a streamed result

T = TypeVar("T")


@dataclass(frozen=True)
class Listing(Generic[T]):
    """The first findings of a check, and how many there are in all.

    Attributes:
        shown: the first findings, in the check's order (at most its `limit`).
        total: every finding, shown or not.
    """

    shown: tuple[T, ...]
    total: int

    @property
    def left_out(self) -> int:
        """The findings counted but not listed."""
        return self.total - len(self.shown)


class _Lister(Generic[T]):
    """Collects a `Listing` from a stream: keeps the first `limit`, counts them all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.shown: list[T] = []
        self.total = 0

    def add(self, finding: T) -> None:
        self.total += 1
        if len(self.shown) < self.limit:
            self.shown.append(finding)

    def listing(self) -> Listing[T]:
        return Listing(tuple(self.shown), self.total)


@dataclass(frozen=True)
class Interval:
    """One `gpu_intervals` row, by its key and what a reader needs to find it."""

    node: str
    slot_id: str
    period_start: float
    period_end: float
    job_id: int | None


@dataclass(frozen=True)
class Overlap:
    """An interval that starts before an earlier interval of its slot ends.

    Attributes:
        interval: the interval that starts too early.
        previous: the slot's interval just before it (by start); it is the one overlapped
            when `previous.period_end == earlier_end`, else an interval before it is.
        earlier_end: the latest end of all the slot's intervals that start before it.
    """

    interval: Interval
    previous: Interval
    earlier_end: float

    @property
    def overlap_seconds(self) -> float:
        """How long the slot is counted twice at this interval's start."""
        end = min(self.earlier_end, self.interval.period_end)
        return max(end - self.interval.period_start, 0.0)


@dataclass(frozen=True)
class SlotOverlaps:
    """How many of one slot's intervals overlap an earlier one."""

    node: str
    slot_id: str
    count: int


@dataclass(frozen=True)
class OverlapReport:
    """`interval_overlaps`' findings: the overlapping intervals and the slots they are on."""

    overlaps: Listing[Overlap]
    slots: Listing[SlotOverlaps]


@dataclass(frozen=True)
class OrphanSummaries:
    """A job with GPU summaries but no `jobs` row: no report counts it."""

    cluster: str
    job_id: int
    summaries: int
    first_start: float
    last_end: float


@dataclass(frozen=True)
class OpenJob:
    """A job the store holds as not ended (`jobs.end_time` NULL)."""

    job_id: int
    state: str | None
    submit_time: float | None
    start_time: float | None


def _streamed(conn: sa.Connection, query: sa.Select[Any]) -> Iterator[sa.Row[Any]]:
    """The rows of `query`, fetched `STREAM_ROWS` at a time; the caller reads them all.

    A server-side cursor where the driver has one (psycopg, PyMySQL's SSCursor, on which
    no other query may run before the last row is read).
    """
    yield from conn.execute(query.execution_options(yield_per=STREAM_ROWS))


def _interval(node: Any, slot_id: Any, start: Any, end: Any, job_id: Any) -> Interval:
    return Interval(
        str(node), str(slot_id), float(start), float(end), None if job_id is None else int(job_id)
    )


# Seconds two overlapping rows may cover beyond their union's span (float stamps).
OVERLAP_SLACK = 0.5


def interval_overlaps(db: Database, limit: int = LIMIT) -> OverlapReport:
    """The `gpu_intervals` rows whose time is also counted by an earlier row of their slot.

    A row is the envelope of its pieces in one shipping period (the spool merges a job's
    pieces there: start the first's, end the last's, covered_seconds their sum), so the
    unallocated row of a period a short job starts and ends in spans the job's row:
    envelopes overlap, and nothing is counted twice. So the rows of a slot (node,
    slot_id), by period_start, are cut into runs of overlapping envelopes (a row that
    starts before the latest end of the slot's earlier rows continues the run), and a run
    whose rows cover more seconds than its span, by more than OVERLAP_SLACK, counts time
    twice (a wall clock step once stored three rows holding 9.6 s in a 5-s period): each
    of its rows but the first is flagged, named with the row before it (`LAG`) and the
    latest end before it. The windows' order is the table's key (node, slot_id,
    period_start), so the database reads the key's index in order; only the flagged rows
    come back, in that order.

    Args:
        db: the store.
        limit: overlaps (and slots) listed; the others are counted.
    """
    t = gpu_intervals.c
    by, order = (t.node, t.slot_id), t.period_start
    windowed = sa.select(
        t.node,
        t.slot_id,
        t.period_start,
        t.period_end,
        t.job_id,
        t.covered_seconds,
        sa.func.lag(t.period_start).over(partition_by=by, order_by=order).label("previous_start"),
        sa.func.lag(t.period_end).over(partition_by=by, order_by=order).label("previous_end"),
        sa.func.lag(t.job_id).over(partition_by=by, order_by=order).label("previous_job_id"),
        sa.func.max(t.period_end)
        .over(partition_by=by, order_by=order, rows=(None, -1))
        .label("earlier_end"),
    ).subquery("slotted")
    w = windowed.c
    continues = sa.and_(w.earlier_end.is_not(None), w.period_start < w.earlier_end)
    w_by, w_order = (w.node, w.slot_id), w.period_start
    numbered = sa.select(
        windowed,
        sa.func.sum(sa.case((continues, 0), else_=1))
        .over(partition_by=w_by, order_by=w_order, rows=(None, 0))
        .label("run"),
    ).subquery("numbered")
    n = numbered.c
    run = (n.node, n.slot_id, n.run)
    totalled = sa.select(
        numbered,
        sa.func.sum(n.covered_seconds).over(partition_by=run).label("run_covered"),
        sa.func.min(n.period_start).over(partition_by=run).label("run_start"),
        sa.func.max(n.period_end).over(partition_by=run).label("run_end"),
    ).subquery("totalled")
    r = totalled.c
    query = (
        sa.select(totalled)
        .where(
            r.earlier_end.is_not(None),
            r.period_start < r.earlier_end,
            r.run_covered > r.run_end - r.run_start + OVERLAP_SLACK,
        )
        .order_by(r.node, r.slot_id, r.period_start)
    )
    overlaps: _Lister[Overlap] = _Lister(limit)
    slots: _Lister[SlotOverlaps] = _Lister(limit)
    current: tuple[str, str] | None = None
    count = 0
    with db.reading("checking gpu_intervals for overlaps") as conn:
        for row in _streamed(conn, query):
            interval = _interval(
                row.node, row.slot_id, row.period_start, row.period_end, row.job_id
            )
            previous = _interval(
                row.node, row.slot_id, row.previous_start, row.previous_end, row.previous_job_id
            )
            overlaps.add(Overlap(interval, previous, float(row.earlier_end)))
            key = (interval.node, interval.slot_id)
            if key != current:  # the rows come by slot: one count per run of a slot's rows
                if current is not None:
                    slots.add(SlotOverlaps(*current, count))
                current, count = key, 0
            count += 1
    if current is not None:
        slots.add(SlotOverlaps(*current, count))
    return OverlapReport(overlaps.listing(), slots.listing())


def negative_intervals(db: Database, limit: int = LIMIT) -> Listing[Interval]:
    """The `gpu_intervals` rows whose period_end is before their period_start."""
    t = gpu_intervals.c
    query = (
        sa.select(t.node, t.slot_id, t.period_start, t.period_end, t.job_id)
        .where(t.period_end < t.period_start)
        .order_by(t.node, t.slot_id, t.period_start)
    )
    found: _Lister[Interval] = _Lister(limit)
    with db.reading("checking gpu_intervals for negative lengths") as conn:
        for row in _streamed(conn, query):
            found.add(
                _interval(row.node, row.slot_id, row.period_start, row.period_end, row.job_id)
            )
    return found.listing()


def orphan_summaries(db: Database, limit: int = LIMIT) -> Listing[OrphanSummaries]:
    """The jobs (of every cluster in the store) with summaries and no `jobs` row."""
    s, j = job_gpu_summaries.c, jobs.c
    query = (
        sa.select(
            s.cluster,
            s.job_id,
            sa.func.count().label("summaries"),
            sa.func.min(s.start).label("first_start"),
            sa.func.max(s.end).label("last_end"),
        )
        .where(~sa.exists().where(j.cluster == s.cluster, j.job_id == s.job_id))
        .group_by(s.cluster, s.job_id)
        .order_by(s.cluster, s.job_id)
    )
    found: _Lister[OrphanSummaries] = _Lister(limit)
    with db.reading("checking job_gpu_summaries for jobs without a jobs row") as conn:
        for row in _streamed(conn, query):
            found.add(
                OrphanSummaries(
                    str(row.cluster or ""),
                    int(row.job_id),
                    int(row.summaries),
                    float(row.first_start),
                    float(row.last_end),
                )
            )
    return found.listing()


def open_jobs(
    db: Database, cluster: str, after: int | None = None, count: int = OPEN_JOBS_PAGE
) -> list[OpenJob]:
    """One page of the cluster's jobs with no end time, by job id, after job id `after`.

    Each page is its own short read (keyset paging), so no transaction stays open while
    the caller asks Slurm about the page.
    """
    j = jobs.c
    query = (
        sa.select(j.job_id, j.state, j.submit_time, j.start_time)
        .where(j.cluster == cluster, j.end_time.is_(None))
        .order_by(j.job_id)
        .limit(count)
    )
    if after is not None:
        query = query.where(j.job_id > after)
    with db.reading("reading the jobs that have not ended") as conn:
        return [
            OpenJob(int(r.job_id), r.state, _seconds(r.submit_time), _seconds(r.start_time))
            for r in conn.execute(query)
        ]


def all_open_jobs(
    db: Database, cluster: str, page: int = OPEN_JOBS_PAGE
) -> Iterator[Sequence[OpenJob]]:
    """Every page of `open_jobs`, in job id order."""
    after: int | None = None
    while True:
        jobs_page = open_jobs(db, cluster, after, page)
        if not jobs_page:
            return
        yield jobs_page
        after = jobs_page[-1].job_id


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)
