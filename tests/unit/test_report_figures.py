"""The report figures (reports/figures.py) against a plain pandas group-by, on random rows.

`Groups` adds each group's ledger sums with `np.add.reduceat`, pandas pairwise: the
figures agree up to the order of their additions (`same`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_gpu.ledger import figures as ledger_figures
from slurm_gpu.ledger.figures import FIGURE_KEYS, GPM_MEANS
from slurm_gpu.ledger.sums import ROW_COLUMNS, row_sums
from slurm_gpu.reports.figures import (
    GPM_COLUMNS,
    JOB_TOTAL_KEYS,
    Groups,
    figures,
    grouped_figures,
    idle_seconds,
    physical_seconds,
)

NAN = float("nan")
# Unknown values arrive as NaN (numbers) or None (texts), as in a prorated frame.
numbers = st.one_of(st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False), st.just(NAN))
percent = st.one_of(st.floats(0.0, 100.0, allow_nan=False), st.just(NAN))
names = st.one_of(st.sampled_from(["a", "b", "c"]), st.none())
COLUMNS = {
    "job_id": st.integers(1, 6),
    "user": names,
    "account": names,
    "gpu_seconds": numbers,
    "active_seconds": numbers,
    "missing_seconds": numbers,
    "util_mean_percent": percent,
    "mem_gib_seconds": numbers,
    "energy_joules": numbers,
    "cost": numbers,
    "queue_wait": numbers,
    # GPM (Hopper+): NaN means where the GPU has none, seconds NaN or 0 there.
    "gpm_seconds": numbers,
    "sm_active_mean_percent": percent,
    "sm_occupancy_mean_percent": percent,
    "tensor_active_mean_percent": percent,
    "dram_bw_mean_percent": percent,
    "idle_held_cost": numbers,
    # The job's suspended seconds (sacct's Suspended; NaN: none recorded).
    "suspended_seconds": numbers,
}
rows = st.lists(st.fixed_dictionaries(COLUMNS), max_size=40).map(
    lambda records: pd.DataFrame(records, columns=list(COLUMNS))
)


def close(value: Any) -> Any:
    """A float, equal to those up to the order of additions; anything else exactly."""
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-9, abs=1e-9, nan_ok=True)
    return value


def same(groups: list[tuple[Any, dict[str, Any]]]) -> list[tuple[Any, dict[str, Any]]]:
    """Each group's figures, its floats `close`."""
    return [(key, {name: close(v) for name, v in values.items()}) for key, values in groups]


def time_split(part: pd.DataFrame) -> tuple[float, float | None, float | None, float]:
    """GPU-seconds, active, idle, missing: idle is measured time only, never missing time.

    A row's missing seconds count up to its GPU-seconds; where GPU-seconds were held but
    none was measured, active and idle are unknown.
    """
    gpu = part["gpu_seconds"].fillna(0.0)
    gpu_seconds = float(part["gpu_seconds"].sum())
    missing_rows = np.minimum(part["missing_seconds"].fillna(0.0), gpu)
    missing = float(missing_rows.sum())
    measured = gpu_seconds - missing
    # Summed differences leave a rounding residue: the ledger's share counts as none.
    if gpu_seconds > 0 and measured <= 1e-9 * gpu_seconds:
        return gpu_seconds, None, None, missing
    active = float(np.minimum(part["active_seconds"].fillna(0.0), gpu - missing_rows).sum())
    return gpu_seconds, active, max(measured - active, 0.0), missing


def pandas_gpm(part: pd.DataFrame) -> dict[str, Any]:
    """GPM seconds, the GPM means weighted by GPM seconds, effective seconds (pandas)."""
    out: dict[str, Any] = {"gpm_seconds": float(part["gpm_seconds"].sum())}
    for name in (*GPM_MEANS, "effective"):
        column = "sm_active_mean_percent" if name == "effective" else name
        known = part[part[column].notna()]
        weight = known["gpm_seconds"].fillna(0.0)
        total = float((known[column] * weight).sum())
        if name == "effective":
            out["effective_seconds"] = total / 100.0 if float(weight.sum()) > 0 else None
        else:
            out[name] = total / float(weight.sum()) if float(weight.sum()) > 0 else None
    return out


