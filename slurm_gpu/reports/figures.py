"""The figures every report shows, per group of GPU rows: the ledger's, over column arrays.

A report figure (`FIGURE_KEYS`: GPU-hours, utilization, idle GPU-hours, energy, cost,
queue wait, ...) is computed from sums over GPU rows: one row per job and GPU, prorated
to the period (reports/summary.py `prorated`). A job's totals (`JOB_TOTAL_KEYS`, the
sacct rows) come from the same sums over the job's GPU rows, in seconds, bytes and joules.

Every figure is the ledger's (slurm_gpu/ledger, issue 24), by the one road every report
takes: each row's sums (`ledger.sums.row_sums`: held, active and missing seconds clipped
by `ledger.time`, utilization and GPM means weighted by their seconds, energy and the
rows that knew it...), added per group, then `ledger.figures.figures` of the group's
summed sums (a job's totals: the ledger's `time.active`, `time.idle`, `util_mean`,
`gpm_means`, `effective_seconds` of them). This module only groups rows and names keys.

`Groups` computes them for every group at once: the rows are stably sorted by group, so
each group is one slice of every column array and keeps its rows' order, and a sum per
group is one `np.add.reduceat` over a column (`rows.groupby(key, sort=True)`'s groups, up
to the order of the additions). `Groups(rows)` (no key) is one group of every row in row
order: the totals. Queue wait (Start - Submit) counts each job once, at its first row;
its 95th percentile interpolates linearly (numpy's and pandas' default).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.ledger import figures as ledger_figures
from slurm_gpu.ledger import time
from slurm_gpu.ledger.figures import FIGURE_KEYS, GPM_MEANS
from slurm_gpu.ledger.sums import ROW_COLUMNS, row_sums

JOB_TOTAL_KEYS = (
    "gpu_model",
    "gpu_seconds",
    "active_seconds",
    "idle_seconds",
    "missing_seconds",
    "suspended_gpu_seconds",
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

CHARGES = ("cost", "idle_held_cost")
"""A GPU row's charge (reports/pricing.py), summed per group beside its ledger sums."""

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
        self._summed: dict[str, np.ndarray] | None = None
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

    def summed(self) -> dict[str, np.ndarray]:
        """Each sum per group: its rows' ledger sums (`row_sums`) and `CHARGES` added.

        A column the rows lack is unknown to the ledger (a sum of 0, a mean of none).
        """
        if self._summed is None:
            n = len(self.positions())
            rows = {name: self.column(name) for name in ROW_COLUMNS if name in self.rows}
            per_row = row_sums(rows or {"gpu_seconds": np.zeros(n)}, 0.0)
            for name in CHARGES:
                per_row[name] = (
                    np.nan_to_num(self.column(name)) if name in self.rows else np.zeros(n)
                )
            self._summed = {name: self._add(values) for name, values in per_row.items()}
        return self._summed

    def sums(self) -> list[dict[str, float]]:
        """Each group's summed sums (`summed`), as the ledger's figures take them."""
        summed = self.summed()
        names = list(summed)
        groups = np.transpose([summed[name] for name in names]).tolist()
        return [dict(zip(names, group, strict=True)) for group in groups]

    def _starts(self) -> np.ndarray:
        return np.array([a for a, _ in self.bounds], dtype=np.intp)

    def _add(self, values: np.ndarray) -> np.ndarray:
        """`values` (in group order) added per group (0 for a group of no rows)."""
        return self._reduce(np.add, values, 0.0)

    def _reduce(self, ufunc: np.ufunc, values: np.ndarray, empty: float) -> np.ndarray:
        """`ufunc.reduceat` of `values` over each group (`empty` for a group of no rows)."""
        if len(values) == 0:
            return np.full(len(self.bounds), empty)
        if len(self.bounds) == 1:  # the totals: numpy's (pairwise) reduce
            return np.asarray([ufunc.reduce(values)], dtype=float)
        reduced: np.ndarray = ufunc.reduceat(values, self._starts())
        return reduced

    def figures(self) -> list[tuple[Any, dict[str, Any]]]:
        """`(key, figures)` for every group, in key order; figures keyed by FIGURE_KEYS.

        The ledger's figures (`ledger.figures.figures`) of the group's summed sums.
        """
        held_cost = "idle_held_cost" in self.rows
        out = []
        for key, total, counted in zip(self.keys, self.sums(), self._counted(), strict=True):
            figures = ledger_figures.figures(total, counted, held_cost)
            out.append((key, {name: figures[name] for name in FIGURE_KEYS}))
        return out

    def _counted(self) -> list[ledger_figures.Counted]:
        """Each group's jobs, users and queue waits (a job's wait counted at its first row)."""
        wait = self.column("queue_wait")
        job = self.codes("job_id")
        user = self.codes("user")
        out = []
        for a, b in self.bounds:
            firsts = _first_rows(job[a:b])
            waits = wait[a:b][firsts]
            waits = waits[~np.isnan(waits)]
            out.append(
                ledger_figures.Counted(
                    jobs=int((job[a:b][firsts] >= 0).sum()),
                    users=_distinct(user[a:b]),
                    queue_wait_mean=float(waits.sum() / len(waits)) if len(waits) else None,
                    queue_wait_p95=float(np.percentile(waits, 95.0)) if len(waits) else None,
                )
            )
        return out

    def job_totals(self) -> list[tuple[Any, dict[str, Any]]]:
        """`(key, totals)` for every group, totals keyed by JOB_TOTAL_KEYS.

        The ledger's figures of the group's summed sums, in seconds and joules.
        Utilization: the ledger's (weighted by GPU-seconds); where the rows with readings
        have no GPU-seconds, their plain mean.
        """
        util = self.column("util_mean_percent")
        readings = self._add(np.where(np.isnan(util), 0.0, 1.0)).tolist()
        readings_sum = self._add(np.nan_to_num(util)).tolist()
        util_max = self._reduce(np.fmax, self.column("util_max_percent"), np.nan).tolist()
        mem_max = self._reduce(np.fmax, self.column("mem_max_bytes"), np.nan).tolist()
        until, newest = self.values("data_until"), self._newest()
        models = self.values("gpu_model")
        sources = self.values("source")
        held_cost = "idle_held_cost" in self.rows
        summed = self.summed()
        split = (summed["gpu_seconds"], summed["active_seconds"], summed["missing_seconds"])
        active = np.asarray(time.active(*split), dtype=float).tolist()
        idle = np.asarray(time.idle(*split), dtype=float).tolist()
        out = []
        for i, (key, (a, b), total) in enumerate(
            zip(self.keys, self.bounds, self.sums(), strict=True)
        ):
            if a == b:
                out.append((key, empty_job_totals()))
                continue
            mean = ledger_figures.util_mean(total)
            if mean is None and readings[i] > 0:
                mean = readings_sum[i] / readings[i]
            totals = {
                "gpu_model": ",".join(sorted({str(m) for m in models[a:b] if m})),
                "gpu_seconds": total["gpu_seconds"],
                "active_seconds": _known(active[i]),
                "idle_seconds": _known(idle[i]),
                "missing_seconds": total["missing_seconds"],
                "suspended_gpu_seconds": total["suspended_seconds"],
                "util_mean_percent": mean,
                "util_max_percent": _known(util_max[i]),
                "mem_max_bytes": int(mem_max[i]) if _known(mem_max[i]) is not None else None,
                "mem_gib_seconds": total["mem_gib_seconds"],
                "energy_joules": ledger_figures.energy_joules(total),
                "cost": total["cost"],
                "data_until": newest[i] if newest is not None else pd.Series(until[a:b]).max(),
                "source": ",".join(sorted({str(s) for s in sources[a:b]})),
                "gpm_seconds": total["gpm_seconds"],
                **ledger_figures.gpm_means(total),
                "effective_seconds": ledger_figures.effective_seconds(total),
                "idle_held_cost": total["idle_held_cost"] if held_cost else None,
            }
            out.append((key, totals))
        return out

    def _newest(self) -> np.ndarray | None:
        """Each group's newest `data_until` where the column is floats (NaN: none)."""
        until = self.values("data_until")
        if until.dtype.kind != "f":
            return None  # texts or objects: pandas' max, group by group
        return self._reduce(np.fmax, until, np.nan)


