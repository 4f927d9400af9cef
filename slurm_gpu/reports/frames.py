"""The job and GPU frames of every report: their columns, and store rows made into them.

Job frame: one row per job (JOB_COLUMNS). GPU frame: one row per job and GPU, the
store's summary rows column for column (GPU_COLUMNS). Store rows arrive as the driver's
tuples; they are made into frames column by column, text columns with few values as
categoricals.

Units: seconds, bytes, GiB-seconds, joules; the columns say so.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.ledger import time as ledger_time
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
    "suspended_seconds",
    "time_limit_seconds",
    "nodes",
    "alloc_gpus",
    "exit_code",
]
# One row per job and GPU slot: the store's summary rows, column for column, their NVML
# GPM columns (revision 0006; figures.GPM_COLUMNS, by the same names) and their slot's
# id, kind, share, MIG profile and measurement (revision 0009; a whole GPU's slot id is
# its UUID, its kind "gpu", share 1, measured by "nvml").
GPU_COLUMNS = [
    *queries.SUMMARY_ROW_COLUMNS,
    *queries.GPM_SUMMARY_COLUMNS,
    *queries.SLOT_SUMMARY_COLUMNS,
]
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


def stored_jobs(stored: list[tuple[Any, ...]], read: Sequence[str], now: float) -> pd.DataFrame:
    """The store's job rows (tuples of the `read` columns) as the job frame.

    Column by column: what reports/usage.py's `_from_store` and `_finish` do per row,
    with the dtypes a frame of their records gets. `read`: queries.JOB_ROW_COLUMNS.
    """
    if not len(stored):
        return pd.DataFrame(columns=JOB_COLUMNS)
    raw = pd.DataFrame.from_records(stored, columns=list(read))
    start = pd.to_numeric(raw["start_time"]).to_numpy(dtype=float, na_value=np.nan)
    end = pd.to_numeric(raw["end_time"]).to_numpy(dtype=float, na_value=np.nan)
    stop = np.where(np.isnan(end), now, end)
    suspended = (
        pd.to_numeric(raw["suspended_seconds"]).to_numpy(dtype=float, na_value=np.nan)
        if "suspended_seconds" in raw
        else np.full(len(raw), np.nan)
    )
    elapsed = np.where(np.isnan(start), 0.0, ledger_time.elapsed(start, stop, suspended))
    n = len(raw)
    columns: dict[str, pd.Series] = {
        "job_id": raw["job_id"],
        "job_id_text": _id_texts(raw),
        "name": _text(raw["job_name"]),
        "user": categorical(raw["user"]),
        "account": categorical(raw["account"]),
        "partition": categorical(raw["partition"]),
        "qos": pd.Series([""] * n, dtype="str"),
        "state": _text(raw["state"]),
        "submit_time": raw["submit_time"],
        "start_time": raw["start_time"],
        "end_time": raw["end_time"],
        "elapsed_seconds": pd.Series(elapsed, dtype=float),
        "suspended_seconds": pd.Series(suspended, dtype=float),
        "time_limit_seconds": pd.Series([None] * n, dtype=object),
        "nodes": _text(raw["nodes"]),
        "alloc_gpus": pd.to_numeric(raw["gpus"]).fillna(0).astype("int64"),
        "exit_code": raw["exit_code"],
    }
    return pd.DataFrame(columns, columns=JOB_COLUMNS)


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
    stored: list[tuple[Any, ...]],
    wanted: np.ndarray,
    columns: Sequence[str],
) -> list[tuple[Any, ...]]:
    """Summary rows of the `wanted` jobs, in no particular order (`gpu_rows` orders them).

    The window's in one joined query, the rest (jobs only sacct knows) by id.
    """
    in_store = np.sort(_job_ids(stored))  # sorted like `wanted`
    between = (int(in_store[0]), int(in_store[-1])) if len(in_store) else None
    same = np.array_equal(in_store, wanted)  # usually: no job only sacct knows
    extra = [] if same else np.setdiff1d(wanted, in_store).tolist()
    more = queries.summary_rows_for(store, extra, columns=columns) if extra else []
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


def _job_ids(rows: list[tuple[Any, ...]]) -> np.ndarray:
    """The job ids of store rows (every read selects job_id first), as int64."""
    return np.fromiter(map(operator.itemgetter(0), rows), dtype=np.int64, count=len(rows))


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
        jobs: the job frame (job_id, start_time, end_time, alloc_gpus, nodes).
        now: the current time (the end of running jobs).
        lag: how far behind `now` a reporting agent's newest stored interval may be
            ([store] ship_aggregate plus two [node].interval): readings older than that
            are stale, and the time since them missing, not yet to come.
    """

    jobs: pd.DataFrame
    now: float
    lag: float

    def held(self, job_ids: Sequence[int]) -> dict[int, HeldJob]:
        """{job id: when it held its GPUs} of these (few) jobs."""
        wanted = self.jobs[self.jobs["job_id"].isin(list(job_ids))]
        node_lists = dict(zip(wanted["job_id"].tolist(), wanted["nodes"].tolist(), strict=True))
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
    summary_rows: list[tuple[Any, ...]],
    read: Sequence[str],
    unsummarized: Unsummarized | None = None,
) -> pd.DataFrame:
    """The GPU frame of summary rows (tuples of the `read` columns).

    The summaries in job, node, GPU order, then the rows of jobs with no summary (running
    jobs: their intervals' totals; a job with no interval either, one row per node of
    its allocated GPUs, all missing), in the `read` columns (GPU_COLUMNS).

    Args:
        store: the accounting store.
        job_ids: the jobs, sorted.
        summary_rows: their summary rows.
        read: the columns of `summary_rows`.
        unsummarized: when the jobs with no summary held their GPUs; None counts their
            intervals' covered seconds only (no missing time).
    """
    if not len(job_ids):
        return with_gpm(pd.DataFrame(columns=list(read)))
    summarized = len(summary_rows)
    rest = job_ids[~np.isin(job_ids, _job_ids(summary_rows))].tolist()  # sorted, like job_ids
    running: list[tuple[Any, ...]] = []
    if rest:
        models = queries.gpu_models(store)
        measured: set[int] = set()
        jobs = unsummarized.held(rest) if unsummarized is not None else {}
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
    frame = pd.DataFrame.from_records([*summary_rows, *running], columns=list(read))
    for name in read:  # (in place: a new frame would copy the number columns once more)
        if name in CATEGORICAL_COLUMNS:
            frame[name] = categorical(frame[name])
    # The summaries by job, node, GPU (in string order on every backend), sorted here
    # as integer codes: cheaper than a database sort or a sort of tuples.
    sort_by = ("slot_id", "gpu_uuid", "node", "job_id")
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


def _ascending(keys: tuple[np.ndarray, ...]) -> bool:
    """Whether rows are already in `np.lexsort(keys)` order (last key first)."""
    later = np.zeros(max(len(keys[0]) - 1, 0), dtype=bool)  # row > the one before
    same = np.ones_like(later)
    for key in reversed(keys):
        step = np.diff(key)
        later |= same & (step > 0)
        same &= step == 0
    return bool(np.all(later | same))
