"""The job and GPU frames of every report: their columns, and store rows made into them.

Job frame: one row per job (JOB_COLUMNS; FIGURE_JOB_COLUMNS when only report figures
were read). GPU frame: one row per job and GPU, the store's summary rows column for
column (GPU_COLUMNS; FIGURE_GPU_COLUMNS for figures only). Store rows arrive as the
driver's tuples or, for a figures-only read, as one numpy structured array; they are
made into frames column by column, text columns with few values as categoricals.

Units: seconds, bytes, GiB-seconds, joules; the columns say so.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.reports.figures import GPM_COLUMNS
from slurm_gpu.store import Store, queries
from slurm_gpu.units import is_known

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
# One row per job and GPU slot: the store's summary rows, column for column, their NVML
# GPM columns (revision 0006; figures.GPM_COLUMNS, by the same names) and their slot's
# id, kind, share, MIG profile and measurement (revision 0009; a whole GPU's slot id is
# its UUID, its kind "gpu", share 1, measured by "nvml").
GPU_COLUMNS = [
    *queries.SUMMARY_ROW_COLUMNS,
    *queries.GPM_SUMMARY_COLUMNS,
    *queries.SLOT_SUMMARY_COLUMNS,
]
# The GPU figures report figures are summed from,
FIGURE_GPU_NUMBERS = (
    "gpu_seconds",
    "active_seconds",
    "util_mean_percent",
    "mem_gib_seconds",
    "energy_joules",
    "missing_seconds",
    *queries.GPM_SUMMARY_COLUMNS,
)
# and what prices and groups a slot (issue 14: its kind, share of its GPU, MIG profile),
FIGURE_SLOT_COLUMNS = ("slot_kind", "share", "mig_profile")
# in these GPU columns (no GPU UUID: a figure counts GPU rows, never names a GPU),
FIGURE_GPU_COLUMNS = ["job_id", "node", "gpu_model", *FIGURE_GPU_NUMBERS, *FIGURE_SLOT_COLUMNS]
# read as these (node and model as one text).
FIGURE_GPU_ROW_COLUMNS = ("job_id", "node_model", *FIGURE_GPU_NUMBERS, *FIGURE_SLOT_COLUMNS)
# Text columns with few distinct values, held as categoricals: grouping and joining on
# them then works on integer codes, factorized once here instead of in every report.
CATEGORICAL_COLUMNS = (
    "user",
    "account",
    "partition",
    "node",
    "gpu_uuid",
    "gpu_model",
    "slot_id",
    "slot_kind",
    "mig_profile",
    "measured_by",
)
# Store rows as read: the driver's tuples, or (a figures-only read) one numpy
# structured array of `numpy_dtype(columns)`.
Records = list[tuple[Any, ...]] | np.ndarray


def categorical(column: pd.Series) -> pd.Series:
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


def stored_jobs(stored: Records, read: Sequence[str], now: float) -> pd.DataFrame:
    """The store's job rows (tuples of the `read` columns) as the job frame.

    Column by column: what reports/usage.py's `_from_store` and `_finish` do per row,
    with the dtypes a frame of their records gets. JOB_COLUMNS, or FIGURE_JOB_COLUMNS
    when only their columns were read.
    """
    every = set(read) >= set(queries.JOB_ROW_COLUMNS)
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
        "user": lambda: categorical(raw["user"]),
        "account": lambda: categorical(raw["account"]),
        "partition": lambda: categorical(raw["partition"]),
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
    """`job_id_text` of every row: the job id, `<array>_<task>` or `<het>+<offset>`."""
    text = raw["job_id"].astype(str)
    special = (raw["array_job_id"].notna() & raw["array_task_id"].notna()) | (
        raw["het_job_id"].notna() & raw["het_job_offset"].notna()
    )
    if special.any():
        text = text.copy()
        for i in np.flatnonzero(special.to_numpy()):
            text.iat[int(i)] = job_id_text({k: _int_or_none(raw.at[i, k]) for k in _ID_KEYS})
    return text


def _text(column: pd.Series) -> pd.Series:
    """`row.get(name) or ""` for a whole column (a str column, as for its records)."""
    if column.dtype == object:
        column = column.where(column.notna() & (column != ""), "").astype("str")
    return column.fillna("") if column.hasnans else column


_ID_KEYS = ("job_id", "array_job_id", "array_task_id", "het_job_id", "het_job_offset")


def _int_or_none(value: Any) -> Any:
    """A stored id part as an int; None when unknown (NULL read as NaN)."""
    if not is_known(value):
        return None
    return int(value) if isinstance(value, float | np.integer | np.floating) else value


def window_summaries(
    store: Store,
    since: float | None,
    until: float | None,
    stored: Records,
    wanted: np.ndarray,
    columns: Sequence[str],
) -> Records:
    """Summary rows of the `wanted` jobs, in no particular order (`gpu_rows` orders them).

    The window's in one joined query, the rest (jobs only sacct knows) by id. A numpy
    array when `stored` is one (a figures-only read), else tuples.
    """
    in_store = np.sort(_job_ids(stored))  # sorted like `wanted`
    between = (int(in_store[0]), int(in_store[-1])) if len(in_store) else None
    same = np.array_equal(in_store, wanted)  # usually: no job only sacct knows
    extra = [] if same else np.setdiff1d(wanted, in_store).tolist()
    more = queries.summary_rows_for(store, extra, columns=columns) if extra else []
    if isinstance(stored, np.ndarray):
        dtype = numpy_dtype(columns)
        array = (
            queries.summary_array_in_window(store, since, until, between, dtype)
            if between
            else np.zeros(0, dtype=dtype)
        )
        if not same:
            array = array[np.isin(_job_ids(array), wanted)]
        return _concatenated(array, more, columns)
    rows = (
        queries.summary_rows_in_window(store, since, until, between, columns=columns, ordered=False)
        if between
        else []
    )
    if not same:
        keep = {int(j) for j in wanted}
        rows = [r for r in rows if r[0] in keep]
    return [*rows, *more]


def job_id_text(row: dict[str, Any]) -> str:
    """The job id as sacct shows it: `<id>`, `<array>_<task>` or `<het>+<offset>`."""
    if row.get("array_job_id") is not None and row.get("array_task_id") is not None:
        return f"{row['array_job_id']}_{row['array_task_id']}"
    if row.get("het_job_id") is not None and row.get("het_job_offset") is not None:
        return f"{row['het_job_id']}+{row['het_job_offset']}"
    return str(row["job_id"])


def _job_ids(rows: Records) -> np.ndarray:
    """The job ids of store rows (every read selects job_id first), as int64."""
    if isinstance(rows, np.ndarray):
        return rows["job_id"].astype(np.int64, copy=False)
    return np.fromiter(map(operator.itemgetter(0), rows), dtype=np.int64, count=len(rows))


def _concatenated(
    array: np.ndarray, more: Sequence[tuple[Any, ...]], read: Sequence[str]
) -> np.ndarray:
    """A figures-only read's rows (`numpy_dtype(read)`) followed by `more` of them."""
    if not more:
        return array
    return np.concatenate([array, np.fromiter(more, dtype=numpy_dtype(read), count=len(more))])


