"""Jobs and their GPU use as two pandas frames: the one source of every report figure.

Job facts: the store's `jobs` table, with sacct's live rows laid over it (submit, start,
end, state, name, node list, allocated GPUs, time limit), so a report is right even when
`slurm-gpu sync` has not run. GPU facts: one row per job and GPU, from the job's
summaries (finished jobs) or, when it has none yet (running jobs, summary not shipped),
from the totals of its stored per-minute intervals.

Units: seconds, bytes, GiB-seconds, joules; the columns say so.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.access import Scope
from slurm_gpu.reports.settings import CostSettings
from slurm_gpu.slurm.sacct import SacctJob
from slurm_gpu.store import Store
from slurm_gpu.store import usage as store_usage

JOB_COLUMNS = [
    "job_id",
    "job_id_text",
    "name",
    "user",
    "account",
    "partition",
    "qos",
    "state",
    "submit_time",
    "start_time",
    "end_time",
    "elapsed_seconds",
    "time_limit_seconds",
    "nodes",
    "alloc_gpus",
    "exit_code",
]
# What report figures (`report`, `report monthly`) need of a job: its user, account and
# partition, its times (proration, queue wait), GPUs and time limit; the other columns
# (name, state, node list, ...) only list jobs. A month has ~10^5 jobs and ~10^6 GPU
# rows, and every column read from the store costs an object per row.
FIGURE_JOB_COLUMNS = [
    "job_id",
    "user",
    "account",
    "partition",
    "submit_time",
    "start_time",
    "end_time",
    "elapsed_seconds",
    "time_limit_seconds",
    "alloc_gpus",
]
# The store's job columns they come from (user, account and partition as one text).
FIGURE_JOB_ROW_COLUMNS = ("job_id", "owner", "submit_time", "start_time", "end_time", "gpus")
# One row per job and GPU: the store's summary rows, column for column.
GPU_COLUMNS = list(store_usage.SUMMARY_ROW_COLUMNS)
# The GPU figures report figures are summed from,
FIGURE_GPU_NUMBERS = (
    "gpu_seconds",
    "active_seconds",
    "util_mean_percent",
    "mem_gib_seconds",
    "energy_joules",
)
# in these GPU columns (no GPU UUID: a figure counts GPU rows, never names a GPU),
FIGURE_GPU_COLUMNS = ["job_id", "node", "gpu_model", *FIGURE_GPU_NUMBERS]
# read as these (node and model as one text).
FIGURE_GPU_ROW_COLUMNS = ("job_id", "node_model", *FIGURE_GPU_NUMBERS)
# Text columns with few distinct values, held as categoricals: grouping and joining on
# them then works on integer codes, factorized once here instead of in every report.
CATEGORICAL_COLUMNS = ("user", "account", "partition", "node", "gpu_uuid", "gpu_model")
# Store rows as read: the driver's tuples, or (a figures-only read) one numpy
# structured array of `_numpy_dtype(columns)`.
Records = list[tuple[Any, ...]] | np.ndarray
RUNNING_STATES = frozenset({"RUNNING", "REQUEUED", "SUSPENDED", "COMPLETING"})


@dataclass(frozen=True)
class JobFilter:
    """sacct's selection options (empty tuple: no restriction)."""

    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    job_ids: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    states: tuple[str, ...] = ()


