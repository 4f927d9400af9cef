"""`slurm-gpu report`: sreport-style totals per user, account, partition, node, GPU model.

Every figure is a sum over job GPU rows (see reports/jobs.py), each prorated to the part
of the job inside the period (a job that ran half inside counts half), as sreport
counts usage inside its period. Utilization is weighted by GPU-hours; queue wait is per
job (Start - Submit), its mean and 95th percentile (linear interpolation, pandas'
default) over the jobs that started.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from slurm_gpu.reports.jobs import Usage
from slurm_gpu.reports.render import Cell, Field, fixed, fmt_int, fmt_text

GroupBy = Literal["user", "account", "partition", "node", "gpu_model", "cluster"]
GROUP_KEYS: dict[str, str] = {
    "users": "user",
    "accounts": "account",
    "partitions": "partition",
    "nodes": "node",
    "gpu-models": "gpu_model",
    "cluster": "cluster",
}
GROUP_TITLES = {
    "user": "User",
    "account": "Account",
    "partition": "Partition",
    "node": "Node",
    "gpu_model": "GPUModel",
    "cluster": "Cluster",
}
TOTAL = "TOTAL"


@dataclass
class Report:
    """One report: rows per group, the totals row, and the top users by idle GPU-hours."""

    group: str
    rows: list[dict[str, Any]]
    total: dict[str, Any]
    top_waste: list[dict[str, Any]]


def prorated(usage: Usage, since: float, until: float, now: float) -> pd.DataFrame:
    """GPU rows joined with their job's facts, scaled to the part inside [since, until]."""
    gpus = usage.gpus
    if gpus.empty:
        return pd.DataFrame(
            columns=[*gpus.columns, "user", "account", "partition", "fraction", "queue_wait"]
        )
    facts = usage.jobs.set_index("job_id")[
        ["user", "account", "partition", "start_time", "end_time", "submit_time"]
    ]
    rows = gpus.join(facts, on="job_id")
    rows["fraction"] = _fractions(rows["start_time"], rows["end_time"], since, until, now)
    for column in ("gpu_seconds", "active_seconds", "mem_gib_seconds", "energy_joules", "cost"):
        rows[column] = rows[column].astype(float) * rows["fraction"]
    start = _seconds(rows["start_time"])
    submit = _seconds(rows["submit_time"])
    rows["queue_wait"] = np.where(np.isnan(start) | np.isnan(submit), np.nan, start - submit)
    return rows


def _seconds(column: pd.Series) -> np.ndarray:
    """A time column as floats, NaN where unknown (None or NaN)."""
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _fractions(
    starts: pd.Series, ends: pd.Series, since: float, until: float, now: float
) -> np.ndarray:
    """`_fraction` of every row at once."""
    start = _seconds(starts)
    end = _seconds(ends)
    stop = np.where(np.isnan(end), now, end)
    length = stop - start
    inside = np.minimum(stop, until) - np.maximum(start, since)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.minimum(np.maximum(inside / length, 0.0), 1.0)
    instant = np.where((since <= start) & (start <= until), 1.0, 0.0)
    out = np.where(length <= 0, instant, share)
    return np.where(np.isnan(start), 1.0, out)


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _fraction(start: Any, end: Any, since: float, until: float, now: float) -> float:
    if not _known(start):
        return 1.0
    stop = float(end) if _known(end) else now
    length = stop - float(start)
    if length <= 0:
        return 1.0 if since <= float(start) <= until else 0.0
    inside = min(stop, until) - max(float(start), since)
    return min(max(inside / length, 0.0), 1.0)


def build_report(
    usage: Usage,
    group: str,
    *,
    since: float,
    until: float,
    now: float,
    cluster: str = "",
    all_nodes: Sequence[str] = (),
    hot_factor: float = 1.5,
    top: int | None = None,
    sort: str | None = None,
    waste_top: int = 5,
) -> Report:
    """Totals per group over the period.

    Args:
        usage: the visible jobs and their GPU rows.
        group: one of GROUP_KEYS' values.
        all_nodes: nodes to list even with no use (report nodes).
        hot_factor: a node is hot when its GPU-hour share > hot_factor / number of nodes.
        top: keep the first N rows after sorting.
        sort: a field name to sort by (descending for numbers); default GPU-hours.
    """
    rows = prorated(usage, since, until, now)
    rows = rows[rows["fraction"] > 0] if len(rows) else rows
    rows = rows.assign(cluster=cluster or "cluster")
    key = group
    groups: list[dict[str, Any]] = []
    if len(rows):
        for value, figures in Segments(rows, key).figures():
            groups.append({"key": value, **figures})
    if group == "node":
        seen = {g["key"] for g in groups}
        for node in all_nodes:
            if node not in seen:
                groups.append({"key": node, **_figures(rows.iloc[0:0])})
        total_hours = sum(g["gpu_hours"] for g in groups)
        mean_share = 1.0 / len(groups) if groups else 0.0
        for g in groups:
            g["share_percent"] = 100.0 * g["gpu_hours"] / total_hours if total_hours else 0.0
            g["hot"] = (
                "hot"
                if total_hours and g["gpu_hours"] / total_hours > hot_factor * mean_share
                else ""
            )
    total = {"key": TOTAL, **_figures(rows)}
    if group == "node":
        total["share_percent"] = 100.0 if groups else 0.0
        total["hot"] = ""
    groups = _sorted(groups, sort)
    if top is not None:
        groups = groups[:top]
    waste = []
    if len(rows):
        for user, figures in Segments(rows, "user").figures():
            if figures["idle_gpu_hours"] > 0:
                waste.append({"key": user, **figures})
    waste.sort(key=lambda g: (-g["idle_gpu_hours"], g["key"]))
    return Report(group, groups, total, waste[:waste_top])


