"""`slurm-gpu report monthly` is the same from every source of sums on every backend.

The SQL of store/monthly_reads.py (the utilization bins summed by the database, a CASE
in SELECT and GROUP BY) and the `job_usage` reads behind reports/monthly_rows.py, beside
the raw rows of the unfolded jobs, on SQLite, PostgreSQL and MariaDB: the synthetic store
of tests/synthetic_usage.py, its November in a time zone that cuts the UTC days under
every [cost] unit and charge for an admin, and for one user, is the same from the folded,
the raw-only and the half-folded store (tests/usage_sources.py).
"""

from __future__ import annotations

from slurm_gpu.access import Caller, Scope
from slurm_gpu.reports.monthly import MonthlyReport, build_monthly
from slurm_gpu.store import Store
from tests.synthetic_usage import COSTS, KOLKATA, assert_same_monthly, enforce, fill, monthly_env
from tests.usage_sources import by_source


def test_monthly_report_is_the_same_from_every_source(store: Store) -> None:
    """Every table for an admin under every [cost], and for u4, from every source."""
    fill(store)
    enforce(store)
    u4 = Scope(Caller(1004, "u4"), False)

    def build(s: Store) -> dict[str, MonthlyReport]:
        admin = {
            str(n): build_monthly(monthly_env(s, cost, KOLKATA), "2026-11")
            for n, cost in enumerate(COSTS)
        }
        return {**admin, "u4": build_monthly(monthly_env(s, COSTS[0], scope=u4), "2026-11")}

    reports = by_source(store, build)
    folded = reports["folded"]
    for n in range(len(COSTS)):
        report = folded[str(n)]
        assert report.utilization and report.waste_jobs and report.slots and report.actions
        assert any(u["gpus"] for u in report.utilization)
    assert {u["key"] for u in folded["u4"].users} == {"u4"}
    assert_same_monthly(reports)
