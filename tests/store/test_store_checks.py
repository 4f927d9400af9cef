"""store/checks.py's SQL on every backend (issue 25 item 3, `slurm-gpu db check`).

Overlapping and negative intervals, summaries without a job, the open jobs.

The window functions (LAG, MAX over the preceding rows) run as written on SQLite,
PostgreSQL and MariaDB; the server backends carry the `db` marker (tests/store/conftest.py).
"""

from __future__ import annotations

from slurm_gpu.models import GpuInterval, JobGpuSummary
from slurm_gpu.store import Store
from slurm_gpu.store.checks import (
    Interval,
    OpenJob,
    OrphanSummaries,
    SlotOverlaps,
    all_open_jobs,
    interval_overlaps,
    negative_intervals,
    orphan_summaries,
)

T0 = 1_790_000_000.0


def interval(
    start: float,
    end: float,
    job_id: int | None,
    slot: str = "GPU-1",
    node: str = "gpu1",
    covered: float | None = None,
) -> GpuInterval:
    """A whole-GPU interval of `node`'s `slot` (its UUID), T0-relative times.

    `covered`: its measured seconds (default all of it, end - start).
    """
    return GpuInterval(
        node=node,
        gpu_uuid=slot,
        period_start=T0 + start,
        period_end=T0 + end,
        job_id=job_id,
        util_mean_percent=50.0,
        util_max_percent=60.0,
        util_min_percent=40.0,
        util_sample_count=6,
        active_seconds=1.0,
        covered_seconds=max(end - start, 0.0) if covered is None else covered,
        mem_used_max_bytes=None,
        mem_total_bytes=None,
        power_mean_watts=None,
        energy_joules=None,
        temperature_max_celsius=None,
        ecc_errors_total=None,
    )


def summary(job_id: int, gpu: str, start: float, end: float) -> JobGpuSummary:
    """A summary of `job_id` on gpu1's `gpu`, T0-relative times."""
    return JobGpuSummary(
        job_id=job_id,
        node="gpu1",
        gpu_uuid=gpu,
        gpu_model="A100",
        start=T0 + start,
        end=T0 + end,
        gpu_seconds=end - start,
        util_mean_percent=None,
        util_max_percent=None,
        active_seconds=0.0,
        mem_max_bytes=None,
        mem_gib_seconds=0.0,
        energy_joules=None,
        reading_count=0,
        missing_seconds=end - start,
        user="alice",
        account="physics",
        partition="gpu",
    )


def at(node: str, slot: str, start: float, end: float, job_id: int | None) -> Interval:
    """The Interval a check reports, T0-relative times."""
    return Interval(node, slot, T0 + start, T0 + end, job_id)


def test_back_to_back_intervals_and_other_slots_do_not_overlap(store: Store) -> None:
    """Intervals that touch, and the same times on another slot or node: no finding."""
    store.add_intervals(
        [
            interval(0, 60, 1),
            interval(60, 120, 1),
            interval(0, 60, 2, slot="GPU-2"),
            interval(30, 90, 3, node="gpu2"),
        ]
    )
    report = interval_overlaps(store)
    assert (0, 0, ()) == (report.overlaps.total, report.slots.total, report.overlaps.shown)


def test_envelopes_of_a_short_job_and_the_unallocated_time_around_it_are_clean(
    store: Store,
) -> None:
    """A job of 0.5 s inside one 5-s period: the unallocated row spans it, nothing twice.

    The spool merges a period's pieces of one job (unallocated: none) into one row: its
    envelope [0, 5) covers the job's [3.2, 3.7), its covered seconds the 4.5 s around it.
    A second short job in the same period, and the next period's row, are clean too.
    """
    store.add_intervals(
        [
            interval(0, 5, None, covered=4.0),
            interval(1.0, 1.5, 8),
            interval(3.2, 3.7, 7),
            interval(5, 10, None),
        ]
    )
    report = interval_overlaps(store)
    assert (0, ()) == (report.overlaps.total, report.overlaps.shown)
    # The same rows with the unallocated row claiming all of its 5 s: counted twice.
    store.add_intervals(
        [interval(0, 5, None, covered=5.0, slot="GPU-2"), interval(3, 4, 9, slot="GPU-2")]
    )
    found = interval_overlaps(store)
    assert [(o.interval.job_id, o.previous.job_id) for o in found.overlaps.shown] == [(9, None)]