@dataclass
class Usage:
    """The two frames: `jobs` (one row per job) and `gpus` (one row per job and GPU)."""

    jobs: pd.DataFrame
    gpus: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def load_usage(
    store: Store,
    *,
    since: float | None,
    until: float | None,
    now: float,
    sacct_jobs: Sequence[SacctJob] | None,
    scope: Scope,
    filters: JobFilter = JobFilter(),
    cost: CostSettings | None = None,
    figures_only: bool = False,
) -> Usage:
    """Jobs overlapping [since, until] (or `filters.job_ids`) that `scope` may see.

    Args:
        store: the accounting store.
        since, until: the period (POSIX seconds; None: open).
        now: the current time (elapsed time of running jobs).
        sacct_jobs: sacct's rows for the same selection, or None to use the store only.
        scope: what the caller may see (applied before anything is computed).
        filters: sacct's -u/-A/-r/-j/-N/-s.
        cost: prices; None leaves cost columns at 0.
        figures_only: read only what report figures need: the GPU frame then has
            FIGURE_GPU_COLUMNS (and cost), the job frame at least FIGURE_JOB_COLUMNS
            (`with_job_listing` adds the rest for a few jobs).
    """
    numeric = [int(j) for j in filters.job_ids if j.isdigit()]
    if filters.job_ids:
        since = until = None  # like sacct -j: the jobs, whenever they ran
    # sacct's rows are laid over whole store rows; -j, -s and -N select by job id text,
    # state and node list: those need every column.
    lean = figures_only and not (sacct_jobs or filters.job_ids or filters.states or filters.nodes)
    read = FIGURE_JOB_ROW_COLUMNS if lean else store_usage.JOB_ROW_COLUMNS
    stored: Records
    if lean:  # a window's figures: straight into numpy
        stored = store_usage.job_array_in_window(store, since, until, _numpy_dtype(read))
    elif numeric or not filters.job_ids:
        stored = store_usage.job_rows_in_window(
            store, since, until, numeric, columns=read, ordered=False
        )
    else:
        stored = []
    if sacct_jobs:
        rows: dict[int, dict[str, Any]] = {}
        for record in stored:
            row = dict(zip(read, record, strict=True))
            rows[int(row["job_id"])] = _from_store(row)
        for job in sacct_jobs:
            rows[job.job_id] = _overlay(rows.get(job.job_id), job)
        jobs = pd.DataFrame([_finish(r, now) for r in rows.values()], columns=JOB_COLUMNS)
    else:
        jobs = _stored_jobs(stored, read, now)
    jobs = _select(jobs, filters, scope)
    wanted = jobs["job_id"].to_numpy(dtype="int64")
    gpu_columns = FIGURE_GPU_ROW_COLUMNS if figures_only else GPU_COLUMNS
    summary_rows: Records
    if numeric or filters.job_ids or not len(wanted):
        summary_rows = store_usage.summary_rows_for(store, wanted.tolist(), columns=gpu_columns)
    else:
        summary_rows = _window_summaries(store, since, until, stored, wanted, gpu_columns)
    gpus = _gpu_rows(store, wanted, summary_rows, gpu_columns)
    if not gpus.empty:
        jobs["alloc_gpus"] = _alloc_or_counted(jobs, gpus["job_id"].to_numpy())
    gpus = add_cost(gpus, jobs, cost)
    for name in ("user", "account", "partition"):
        jobs[name] = _categorical(jobs[name])
    return Usage(jobs.reset_index(drop=True), gpus.reset_index(drop=True))


def with_job_listing(store: Store, jobs: pd.DataFrame, now: float) -> pd.DataFrame:
    """`jobs` with all JOB_COLUMNS: what a figures-only job frame read from the store
    alone lacks (name, state, ...) is read from the store, for these (few) jobs."""
    missing = [name for name in JOB_COLUMNS if name not in jobs.columns]
    if not missing:
        return jobs
    stored = store_usage.job_rows_in_window(store, None, None, jobs["job_id"].tolist())
    listing = _stored_jobs(stored, store_usage.JOB_ROW_COLUMNS, now).set_index("job_id")
    return jobs.join(listing[missing], on="job_id")[JOB_COLUMNS]


def _alloc_or_counted(jobs: pd.DataFrame, gpu_job_ids: np.ndarray) -> list[int] | np.ndarray:
    """Each job's allocated GPUs, or where unknown (None, 0) the number of its GPU rows."""
    ids, counts = np.unique(gpu_job_ids, return_counts=True)
    alloc = jobs["alloc_gpus"]
    if alloc.dtype == np.int64 and len(ids):  # store rows: no None, in numpy (~10^5 jobs)
        job_ids = jobs["job_id"].to_numpy(dtype=np.int64)
        at = np.minimum(np.searchsorted(ids, job_ids), len(ids) - 1)
        counted_at = np.where(ids[at] == job_ids, counts[at], 0)
        known = alloc.to_numpy()
        return np.where(known > 0, known, counted_at)
    counted = dict(zip(ids.tolist(), counts.tolist(), strict=True))
    return [
        a if a and a > 0 else counted.get(j, 0)
        for j, a in zip(jobs["job_id"].tolist(), jobs["alloc_gpus"].tolist(), strict=True)
    ]


