# The project writes `expected == actual` (DESIGN.md); ruff calls that a Yoda condition.
"""Revision 0008 on every backend: Slurm's SLUID of a job (`jobs.sluid`).

A store at 0007 upgrades to 0008 with every job row kept (its SLUID unknown: None); the
hooks' events then fill it, and a job's SLUID is never replaced by an event without one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from slurm_gpu.models import JobEvent, JobEventKind
from slurm_gpu.store import Store

T0 = 1_800_000_000.0
SLUID = "s3WHM8RV2YXQ00"


@pytest.fixture
def store_at_0007(store_url: str) -> Iterator[Store]:
    old = Store(store_url, cluster="alpha")
    old.upgrade("0007")
    yield old
    old.dispose()


def test_upgrade_from_0007_keeps_the_jobs_and_then_stores_sluids(store_at_0007: Store) -> None:
    store = store_at_0007
    job = {"cluster": "alpha", "job_id": 42, "user": "alice", "account": "physics",
           "gpus": 1, "start_time": T0, "end_time": T0 + 60, "state": "COMPLETED"}  # fmt: skip
    with store.writing("a job at 0007") as conn:
        assert "sluid" not in {c["name"] for c in sa.inspect(conn).get_columns("jobs")}
        conn.execute(sa.insert(sa.table("jobs", *map(sa.column, job))), [job])

    store.upgrade("0008")
    assert "0008" == store.current_revision()
    store.upgrade()  # to head: the read and write API read the newest revision's columns
    kept = store.job(42) or {}
    assert {**job, "sluid": None} == {k: kept[k] for k in (*job, "sluid")}

    store.add_events([JobEvent("gpu1", 43, JobEventKind.STARTED, T0, "bob", sluid=SLUID)])
    store.add_events([JobEvent("gpu1", 43, JobEventKind.ENDED, T0 + 9, "bob", exit_code=0)])
    assert (SLUID, T0 + 9) == ((store.job(43) or {})["sluid"], (store.job(43) or {})["end_time"])
    assert {43: SLUID} == store.sluids([42, 43, 44])