def _figures(rows: pd.DataFrame) -> dict[str, Any]:
    gpu_seconds = float(rows["gpu_seconds"].sum()) if len(rows) else 0.0
    active = float(rows["active_seconds"].sum()) if len(rows) else 0.0
    idle = max(gpu_seconds - active, 0.0)
    # The rows with a mean utilization, column by column (not a copy of every column).
    known = rows["util_mean_percent"].notna() if len(rows) else pd.Series(dtype=bool)
    known_gpu = rows["gpu_seconds"][known] if len(rows) else pd.Series(dtype=float)
    weight = float(known_gpu.sum()) if len(known_gpu) else 0.0
    util = (
        float((rows["util_mean_percent"][known].astype(float) * known_gpu).sum() / weight)
        if weight > 0
        else None
    )
    waits = (
        rows["queue_wait"][~rows["job_id"].duplicated()].dropna().astype(float)
        if len(rows)
        else pd.Series(dtype=float)
    )
    energy = rows["energy_joules"].dropna() if len(rows) else pd.Series(dtype=float)
    return {
        "jobs": int(rows["job_id"].nunique()) if len(rows) else 0,
        "users": int(rows["user"].nunique()) if len(rows) else 0,
        "gpu_hours": gpu_seconds / 3600.0,
        "gpu_mem_hours": float(rows["mem_gib_seconds"].sum()) / 3600.0 if len(rows) else 0.0,
        "util_mean_percent": util,
        "active_gpu_hours": active / 3600.0,
        "idle_gpu_hours": idle / 3600.0,
        "idle_percent": 100.0 * idle / gpu_seconds if gpu_seconds > 0 else None,
        "energy_kwh": float(energy.sum()) / 3.6e6 if len(energy) else None,
        "cost": float(rows["cost"].sum()) if len(rows) else 0.0,
        "queue_wait_mean": float(waits.mean()) if len(waits) else None,
        "queue_wait_p95": float(waits.quantile(0.95)) if len(waits) else None,
    }


class Segments:
    """Rows grouped like `rows.groupby(key, sort=True)`, as slices of column arrays.

    The rows are stably sorted by group, so every group's rows keep their order and a
    sum over a slice adds the same numbers in the same order as pandas does over the
    group's part: the figures are bit for bit those of `_figures(part)` per group, with
    a few numpy calls per group instead of a frame per group.
    """

    def __init__(self, rows: pd.DataFrame, key: str) -> None:
        codes, uniques = pd.factorize(rows[key], sort=True)
        # Few groups: as int16 the stable sort is a radix sort (same order, ~5x faster).
        narrow = codes.astype(np.int16) if len(uniques) < 2**15 else codes
        order = np.argsort(narrow, kind="stable")
        order = order[codes[order] >= 0]  # groupby leaves NaN keys out
        counts = np.bincount(codes[codes >= 0], minlength=len(uniques))
        ends = np.cumsum(counts)
        self.keys = list(uniques)
        self.bounds = list(zip((ends - counts).tolist(), ends.tolist(), strict=True))
        self.rows = rows
        self.order = order
        self._columns: dict[str, np.ndarray] = {}

    def column(self, name: str, dtype: Any = float) -> np.ndarray:
        """The column in group order (floats, NaN where missing, unless `dtype` says)."""
        if name not in self._columns:
            values = self.rows[name]
            if dtype is float:
                array = pd.to_numeric(values).to_numpy(dtype=float, na_value=np.nan)
            else:
                array = values.to_numpy(dtype=dtype)
            self._columns[name] = np.ascontiguousarray(array[self.order])
        return self._columns[name]

    def codes(self, name: str) -> np.ndarray:
        """The column's factorized codes in group order (-1: missing)."""
        key = f"codes:{name}"
        if key not in self._columns:
            codes, _ = pd.factorize(self.rows[name])
            self._columns[key] = np.ascontiguousarray(codes[self.order])
        return self._columns[key]

    def sum(self, name: str, a: int, b: int) -> float:
        """`part[name].sum()` (NaN counted as 0, like pandas)."""
        values = self.column(name)[a:b]
        nan = np.isnan(values)
        if nan.any():
            values = np.where(nan, 0.0, values)
        return float(values.sum())

    def figures(self) -> list[tuple[Any, dict[str, Any]]]:
        """`(key, _figures(part))` for every group, in groupby order."""
        gpu = self.column("gpu_seconds")
        util = self.column("util_mean_percent")
        energy = self.column("energy_joules")
        wait = self.column("queue_wait")
        job = self.codes("job_id")
        user = self.codes("user")
        out = []
        for key, (a, b) in zip(self.keys, self.bounds, strict=True):
            gpu_seconds = self.sum("gpu_seconds", a, b)
            active = self.sum("active_seconds", a, b)
            idle = max(gpu_seconds - active, 0.0)
            known = ~np.isnan(util[a:b])
            known_gpu = gpu[a:b][known]
            weight = float(known_gpu.sum()) if len(known_gpu) else 0.0
            mean_util = float((util[a:b][known] * known_gpu).sum() / weight) if weight > 0 else None
            jobs, first = np.unique(job[a:b], return_index=True)
            waits = wait[a:b][np.sort(first)]
            waits = waits[~np.isnan(waits)]
            used = energy[a:b][~np.isnan(energy[a:b])]
            users = np.unique(user[a:b])
            out.append(
                (
                    key,
                    {
                        "jobs": int((jobs >= 0).sum()),
                        "users": int((users >= 0).sum()),
                        "gpu_hours": gpu_seconds / 3600.0,
                        "gpu_mem_hours": self.sum("mem_gib_seconds", a, b) / 3600.0,
                        "util_mean_percent": mean_util,
                        "active_gpu_hours": active / 3600.0,
                        "idle_gpu_hours": idle / 3600.0,
                        "idle_percent": 100.0 * idle / gpu_seconds if gpu_seconds > 0 else None,
                        "energy_kwh": float(used.sum()) / 3.6e6 if len(used) else None,
                        "cost": self.sum("cost", a, b),
                        "queue_wait_mean": float(waits.sum() / len(waits)) if len(waits) else None,
                        "queue_wait_p95": float(np.percentile(waits, 95.0)) if len(waits) else None,
                    },
                )
            )
        return out


