"""Bulk queries for the reports, the exporter and `slurm-gpu status`, and the jobs sync.

Functions of a `Store`, run through its public `reading()` transactions: the reports read
jobs, job GPU summaries (finished jobs) and per-interval totals (running jobs) in bulk,
as tuples or numpy arrays; `sync_jobs` writes the facts sacct knows (submit/start/end,
state, name, nodes) into `jobs`.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import sqlalchemy as sa

from slurm_gpu.models import JobGpuSummary, Measurement, SlotKind
from slurm_gpu.store import convert
from slurm_gpu.store.dialect import BULK_ROWS
from slurm_gpu.store.gpm_means import GpmMeans
from slurm_gpu.store.schema import (
    GPM_METRICS,
    gpu_intervals,
    gpu_inventory,
    job_gpu_summaries,
    job_usage,
    jobs,
)
from slurm_gpu.store.store import Store
from slurm_gpu.units import GIB

CHUNK = 500  # ids per IN (...) clause: far below every backend's parameter limit
_Key = TypeVar("_Key", int, str)


@dataclass(frozen=True)
class IntervalTotals(GpmMeans):
    """One running job's use of one GPU slot, summed over its stored intervals.

    The same figures a `JobGpuSummary` holds, so a running job reads like a finished one;
    `last_period_end` says how fresh they are. `gpu_uuid` is the physical GPU, `slot_id`
    the slot's id as stored (a whole GPU's is its UUID).
    """

    job_id: int
    node: str
    gpu_uuid: str
    first_period_start: float
    last_period_end: float
    covered_seconds: float
    active_seconds: float
    util_weighted_sum: float
    util_covered_seconds: float
    util_max_percent: float | None
    mem_max_bytes: int | None
    mem_gib_seconds: float
    energy_joules: float | None
    interval_count: int
    # NVML GPM (revision 0006): seconds measured, and per metric its percent-seconds
    # over the GPM seconds that had it; the `*_mean_percent` properties are the means,
    # named like JobGpuSummary's fields.
    gpm_seconds: float = 0.0
    sm_active_weighted_sum: float = 0.0
    sm_active_gpm_seconds: float = 0.0
    sm_occupancy_weighted_sum: float = 0.0
    sm_occupancy_gpm_seconds: float = 0.0
    tensor_active_weighted_sum: float = 0.0
    tensor_active_gpm_seconds: float = 0.0
    dram_bw_weighted_sum: float = 0.0
    dram_bw_gpm_seconds: float = 0.0
    # The slot (revision 0009); a whole GPU's slot_id is its UUID ("" for totals made
    # by hand: the GPU's).
    slot_id: str = ""
    slot_kind: SlotKind = SlotKind.GPU
    share: float = 1.0
    mig_profile: str = ""
    measured_by: Measurement = Measurement.NVML

    @property
    def util_mean_percent(self) -> float | None:
        """Mean utilization weighted by covered seconds (None: no samples)."""
        if self.util_covered_seconds <= 0:
            return None
        return self.util_weighted_sum / self.util_covered_seconds


def _chunks(values: Sequence[_Key]) -> Iterator[list[_Key]]:
    """The distinct values, sorted, CHUNK at a time (for IN (...) clauses)."""
    unique = sorted(set(values))
    for i in range(0, len(unique), CHUNK):
        yield unique[i : i + CHUNK]


def jobs_in_window(
    store: Store, since: float | None, until: float | None, job_ids: Sequence[int] = ()
) -> list[dict[str, Any]]:
    """`jobs` rows of the store's cluster that overlap [since, until], or the given ids.

    A job overlaps when it started (or, still pending, was submitted) before `until` and
    has not ended before `since`; rows with no time at all are left out.
    """
    j = jobs.c
    base = sa.select(jobs).where(j.cluster == store.cluster)
    queries = []
    if job_ids:
        queries = [base.where(j.job_id.in_(chunk)) for chunk in _chunks(job_ids)]
    else:
        began = sa.func.coalesce(j.start_time, j.submit_time)
        query = base.where(began.is_not(None))
        if until is not None:
            query = query.where(began <= until)
        if since is not None:
            query = query.where(sa.or_(j.end_time.is_(None), j.end_time >= since))
        queries = [query]
    rows: list[dict[str, Any]] = []
    with store.reading("reading jobs") as conn:
        for query in queries:
            rows.extend(dict(r) for r in conn.execute(query.order_by(j.job_id)).mappings())
    return rows


def _window(query: Any, since: float | None, until: float | None) -> Any:
    """`jobs_in_window`'s overlap test on `jobs` (index on end_time: migration 0003)."""
    j = jobs.c
    began = sa.func.coalesce(j.start_time, j.submit_time)
    query = query.where(began.is_not(None))
    if until is not None:
        query = query.where(began <= until)
    if since is not None:
        query = query.where(sa.or_(j.end_time.is_(None), j.end_time >= since))
    return query