def test_every_interval_inside_an_earlier_long_one_is_found(store: Store) -> None:
    """A [0,100) covers B [10,20) and C [30,40): both found, against the running max end.

    B's previous row is A, the one it overlaps; C's previous row, B, ended before C began,
    so the overlapped one is an earlier interval, ending at A's end. D [100,160) touches.
    """
    store.add_intervals(
        [interval(0, 100, 1), interval(10, 20, 2), interval(30, 40, 3), interval(100, 160, 4)]
    )
    report = interval_overlaps(store)
    found = [
        (o.interval, o.previous, o.earlier_end, o.overlap_seconds) for o in report.overlaps.shown
    ]
    assert [
        (at("gpu1", "GPU-1", 10, 20, 2), at("gpu1", "GPU-1", 0, 100, 1), T0 + 100, 10.0),
        (at("gpu1", "GPU-1", 30, 40, 3), at("gpu1", "GPU-1", 10, 20, 2), T0 + 100, 10.0),
    ] == found
    assert (2, (SlotOverlaps("gpu1", "GPU-1", 2),)) == (report.overlaps.total, report.slots.shown)


def test_overlaps_are_counted_per_slot_beyond_the_limit(store: Store) -> None:
    """limit=1: the first overlap and the first slot listed; all three and both counted."""
    store.add_intervals(
        [
            interval(0, 60, 1),
            interval(30, 90, 2),
            interval(60, 120, 3),
            interval(0, 60, 4, slot="GPU-2"),
            interval(59, 70, 5, slot="GPU-2"),
        ]
    )
    report = interval_overlaps(store, limit=1)
    assert (3, 1, 2) == (report.overlaps.total, len(report.overlaps.shown), report.slots.total)
    assert (SlotOverlaps("gpu1", "GPU-1", 2),) == report.slots.shown
    assert 2 == report.slots.left_out + len(report.slots.shown)


def test_an_interval_ending_before_it_starts_is_found(store: Store) -> None:
    """end < start is found; a zero-length interval (end == start) is not."""
    store.add_intervals([interval(100, 40, 7), interval(200, 200, 8), interval(0, 60, None)])
    listing = negative_intervals(store)
    assert (1, (at("gpu1", "GPU-1", 100, 40, 7),)) == (listing.total, listing.shown)


def test_summaries_without_a_jobs_row_of_their_cluster_are_found(
    store: Store, store_url: str
) -> None:
    """Job 5's two summaries have no `alpha` jobs row (only `beta` has a job 5); job 6's do."""
    store.upsert_jobs([{"job_id": 6, "start_time": T0, "end_time": T0 + 60}])
    with Store(store_url, cluster="beta") as beta:
        beta.upsert_jobs([{"job_id": 5, "start_time": T0, "end_time": T0 + 60}])
    store.add_summaries(
        [summary(5, "GPU-1", 0, 60), summary(5, "GPU-2", 10, 70), summary(6, "GPU-1", 0, 60)]
    )
    listing = orphan_summaries(store)
    assert (1, (OrphanSummaries("alpha", 5, 2, T0, T0 + 70),)) == (listing.total, listing.shown)


def test_open_jobs_come_a_page_at_a_time_by_job_id(store: Store) -> None:
    """Jobs without an end time, of this cluster only, in pages of two."""
    store.upsert_jobs(
        [
            {"job_id": 1, "state": "RUNNING", "start_time": T0},
            {"job_id": 2, "state": "COMPLETED", "start_time": T0, "end_time": T0 + 60},
            {"job_id": 3, "state": "PENDING", "submit_time": T0},
            {"job_id": 4, "state": "RUNNING", "start_time": T0 + 5},
        ]
    )
    pages = [list(page) for page in all_open_jobs(store, "alpha", page=2)]
    assert [
        [OpenJob(1, "RUNNING", None, T0), OpenJob(3, "PENDING", T0, None)],
        [OpenJob(4, "RUNNING", None, T0 + 5)],
    ] == pages
    assert [] == list(all_open_jobs(store, "beta"))