def _categorical(column: pd.Series) -> pd.Series:
    """`_text(column)` as a categorical, categories sorted (codes in string order)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column
    codes, uniques = pd.factorize(column, sort=True)
    if (codes < 0).any() or (len(uniques) and uniques[0] == ""):
        # None and "" both read "": one category, sorted first.
        blank = len(uniques) > 0 and uniques[0] == ""
        uniques = uniques if blank else pd.Index(["", *uniques], dtype="str")
        codes = np.where(codes < 0, 0, codes if blank else codes + 1)
    return pd.Series(pd.Categorical.from_codes(codes, uniques), index=column.index)


def _stored_jobs(stored: Records, read: Sequence[str], now: float) -> pd.DataFrame:
    """The store's job rows (tuples of the `read` columns) as the job frame, column by
    column: what `_from_store` and `_finish` do per row, with the dtypes a frame of their
    records gets. JOB_COLUMNS, or FIGURE_JOB_COLUMNS when only their columns were read."""
    every = set(read) >= set(store_usage.JOB_ROW_COLUMNS)
    names = JOB_COLUMNS if every else FIGURE_JOB_COLUMNS
    if not len(stored):
        return pd.DataFrame(columns=names)
    raw = _row_frame(stored, read)
    start = pd.to_numeric(raw["start_time"]).to_numpy(dtype=float, na_value=np.nan)
    end = pd.to_numeric(raw["end_time"]).to_numpy(dtype=float, na_value=np.nan)
    stop = np.where(np.isnan(end), now, end)
    elapsed = np.where(np.isnan(start), 0.0, np.maximum(stop - start, 0.0))
    n = len(raw)
    columns: dict[str, Callable[[], pd.Series]] = {
        "job_id": lambda: raw["job_id"],
        "job_id_text": lambda: _id_texts(raw),
        "name": lambda: _text(raw["job_name"]),
        "user": lambda: _categorical(raw["user"]),
        "account": lambda: _categorical(raw["account"]),
        "partition": lambda: _categorical(raw["partition"]),
        "qos": lambda: pd.Series([""] * n, dtype="str"),
        "state": lambda: _text(raw["state"]),
        "submit_time": lambda: raw["submit_time"],
        "start_time": lambda: raw["start_time"],
        "end_time": lambda: raw["end_time"],
        "elapsed_seconds": lambda: pd.Series(elapsed, dtype=float),
        "time_limit_seconds": lambda: pd.Series([None] * n, dtype=object),
        "nodes": lambda: _text(raw["nodes"]),
        "alloc_gpus": lambda: pd.to_numeric(raw["gpus"]).fillna(0).astype("int64"),
        "exit_code": lambda: raw["exit_code"],
    }
    return pd.DataFrame({name: columns[name]() for name in names}, columns=names)


def _id_texts(raw: pd.DataFrame) -> pd.Series:
    """`_array_text` of every row: the job id, `<array>_<task>` or `<het>+<offset>`."""
    text = raw["job_id"].astype(str)
    special = (raw["array_job_id"].notna() & raw["array_task_id"].notna()) | (
        raw["het_job_id"].notna() & raw["het_job_offset"].notna()
    )
    if special.any():
        text = text.copy()
        for i in np.flatnonzero(special.to_numpy()):
            text.iat[int(i)] = _array_text({k: _none(raw.at[i, k]) for k in _ID_KEYS})
    return text


def _text(column: pd.Series) -> pd.Series:
    """`row.get(name) or ""` for a whole column (a str column, as for its records)."""
    if column.dtype == object:
        column = column.where(column.notna() & (column != ""), "").astype("str")
    return column.fillna("") if column.hasnans else column


_ID_KEYS = ("job_id", "array_job_id", "array_task_id", "het_job_id", "het_job_offset")


def _none(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value) if isinstance(value, float | np.integer | np.floating) else value


def _window_summaries(
    store: Store,
    since: float | None,
    until: float | None,
    stored: Records,
    wanted: np.ndarray,
    columns: Sequence[str],
) -> Records:
    """Summary rows of the `wanted` jobs, in no particular order (`_gpu_rows` orders
    them): the window's in one joined query, the rest (jobs only sacct knows) by id.
    A numpy array when `stored` is one (a figures-only read), else tuples."""
    in_store = np.sort(_job_ids(stored))  # sorted like `wanted`
    between = (int(in_store[0]), int(in_store[-1])) if len(in_store) else None
    same = np.array_equal(in_store, wanted)  # usually: no job only sacct knows
    extra = [] if same else np.setdiff1d(wanted, in_store).tolist()
    more = store_usage.summary_rows_for(store, extra, columns=columns) if extra else []
    if isinstance(stored, np.ndarray):
        dtype = _numpy_dtype(columns)
        array = (
            store_usage.summary_array_in_window(store, since, until, between, dtype)
            if between
            else np.zeros(0, dtype=dtype)
        )
        if not same:
            array = array[np.isin(_job_ids(array), wanted)]
        return _concatenated(array, more, columns)
    rows = (
        store_usage.summary_rows_in_window(
            store, since, until, between, columns=columns, ordered=False
        )
        if between
        else []
    )
    if not same:
        keep = {int(j) for j in wanted}
        rows = [r for r in rows if r[0] in keep]
    return [*rows, *more]


def _from_store(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "job_id": int(row["job_id"]),
        "job_id_text": _array_text(row),
        "name": row.get("job_name") or "",
        "user": row.get("user") or "",
        "account": row.get("account") or "",
        "partition": row.get("partition") or "",
        "qos": "",
        "state": row.get("state") or "",
        "submit_time": row.get("submit_time"),
        "start_time": row.get("start_time"),
        "end_time": row.get("end_time"),
        "time_limit_seconds": None,
        "nodes": row.get("nodes") or "",
        "alloc_gpus": int(row.get("gpus") or 0),
        "exit_code": row.get("exit_code"),
    }


def _array_text(row: dict[str, Any]) -> str:
    if row.get("array_job_id") is not None and row.get("array_task_id") is not None:
        return f"{row['array_job_id']}_{row['array_task_id']}"
    if row.get("het_job_id") is not None and row.get("het_job_offset") is not None:
        return f"{row['het_job_id']}+{row['het_job_offset']}"
    return str(row["job_id"])


def _overlay(base: dict[str, Any] | None, job: SacctJob) -> dict[str, Any]:
    """sacct's facts win over the store's; the store keeps what sacct lacks."""
    row = dict(base or {})
    facts = {
        "job_id": job.job_id,
        "job_id_text": job.job_id_text,
        "name": job.name,
        "user": job.user,
        "account": job.account,
        "partition": job.partition,
        "qos": job.qos,
        "state": job.state,
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "time_limit_seconds": job.time_limit_seconds,
        "nodes": ",".join(job.nodes),
        "alloc_gpus": job.alloc_gpus,
        "exit_code": job.exit_code,
    }
    for key, value in facts.items():
        if (value is not None and value != "") or key not in row:
            row[key] = value
    # sacct's Start/End are whole seconds; prefer them (Elapsed and QueueWait then
    # match sacct's exactly).
    return row


def _finish(row: dict[str, Any], now: float) -> dict[str, Any]:
    start, end = row.get("start_time"), row.get("end_time")
    elapsed = 0.0 if start is None else max((end if end is not None else now) - start, 0.0)
    out = {name: row.get(name) for name in JOB_COLUMNS}
    out["elapsed_seconds"] = elapsed
    return out


def _select(jobs: pd.DataFrame, f: JobFilter, scope: Scope) -> pd.DataFrame:
    def keep(mask: list[bool]) -> pd.DataFrame:
        # A boolean Series on the frame's index: a plain empty list would select columns.
        return jobs[pd.Series(mask, index=jobs.index, dtype=bool)]

    # scope.sees once per distinct (user, account): a month has ~10^5 jobs, ~10^2 pairs.
    if not scope.all:
        pairs = list(zip(jobs["user"], jobs["account"], strict=True))
        seen = {pair: scope.sees(*pair) for pair in set(pairs)}
        jobs = keep([seen[pair] for pair in pairs])
    if f.users:
        jobs = keep(list(jobs["user"].isin(f.users)))
    if f.accounts:
        jobs = keep(list(jobs["account"].isin(f.accounts)))
    if f.partitions:
        jobs = keep(list(jobs["partition"].isin(f.partitions)))
    if f.job_ids:
        jobs = keep(
            [
                _id_matches(i, t, f.job_ids)
                for i, t in zip(jobs["job_id"], jobs["job_id_text"], strict=True)
            ]
        )
    if f.states:
        wanted = {s.upper() for s in f.states}
        jobs = keep([str(s).upper() in wanted for s in jobs["state"]])
    if f.nodes:
        wanted_nodes = set(f.nodes)
        jobs = keep([bool(wanted_nodes & set(str(n).split(","))) for n in jobs["nodes"]])
    return jobs if jobs["job_id"].is_monotonic_increasing else jobs.sort_values("job_id")


def _id_matches(job_id: Any, text: Any, wanted: tuple[str, ...]) -> bool:
    """-j 150 selects job 150 and every task of array 150 (150_1...), like sacct."""
    text = str(text)
    return any(
        w == str(job_id) or w == text or text.startswith(w + "_") or text.startswith(w + "+")
        for w in wanted
    )


def _job_ids(rows: Records) -> np.ndarray:
    """The job ids of store rows (every read selects job_id first), as int64."""
    if isinstance(rows, np.ndarray):
        return rows["job_id"].astype(np.int64, copy=False)
    return np.fromiter(map(operator.itemgetter(0), rows), dtype=np.int64, count=len(rows))


def _concatenated(
    array: np.ndarray, more: Sequence[tuple[Any, ...]], read: Sequence[str]
) -> np.ndarray:
    """A figures-only read's rows (`_numpy_dtype(read)`) followed by `more` of them."""
    if not more:
        return array
    return np.concatenate([array, np.fromiter(more, dtype=_numpy_dtype(read), count=len(more))])


