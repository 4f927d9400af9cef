"""The figures every report shows, declared once and computed once, over column arrays.

A report figure (`FIGURE_KEYS`: GPU-hours, utilization, idle GPU-hours, energy, cost,
queue wait, ...) is a sum or a mean over GPU rows: one row per job and GPU, prorated to
the period (reports/summary.py `prorated`). A job's totals (`JOB_TOTAL_KEYS`, the sacct
rows) are the same sums over the job's GPU rows, in seconds, bytes and joules.

`Groups` computes them for every group at once: the rows are stably sorted by group, so
each group is one slice of every column array and keeps its rows' order. A sum over a
slice then adds the same numbers in the same order as pandas does over the group's part
(`rows.groupby(key, sort=True)`), with a few numpy calls per group instead of a frame per
group. `Groups(rows)` (no key) is one group of every row in row order: the totals.

Missing data is never idle (README): a GPU row's GPU-seconds (held, and charged) are its
measured seconds plus its `missing_seconds` (held with no readings: agent down, GPU lost).
Idle is measured time below the active threshold, `gpu - missing - active`
(`idle_seconds`, the one place that rule is written); missing time is its own figure and
share. Where nothing was measured at all, active and idle GPU-hours and the idle share are
unknown (None), never 0 % or 100 % idle.

Utilization is weighted by GPU-seconds over the rows that have a mean utilization;
the GPM figures (NVML GPU Performance Monitoring, Hopper and newer: SM activity, SM
occupancy, tensor activity, DRAM bandwidth) by each row's `gpm_seconds` (the seconds GPM
measured) over the rows that have the figure: a GPU without GPM adds nothing to them, and
where no row was measured they are unknown (None), never 0 %. Effective GPU-hours are the
GPM-measured GPU-hours x SM activity (time nobody measured is in none of them), and
`gpm_percent` says which share of the GPU-hours GPM measured. `idle_held_cost` is the
held-but-unused part of the charge under `[cost] charge = "effective"` (reports/pricing.py;
None when no row carries it). Queue wait (Start - Submit) counts each job once, at its
first row; its 95th percentile interpolates linearly (numpy's and pandas' default).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.ledger import time
from slurm_gpu.ledger.figures import GPM_MEANS

JOB_TOTAL_KEYS = (
    "gpu_model",
    "gpu_seconds",
    "active_seconds",
    "idle_seconds",
    "missing_seconds",
    "util_mean_percent",
    "util_max_percent",
    "mem_max_bytes",
    "mem_gib_seconds",
    "energy_joules",
    "cost",
    "data_until",
    "source",
    "gpm_seconds",
    "sm_active_mean_percent",
    "sm_occupancy_mean_percent",
    "tensor_active_mean_percent",
    "dram_bw_mean_percent",
    "effective_seconds",
    "idle_held_cost",
)
"""What a job's record (a sacct row) sums from its GPU rows, in this order."""

GPM_COLUMNS = ("gpm_seconds", *GPM_MEANS)
"""A GPU row's GPM columns: 0 and NaN where its GPU has no GPM."""

# Above this many rows, the first row of each job is found by hashing (pandas) rather
# than by sorting (np.unique): a month's totals have ~10^6 rows, a group ~10^3.
_HASH_FROM = 4096


