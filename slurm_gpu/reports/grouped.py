"""A report's groups and totals from sums rows, whatever their source (issue 24).

A report row is the ledger's figures (slurm_gpu/ledger/figures.py) of the sums of its
rows: the usage rollups of folded jobs (reports/rollups.py `period_usage`) or the raw
rows of any job (`raw_sums`: a finished job's summaries, a running job's interval
totals, as the ledger sums them). Sums add; the jobs, users and queue waits are counted:
the rollups count each folded job by its weights (schema.py MEMBER_WEIGHTS) and a log2
histogram of waits, the jobs counted one by one (`members`) by their ids and exact waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from slurm_gpu.ledger import figures as ledger_figures
from slurm_gpu.ledger import time
from slurm_gpu.reports.summary import (
    TOTAL,
    Report,
    has_slots,
    prorated,
    slot_groups,
    sorted_rows,
)
from slurm_gpu.reports.sums import PRICED, gpu_sums, prorate
from slurm_gpu.reports.usage import Usage
from slurm_gpu.store import usage_rollup
from slurm_gpu.store.schema import (
    USAGE_PLACE,
    WAIT_BUCKETS,
    WAIT_HISTOGRAMS,
)

FIGURE_SUMS = PRICED
MEMBER_COLUMNS = ("job_id", "user", "account", "partition", *USAGE_PLACE, "queue_wait")


def counted_figures(weights: Sequence[str]) -> tuple[str, ...]:
    """The `usage_daily` count columns of these weights (schema.py MEMBER_WEIGHTS)."""
    return tuple(
        c
        for w in dict.fromkeys(weights)
        for c in (w, f"{w}_waited", f"{w}_wait_seconds", *WAIT_HISTOGRAMS[w])
    )


# The `usage_daily` count weight that counts a job once in a group of this report
# (schema.py MEMBER_WEIGHTS); groups by owner, the cluster and the totals: "jobs".
WEIGHT_OF = {"node": "node_jobs", "gpu_model": "model_jobs", "slot": "slot_jobs"}
BUCKET_NOTE = (
    "QueueWaitP95 is read from the usage rollups' log2 histogram of queue waits "
    "(within one bucket, a factor of 2, of the exact 95th percentile); QueueWaitMean is exact."
)


def report_of(
    sums: pd.DataFrame,
    members: pd.DataFrame,
    group: str,
    *,
    held_cost: bool,
    cluster: str = "",
    all_nodes: Sequence[str] = (),
    busy_factor: float = 1.5,
    top: int | None = None,
    sort: str | None = None,
    waste_top: int = 5,
) -> Report:
    """The report of these sums rows: one row per `group` value, the totals, the waste.

    Args:
        sums: sums rows (owner, place, PRICED and the counts of `with_counts`).
        members: the jobs counted one by one (MEMBER_COLUMNS).
        group: user, account, partition, node, gpu_model, slot or cluster.
        held_cost: [cost] charge is "effective" (IdleHeldCost shown).
        cluster: the name of the "cluster" group's one row.
        all_nodes: nodes to list even with no use (report nodes).
        busy_factor: a node is busy when its GPU-hour share > busy_factor / nodes.
        top: keep the first N rows after sorting.
        sort: a field name to sort by (descending for numbers); default GPU-hours.
        waste_top: users listed by idle GPU-hours.
    """
    weight = WEIGHT_OF.get(group, "jobs")
    sums = sums.assign(cluster=cluster or "cluster")
    members = members.assign(cluster=cluster or "cluster")
    if group == "slot":
        sums = sums.assign(slot=_slot_labels(sums))
        members = members.assign(slot=_slot_labels(members))
    # One float matrix of the sums for the totals, the waste and groups counted by "jobs".
    by_jobs = _matrix(sums, summed_columns("jobs"))
    shared = by_jobs if weight == "jobs" else None
    groups = [
        {"key": key, **f}
        for key, f in grouped(sums, members, group, held_cost, weight, matrix=shared)
    ]
    if group == "node":
        seen = {g["key"] for g in groups}
        empty = figures_of(sums.iloc[0:0], members.iloc[0:0], held_cost)
        for node in all_nodes:
            if node not in seen:
                groups.append({"key": node, **empty})
        total_hours = sum(g["gpu_hours"] for g in groups)
        mean_share = 1.0 / len(groups) if groups else 0.0
        for g in groups:
            g["share_percent"] = 100.0 * g["gpu_hours"] / total_hours if total_hours else 0.0
            g["busy"] = (
                "busy"
                if total_hours and g["gpu_hours"] / total_hours > busy_factor * mean_share
                else ""
            )
    total = {"key": TOTAL, **figures_of(sums, members, held_cost, matrix=by_jobs)}
    if group == "node":
        total["share_percent"] = 100.0 if groups else 0.0
        total["busy"] = ""
    if group == "user":  # the users' figures are those just computed
        wasted = [{**g} for g in groups if (g["idle_gpu_hours"] or 0.0) > 0]
        waste = sorted(wasted, key=lambda g: (-g["idle_gpu_hours"], g["key"]))[:waste_top]
    else:
        waste = [
            {"key": key, **f}
            for key, f in grouped(
                sums, members, "user", held_cost, "jobs", top_idle=waste_top, matrix=by_jobs
            )
        ]
    groups = sorted_rows(groups, sort)
    if top is not None:
        groups = groups[:top]
    notes = []
    if len(sums) and float(sums[list(WAIT_HISTOGRAMS[weight])].to_numpy(dtype=float).sum()) > 0:
        notes.append(BUCKET_NOTE)
    return Report(group, groups, total, waste, notes, held_slots=has_slots(sums))


def with_counts(sums: pd.DataFrame, weights: Sequence[str]) -> pd.DataFrame:
    """Sums rows with the count columns of `weights` (0 where a row counts no job)."""
    counted = list(counted_figures(weights))
    present = [n for n in counted if n in sums]
    counts = np.zeros((len(sums), len(counted)))
    if present:  # the edges' and raw rows' counts are none (NaN): 0
        where = [counted.index(n) for n in present]
        counts[:, where] = np.nan_to_num(sums[present].to_numpy(dtype=float), nan=0.0)
    return pd.concat(
        [sums.drop(columns=present), pd.DataFrame(counts, index=sums.index, columns=counted)],
        axis=1,
    )


def raw_sums(
    usage: Usage, since: float, until: float, now: float
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(sums, rows): raw GPU rows as sums rows prorated to [since, until].

    The rows' charge is theirs (`reports/pricing.py add_cost`, the ledger's); without
    one, 0. sums: owner, place, PRICED; rows: the prorated GPU rows they came from (same
    order, those with a part inside the period), with their job's facts and queue wait.
    """
    rows = prorated(usage, since, until, now)
    if len(rows):
        rows = rows[rows["fraction"] > 0]
    if not len(rows):
        return pd.DataFrame(columns=[*usage_rollup.OWNER, *USAGE_PLACE, *PRICED]), rows
    elapsed = usage.jobs.drop_duplicates("job_id").set_index("job_id")["elapsed_seconds"]
    # The ledger's sums of the whole rows (as the fold has them), then prorated.
    gpus = usage.gpus.loc[rows.index]
    whole = gpu_sums(gpus, elapsed).reset_index(drop=True)
    for name in ("cost", "idle_cost"):
        whole[name] = pd.to_numeric(gpus[name]).to_numpy(dtype=float) if name in gpus else 0.0
    whole["idle_held_cost"] = (
        pd.to_numeric(gpus["idle_held_cost"]).to_numpy(dtype=float)
        if "idle_held_cost" in gpus
        else np.nan
    )
    rows = rows.reset_index(drop=True)
    place = pd.DataFrame(
        {
            **{name: rows[name].astype(object).to_numpy() for name in usage_rollup.OWNER},
            "node": rows["node"].astype(object).to_numpy(),
            "gpu_model": rows["gpu_model"].astype(object).fillna("").to_numpy(),
            "slot_kind": rows["slot_kind"].astype(object).fillna("gpu").to_numpy()
            if "slot_kind" in rows
            else "gpu",
            "mig_profile": rows["mig_profile"].astype(object).fillna("").to_numpy()
            if "mig_profile" in rows
            else "",
            "share": pd.to_numeric(rows["share"], errors="coerce").fillna(1.0).to_numpy()
            if "share" in rows
            else 1.0,
        }
    )
    sums = prorate(pd.concat([place, whole], axis=1), rows["fraction"].to_numpy())
    return sums, rows