@dataclass(frozen=True)
class HeldJob:
    """When a job held how many GPUs where: what its rows with no summary count from."""

    start: float | None
    end: float | None
    gpus: int
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Unsummarized:
    """What the rows of jobs with no summary (yet) are measured against.

    Attributes:
        jobs: the job frame (job_id, start_time, end_time, alloc_gpus; nodes if read).
        now: the current time (the end of running jobs).
        lag: how far behind `now` a reporting agent's newest stored interval may be
            ([store] ship_aggregate plus two [node].interval): readings older than that
            are stale, and the time since them missing, not yet to come.
    """

    jobs: pd.DataFrame
    now: float
    lag: float

    def held(self, store: Store, job_ids: Sequence[int]) -> dict[int, HeldJob]:
        """{job id: when it held its GPUs} of these (few) jobs."""
        wanted = self.jobs[self.jobs["job_id"].isin(list(job_ids))]
        if "nodes" in wanted:
            node_lists = dict(zip(wanted["job_id"].tolist(), wanted["nodes"].tolist(), strict=True))
        else:
            stored = queries.job_rows_in_window(
                store, None, None, list(job_ids), columns=("job_id", "nodes")
            )
            node_lists = {int(j): n for j, n in stored}
        out = {}
        for job_id, start, end, gpus in zip(
            wanted["job_id"].tolist(),
            wanted["start_time"].tolist(),
            wanted["end_time"].tolist(),
            wanted["alloc_gpus"].tolist(),
            strict=True,
        ):
            nodes = tuple(n for n in str(node_lists.get(job_id) or "").split(",") if n)
            out[int(job_id)] = HeldJob(
                start=float(start) if is_known(start) else None,
                end=float(end) if is_known(end) else None,
                gpus=int(gpus) if is_known(gpus) else 0,
                nodes=nodes,
            )
        return out

    def counted_until(self, job: HeldJob, data_until: float) -> float:
        """Until when the job's GPU time is counted (measured or missing).

        The job's end (now, while it runs), but not the part a reporting agent has not
        shipped yet: that is neither measured nor missing.
        """
        stop = job.end if job.end is not None else self.now
        return min(stop, max(data_until, self.now - self.lag))


