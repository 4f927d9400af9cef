"""The exporter's usage counters from the usage rollups (revision 0010, issues 16 and 24).

On its first read of a store, the exporter sums the jobs that ended before the settling
horizon from the rollups in the database (every month's `usage_monthly` less the folded
jobs ended since) instead of reading every raw row or `job_usage` row ever stored;
the jobs not folded and the rest come from raw rows. The counters must be those of every
raw row (`load_usage`): GPU-hours and cost per user and account, and active GPU-hours as
the reports clip them (at most the measured part of the held time), over the synthetic
store of tests/synthetic_usage.py (every GPU shape, two nodes, a requeued job, missing
data, a running job and an ended one whose summary never came), from each source of sums
(tests/usage_sources.py: folded, raw-only, half-folded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config import Config
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.metrics.collector import SETTLE_SECONDS, ClusterCollector
from slurm_gpu.reports.usage import load_usage
from slurm_gpu.store import Store
from slurm_gpu.store.schema import job_usage
from slurm_gpu.testing import FixedClock
from tests.synthetic_usage import COSTS, NOW, copied, synthetic_file
from tests.unit.test_exporter import fake_slurm
from tests.usage_sources import by_source

ROOT = Scope(Caller(0, "root"), True, reason="root")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_file(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture
def store(synthetic: Path, tmp_path: Path) -> Iterator[Store]:
    """A copy of the synthetic store (tests/synthetic_usage.py), folded as ingest left it."""
    with copied(synthetic, tmp_path) as s:
        yield s


def raw_counters(
    store: Store, cost: CostSettings | None
) -> dict[tuple[str, str], tuple[float, float, float]]:
    """{(user, account): (GPU-hours, active GPU-hours clipped, cost)} from every raw row.

    Worked out here by hand from the GPU rows, their job's suspended seconds included.
    """
    usage = load_usage(
        store, since=None, until=None, now=NOW, sacct_jobs=None, scope=ROOT, cost=cost
    )
    gpus = usage.gpus.merge(usage.jobs[["job_id", "user", "account"]], on="job_id")
    span = gpus["gpu_seconds"].astype(float).fillna(0.0).to_numpy()
    missing = np.minimum(gpus["missing_seconds"].astype(float).fillna(0.0).to_numpy(), span)
    busy = np.minimum(gpus["active_seconds"].astype(float).fillna(0.0).to_numpy(), span - missing)
    # The job's suspended seconds leave its held time (Slurm's charge): idle time first,
    # then missing, then active.
    paused = np.minimum(gpus["suspended_seconds"].astype(float).fillna(0.0).to_numpy(), span)
    from_idle = np.minimum(paused, span - missing - busy)
    from_missing = np.minimum(paused - from_idle, missing)
    held = span - paused
    active = busy - (paused - from_idle - from_missing)
    money = gpus["cost"].astype(float).fillna(0.0).to_numpy() if cost else np.zeros(len(gpus))
    out: dict[tuple[str, str], list[float]] = {}
    for user, account, h, a, c in zip(
        gpus["user"], gpus["account"], held, active, money, strict=True
    ):
        sums = out.setdefault((str(user), str(account)), [0.0, 0.0, 0.0])
        sums[0] += float(h) / 3600.0
        sums[1] += float(a) / 3600.0
        sums[2] += float(c)
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def counters(
    store: Store, cost: CostSettings | None, settle_seconds: float = SETTLE_SECONDS
) -> dict[tuple[str, str], tuple[float, float, float]]:
    """The exporter's first snapshot of the usage counters, under `cost`."""
    config = dataclasses.replace(Config(), cost=cost) if cost else Config()
    collector = ClusterCollector(
        config, store, fake_slurm(), clock=FixedClock(NOW), settle_seconds=settle_seconds
    )
    return collector.snapshot().usage


def assert_counters(
    got: dict[tuple[str, str], tuple[float, float, float]],
    expected: dict[tuple[str, str], tuple[float, float, float]],
    priced: bool,
) -> None:
    assert sorted(got) == sorted(expected)
    for key, (hours, active, money) in expected.items():
        assert got[key][0] == pytest.approx(hours, rel=1e-9), key
        assert got[key][1] == pytest.approx(active, rel=1e-9), key
        assert got[key][2] == pytest.approx(money if priced else 0.0, rel=1e-9, abs=1e-9), key


@pytest.mark.parametrize(
    "cost",
    [None, *COSTS],
    ids=["no-cost", *(f"{c.unit}-{c.charge}" for c in COSTS)],
)
def test_exporter_counters_from_rollups_equal_raw_rows(
    store: Store, cost: CostSettings | None
) -> None:
    """Every (user, account) counter: GPU-hours, active GPU-hours and cost."""
    assert_counters(counters(store, cost), raw_counters(store, cost), cost is not None)


def test_folded_jobs_ended_inside_the_settling_window_are_counted_once(store: Store) -> None:
    """The settled part is every month's rollups less the folded jobs ended since.

    A settling window of 30 days holds most of the synthetic folded jobs: they are read
    from raw rows, so the rollups' part must leave them out, or they count twice.
    """
    settle = 30 * 24 * 3600.0
    with store.engine.connect() as conn:
        folded_since = conn.execute(
            sa.select(sa.func.count()).where(job_usage.c.end_time >= NOW - settle)
        ).scalar_one()
    assert folded_since > 0
    cost = COSTS[0]
    assert_counters(counters(store, cost, settle), raw_counters(store, cost), True)


def test_exporter_counters_are_the_same_from_every_source(store: Store) -> None:
    """The counters of jobs read from raw rows are those of the same jobs folded.

    The raw-only and half-folded stores (tests/usage_sources.py) hold jobs with
    summaries that are not folded: the exporter reads them from raw rows (`_per_job`),
    and must clip their active time to the measured part of the held time as the fold
    and the reports do.
    """
    expected = raw_counters(store, None)
    got = by_source(store, lambda s: counters(s, None))
    assert_counters(got["folded"], expected, False)
    for source in ("raw", "half"):
        assert_counters(got[source], expected, False)