def _slot_labels(frame: pd.DataFrame) -> pd.Series:
    return slot_groups(frame) if len(frame) else pd.Series([], dtype=object)


def grouped(
    sums: pd.DataFrame,
    members: pd.DataFrame,
    key: str,
    held_cost: bool,
    weight: str,
    *,
    top_idle: int | None = None,
    matrix: np.ndarray | None = None,
) -> list[tuple[Any, dict[str, Any]]]:
    """`(value, figures)` per distinct value of `key`, in sorted order (numpy, no groupby).

    `weight`: the count weight of this grouping (WEIGHT_OF). `top_idle`: only that many
    groups with idle GPU-hours, most idle first (the top waste): the figures of the other
    groups are not computed. `matrix`: `_matrix` of sums' `summed_columns(weight)`,
    where the caller has it.
    """
    if not len(sums) and not len(members):
        return []
    names = [*FIGURE_SUMS, weight, f"{weight}_waited", f"{weight}_wait_seconds"]
    column = {n: i for i, n in enumerate(names)}
    histogram = list(WAIT_HISTOGRAMS[weight])
    exact = _exact(members.assign(_key=members[key].astype(str)))
    found, values = pd.factorize(sums[key].astype(str).to_numpy(dtype=object))
    keys = sorted(set(values) | set(exact))
    index = {k: i for i, k in enumerate(keys)}
    # Each row's key's place in `keys`: mapped once per distinct key, not per row.
    codes = np.array([index[v] for v in values], dtype=np.intp)[found]
    if matrix is None:
        matrix = _matrix(sums, [*names, *histogram])
    summed = _sum_by(codes, matrix, len(keys))
    user_codes, users_seen = pd.factorize(sums["user"].to_numpy(dtype=object))
    pairs = np.unique(codes * max(len(users_seen), 1) + user_codes)
    users = np.bincount(pairs // max(len(users_seen), 1), minlength=len(keys))
    chosen = np.arange(len(keys))
    if top_idle is not None:
        idle = _idle_hours(summed, column)
        wasted = [int(i) for i in np.flatnonzero(idle > 0)]  # unknown (NaN): never
        wasted.sort(key=lambda i: (-idle[i], keys[i]))
        chosen = np.array(wasted[:top_idle], dtype=np.intp)
    summed = summed[chosen]
    counted = _counts(
        summed[:, [column[weight], column[f"{weight}_waited"], column[f"{weight}_wait_seconds"]]],
        np.rint(summed[:, len(names) :]),
        [exact.get(keys[i]) for i in chosen],
        users[chosen],
    )
    totals = summed[:, : len(names)].tolist()
    return [
        (keys[i], _from_totals(dict(zip(names, row, strict=True)), c, held_cost))
        for i, row, c in zip(chosen.tolist(), totals, counted, strict=True)
    ]


def _sum_by(codes: np.ndarray, matrix: np.ndarray, n: int) -> np.ndarray:
    """The rows of `matrix` summed per code (0..n-1), in row order within a code."""
    out = np.zeros((n, matrix.shape[1]))
    if not len(codes):
        return out
    order = np.argsort(codes, kind="stable")
    ordered = codes[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    out[ordered[starts]] = np.add.reduceat(matrix[order], starts, axis=0)
    return out


def _idle_hours(summed: np.ndarray, column: dict[str, int]) -> np.ndarray:
    """The ledger's idle GPU-hours of each row of sums (NaN where unknown)."""
    idle = time.idle(
        summed[:, column["gpu_seconds"]],
        summed[:, column["active_seconds"]],
        summed[:, column["missing_seconds"]],
    )
    return np.asarray(idle, dtype=float) / 3600.0


def summed_columns(weight: str) -> list[str]:
    """The columns a group's figures are summed from, its jobs counted by `weight`."""
    return [
        *FIGURE_SUMS,
        weight,
        f"{weight}_waited",
        f"{weight}_wait_seconds",
        *WAIT_HISTOGRAMS[weight],
    ]


def jobs_matrix(frame: pd.DataFrame) -> np.ndarray:
    """The `matrix` that `grouped` (weight "jobs") and `figures_of` take, of `frame`'s rows.

    Built once for a frame, its rows can be taken for any subset of the frame's rows.
    """
    return _matrix(frame, summed_columns("jobs"))


def _matrix(frame: pd.DataFrame, names: Sequence[str]) -> np.ndarray:
    """These columns of `frame` as one float matrix, NaN as 0 (pandas' sum skips NaN)."""
    if not len(frame):
        return np.zeros((0, len(names)))
    matrix: np.ndarray = np.nan_to_num(frame[list(names)].to_numpy(dtype=float), nan=0.0)
    return matrix


def _exact(members: pd.DataFrame) -> dict[str, tuple[int, np.ndarray]]:
    """{group: (jobs, their known queue waits)} of the jobs counted one by one."""
    if not len(members):
        return {}
    jobs = members.drop_duplicates(["_key", "job_id"])
    codes, names = pd.factorize(jobs["_key"].to_numpy(dtype=object))
    waits = pd.to_numeric(jobs["queue_wait"]).to_numpy(dtype=float, na_value=np.nan)
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=len(names))
    parts = np.split(waits[order], np.cumsum(counts)[:-1])
    return {
        str(name): (int(counts[c]), part[~np.isnan(part)])
        for c, (name, part) in enumerate(zip(names, parts, strict=True))
    }


def _counts(
    folded_sums: np.ndarray,
    folded: np.ndarray,
    exact: Sequence[tuple[int, np.ndarray] | None],
    users: np.ndarray,
) -> list[tuple[int, int, float | None, float | None]]:
    """(jobs, users, queue wait mean, p95) per group: its folded counts plus `exact`.

    `folded_sums`: per group the folded jobs' weight, waited weight and wait seconds;
    `folded`: their waits, known by their histogram only (WAIT_HISTOGRAMS, rounded counts):
    where a group holds any, its 95th percentile is read from the buckets (within one
    bucket of numpy's); else it is numpy's of the exact waits.
    """
    waits = [e[1] if e is not None else np.zeros(0) for e in exact]
    n_exact = np.array([e[0] if e is not None else 0 for e in exact], dtype=np.int64)
    jobs = np.rint(folded_sums[:, 0]).astype(np.int64) + n_exact
    waited = folded_sums[:, 1] + np.array([len(w) for w in waits], dtype=float)
    known = waited > 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = (folded_sums[:, 2] + np.array([float(w.sum()) for w in waits])) / waited
    by_buckets = known & (folded.sum(axis=1) > 0)
    counts = folded[by_buckets]
    buckets: list[int] = np.flatnonzero(by_buckets).tolist()
    for row, i in enumerate(buckets):
        if len(waits[i]):
            counts[row] += np.bincount(wait_buckets(waits[i]), minlength=WAIT_BUCKETS)
    p95: list[float | None] = [None] * len(exact)
    for i, value in zip(buckets, histogram_percentiles(counts, 95.0).tolist(), strict=True):
        p95[i] = value
    exactly: list[int] = np.flatnonzero(known & ~by_buckets).tolist()
    for i in exactly:
        p95[i] = float(np.percentile(waits[i], 95.0))
    return [
        (int(j), int(u), float(m) if k else None, p)
        for j, u, m, k, p in zip(
            jobs.tolist(), users.tolist(), mean.tolist(), known.tolist(), p95, strict=True
        )
    ]


def _count_of(
    row: dict[str, Any],
    weight: str,
    folded: np.ndarray,
    exact: tuple[int, np.ndarray] | None,
    users: int,
) -> tuple[int, int, float | None, float | None]:
    """`_counts` of one group, its sums in `row`."""
    sums = np.array([[row[weight], row[f"{weight}_waited"], row[f"{weight}_wait_seconds"]]])
    return _counts(sums.astype(float), folded.reshape(1, -1), [exact], np.array([users]))[0]


def wait_buckets(waits: np.ndarray) -> np.ndarray:
    """`usage_rollup.wait_bucket` of every wait."""
    with np.errstate(divide="ignore", invalid="ignore"):
        bucket = np.floor(np.log2(np.maximum(waits, 1.0))).astype(np.int64) + 1
    return np.where(waits < 1.0, 0, np.minimum(bucket, WAIT_BUCKETS - 1))


def histogram_percentile(counts: np.ndarray, q: float) -> float:
    """numpy's (linear) percentile `q` of values known by their bucket counts only.

    The value of each rank is placed evenly inside its bucket (the last bucket, with no
    upper bound: its lower bound), then interpolated between ranks as numpy does.
    """
    return float(histogram_percentiles(np.asarray(counts, dtype=float).reshape(1, -1), q)[0])


def histogram_percentiles(counts: np.ndarray, q: float) -> np.ndarray:
    """`histogram_percentile` of each row of bucket counts (each row holding some)."""
    if not len(counts):
        return np.zeros(0)
    total = counts.sum(axis=1)
    cumulative = np.cumsum(counts, axis=1)
    rows = np.arange(len(counts))
    last = WAIT_BUCKETS - 1

    def value(rank: np.ndarray) -> np.ndarray:
        bucket = (cumulative <= rank[:, None]).sum(axis=1)
        low = np.where(bucket == 0, 0.0, 2.0 ** (bucket - 1.0))
        high = np.where(bucket == 0, 1.0, 2.0 ** bucket.astype(float))
        here = counts[rows, bucket]
        before = cumulative[rows, bucket] - here
        inside = low + (rank - before + 0.5) / here * (high - low)
        return np.where(bucket == last, low, inside)

    h = (total - 1) * q / 100.0
    lo = np.floor(h)
    a, b = value(lo), value(np.minimum(lo + 1, total - 1))
    result: np.ndarray = a + (h - lo) * (b - a)
    return result


def figures_of(
    sums: pd.DataFrame,
    members: pd.DataFrame,
    held_cost: bool,
    *,
    matrix: np.ndarray | None = None,
) -> dict[str, Any]:
    """The figures of every row together (the totals row); `matrix` as `_grouped` takes it."""
    names = [*FIGURE_SUMS, "jobs", "jobs_waited", "jobs_wait_seconds"]
    histogram = list(WAIT_HISTOGRAMS["jobs"])
    if matrix is None:
        matrix = _matrix(sums, [*names, *histogram])
    summed = matrix.sum(axis=0)
    totals = dict(zip(names, summed[: len(names)].tolist(), strict=True))
    exact = _exact(members.assign(_key="")) if len(members) else {}
    users = int(sums["user"].nunique()) if len(sums) else 0
    counted = _count_of(totals, "jobs", np.rint(summed[len(names) :]), exact.get(""), users)
    return _from_totals(totals, counted, held_cost)


def _from_totals(
    total: dict[str, Any], counted: tuple[int, int, float | None, float | None], held_cost: bool
) -> dict[str, Any]:
    """The ledger's figures of one group, from its sums and counts (FIGURE_KEYS)."""
    return ledger_figures.figures(total, ledger_figures.Counted(*counted), held_cost)