# Less than a second unaccounted is clock granularity, not missing data (as at job end,
# node/spool.py `finish_job`).
_MISSING_FROM = 1.0


def gpu_rows(
    store: Store,
    job_ids: np.ndarray,
    summary_rows: Records,
    read: Sequence[str],
    unsummarized: Unsummarized | None = None,
) -> pd.DataFrame:
    """The GPU frame of summary rows (tuples of the `read` columns).

    The summaries in job, node, GPU order, then the rows of jobs with no summary (running
    jobs: their intervals' totals; a job with no interval either, one row per node of
    its allocated GPUs, all missing). GPU_COLUMNS, or FIGURE_GPU_COLUMNS when those were
    read.

    Args:
        store: the accounting store.
        job_ids: the jobs, sorted.
        summary_rows: their summary rows.
        read: the columns of `summary_rows`.
        unsummarized: when the jobs with no summary held their GPUs; None counts their
            intervals' covered seconds only (no missing time).
    """
    names = [part for name in read for part in queries.JOINED.get(name, (name,))]
    if not len(job_ids):
        return with_gpm(pd.DataFrame(columns=names))
    summarized = len(summary_rows)
    rest = job_ids[~np.isin(job_ids, _job_ids(summary_rows))].tolist()  # sorted, like job_ids
    running: list[tuple[Any, ...]] = []
    if rest:
        models = queries.gpu_models(store)
        measured: set[int] = set()
        jobs = unsummarized.held(store, rest) if unsummarized is not None else {}
        for t in queries.interval_totals_for(store, rest):
            measured.add(t.job_id)
            model = models.get(t.gpu_uuid, "")
            held = jobs.get(t.job_id)
            missing = 0.0
            if unsummarized is not None and held is not None and held.start is not None:
                until = unsummarized.counted_until(held, t.last_period_end)
                missing = max(until - held.start - t.covered_seconds, 0.0)
            row = {
                "job_id": t.job_id,
                "node": t.node,
                "gpu_uuid": t.gpu_uuid,
                "gpu_model": model,
                "node_model": queries.JOIN_SEPARATOR.join((t.node, model)),
                "gpu_seconds": t.covered_seconds + _missing(missing),
                "active_seconds": t.active_seconds,
                "util_mean_percent": t.util_mean_percent,
                "util_max_percent": t.util_max_percent,
                "mem_max_bytes": t.mem_max_bytes,
                "mem_gib_seconds": t.mem_gib_seconds,
                "energy_joules": t.energy_joules,
                "missing_seconds": _missing(missing),
                "source": "intervals",
                "data_until": t.last_period_end,
                **_interval_gpm(t),
                "slot_id": t.slot_id or t.gpu_uuid,
                "slot_kind": t.slot_kind.value,
                "share": t.share,
                "mig_profile": t.mig_profile,
                "measured_by": t.measured_by.value,
            }
            running.append(tuple(row[name] for name in read))
        if unsummarized is not None:
            unmeasured = [j for j in rest if j not in measured]
            running += _unmeasured_rows(unsummarized, jobs, unmeasured, read)
    records = (
        _concatenated(summary_rows, running, read)
        if isinstance(summary_rows, np.ndarray)
        else [*summary_rows, *running]
    )
    frame = _row_frame(records, read)
    for name in read:  # (in place: a new frame would copy the number columns once more)
        if name in CATEGORICAL_COLUMNS:
            frame[name] = categorical(frame[name])
    # The summaries by job, node, GPU (in string order on every backend), sorted here
    # as integer codes: cheaper than a database sort or a sort of tuples. A figures-only
    # read has no GPU column: a job's GPUs on a node stay in the order read.
    sort_by = [name for name in ("slot_id", "gpu_uuid", "node", "job_id") if name in frame.columns]
    keys = tuple(
        (frame[name].cat.codes if name != "job_id" else frame[name]).to_numpy()[:summarized]
        for name in sort_by
    )
    if not _ascending(keys):
        order = np.concatenate([np.lexsort(keys), np.arange(summarized, len(frame))])
        frame = frame.take(order)
    return with_gpm(frame)