def _gpu_rows(
    store: Store,
    job_ids: np.ndarray,
    summary_rows: Records,
    read: Sequence[str],
) -> pd.DataFrame:
    """The GPU frame of summary rows (tuples of the `read` columns): them in job, node,
    GPU order, then the rows of jobs with no summary (running jobs: their intervals'
    totals). GPU_COLUMNS, or FIGURE_GPU_COLUMNS when those were read."""
    names = [part for name in read for part in store_usage.JOINED.get(name, (name,))]
    if not len(job_ids):
        return pd.DataFrame(columns=names)
    summarized = len(summary_rows)
    rest = job_ids[~np.isin(job_ids, _job_ids(summary_rows))].tolist()  # sorted, like job_ids
    running: list[tuple[Any, ...]] = []
    if rest:
        models = store_usage.gpu_models(store)
        for t in store_usage.interval_totals_for(store, rest):
            model = models.get(t.gpu_uuid, "")
            row = {
                "job_id": t.job_id,
                "node": t.node,
                "gpu_uuid": t.gpu_uuid,
                "gpu_model": model,
                "node_model": store_usage.JOIN_SEPARATOR.join((t.node, model)),
                "gpu_seconds": t.covered_seconds,
                "active_seconds": t.active_seconds,
                "util_mean_percent": t.util_mean_percent,
                "util_max_percent": t.util_max_percent,
                "mem_max_bytes": t.mem_max_bytes,
                "mem_gib_seconds": t.mem_gib_seconds,
                "energy_joules": t.energy_joules,
                "missing_seconds": 0.0,
                "source": "intervals",
                "data_until": t.last_period_end,
            }
            running.append(tuple(row[name] for name in read))
    records = (
        _concatenated(summary_rows, running, read)
        if isinstance(summary_rows, np.ndarray)
        else [*summary_rows, *running]
    )
    frame = _row_frame(records, read)
    for name in read:  # (in place: a new frame would copy the number columns once more)
        if name in CATEGORICAL_COLUMNS:
            frame[name] = _categorical(frame[name])
    # The summaries by job, node, GPU (in string order on every backend), sorted here
    # as integer codes: cheaper than a database sort or a sort of tuples. A figures-only
    # read has no GPU column: a job's GPUs on a node stay in the order read.
    sort_by = [name for name in ("gpu_uuid", "node", "job_id") if name in frame.columns]
    keys = tuple(
        (frame[name].cat.codes if name != "job_id" else frame[name]).to_numpy()[:summarized]
        for name in sort_by
    )
    if not _ascending(keys):
        order = np.concatenate([np.lexsort(keys), np.arange(summarized, len(frame))])
        frame = frame.take(order)
    return frame