def physical_seconds(rows: pd.DataFrame, key: str | None = None) -> dict[Any, float]:
    """Physical GPU-seconds per group (`key`; None: every row, keyed None).

    A GPU slot's GPU-seconds are slot-seconds held; `share x` them is its part of the
    physical GPU (issue 14, the ledger's `physical_seconds`): seven 1g.10gb slices held
    for an hour are 7 slot-hours and one physical GPU-hour. A row without a share (from
    before slots) is a whole GPU.
    """
    groups = Groups(rows, key)
    physical = groups.summed()["physical_seconds"].tolist()
    return dict(zip(groups.keys, physical, strict=True))


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
        **dict.fromkeys(
            (
                "gpu_seconds",
                "active_seconds",
                "idle_seconds",
                "missing_seconds",
                "suspended_seconds",
            ),
            0.0,
        ),
        **dict.fromkeys(("mem_gib_seconds", "cost", "gpm_seconds"), 0.0),
    }


def idle_seconds(rows: pd.DataFrame) -> np.ndarray:
    """Each row's measured idle seconds (the ledger's `time.idle` of the row), at least 0.

    A row held but not measured at all has no idle seconds (0). Row by row what `Groups`
    sums (the monthly report's idle cost and wasteful jobs).
    """

    def numbers(name: str) -> np.ndarray:
        if name not in rows:
            return np.zeros(len(rows))
        return pd.to_numeric(rows[name]).to_numpy(dtype=float, na_value=np.nan)

    held, active, missing, _ = time.row_time(
        numbers("gpu_seconds"),
        numbers("active_seconds"),
        numbers("missing_seconds"),
        numbers("suspended_seconds"),
    )
    idle = np.asarray(time.idle(held, active, missing), dtype=float)
    known: np.ndarray = np.where(np.isnan(idle), 0.0, idle)
    return known


def _known(value: Any) -> float | None:
    """A number as a float; None where unknown (None or NaN)."""
    return None if value is None or np.isnan(value) else float(value)


def _first_rows(codes: np.ndarray) -> np.ndarray:
    """Positions of each code's first row (missing codes included), in row order."""
    if len(codes) > _HASH_FROM:
        return np.flatnonzero(~pd.Series(codes).duplicated().to_numpy())
    _, first = np.unique(codes, return_index=True)
    return np.sort(first)


def _distinct(codes: np.ndarray) -> int:
    """How many distinct codes that are not missing (-1)."""
    return int((codes[_first_rows(codes)] >= 0).sum())