def with_gpm(gpus: pd.DataFrame) -> pd.DataFrame:
    """`gpus` with every GPM column: one it lacks is unknown (0 seconds, NaN means).

    A frame read without them (a caller's `read`) and GPUs without GPM read alike: not
    measured, never 0 %.
    """
    for name in GPM_COLUMNS:  # (in place, like gpu_rows' categoricals)
        if name not in gpus.columns:
            gpus[name] = 0.0 if name == "gpm_seconds" else np.nan
        elif gpus[name].dtype != float:  # tuples of None (no GPU measured) read as objects
            gpus[name] = pd.to_numeric(gpus[name]).astype(float)
    if len(gpus):
        gpus["gpm_seconds"] = gpus["gpm_seconds"].fillna(0.0)
    return gpus


def _interval_gpm(totals: queries.IntervalTotals) -> dict[str, Any]:
    """A running job's GPM figures from its intervals' totals (None: not measured)."""
    return {
        "gpm_seconds": totals.gpm_seconds,
        "sm_active_mean_percent": totals.sm_active_mean_percent,
        "sm_occupancy_mean_percent": totals.sm_occupancy_mean_percent,
        "tensor_active_mean_percent": totals.tensor_active_mean_percent,
        "dram_bw_mean_percent": totals.dram_bw_mean_percent,
    }


def _missing(seconds: float) -> float:
    return seconds if seconds >= _MISSING_FROM else 0.0


def _unmeasured_rows(
    unsummarized: Unsummarized,
    jobs: Mapping[int, HeldJob],
    job_ids: Sequence[int],
    read: Sequence[str],
) -> list[tuple[Any, ...]]:
    """Rows of jobs that held GPUs and have no reading at all (agent down all along).

    One row per node (GPU unknown), its share of the allocated GPUs, every second of it
    missing: the GPU-hours are held, and charged, whether or not anybody measured them.
    """
    out: list[tuple[Any, ...]] = []
    for job_id in job_ids:
        job = jobs.get(job_id)
        if job is None or job.gpus <= 0 or job.start is None:
            continue
        seconds = _missing(unsummarized.counted_until(job, job.start) - job.start)
        if seconds <= 0:
            continue
        nodes = job.nodes or ("",)
        share, extra = divmod(job.gpus, len(nodes))
        for n, node in enumerate(nodes):
            gpus = share + (1 if n < extra else 0)
            if gpus == 0:
                continue
            row = {
                "job_id": job_id,
                "node": node,
                "gpu_uuid": "",
                "gpu_model": "",
                "node_model": queries.JOIN_SEPARATOR.join((node, "")),
                "gpu_seconds": gpus * seconds,
                "active_seconds": 0.0,
                "util_mean_percent": None,
                "util_max_percent": None,
                "mem_max_bytes": None,
                "mem_gib_seconds": 0.0,
                "energy_joules": None,
                "missing_seconds": gpus * seconds,
                "source": "none",
                "data_until": None,
                "gpm_seconds": 0.0,
                **dict.fromkeys(GPM_COLUMNS[1:]),
                # Whole GPUs as far as anybody knows; nothing measured them.
                "slot_id": "",
                "slot_kind": "gpu",
                "share": 1.0,
                "mig_profile": "",
                "measured_by": "",
            }
            out.append(tuple(row[name] for name in read))
    return out