def without_suspended(part: pd.DataFrame) -> pd.DataFrame:
    """The rows with their suspended time taken out of idle, then missing, then active.

    Slurm does not charge suspended time: a row's GPU-seconds become its span less it.
    """
    span = part["gpu_seconds"].fillna(0.0)
    lost = np.minimum(part["missing_seconds"].fillna(0.0), span)
    busy = np.minimum(part["active_seconds"].fillna(0.0), span - lost)
    paused = np.minimum(part["suspended_seconds"].fillna(0.0), span)
    from_idle = np.minimum(paused, span - lost - busy)
    from_missing = np.minimum(paused - from_idle, lost)
    out = part.copy()
    out["gpu_seconds"] = (span - paused).where(part["gpu_seconds"].notna())
    out["missing_seconds"] = lost - from_missing
    out["active_seconds"] = busy - (paused - from_idle - from_missing)
    out["suspended_seconds"] = paused
    return out


def pandas_figures(part: pd.DataFrame) -> dict[str, Any]:
    """The figures as a plain pandas computation over one group's rows."""
    suspended = float(np.minimum(part["suspended_seconds"].fillna(0.0),
                                 part["gpu_seconds"].fillna(0.0)).sum())  # fmt: skip
    part = without_suspended(part)
    gpu_seconds, active, idle, missing = time_split(part)
    gpm = pandas_gpm(part)
    known = part[part["util_mean_percent"].notna()]
    weight = float(known["gpu_seconds"].sum())
    weighted = (known["util_mean_percent"] * known["gpu_seconds"]).sum()
    waits = part["queue_wait"][~part["job_id"].duplicated()].dropna()
    energy = part["energy_joules"].dropna()
    return {
        "jobs": int(part["job_id"].nunique()),
        "users": int(part["user"].nunique()),
        "gpu_hours": gpu_seconds / 3600.0,
        "gpu_mem_hours": float(part["mem_gib_seconds"].sum()) / 3600.0,
        "util_mean_percent": float(weighted / weight) if weight > 0 else None,
        "active_gpu_hours": None if active is None else active / 3600.0,
        "idle_gpu_hours": None if idle is None else idle / 3600.0,
        "idle_percent": 100.0 * idle / gpu_seconds if idle is not None and gpu_seconds else None,
        "missing_gpu_hours": missing / 3600.0,
        "missing_percent": 100.0 * missing / gpu_seconds if gpu_seconds > 0 else None,
        "suspended_gpu_hours": suspended / 3600.0,
        "energy_kwh": float(energy.sum()) / 3.6e6 if len(energy) else None,
        "cost": float(part["cost"].sum()),
        "queue_wait_mean": float(waits.mean()) if len(waits) else None,
        "queue_wait_p95": float(waits.quantile(0.95)) if len(waits) else None,
        "gpm_gpu_hours": gpm["gpm_seconds"] / 3600.0,
        "gpm_percent": 100.0 * gpm["gpm_seconds"] / gpu_seconds if gpu_seconds > 0 else None,
        **{name: gpm[name] for name in GPM_MEANS},
        "effective_gpu_hours": None
        if gpm["effective_seconds"] is None
        else gpm["effective_seconds"] / 3600.0,
        "idle_held_cost": float(part["idle_held_cost"].sum()),
    }


@settings(max_examples=200, deadline=None)
@given(rows)
def test_grouped_figures_are_a_pandas_group_by(frame: pd.DataFrame) -> None:
    """Per account (rows of no account in none), the figures pandas computes."""
    expected = [(key, pandas_figures(part)) for key, part in frame.groupby("account", sort=True)]
    actual = grouped_figures(frame, "account")
    assert [list(FIGURE_KEYS)] * len(actual) == [list(f) for _, f in actual]
    assert same(expected) == actual


@settings(max_examples=200, deadline=None)
@given(rows)
def test_totals_are_the_group_of_every_row(frame: pd.DataFrame) -> None:
    """The totals are pandas' figures over every row, and those of one group of every row."""
    total = figures(frame)
    assert list(FIGURE_KEYS) == list(total)
    assert same([(None, pandas_figures(frame))]) == [(None, total)]
    if len(frame):
        assert same([("x", total)]) == grouped_figures(frame.assign(everyone="x"), "everyone")


@settings(max_examples=200, deadline=None)
@given(rows)
def test_totals_add_up_the_groups(frame: pd.DataFrame) -> None:
    """The totals' GPU-hours, active GPU-hours, GPU-memory hours and cost add up the groups'.

    Every row is in some group: users with no name are one group of their own.
    """
    frame = frame.assign(user=frame["user"].fillna(""))
    groups = [f for _, f in grouped_figures(frame, "user")]
    total = figures(frame)
    for key in (
        "gpu_hours",
        "active_gpu_hours",
        "missing_gpu_hours",
        "gpu_mem_hours",
        "cost",
        "gpm_gpu_hours",
        "effective_gpu_hours",
        "idle_held_cost",
    ):
        expected = math.fsum(g[key] or 0.0 for g in groups)
        assert expected == pytest.approx(total[key] or 0.0, rel=1e-12, abs=1e-9)
    assert total["users"] == sum(g["users"] for g in groups)