def _sorted_in_python(store: Store) -> bool:
    """True where Python's string order is the database's (SQLite's BINARY collation).

    There a window query asks for no ORDER BY and the rows are sorted here instead:
    SQLite's planner, offered to skip the sort, walks a whole table in key order
    instead of the month through the end_time index (seconds instead of a fraction).
    """
    return store.dialect == "sqlite"


# The `jobs` columns reports/frames.py reads (cluster and uid it does not).
JOB_ROW_COLUMNS = tuple(c.name for c in jobs.columns if c.name not in ("cluster", "uid"))


def job_rows_in_window(
    store: Store,
    since: float | None,
    until: float | None,
    job_ids: Sequence[int] = (),
    *,
    columns: Sequence[str] = JOB_ROW_COLUMNS,
    ordered: bool = True,
    het_components: bool = False,
) -> list[tuple[Any, ...]]:
    """`jobs_in_window` as plain tuples of `columns` (of `JOB_ROW_COLUMNS`).

    Ordered by job id unless `ordered` is false: then in the order the database read
    them, for a caller that sorts them itself (a month read through the end_time index
    comes in end order; reading the tuples in job order afterwards jumps all over memory).
    With `het_components`, a heterogeneous job's leader id in `job_ids` also selects its
    other components, as `sacct -j <leader>` does.
    """
    rows: list[tuple[Any, ...]] = []
    with store.reading("reading jobs") as conn:
        for query in _job_queries(store, since, until, job_ids, columns, het_components):
            rows.extend(_tuples(conn, query))
    if ordered:
        at = list(columns).index("job_id")
        rows.sort(key=operator.itemgetter(at))  # job ids are unique: any backend, one order
    return rows


def _job_queries(
    store: Store,
    since: float | None,
    until: float | None,
    job_ids: Sequence[int],
    columns: Sequence[str],
    het_components: bool = False,
) -> list[Any]:
    j = jobs.c
    base = sa.select(*(j[name] for name in columns)).where(j.cluster == store.cluster)
    if job_ids and het_components:
        return [
            base.where(sa.or_(j.job_id.in_(chunk), j.het_job_id.in_(chunk)))
            for chunk in _chunks(job_ids)
        ]
    if job_ids:
        return [base.where(j.job_id.in_(chunk)) for chunk in _chunks(job_ids)]
    return [_window(base, since, until)]


def _tuples(conn: sa.Connection, query: Any) -> list[tuple[Any, ...]]:
    """All rows of a query as the driver's plain tuples, without a `Row` per row.

    The bulk queries select only BigInteger, Integer, String, Text and Double columns
    (and a string literal), which SQLAlchemy passes through unchanged on every
    supported driver (sqlite3, psycopg, PyMySQL): the driver's rows are the values.
    """
    result = conn.execute(query.execution_options(**{BULK_ROWS: True}))
    rows = result.cursor.fetchall()
    result.close()
    return rows if isinstance(rows, list) else list(rows)