def _sorted(groups: list[dict[str, Any]], sort: str | None) -> list[dict[str, Any]]:
    fields = report_fields("")
    name = sort or "GPUHours"
    by_lower = {n.lower(): f for n, f in fields.items()}
    chosen = by_lower.get(name.lower())
    if chosen is None:
        raise ValueError(f"--sort: unknown field {name!r}; valid fields: {', '.join(fields)}")

    def numeric(g: Mapping[str, Any]) -> tuple[int, float, str]:
        value = chosen.get(g)
        if isinstance(value, int | float) and not (isinstance(value, float) and math.isnan(value)):
            return (0, -float(value), str(g["key"]))
        return (1, 0.0, str(g["key"]))

    values = [chosen.get(g) for g in groups]
    if any(isinstance(v, str) for v in values):
        return sorted(groups, key=lambda g: str(chosen.get(g) or ""))
    return sorted(groups, key=numeric)


def _get(name: str) -> Any:
    def get(record: Mapping[str, Any]) -> Cell:
        value = record.get(name)
        if isinstance(value, float) and math.isnan(value):
            return None
        return value

    return get


def report_fields(currency: str, group: str = "user") -> dict[str, Field]:
    """The columns of a report; the first is the group's name."""
    cost_unit = f" ({currency})" if currency else ""
    h4 = fixed(4)
    fields = [
        Field(GROUP_TITLES.get(group, "Key"), -22, "What the row is about", _get("key"), fmt_text),
        Field("Jobs", 6, "GPU jobs", _get("jobs"), fmt_int),
        Field("Users", 5, "Distinct users", _get("users"), fmt_int),
        Field("GPUHours", 10, "GPU-hours in the period", _get("gpu_hours"), h4),
        Field("GPUMemHours", 11, "GPU memory in use x hours, GiB-hours", _get("gpu_mem_hours"), h4),
        Field(
            "GPUUtilAvg",
            10,
            "Mean utilization %, weighted by GPU-hours",
            _get("util_mean_percent"),
            fixed(1),
        ),
        Field(
            "ActiveGPUHours",
            14,
            "GPU-hours above the active threshold",
            _get("active_gpu_hours"),
            h4,
        ),
        Field("IdleGPUHours", 12, "GPU-hours minus active GPU-hours", _get("idle_gpu_hours"), h4),
        Field("IdlePct", 7, "Idle share of the GPU-hours, %", _get("idle_percent"), fixed(1)),
        Field("EnergyKWh", 9, "GPU energy, kWh", _get("energy_kwh"), fixed(5)),
        Field("Cost", 10, f"Cost by [cost] prices{cost_unit}", _get("cost"), fixed(2)),
        Field(
            "QueueWaitMean", 13, "Mean Start - Submit, seconds", _get("queue_wait_mean"), fixed(1)
        ),
        Field(
            "QueueWaitP95",
            12,
            "95th percentile Start - Submit, seconds",
            _get("queue_wait_p95"),
            fixed(1),
        ),
    ]
    if group == "node":
        fields += [
            Field("SharePct", 8, "Share of all GPU-hours, %", _get("share_percent"), fixed(1)),
            Field(
                "Hot",
                4,
                "hot: share above [reports] hot_node_factor x the mean",
                _get("hot"),
                fmt_text,
            ),
        ]
    return {f.name: f for f in fields}