class Groups:
    """GPU rows grouped like `rows.groupby(key, sort=True)`, as slices of column arrays.

    Attributes:
        keys: the group keys, sorted (rows whose key is missing are in no group).
        bounds: each group's [start, end) in group order.
        order: the row positions in group order.
    """

    def __init__(self, rows: pd.DataFrame, key: str | None = None) -> None:
        """Group `rows` by the column `key`; None: one group of every row, in row order."""
        self.rows = rows
        self._columns: dict[str, np.ndarray] = {}
        self._time: time.RowTime | None = None
        if key is None:
            self.keys: list[Any] = [None]
            self.bounds = [(0, len(rows))]
            self.order: np.ndarray | None = None
            return
        codes, uniques = pd.factorize(rows[key], sort=True)
        # Few groups: as int16 the stable sort is a radix sort (same order, ~5x faster).
        narrow = codes.astype(np.int16) if len(uniques) < 2**15 else codes
        order = np.argsort(narrow, kind="stable")
        self.order = order[codes[order] >= 0]  # groupby leaves missing keys out
        counts = np.bincount(codes[codes >= 0], minlength=len(uniques))
        ends = np.cumsum(counts)
        self.keys = list(uniques)
        self.bounds = list(zip((ends - counts).tolist(), ends.tolist(), strict=True))

    def positions(self) -> np.ndarray:
        """The row positions in group order."""
        return np.arange(len(self.rows)) if self.order is None else self.order

    def _in_order(self, array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(array if self.order is None else array[self.order])

    def column(self, name: str) -> np.ndarray:
        """The column in group order, as floats (NaN where missing)."""
        if name not in self._columns:
            values = pd.to_numeric(self.rows[name]).to_numpy(dtype=float, na_value=np.nan)
            self._columns[name] = self._in_order(values)
        return self._columns[name]

    def codes(self, name: str) -> np.ndarray:
        """The column's factorized codes in group order (-1: missing)."""
        key = f"codes:{name}"
        if key not in self._columns:
            codes, _ = pd.factorize(self.rows[name])
            self._columns[key] = self._in_order(codes)
        return self._columns[key]

    def values(self, name: str) -> np.ndarray:
        """The column in group order, in its own dtype (texts as objects)."""
        key = f"values:{name}"
        if key not in self._columns:
            self._columns[key] = self._in_order(self.rows[name].to_numpy())
        return self._columns[key]

    def sum(self, name: str, a: int, b: int) -> float:
        """`part[name].sum()` of the group [a, b) (NaN counted as 0, like pandas).

        A column the rows lack sums to 0 (`missing_seconds` of rows from before it).
        """
        if name not in self.rows:
            return 0.0
        return _sum(self.column(name)[a:b])

    def _row_time(self) -> time.RowTime:
        """Each row's held, active and missing seconds as the ledger clips them."""
        if self._time is None:
            self._time = time.row_time(
                self.column("gpu_seconds"),
                self.column("active_seconds"),
                self.column("missing_seconds")
                if "missing_seconds" in self.rows
                else np.zeros(len(self.rows)),
            )
        return self._time

    def _missing(self) -> np.ndarray:
        """Each row's missing seconds, at most its GPU-seconds (0 where unknown)."""
        return np.asarray(self._row_time().missing, dtype=float)

    def _active(self) -> np.ndarray:
        """Each row's active seconds, at most its measured ones (0 where unknown)."""
        return np.asarray(self._row_time().active, dtype=float)

    def _gpm(self, a: int, b: int) -> dict[str, Any]:
        """The GPM figures of the group [a, b): GPM-measured seconds, means, effective seconds.

        Each mean is weighted by `gpm_seconds` over the rows that have it; None where
        those rows measured nothing. Effective seconds: the SM activity mean's weighted
        sum / 100 (None where SM activity is unknown).
        """
        weights = self._gpm_seconds()[a:b]
        out: dict[str, Any] = {"gpm_seconds": _sum(weights)}
        sums = {name: self._weighted_sum(name, a, b) for name in GPM_MEANS}
        for name, (total, weight) in sums.items():
            out[name] = total / weight if weight > 0 else None
        total, weight = sums["sm_active_mean_percent"]
        out["effective_seconds"] = total / 100.0 if weight > 0 else None
        return out

    def _gpm_seconds(self) -> np.ndarray:
        """Each row's GPM-measured seconds (0 where unknown or where rows lack the column)."""
        if "gpm" not in self._columns:
            self._columns["gpm"] = (
                np.nan_to_num(self.column("gpm_seconds"))
                if "gpm_seconds" in self.rows
                else np.zeros(len(self.rows))
            )
        return self._columns["gpm"]

    def _weighted_sum(self, name: str, a: int, b: int) -> tuple[float, float]:
        """(sum of `name` x gpm_seconds, sum of gpm_seconds) over the rows that have `name`."""
        if name not in self.rows:
            return 0.0, 0.0
        values = self.column(name)[a:b]
        known = ~np.isnan(values)
        weights = self._gpm_seconds()[a:b][known]
        return _sum(values[known] * weights), _sum(weights)

    def _held_cost(self, a: int, b: int) -> float | None:
        """The idle-held part of the charge (None where no row carries one)."""
        return self.sum("idle_held_cost", a, b) if "idle_held_cost" in self.rows else None

    def _time_split(self, a: int, b: int) -> tuple[float, float | None, float | None, float]:
        """(GPU-seconds, active, idle, missing seconds) of the group [a, b).

        Row by row, missing counts up to the GPU-seconds and active up to the measured
        rest; active and idle are None where GPU-seconds were held but none measured.
        """
        gpu_seconds = self.sum("gpu_seconds", a, b)
        missing = _sum(self._missing()[a:b])
        active = _sum(self._active()[a:b])
        idle = float(time.idle(gpu_seconds, active, missing))
        if np.isnan(idle):  # held, none of it measured: unknown, never idle
            return gpu_seconds, None, None, missing
        return gpu_seconds, active, idle, missing

    def figures(self) -> list[tuple[Any, dict[str, Any]]]:
        """`(key, figures)` for every group, in key order; figures keyed by FIGURE_KEYS."""
        gpu = self.column("gpu_seconds")
        util = self.column("util_mean_percent")
        energy = self.column("energy_joules")
        wait = self.column("queue_wait")
        job = self.codes("job_id")
        user = self.codes("user")
        out = []
        for key, (a, b) in zip(self.keys, self.bounds, strict=True):
            gpu_seconds, active, idle, missing = self._time_split(a, b)
            firsts = _first_rows(job[a:b])
            waits = wait[a:b][firsts]
            waits = waits[~np.isnan(waits)]
            used = _not_nan(energy[a:b])
            figures = {
                "jobs": int((job[a:b][firsts] >= 0).sum()),
                "users": _distinct(user[a:b]),
                "gpu_hours": gpu_seconds / 3600.0,
                "gpu_mem_hours": self.sum("mem_gib_seconds", a, b) / 3600.0,
                "util_mean_percent": _weighted(util[a:b], gpu[a:b]),
                "active_gpu_hours": _hours(active),
                "idle_gpu_hours": _hours(idle),
                "idle_percent": _share(idle, gpu_seconds),
                "missing_gpu_hours": missing / 3600.0,
                "missing_percent": _share(missing, gpu_seconds),
                "energy_kwh": float(used.sum()) / 3.6e6 if len(used) else None,
                "cost": self.sum("cost", a, b),
                "queue_wait_mean": float(waits.sum() / len(waits)) if len(waits) else None,
                "queue_wait_p95": float(np.percentile(waits, 95.0)) if len(waits) else None,
            }
            gpm = self._gpm(a, b)
            figures["gpm_gpu_hours"] = gpm["gpm_seconds"] / 3600.0
            figures["gpm_percent"] = _share(gpm["gpm_seconds"], gpu_seconds)
            figures.update({name: gpm[name] for name in GPM_MEANS})
            figures["effective_gpu_hours"] = _hours(gpm["effective_seconds"])
            figures["idle_held_cost"] = self._held_cost(a, b)
            out.append((key, figures))
        return out

    def job_totals(self) -> list[tuple[Any, dict[str, Any]]]:
        """`(key, totals)` for every group, totals keyed by JOB_TOTAL_KEYS.

        Utilization: weighted by GPU-seconds; where the rows with readings have no
        GPU-seconds, their plain mean.
        """
        gpu = self.column("gpu_seconds")
        util = self.column("util_mean_percent")
        util_max = self.column("util_max_percent")
        mem_max = self.column("mem_max_bytes")
        energy = self.column("energy_joules")
        models = self.values("gpu_model")
        sources = self.values("source")
        until = self.values("data_until")
        has_cost = "cost" in self.rows
        out = []
        for key, (a, b) in zip(self.keys, self.bounds, strict=True):
            if a == b:
                out.append((key, empty_job_totals()))
                continue
            gpu_seconds, active, idle, missing = self._time_split(a, b)
            mean = _weighted(util[a:b], gpu[a:b])
            if mean is None:
                readings = _not_nan(util[a:b])
                mean = float(readings.sum() / len(readings)) if len(readings) else None
            peak_util, peak_mem = _not_nan(util_max[a:b]), _not_nan(mem_max[a:b])
            used = _not_nan(energy[a:b])
            totals = {
                "gpu_model": ",".join(sorted({str(m) for m in models[a:b] if m})),
                "gpu_seconds": gpu_seconds,
                "active_seconds": active,
                "idle_seconds": idle,
                "missing_seconds": missing,
                "util_mean_percent": mean,
                "util_max_percent": float(peak_util.max()) if len(peak_util) else None,
                "mem_max_bytes": int(peak_mem.max()) if len(peak_mem) else None,
                "mem_gib_seconds": self.sum("mem_gib_seconds", a, b),
                "energy_joules": float(used.sum()) if len(used) else None,
                "cost": self.sum("cost", a, b) if has_cost else 0.0,
                "data_until": pd.Series(until[a:b]).max(),
                "source": ",".join(sorted({str(s) for s in sources[a:b]})),
                **self._gpm(a, b),
                "idle_held_cost": self._held_cost(a, b),
            }
            out.append((key, totals))
        return out


def physical_seconds(rows: pd.DataFrame, key: str | None = None) -> dict[Any, float]:
    """Physical GPU-seconds per group (`key`; None: every row, keyed None).

    A GPU slot's GPU-seconds are slot-seconds held; `share x` them is its part of the
    physical GPU (issue 14): seven 1g.10gb slices held for an hour are 7 slot-hours and
    one physical GPU-hour. A row without a share (from before slots) is a whole GPU.
    """
    groups = Groups(rows, key)
    held = np.nan_to_num(groups.column("gpu_seconds"))
    share = groups.column("share") if "share" in rows else np.ones(len(held))
    physical = held * np.where(np.isnan(share), 1.0, share)
    return {k: _sum(physical[a:b]) for k, (a, b) in zip(groups.keys, groups.bounds, strict=True)}


def figures(rows: pd.DataFrame) -> dict[str, Any]:
    """The report figures (FIGURE_KEYS) of all `rows` together: a totals row."""
    return Groups(rows).figures()[0][1]


def grouped_figures(rows: pd.DataFrame, key: str) -> list[tuple[Any, dict[str, Any]]]:
    """`(value, figures)` per distinct `rows[key]`, in sorted order."""
    return Groups(rows, key).figures()


def empty_job_totals() -> dict[str, Any]:
    """The totals of a job with no GPU rows."""
    return {
        **dict.fromkeys(JOB_TOTAL_KEYS),
        **dict.fromkeys(("gpu_model", "source"), ""),
        **dict.fromkeys(("gpu_seconds", "active_seconds", "idle_seconds", "missing_seconds"), 0.0),
        **dict.fromkeys(("mem_gib_seconds", "cost", "gpm_seconds"), 0.0),
    }


def idle_seconds(rows: pd.DataFrame) -> np.ndarray:
    """Each row's measured idle seconds: GPU-seconds - missing - active, at least 0.

    Row by row what `Groups` sums (the monthly report's idle cost and wasteful jobs).
    """

    def numbers(name: str) -> np.ndarray:
        if name not in rows:
            return np.zeros(len(rows))
        return pd.to_numeric(rows[name]).to_numpy(dtype=float, na_value=np.nan)

    held, active, missing = time.row_time(
        numbers("gpu_seconds"), numbers("active_seconds"), numbers("missing_seconds")
    )
    idle: np.ndarray = np.asarray(held, dtype=float) - missing - active
    return idle


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600.0


def _share(part: float | None, whole: float) -> float | None:
    """`part` as a percentage of `whole`; None when either is unknown or whole is 0."""
    return 100.0 * part / whole if part is not None and whole > 0 else None


def _sum(values: np.ndarray) -> float:
    """pandas' `Series.sum()`: NaN counted as 0."""
    nan = np.isnan(values)
    if nan.any():
        values = np.where(nan, 0.0, values)
    return float(values.sum())


def _not_nan(values: np.ndarray) -> np.ndarray:
    """pandas' `Series.dropna()`: the values that are not NaN."""
    known: np.ndarray = values[~np.isnan(values)]
    return known


def _weighted(util: np.ndarray, gpu_seconds: np.ndarray) -> float | None:
    """Mean utilization weighted by GPU-seconds over the rows with a mean; None if none."""
    known = ~np.isnan(util)
    weights = gpu_seconds[known]
    weight = _sum(weights)
    return _sum(util[known] * weights) / weight if weight > 0 else None


def _first_rows(codes: np.ndarray) -> np.ndarray:
    """Positions of each code's first row (missing codes included), in row order."""
    if len(codes) > _HASH_FROM:
        return np.flatnonzero(~pd.Series(codes).duplicated().to_numpy())
    _, first = np.unique(codes, return_index=True)
    return np.sort(first)


def _distinct(codes: np.ndarray) -> int:
    """How many distinct codes that are not missing (-1)."""
    return int((codes[_first_rows(codes)] >= 0).sum())