# Rows fetched per driver call by `_array`: bounded memory, and each row's tuple is
# freed as soon as numpy has copied it (no million-tuple list for the collector to walk).
ARRAY_FETCH_ROWS = 10_000


def _batched(cursor: Any) -> Iterator[tuple[Any, ...]]:
    """A cursor's rows, fetched ARRAY_FETCH_ROWS at a time.

    An empty batch (a list, or PyMySQL's tuple) ends them.
    """
    while batch := cursor.fetchmany(ARRAY_FETCH_ROWS):
        yield from batch


def _array(conn: sa.Connection, query: Any, dtype: np.dtype[Any]) -> np.ndarray:
    """All rows of a bulk query (as for `_tuples`) as one numpy structured array.

    NULL reads as NaN in a float field and None in an object (text) field; an integer
    field must hold no NULL.
    """
    result = conn.execute(query.execution_options(**{BULK_ROWS: True}))
    cursor = result.cursor
    rows: Iterator[tuple[Any, ...]]
    if conn.dialect.name == "sqlite":  # sqlite3 steps the statement per row in C
        rows = iter(cast(Iterable[tuple[Any, ...]], cursor))
    else:  # psycopg and PyMySQL make a batch of rows in one call, one by one in Python
        rows = _batched(cursor)
    array = np.fromiter(rows, dtype=dtype)
    result.close()
    return array


# The columns of `summary_rows_*` (reports/frames.py builds its GPU frame with them).
SUMMARY_ROW_COLUMNS = (
    "job_id",
    "node",
    "gpu_uuid",
    "gpu_model",
    "gpu_seconds",
    "active_seconds",
    "util_mean_percent",
    "util_max_percent",
    "mem_max_bytes",
    "mem_gib_seconds",
    "energy_joules",
    "missing_seconds",
    "source",
    "data_until",
)


# The NVML GPM columns of job_gpu_summaries (revision 0006), named like JobGpuSummary's
# fields: `summary_rows_*` and `summary_array_in_window` read them when asked (columns=,
# or a dtype's field names); NULL (NaN in an array) where not measured, gpm_seconds 0.
GPM_SUMMARY_COLUMNS = ("gpm_seconds", *(f"{m}_mean_percent" for m in GPM_METRICS))

# The GPU slot columns of job_gpu_summaries (revision 0009), named like JobGpuSummary's
# fields, read when named like the GPM ones. slot_id as stored: a whole GPU's is its UUID
# (never ""), its kind "gpu", share 1, profile "", measured by "nvml".
SLOT_SUMMARY_COLUMNS = ("slot_id", "slot_kind", "share", "mig_profile", "measured_by")


# What each column is in SQL.
_SUMMARY_EXPRESSIONS: dict[str, Any] = {
    **{column.name: column for column in job_gpu_summaries.columns},
    "source": sa.literal("summary", sa.String()).label("source"),
    "data_until": job_gpu_summaries.c.end.label("data_until"),
}


def _summary_select(columns: Sequence[str]) -> Any:
    """SELECT of these columns (`SUMMARY_ROW_COLUMNS`, GPM and slot ones), in this order."""
    return sa.select(*(_SUMMARY_EXPRESSIONS[c] for c in columns))