# The store columns a figures-only read selects, as numpy reads them: ids as int64, the
# rest (times, figures, the GPU count) as float64, NULL as NaN.
_NUMPY_DTYPES = {
    "job_id": "i8",
    "gpus": "f8",
    **{name: "f8" for name in ("submit_time", "start_time", "end_time")},
    **{name: "f8" for name in FIGURE_GPU_NUMBERS},
}


def _numpy_dtype(read: Sequence[str]) -> np.dtype[Any]:
    """The structured dtype a figures-only read of these columns is held in."""
    return np.dtype([(name, _NUMPY_DTYPES.get(name, "O")) for name in read])


def _row_frame(records: Records, read: Sequence[str]) -> pd.DataFrame:
    """Store rows (tuples of the `read` columns, or their structured array) as a frame,
    joined texts split.

    Rows of only `_NUMPY_DTYPES` and joined columns (a figures-only read) go through one
    numpy structured array: a C pass, about half the time of `from_records` inferring
    each column from its objects (~10^6 rows a month). Other rows: `from_records`.
    """
    joined = store_usage.JOINED
    if isinstance(records, np.ndarray):
        array = records
    elif not records or not all(name in _NUMPY_DTYPES or name in joined for name in read):
        frame = pd.DataFrame.from_records(records, columns=list(read))
        for name in read:
            if name in joined:
                parts = _split_joined(frame[name], joined[name])
                frame = frame.drop(columns=name).assign(**parts)
        return frame
    else:
        array = np.fromiter(records, dtype=_numpy_dtype(read), count=len(records))
    columns: dict[str, Any] = {}
    for name in read:
        if name in joined:
            columns.update(_split_joined(pd.Series(array[name], dtype=object), joined[name]))
        else:
            columns[name] = array[name]
    return pd.DataFrame(columns)


