"""`slurm-gpu report monthly` from the usage rollups equals raw rows on every backend.

The SQL of store/monthly_reads.py (the utilization bins summed by the database, a CASE
in SELECT and GROUP BY) and the `job_usage` reads behind reports/monthly_rollups.py, on
SQLite, PostgreSQL and MariaDB: the synthetic store of tests/unit/test_report_rollups.py,
its November in a time zone that cuts the UTC days, for an admin and for one user.
"""

from __future__ import annotations

from slurm_gpu.access import Caller, Scope
from slurm_gpu.store import Store
from tests.unit.test_monthly_rollups import (
    HELD_COSTS,
    KOLKATA,
    assert_same_report,
    both,
    enforce,
    env,
)
from tests.unit.test_report_rollups import fill


def test_monthly_report_from_rollups_equals_raw_rows(store: Store) -> None:
    fill(store)
    enforce(store)
    raw, folded = both(env(store, HELD_COSTS[1], KOLKATA), "2026-11")
    assert raw.utilization and raw.waste_jobs and raw.slots and raw.actions
    assert any(u["gpus"] for u in folded.utilization)
    assert_same_report(raw, folded)
    raw, folded = both(env(store, HELD_COSTS[0], scope=Scope(Caller(1004, "u4"), False)), "2026-11")
    assert {u["key"] for u in folded.users} == {"u4"}
    assert_same_report(raw, folded)
