"""The exporter's usage counters from the usage rollups (revision 0010, issue 16).

On its first read of a store at 0010, the exporter sums the jobs that ended before the
settling horizon from `job_usage` in the database instead of reading every raw row ever
stored; the rest comes from raw rows as before. The counters must be those of the raw
way: GPU-hours and cost per user and account, and active GPU-hours as the reports clip
them (at most the measured part of the held time), over the synthetic store of
tests/unit/test_report_rollups.py (every GPU shape, two nodes, a requeued job, missing
data, a running job and an ended one whose summary never came).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config import Config
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.metrics.collector import ClusterCollector
from slurm_gpu.reports.usage import load_usage
from slurm_gpu.store import Store
from slurm_gpu.testing import FixedClock
from tests.unit.test_exporter import fake_slurm
from tests.unit.test_report_rollups import COSTS, NOW, fill

ROOT = Scope(Caller(0, "root"), True, reason="root")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'store.db'}", cluster="c1") as s:
        s.upgrade()
        fill(s)
        yield s


def raw_counters(
    store: Store, cost: CostSettings | None
) -> dict[tuple[str, str], tuple[float, float, float]]:
    """{(user, account): (GPU-hours, active GPU-hours clipped, cost)} from every raw row."""
    usage = load_usage(
        store, since=None, until=None, now=NOW, sacct_jobs=None, scope=ROOT, cost=cost
    )
    gpus = usage.gpus.merge(usage.jobs[["job_id", "user", "account"]], on="job_id")
    held = gpus["gpu_seconds"].astype(float).fillna(0.0).to_numpy()
    missing = np.minimum(gpus["missing_seconds"].astype(float).fillna(0.0).to_numpy(), held)
    active = np.minimum(gpus["active_seconds"].astype(float).fillna(0.0).to_numpy(), held - missing)
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


@pytest.mark.parametrize("cost", [None, *COSTS[:3]])
def test_exporter_counters_from_rollups_equal_raw_rows(
    store: Store, cost: CostSettings | None
) -> None:
    """Every (user, account) counter: GPU-hours, active GPU-hours and cost."""
    config = dataclasses.replace(Config(), cost=cost) if cost else Config()
    collector = ClusterCollector(config, store, fake_slurm(), clock=FixedClock(NOW))
    usage = collector.snapshot().usage
    expected = raw_counters(store, cost)
    assert sorted(usage) == sorted(expected)
    for key, (hours, active, money) in expected.items():
        got = usage[key]
        assert got[0] == pytest.approx(hours, rel=1e-9), key
        assert got[1] == pytest.approx(active, rel=1e-9), key
        assert got[2] == pytest.approx(money if cost else 0.0, rel=1e-9, abs=1e-9), key
