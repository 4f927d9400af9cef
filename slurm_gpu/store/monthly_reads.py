"""The SQL behind `slurm-gpu report monthly` from the usage rollups (issue 16).

reports/monthly_rollups.py reads the month's `job_usage` rows (store/rollup_reads.py
`boundary_rows`); what those rows lack is each GPU row's mean utilization (a `job_usage`
row sums a job's GPU rows on one place), which the utilization table bins row by row.
It is summed here by the database: per folded job and bin, GPU-seconds and rows, so
what crosses into Python grows with jobs x bins, not with GPU rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from slurm_gpu.store.schema import job_gpu_summaries, jobs
from slurm_gpu.store.store import Store

NO_READINGS = -1  # the bin of a row with no utilization (unknown, never 0)
OUTSIDE = -2  # a mean outside every bin (below 0, above the last edge): in none


def utilization_bins(
    store: Store, since: float, until: float, edges: Sequence[float]
) -> list[tuple[Any, ...]]:
    """(job_id, bin, GPU-seconds, rows) of the folded jobs of [since, until].

    Folded jobs: a start, an end and summaries (store/usage_rollup.py), with
    end >= since and start <= until (the `job_usage` rows' test). Bin i: a mean in
    [edges[i], edges[i+1]); NO_READINGS: none; OUTSIDE: in no bin. The edges are inline
    literals, so that the bin expression in SELECT and GROUP BY is one to PostgreSQL.
    """
    s, j = job_gpu_summaries.c, jobs.c
    util = s.util_mean_percent

    def literal(value: float) -> sa.ColumnElement[Any]:
        return sa.literal_column(repr(float(value)))

    whens: list[tuple[Any, Any]] = [(util.is_(None), sa.literal_column(str(NO_READINGS)))]
    for i, (low, high) in enumerate(itertools.pairwise(edges)):
        inside = sa.and_(util >= literal(low), util < literal(high))
        whens.append((inside, sa.literal_column(str(i))))
    binned = sa.case(*whens, else_=sa.literal_column(str(OUTSIDE))).label("util_bin")
    query = (
        sa.select(s.job_id, binned, sa.func.sum(s.gpu_seconds), sa.func.count())
        .select_from(
            job_gpu_summaries.join(jobs, sa.and_(j.cluster == s.cluster, j.job_id == s.job_id))
        )
        .where(
            s.cluster == store.cluster,
            j.start_time.is_not(None),
            j.end_time.is_not(None),
            j.end_time >= since,
            j.start_time <= until,
        )
        .group_by(s.job_id, binned)
    )
    with store.reading("reading the month's utilization by GPU row") as conn:
        return [tuple(r) for r in conn.execute(query)]
