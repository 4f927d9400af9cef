"""Revision 0012 on every backend: the longest folded job bounds the reads across an end.

`usage_extent` is raised by the refold of every ingest (the dialect's upsert keeping the
larger value) and never lowered by a shorter job; the month's report from the rollups,
whose reads of the jobs across its ends are a range of start times from it, is that of
raw rows, with a job longer than any before across the month's end (issue 16).
"""

from __future__ import annotations

import pytest

from slurm_gpu.store import Store, rollup_reads
from tests.unit.test_report_rollups import (
    COSTS,
    WINDOWS,
    H,
    _job_across,
    assert_same_report,
    fill,
    new_report,
    old_report,
)


def test_the_longest_job_is_kept_and_the_month_is_that_of_raw_rows(store: Store) -> None:
    fill(store)
    since, until = WINDOWS["month"]
    before = rollup_reads.longest_job(store)
    assert before is not None and 0 < before <= 50 * H
    _job_across(store, 960, since - 20 * 24 * H, until + 3 * 24 * H)
    assert rollup_reads.longest_job(store) == pytest.approx(53 * 24 * H)
    _job_across(store, 961, until - 2 * H, until + H)  # shorter: the longest stays
    assert rollup_reads.longest_job(store) == pytest.approx(53 * 24 * H)
    for group in ("user", "account"):
        assert_same_report(
            old_report(store, group, since, until, COSTS[0]),
            new_report(store, group, since, until, COSTS[0]),
        )