def summary_rows_in_window(
    store: Store,
    since: float | None,
    until: float | None,
    job_ids_between: tuple[int, int] | None = None,
    *,
    columns: Sequence[str] = SUMMARY_ROW_COLUMNS,
    ordered: bool = True,
) -> list[tuple[Any, ...]]:
    """Job GPU summaries of the jobs `jobs_in_window` selects, as tuples of `columns`.

    One SELECT: summaries joined to their jobs, the window tested on the jobs' indexed
    end_time; ordered like `summaries_for` (job, node, GPU) unless `ordered` is false.

    Args:
        store: the accounting store.
        since: start of the period (POSIX seconds; None: open).
        until: end of the period (POSIX seconds; None: open).
        job_ids_between: the lowest and highest job id of the window's jobs, when the
            caller read them already (`job_rows_in_window`): a redundant bound that lets
            the database walk the summaries' primary key over that range only (Slurm
            hands out job ids in submit order, so a month is one narrow range).
        columns: which of `SUMMARY_ROW_COLUMNS` (default all), `GPM_SUMMARY_COLUMNS`
            and `SLOT_SUMMARY_COLUMNS` each tuple holds, in the order given.
        ordered: false returns the rows in the order the database found them, for a
            caller that orders them itself (cheaper than a database sort or a tuple
            sort); true needs job_id, node and gpu_uuid among the columns.
    """
    s = job_gpu_summaries.c
    query = _summary_window_query(store, since, until, job_ids_between, columns)
    in_python = ordered and _sorted_in_python(store)
    order = ("job_id", "node", "gpu_uuid", *(["slot_id"] if "slot_id" in columns else []))
    if ordered and not in_python:
        query = query.order_by(*(s[name] for name in order))
    with store.reading("reading job summaries of a period") as conn:
        rows = _tuples(conn, query)
    if in_python:
        at = [columns.index(name) for name in order]
        rows.sort(key=operator.itemgetter(*at))
    return rows


def summary_array_in_window(
    store: Store,
    since: float | None,
    until: float | None,
    job_ids_between: tuple[int, int] | None,
    dtype: np.dtype[Any],
) -> np.ndarray:
    """`summary_rows_in_window` (unordered) as one numpy structured array.

    The fields of `dtype`, named like the columns, say what is read.
    """
    query = _summary_window_query(store, since, until, job_ids_between, dtype.names or ())
    with store.reading("reading job summaries of a period") as conn:
        return _array(conn, query, dtype)


def _summary_window_query(
    store: Store,
    since: float | None,
    until: float | None,
    job_ids_between: tuple[int, int] | None,
    columns: Sequence[str],
) -> Any:
    s = job_gpu_summaries.c
    j = jobs.c
    query = (
        _summary_select(columns)
        .select_from(
            job_gpu_summaries.join(jobs, sa.and_(j.cluster == s.cluster, j.job_id == s.job_id))
        )
        .where(j.cluster == store.cluster)
    )
    query = _window(query, since, until)
    if job_ids_between is not None:
        low, high = job_ids_between
        query = query.where(j.job_id.between(low, high), s.job_id.between(low, high))
    return query


def summary_rows_for(
    store: Store, job_ids: Sequence[int], *, columns: Sequence[str] = SUMMARY_ROW_COLUMNS
) -> list[tuple[Any, ...]]:
    """`summaries_for` as tuples of `columns` (no object per row)."""
    s = job_gpu_summaries.c
    out: list[tuple[Any, ...]] = []
    with store.reading("reading job summaries") as conn:
        for chunk in _chunks(job_ids):
            query = (
                _summary_select(columns)
                .where(s.cluster == store.cluster, s.job_id.in_(chunk))
                .order_by(s.job_id, s.node, s.gpu_uuid, s.slot_id)
            )
            out.extend(_tuples(conn, query))
    return out


def summaries_for(store: Store, job_ids: Sequence[int]) -> list[JobGpuSummary]:
    """Job GPU summaries of these jobs (finished jobs), ordered by job, node, GPU, slot."""
    s = job_gpu_summaries.c
    out: list[JobGpuSummary] = []
    with store.reading("reading job summaries") as conn:
        for chunk in _chunks(job_ids):
            query = (
                sa.select(job_gpu_summaries)
                .where(s.cluster == store.cluster, s.job_id.in_(chunk))
                .order_by(s.job_id, s.node, s.gpu_uuid, s.slot_id)
            )
            out.extend(convert.row_to_summary(r) for r in conn.execute(query).mappings())
    return out