@settings(max_examples=200, deadline=None)
@given(rows)
def test_job_totals_are_a_pandas_group_by(frame: pd.DataFrame) -> None:
    """A job's totals: its GPU rows' sums (utilization weighted, else the plain mean)."""
    frame = frame.assign(
        util_max_percent=frame["util_mean_percent"],
        mem_max_bytes=frame["mem_gib_seconds"],
        gpu_model="A100",
        source="summary",
        data_until=frame["queue_wait"],
    )
    expected = []
    for key, whole in frame.groupby("job_id", sort=True):
        part = without_suspended(whole)
        known = part[part["util_mean_percent"].notna()]
        weight = float(known["gpu_seconds"].sum())
        util = (
            float((known["util_mean_percent"] * known["gpu_seconds"]).sum() / weight)
            if weight > 0
            else (float(known["util_mean_percent"].mean()) if len(known) else None)
        )
        gpu_seconds, active, idle, missing = time_split(part)
        umax = part["util_max_percent"].dropna()
        mem = part["mem_max_bytes"].dropna()
        energy = part["energy_joules"].dropna()
        totals = {
            "gpu_model": "A100",
            "gpu_seconds": gpu_seconds,
            "active_seconds": active,
            "idle_seconds": idle,
            "missing_seconds": missing,
            "suspended_gpu_seconds": float(part["suspended_seconds"].sum()),
            "util_mean_percent": util,
            "util_max_percent": float(umax.max()) if len(umax) else None,
            "mem_max_bytes": int(mem.max()) if len(mem) else None,
            "mem_gib_seconds": float(part["mem_gib_seconds"].sum()),
            "energy_joules": float(energy.sum()) if len(energy) else None,
            "cost": float(part["cost"].sum()),
            "data_until": part["data_until"].max(),
            "source": "summary",
            **pandas_gpm(part),
            "idle_held_cost": float(part["idle_held_cost"].sum()),
        }
        expected.append((key, totals))
    actual = Groups(frame, "job_id").job_totals()
    assert [list(JOB_TOTAL_KEYS)] * len(actual) == [list(t) for _, t in actual]
    # data_until may be NaN on both sides: compare it as text.
    assert same(_comparable(expected)) == _comparable(actual)


def _comparable(groups: list[tuple[Any, dict[str, Any]]]) -> list[tuple[Any, dict[str, Any]]]:
    return [(k, {**t, "data_until": repr(float(t["data_until"]))}) for k, t in groups]


def test_rows_without_gpm_have_unknown_gpm_figures() -> None:
    """Rows from before GPM (no GPM columns) or of GPUs without it: blank, never 0 %."""
    old = pd.DataFrame(
        {"job_id": [1], "user": ["a"], "account": ["x"], "gpu_seconds": [3600.0],
         "active_seconds": [3600.0], "missing_seconds": [0.0], "util_mean_percent": [97.0],
         "mem_gib_seconds": [0.0], "energy_joules": [1.0], "cost": [2.0], "queue_wait": [0.0]}
    )  # fmt: skip
    unmeasured = old.assign(gpm_seconds=0.0, **dict.fromkeys(GPM_MEANS, NAN))
    for frame in (old, unmeasured):
        total = figures(frame)
        assert [None] * 5 == [total[k] for k in (*GPM_MEANS, "effective_gpu_hours")]
        assert (0.0, 0.0, None) == (
            total["gpm_gpu_hours"],
            total["gpm_percent"],
            total["idle_held_cost"],
        )
    assert set(GPM_COLUMNS) <= set(unmeasured.columns)