def _split_joined(texts: pd.Series, parts: Sequence[str]) -> dict[str, pd.Series]:
    """The columns of a store's joined text column (`store_usage.JOINED`), each as a
    categorical (`_categorical`), every distinct text split once."""
    # A dict numbers the texts in order of appearance, as pd.factorize does, in about
    # two thirds of its time here (every row's text is a new object, hashed either way).
    numbers: dict[str, int] = {}
    codes = np.array(
        [numbers.setdefault(text, len(numbers)) for text in texts.to_numpy(dtype=object)],
        dtype=np.intp,
    )
    split = [str(text).split(store_usage.JOIN_SEPARATOR, len(parts) - 1) for text in numbers]
    out = {}
    for i, name in enumerate(parts):
        values = pd.Series(np.array([s[i] for s in split], dtype=object))
        part = _categorical(values)
        out[name] = pd.Series(part.array.take(codes), index=texts.index)
    return out


def _ascending(keys: tuple[np.ndarray, ...]) -> bool:
    """Whether rows are already in `np.lexsort(keys)` order (last key first)."""
    later = np.zeros(max(len(keys[0]) - 1, 0), dtype=bool)  # row > the one before
    same = np.ones_like(later)
    for key in reversed(keys):
        step = np.diff(key)
        later |= same & (step > 0)
        same &= step == 0
    return bool(np.all(later | same))


def price_for(model: str, cost: CostSettings) -> float:
    """Price per unit of a GPU model: the longest [cost] prices key the model contains."""
    lowered = model.lower()
    matches = [k for k in cost.prices if k.lower() in lowered]
    if not matches:
        return cost.default_price
    return cost.prices[max(matches, key=len)]


def add_cost(gpus: pd.DataFrame, jobs: pd.DataFrame, cost: CostSettings | None) -> pd.DataFrame:
    """`gpus` with a `cost` column: price(model) x units of [cost] unit.

    gpu_hour: GPU-seconds / 3600. gpu_mem_hour: GiB-seconds / 3600. job_hour: the job's
    elapsed hours, shared equally by its GPU rows (so a job is charged its runtime once,
    at its GPUs' prices).
    """
    gpus = gpus.copy()
    if gpus.empty or cost is None:
        gpus["cost"] = pd.Series(dtype=float) if gpus.empty else 0.0
        return gpus
    codes, models = pd.factorize(gpus["gpu_model"], use_na_sentinel=False)
    by_model = np.array([price_for(str(m), cost) for m in models], dtype=float)
    prices = pd.Series(by_model[codes], index=gpus.index)
    if cost.unit == "gpu_hour":
        units = gpus["gpu_seconds"] / 3600.0
    elif cost.unit == "gpu_mem_hour":
        units = gpus["mem_gib_seconds"] / 3600.0
    else:
        elapsed = jobs.set_index("job_id")["elapsed_seconds"]
        per_job = gpus.groupby("job_id")["gpu_uuid"].transform("count")
        units = gpus["job_id"].map(elapsed).astype(float) / 3600.0 / per_job
    gpus["cost"] = (prices * units).astype(float)
    return gpus