def interval_totals_for(store: Store, job_ids: Sequence[int]) -> list[IntervalTotals]:
    """Per-job, per-slot totals of the stored intervals of these jobs (for running jobs).

    One per job, node and slot (a whole GPU's slot is the GPU), ordered by job, node,
    physical GPU and slot; each carries its slot's parent, kind, share, profile and
    measurement.

    GPU-memory GiB-seconds are the agent's per interval, summed as its summaries sum them
    (revision 0014), so a job's figure does not change when its summary lands; an interval
    without them (stored before 0014, or shipped by an older agent) counts its peak memory
    times its covered seconds, as every interval of a store before 0014 does.
    The GPM figures (`gpm_seconds`, `sm_active_mean_percent`...) are weighted by each
    interval's GPM seconds, as the agent's summaries are: None where none was measured.
    """
    if not job_ids:
        return []
    t = gpu_intervals.c
    util_seconds = sa.case((t.util_mean_percent.is_(None), 0.0), else_=t.covered_seconds)
    summed = (store.current_revision() or "") >= MEM_GIB_SECONDS_REVISION
    query_cols = (
        t.job_id,
        t.node,
        t.slot_id,
        # One value per slot; max() only satisfies GROUP BY on every backend.
        *(sa.func.max(t[name]).label(name) for name in _SLOT_PARTS),
        sa.func.min(t.period_start).label("first_period_start"),
        sa.func.max(t.period_end).label("last_period_end"),
        sa.func.sum(t.covered_seconds).label("covered_seconds"),
        sa.func.sum(t.active_seconds).label("active_seconds"),
        sa.func.sum(sa.func.coalesce(t.util_mean_percent, 0.0) * util_seconds).label("uws"),
        sa.func.sum(util_seconds).label("ucs"),
        sa.func.max(t.util_max_percent).label("util_max"),
        sa.func.max(t.mem_used_max_bytes).label("mem_max"),
        sa.func.sum(_mem_gib_seconds(summed)).label("mem_gib_seconds"),
        sa.func.sum(t.energy_joules).label("energy"),
        sa.func.count().label("n"),
        sa.func.sum(t.gpm_seconds).label("gpm_seconds"),
    )
    gpm_sums = []
    for m in GPM_METRICS:
        mean = t[f"{m}_mean_percent"]
        gpm_sums.append(sa.func.sum(mean * t.gpm_seconds).label(f"{m}_weighted_sum"))
        seconds = sa.case((mean.is_not(None), t.gpm_seconds), else_=0.0)
        gpm_sums.append(sa.func.sum(seconds).label(f"{m}_gpm_seconds"))
    gpm_names = ("gpm_seconds", *(label.name for label in gpm_sums))
    out: list[IntervalTotals] = []
    with store.reading("reading GPU intervals of jobs") as conn:
        for chunk in _chunks(job_ids):
            query = (
                sa.select(*query_cols, *gpm_sums)
                .where(t.job_id.in_(chunk))
                .group_by(t.job_id, t.node, t.slot_id)
                .order_by(t.job_id, t.node, sa.func.max(t.gpu_uuid), t.slot_id)
            )
            for r in conn.execute(query).mappings():
                out.append(
                    IntervalTotals(
                        job_id=int(r["job_id"]),
                        node=r["node"],
                        gpu_uuid=r["gpu_uuid"],
                        first_period_start=float(r["first_period_start"]),
                        last_period_end=float(r["last_period_end"]),
                        covered_seconds=float(r["covered_seconds"] or 0.0),
                        active_seconds=float(r["active_seconds"] or 0.0),
                        util_weighted_sum=float(r["uws"] or 0.0),
                        util_covered_seconds=float(r["ucs"] or 0.0),
                        util_max_percent=_float(r["util_max"]),
                        mem_max_bytes=None if r["mem_max"] is None else int(r["mem_max"]),
                        mem_gib_seconds=float(r["mem_gib_seconds"] or 0.0),
                        energy_joules=_float(r["energy"]),
                        interval_count=int(r["n"]),
                        **{name: float(r[name] or 0.0) for name in gpm_names},
                        slot_id=r["slot_id"],
                        slot_kind=SlotKind(r["slot_kind"]),
                        share=float(r["share"]),
                        mig_profile=r["mig_profile"],
                        measured_by=Measurement(r["measured_by"]),
                    )
                )
    return out