def test_gpm_means_weight_measured_seconds_only() -> None:
    """An H100 measured 3000 s at 30 % SM next to an A100 (no GPM): 30 %, over 3000 s only."""
    frame = pd.DataFrame(
        {"job_id": [1, 1], "user": ["a", "a"], "account": ["x", "x"],
         "gpu_seconds": [3600.0, 3600.0], "active_seconds": [3600.0, 3600.0],
         "missing_seconds": [0.0, 0.0], "util_mean_percent": [90.0, 90.0],
         "mem_gib_seconds": [0.0, 0.0], "energy_joules": [1.0, 1.0], "cost": [1.0, 1.0],
         "queue_wait": [0.0, 0.0], "gpm_seconds": [3000.0, 0.0],
         "sm_active_mean_percent": [30.0, NAN], "sm_occupancy_mean_percent": [20.0, NAN],
         "tensor_active_mean_percent": [60.0, NAN], "dram_bw_mean_percent": [10.0, NAN]}
    )  # fmt: skip
    total = figures(frame)
    assert (30.0, 20.0, 60.0, 10.0) == tuple(total[k] for k in GPM_MEANS)
    assert 3000.0 * 0.3 / 3600.0 == pytest.approx(total["effective_gpu_hours"])
    assert 100.0 * 3000.0 / 7200.0 == pytest.approx(total["gpm_percent"])


# A GPU slot's share of its GPU per job (NaN: a row from before slots, a whole GPU).
SHARES = {1: 1.0, 2: 1 / 7, 3: 0.5, 4: NAN, 5: 3 / 7, 6: 1.0}


@settings(max_examples=200, deadline=None)
@given(rows)
def test_groups_are_the_ledgers_figures_of_their_summed_row_sums(frame: pd.DataFrame) -> None:
    """A group's figures are `ledger.figures` of its rows' `row_sums` added (issue 24).

    The same road as `slurm-gpu report` (reports/grouped.py): no second formula here.
    """
    frame = frame.assign(share=frame["job_id"].map(SHARES))
    sums = pd.DataFrame(
        row_sums({c: frame[c].to_numpy(dtype=float) for c in ROW_COLUMNS if c in frame}, 0.0)
    ).assign(
        cost=frame["cost"].fillna(0.0),
        idle_held_cost=frame["idle_held_cost"].fillna(0.0),
        account=frame["account"],
    )
    expected = []
    for key, part in sums.groupby("account", sort=True):
        counted = pandas_figures(frame.loc[part.index])
        total = {str(k): v for k, v in part.drop(columns="account").sum().items()}
        figures = ledger_figures.figures(
            total,
            ledger_figures.Counted(
                counted["jobs"],
                counted["users"],
                counted["queue_wait_mean"],
                counted["queue_wait_p95"],
            ),
            held_cost=True,
        )
        expected.append((key, {name: figures[name] for name in FIGURE_KEYS}))
        assert close(total["physical_seconds"]) == physical_seconds(frame, "account")[key]
    assert same(expected) == grouped_figures(frame, "account")


@settings(max_examples=100, deadline=None)
@given(rows)
def test_idle_seconds_add_up_to_the_idle_gpu_hours(frame: pd.DataFrame) -> None:
    """Each row's idle seconds add up to its group's idle GPU-hours (0 where unknown)."""
    frame = frame.assign(user=frame["user"].fillna(""))
    idle = pd.Series(idle_seconds(frame), index=frame.index)
    assert (idle >= 0).all()
    for (_, part), (_, group) in zip(
        frame.groupby("user", sort=True), grouped_figures(frame, "user"), strict=True
    ):
        assert close(3600.0 * (group["idle_gpu_hours"] or 0.0)) == float(idle[part.index].sum())


def test_rows_lacking_columns_group_by_a_key_with_gaps() -> None:
    """Rows without missing seconds or GPM columns (older rows), some of no account.

    Those columns' figures are as if every row had them unknown (NaN).
    """
    frame = pd.DataFrame(
        {"job_id": [1, 2, 3], "user": ["a", "b", "a"], "account": ["x", None, "y"],
         "gpu_seconds": [3600.0, 7200.0, 60.0], "active_seconds": [1800.0, 0.0, 60.0],
         "util_mean_percent": [50.0, NAN, 90.0], "mem_gib_seconds": [1.0, 2.0, 3.0],
         "energy_joules": [NAN, 5.0, 6.0], "cost": [1.0, 2.0, 3.0], "queue_wait": [5.0, 6.0, 7.0]}
    )  # fmt: skip
    unknown = frame.assign(missing_seconds=NAN, gpm_seconds=NAN, **dict.fromkeys(GPM_MEANS, NAN))
    assert grouped_figures(unknown, "account") == grouped_figures(frame, "account")
    assert [("x", 1800.0 / 3600.0), ("y", 0.0)] == [
        (key, f["idle_gpu_hours"]) for key, f in grouped_figures(frame, "account")
    ]