def job_records(usage: Usage) -> list[dict[str, Any]]:
    """One record per job: its facts and the sums of its GPU rows (the sacct rows)."""
    totals = _gpu_totals(usage.gpus, ["job_id"])
    out = []
    for job in usage.jobs.to_dict("records"):
        record = dict(job)
        record.update(totals.get((job["job_id"],), _empty_totals()))
        out.append(_with_queue_wait({str(k): v for k, v in record.items()}))
    return out


def gpu_records(usage: Usage) -> list[dict[str, Any]]:
    """One record per job and GPU (sacct --gpus)."""
    jobs = {j["job_id"]: j for j in usage.jobs.to_dict("records")}
    out = []
    for gpu in usage.gpus.sort_values(["job_id", "node", "gpu_uuid"]).to_dict("records"):
        record = dict(jobs[gpu["job_id"]])
        record.update(_totals(pd.DataFrame([gpu])))
        record["node"] = gpu["node"]
        record["gpu_uuid"] = gpu["gpu_uuid"]
        record["alloc_gpus"] = 1
        record["nodes"] = gpu["node"]
        out.append(_with_queue_wait({str(k): v for k, v in record.items()}))
    return out


def _with_queue_wait(record: dict[str, Any]) -> dict[str, Any]:
    start: Any = record.get("start_time")
    submit: Any = record.get("submit_time")
    record["queue_wait_seconds"] = (
        max(float(start) - float(submit), 0.0) if _known(start) and _known(submit) else None
    )
    return record


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _empty_totals() -> dict[str, Any]:
    return _totals(pd.DataFrame(columns=[*GPU_COLUMNS, "cost"]))


def _gpu_totals(gpus: pd.DataFrame, keys: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    if gpus.empty:
        return {}
    return {
        (key if isinstance(key, tuple) else (key,)): _totals(group)
        for key, group in gpus.groupby(keys)
    }


def _totals(rows: pd.DataFrame) -> dict[str, Any]:
    """Sums over GPU rows; utilization weighted by GPU-seconds (rows with readings)."""
    if rows.empty:
        return {
            "gpu_model": "",
            "gpu_seconds": 0.0,
            "active_seconds": 0.0,
            "idle_seconds": 0.0,
            "util_mean_percent": None,
            "util_max_percent": None,
            "mem_max_bytes": None,
            "mem_gib_seconds": 0.0,
            "energy_joules": None,
            "cost": 0.0,
            "data_until": None,
            "source": "",
        }
    gpu_seconds = float(rows["gpu_seconds"].sum())
    active = float(rows["active_seconds"].sum())
    known = rows[rows["util_mean_percent"].notna()]
    weight = float(known["gpu_seconds"].sum())
    util = (
        float((known["util_mean_percent"] * known["gpu_seconds"]).sum() / weight)
        if weight > 0
        else (float(known["util_mean_percent"].mean()) if len(known) else None)
    )
    energy = rows["energy_joules"].dropna()
    mem = rows["mem_max_bytes"].dropna()
    umax = rows["util_max_percent"].dropna()
    return {
        "gpu_model": ",".join(sorted({str(m) for m in rows["gpu_model"] if m})),
        "gpu_seconds": gpu_seconds,
        "active_seconds": active,
        "idle_seconds": max(gpu_seconds - active, 0.0),
        "util_mean_percent": util,
        "util_max_percent": float(umax.max()) if len(umax) else None,
        "mem_max_bytes": int(mem.max()) if len(mem) else None,
        "mem_gib_seconds": float(rows["mem_gib_seconds"].sum()),
        "energy_joules": float(energy.sum()) if len(energy) else None,
        "cost": float(rows["cost"].sum()) if "cost" in rows else 0.0,
        "data_until": rows["data_until"].max(),
        "source": ",".join(sorted({str(s) for s in rows["source"]})),
    }


def is_running(state: str | None) -> bool:
    """True for a state in which the job still holds its GPUs."""
    return (state or "").upper() in RUNNING_STATES
