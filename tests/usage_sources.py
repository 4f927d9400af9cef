"""The sources a report's sums come by, for tests that run over each (issue 24).

Every report reads one road: the usage rollups for the jobs folded at ingest and the raw
rows (summaries, intervals) of the others. The same jobs must give the same figures
whichever of the two holds them, so report tests run on three stores of the same rows:

- "folded": as ingest leaves it, every finished job with summaries in the rollups;
- "raw": nothing folded, every job listed unfolded (as jobs whose summaries have not
  landed yet), the rollups empty;
- "half": every other job folded back (`usage_rollup.refold`, the ingest's own fold).

A test takes them by the `usage_source` fixture (tests/conftest.py), one store per
source, or by `by_source`: the same store turned into each in turn, many reports built
from each in one pass, then folded back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.reports.rollups import build_report_from_rollups
from slurm_gpu.reports.summary import Report
from slurm_gpu.store import Store, usage_rollup
from slurm_gpu.store.schema import (
    job_usage,
    jobs,
    usage_across,
    usage_daily,
    usage_monthly,
    usage_unfolded,
)

SOURCES = ("folded", "raw", "half")
ROOT = Scope(Caller(0, "root"), True, reason="root")
T = TypeVar("T")


def as_source(store: Store, source: str) -> Store:
    """`store` with its jobs' usage moved to `source` (module docstring); returns it."""
    if source == "folded":
        return store
    j = jobs.c
    with store.writing(f"test: usage from {source} rows") as conn:
        for table in (job_usage, usage_daily, usage_monthly, usage_across, usage_unfolded):
            conn.execute(sa.delete(table))
        listed = sa.select(
            j.cluster, j.job_id, sa.func.coalesce(j.start_time, j.submit_time), j.end_time
        )
        conn.execute(
            sa.insert(usage_unfolded).from_select(
                ["cluster", "job_id", "began", "end_time"], listed
            )
        )
        if source == "half":
            for (cluster,) in conn.execute(sa.select(j.cluster).distinct()).all():
                ids = sorted(
                    int(i) for (i,) in conn.execute(sa.select(j.job_id).where(j.cluster == cluster))
                )
                usage_rollup.refold(conn, cluster, ids[::2])
    return store


def period_report(
    store: Store,
    group: str,
    *,
    since: float,
    until: float,
    now: float,
    cost: CostSettings | None = None,
    lag: float | None = None,
    scope: Scope = ROOT,
    **shape: Any,
) -> Report:
    """`slurm-gpu report <group>` of [since, until] as the command builds it (one road)."""
    return build_report_from_rollups(
        store, group, since=since, until=until, now=now, scope=scope, cost=cost, lag=lag, **shape
    )


def by_source(store: Store, build: Callable[[Store], T]) -> dict[str, T]:
    """{source: `build(store)` from it}, for each of SOURCES, of one store.

    `store` is read as it is (folded, as ingest leaves it), then turned into the raw and
    the half-folded source (`as_source`) and read again; the rollups are rebuilt from the
    raw rows at the end (`Store.rebuild_rollups`, the ingest's fold), so the store is
    folded again afterwards, on every backend.
    """
    built = {"folded": build(store)}
    try:
        for source in SOURCES:
            if source != "folded":
                built[source] = build(as_source(store, source))
    finally:
        store.rebuild_rollups()
    return built
