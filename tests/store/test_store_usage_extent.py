"""Revision 0012 on every backend: the longest folded job bounds the reads across an end.

`usage_extent` is raised by the refold of every ingest (the dialect's upsert keeping the
larger value) and never lowered by a shorter job; the month's report, whose reads of the
jobs across its ends are a range of start times from it, is the same from every source of
sums (tests/usage_sources.py), with a job longer than any before across the month's end
(issue 16).
"""

from __future__ import annotations

import pytest

from slurm_gpu.store import Store, rollup_reads
from tests.synthetic_usage import (
    COSTS,
    WINDOWS,
    H,
    assert_same_reports,
    fill,
    job_across,
    report,
)
from tests.usage_sources import by_source


def test_the_longest_job_is_kept_and_the_month_is_the_same_from_every_source(
    store: Store,
) -> None:
    """A longer job raises the longest job, a shorter one leaves it; reports agree."""
    fill(store)
    since, until = WINDOWS["month"]
    before = rollup_reads.longest_job(store)
    assert 0 < before <= 50 * H
    job_across(store, 960, since - 20 * 24 * H, until + 3 * 24 * H)
    assert rollup_reads.longest_job(store) == pytest.approx(53 * 24 * H)
    job_across(store, 961, until - 2 * H, until + H)  # shorter: the longest stays
    assert rollup_reads.longest_job(store) == pytest.approx(53 * 24 * H)
    assert_same_reports(
        by_source(
            store, lambda s: {g: report(s, g, since, until, COSTS[0]) for g in ("user", "account")}
        )
    )