_SLOT_PARTS = ("gpu_uuid", "slot_kind", "share", "mig_profile", "measured_by")
# The revision whose intervals carry the agent's GiB-seconds (gpu_intervals.mem_gib_seconds).
MEM_GIB_SECONDS_REVISION = "0014"


def _mem_gib_seconds(summed: bool) -> sa.ColumnElement[Any]:
    """An interval's GPU-memory GiB-seconds: the agent's, else peak x covered (before 0014).

    NULL `mem_gib_seconds` is a row stored before revision 0014 or shipped by an agent
    that did not sum them; such a row is read as it was before: its peak memory in use
    (unknown: 0) times its covered seconds. `summed` False: a store before 0014, which
    has no such column, every row read so.
    """
    t = gpu_intervals.c
    peak_x_covered = sa.func.coalesce(t.mem_used_max_bytes, 0) * t.covered_seconds / GIB
    return sa.func.coalesce(t.mem_gib_seconds, peak_x_covered) if summed else peak_x_covered


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def recent_intervals(store: Store, since: float) -> list[dict[str, Any]]:
    """Every interval row (all GPUs, attributed or not) ending after `since`, newest last."""
    t = gpu_intervals.c
    query = sa.select(gpu_intervals).where(t.period_end > since).order_by(t.period_start)
    with store.reading("reading recent GPU intervals") as conn:
        return [dict(r) for r in conn.execute(query).mappings()]


def gpu_models(store: Store) -> dict[str, str]:
    """{gpu_uuid: model} from the inventory."""
    i = gpu_inventory.c
    with store.reading("reading GPU models") as conn:
        return {r.uuid: r.model for r in conn.execute(sa.select(i.uuid, i.model))}


def gpus_per_node(store: Store) -> dict[str, int]:
    """{node: number of GPUs in its inventory}."""
    i = gpu_inventory.c
    query = sa.select(i.node, sa.func.count()).group_by(i.node)
    with store.reading("counting GPUs per node") as conn:
        return {node: int(count) for node, count in conn.execute(query)}


def gpus_used_on(store: Store, nodes: Sequence[str], since: float, until: float) -> dict[str, int]:
    """{node: distinct GPUs in job summaries of [since, until] on it}.

    For nodes the GPU inventory lacks (no agent registered them: a node since removed, say).
    """
    s = job_gpu_summaries.c
    out: dict[str, int] = {}
    with store.reading("counting GPUs used per node") as conn:
        for chunk in _chunks(nodes):
            query = (
                sa.select(s.node, sa.func.count(sa.distinct(s.gpu_uuid)))
                .where(s.cluster == store.cluster, s.node.in_(chunk))
                .where(s.end >= since, s.start <= until)
                .group_by(s.node)
            )
            out.update({str(node): int(count) for node, count in conn.execute(query)})
    return out


def sync_jobs(store: Store, rows: Iterable[Mapping[str, Any]]) -> int:
    """Upsert job facts from Slurm (e.g. `SacctJob.store_row()`) into `jobs`.

    Returns:
        The number of jobs written.
    """
    batch = list(rows)
    for i in range(0, len(batch), CHUNK):
        store.upsert_jobs(batch[i : i + CHUNK])
    return len(batch)


# ---- usage rollups (revision 0010; store/usage_rollup.py, reports/rollups.py) ----------

JOB_USAGE_COLUMNS = tuple(c.name for c in job_usage.columns if c.name != "cluster")