def fill_models(
    gpus: pd.DataFrame, store: Store, gres_types: Mapping[int, str] | None = None
) -> pd.DataFrame:
    """`gpus` with every blank GPU model filled from what its node is known to hold.

    A row with no reading has no model of its own (the agent learns it from NVML): the
    store's GPU inventory names its GPU's model, else its node's (one model on the node),
    else the gres type Slurm recorded for the job (AllocTRES gres/gpu:a100), so its cost
    has a price and `report gpu-models` no blank row.
    """
    if gpus.empty or "gpu_model" not in gpus:
        return gpus
    column = gpus["gpu_model"]
    blank = (column.isna() | (column == "")).to_numpy()  # categorical: compares codes
    if not blank.any():
        return gpus
    models = column.astype(object).where(column.notna(), "")
    by_uuid: dict[str, str] = {}
    by_node: dict[str, set[str]] = {}
    for entry in store.inventory():
        by_uuid[entry.device.uuid] = entry.device.name
        by_node.setdefault(entry.node, set()).add(entry.device.name)
    node_model = {node: next(iter(m)) for node, m in by_node.items() if len(m) == 1}
    filled = models.to_numpy(dtype=object).copy()
    uuids = gpus["gpu_uuid"].to_numpy(dtype=object) if "gpu_uuid" in gpus else None
    nodes = gpus["node"].to_numpy(dtype=object) if "node" in gpus else None
    job_ids = gpus["job_id"].to_numpy()
    for i in np.flatnonzero(blank):
        model = by_uuid.get(str(uuids[i]), "") if uuids is not None else ""
        if not model and nodes is not None:
            model = node_model.get(str(nodes[i]), "")
        if not model and gres_types:
            model = gres_types.get(int(job_ids[i]), "")
        filled[i] = model
    out = gpus.copy()
    out["gpu_model"] = categorical(pd.Series(filled, index=gpus.index, dtype=object))
    return out


# The store columns a figures-only read selects, as numpy reads them: ids as int64, the
# rest (times, figures, the GPU count) as float64, NULL as NaN.
_NUMPY_DTYPES = {
    "job_id": "i8",
    "gpus": "f8",
    **{name: "f8" for name in ("submit_time", "start_time", "end_time")},
    **{name: "f8" for name in FIGURE_GPU_NUMBERS},
    "share": "f8",
    "slot_kind": "O",  # texts as objects (numpy reads them so from the driver's tuples)
    "mig_profile": "O",
}


def numpy_dtype(read: Sequence[str]) -> np.dtype[Any]:
    """The structured dtype a figures-only read of these columns is held in."""
    return np.dtype([(name, _NUMPY_DTYPES.get(name, "O")) for name in read])


def _row_frame(records: Records, read: Sequence[str]) -> pd.DataFrame:
    """Store rows (tuples of the `read` columns, or their structured array) as a frame.

    Joined texts are split.

    Rows of only `_NUMPY_DTYPES` and joined columns (a figures-only read) go through one
    numpy structured array: a C pass, about half the time of `from_records` inferring
    each column from its objects (~10^6 rows a month). Other rows: `from_records`.
    """
    joined = queries.JOINED
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
        array = np.fromiter(records, dtype=numpy_dtype(read), count=len(records))
    columns: dict[str, Any] = {}
    for name in read:
        if name in joined:
            columns.update(_split_joined(pd.Series(array[name], dtype=object), joined[name]))
        else:
            columns[name] = array[name]
    return pd.DataFrame(columns)


def _split_joined(texts: pd.Series, parts: Sequence[str]) -> dict[str, pd.Series]:
    """The columns of a store's joined text column (`queries.JOINED`), as categoricals.

    Every distinct text is split once.
    """
    # A dict numbers the texts in order of appearance, as pd.factorize does, in about
    # two thirds of its time here (every row's text is a new object, hashed either way).
    numbers: dict[str, int] = {}
    codes = np.array(
        [numbers.setdefault(text, len(numbers)) for text in texts.to_numpy(dtype=object)],
        dtype=np.intp,
    )
    split = [str(text).split(queries.JOIN_SEPARATOR, len(parts) - 1) for text in numbers]
    out = {}
    for i, name in enumerate(parts):
        values = pd.Series(np.array([s[i] for s in split], dtype=object))
        part = categorical(values)
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
