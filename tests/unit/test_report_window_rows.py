"""The reports' bulk store reads (store/queries.py): a period's jobs and GPU rows as tuples."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pytest

from slurm_gpu.access import Caller, Scope
from slurm_gpu.models import JobGpuSummary
from slurm_gpu.reports.figures import GPM_COLUMNS
from slurm_gpu.reports.frames import GPU_COLUMNS, JOB_COLUMNS
from slurm_gpu.reports.usage import load_usage, with_job_listing
from slurm_gpu.store import Store
from slurm_gpu.store import queries as store_usage

NOV = dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp()
DEC = dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()
H = 3600.0
ADMIN = Scope(Caller(0, "root"), True, reason="root")


def summary(job: int, node: str, gpu: str, start: float, end: float) -> JobGpuSummary:
    seconds = end - start
    return JobGpuSummary(
        job_id=job, node=node, gpu_uuid=gpu, gpu_model="NVIDIA A100", start=start, end=end,
        gpu_seconds=seconds, util_mean_percent=None if job == 3 else 40.0,
        util_max_percent=50.0, active_seconds=seconds / 2, mem_max_bytes=None if job == 3
        else 2**30, mem_gib_seconds=seconds, energy_joules=None if job == 3 else 10.0,
        reading_count=3, missing_seconds=0.0, user="u", account="a", partition="gpu",
    )  # fmt: skip


@pytest.fixture
def store(store: Store) -> Store:
    """Jobs before, across, inside, after November; one pending, one with no times."""
    jobs = {  # job: (submit, start, end)
        1: (NOV - 10 * H, NOV - 9 * H, NOV - 5 * H),  # October only
        2: (NOV - 3 * H, NOV - 2 * H, NOV + 2 * H),  # across Nov 1
        3: (NOV + H, NOV + 2 * H, NOV + 5 * H),  # inside
        4: (DEC + H, DEC + 2 * H, DEC + 3 * H),  # December
        5: (NOV + 4 * H, None, None),  # pending since November
        6: (None, None, None),  # no times at all
        7: (NOV - 30 * H, NOV - 20 * H, None),  # running since October
    }
    store.upsert_jobs(
        [
            {"job_id": j, "user": "u", "account": "a", "partition": "gpu", "state": "X",
             "submit_time": q, "start_time": b, "end_time": e, "gpus": 2}
            for j, (q, b, e) in jobs.items()
        ]
    )  # fmt: skip
    rows = []
    for j, (_, b, e) in jobs.items():
        if b is not None and e is not None:
            # Nodes and GPUs given out of order: the reads sort them.
            rows += [summary(j, "n2", "G-b", b, e), summary(j, "n1", "G-z", b, e)]
            rows += [summary(j, "n1", "G-a", b, e)]
    store.add_summaries(rows)
    return store


def test_job_rows_in_window_are_jobs_in_window(store: Store) -> None:
    """The tuple read selects the same jobs, in job order, as `jobs_in_window`."""
    expected = [
        tuple(r[c] for c in store_usage.JOB_ROW_COLUMNS)
        for r in store_usage.jobs_in_window(store, NOV, DEC)
    ]
    actual = store_usage.job_rows_in_window(store, NOV, DEC)
    assert expected == actual
    assert [2, 3, 5, 7] == [r[0] for r in actual]


def test_summary_rows_in_window_are_summaries_of_the_window_jobs(store: Store) -> None:
    """One joined read gives the summaries of the window's jobs, ordered job, node, GPU."""
    ids = [int(r["job_id"]) for r in store_usage.jobs_in_window(store, NOV, DEC)]
    expected = [
        (s.job_id, s.node, s.gpu_uuid, s.gpu_model, s.gpu_seconds, s.active_seconds,
         s.util_mean_percent, s.util_max_percent, s.mem_max_bytes, s.mem_gib_seconds,
         s.energy_joules, s.missing_seconds, "summary", s.end)
        for s in store_usage.summaries_for(store, ids)
    ]  # fmt: skip
    actual = store_usage.summary_rows_in_window(store, NOV, DEC)
    assert expected == actual
    assert [(2, "n1", "G-a"), (2, "n1", "G-z"), (2, "n2", "G-b")] == [r[:3] for r in actual[:3]]
    assert [
        *store_usage.SUMMARY_ROW_COLUMNS,
        *store_usage.GPM_SUMMARY_COLUMNS,
        *store_usage.SLOT_SUMMARY_COLUMNS,
    ] == GPU_COLUMNS
    assert list(GPM_COLUMNS) == list(store_usage.GPM_SUMMARY_COLUMNS)  # one name each


def test_open_window_reads_every_job_with_a_time(store: Store) -> None:
    """No period: every job with a start or submit time, like `jobs_in_window`."""
    assert [1, 2, 3, 4, 5, 7] == [r[0] for r in store_usage.job_rows_in_window(store, None, None)]
    assert {1, 2, 3, 4} == {r[0] for r in store_usage.summary_rows_in_window(store, None, None)}


def test_load_usage_gpu_rows_are_those_of_the_visible_jobs(store: Store) -> None:
    """The period's GPU rows: summaries of its finished jobs, in job, node, GPU order."""
    usage = load_usage(store, since=NOV, until=DEC, now=DEC + 10 * H, sacct_jobs=None, scope=ADMIN)
    assert [2, 3, 5, 7] == list(usage.jobs["job_id"])
    assert [2, 2, 2, 3, 3, 3] == list(usage.gpus["job_id"])
    assert ["G-a", "G-z", "G-b"] * 2 == list(usage.gpus["gpu_uuid"])
    assert ["summary"] * 6 == list(usage.gpus["source"])


def test_load_usage_of_a_scope_keeps_only_its_jobs_gpu_rows(store: Store) -> None:
    """A scope that sees nothing gets no jobs and no GPU rows."""
    nobody = Scope(Caller(1000, "eve"), False, accounts=frozenset(), reason="user")
    usage = load_usage(store, since=NOV, until=DEC, now=DEC + 10 * H, sacct_jobs=None, scope=nobody)
    assert 0 == len(usage.jobs)
    assert 0 == len(usage.gpus)


def test_load_usage_names_array_and_het_jobs_like_sacct(tmp_path: Path) -> None:
    """Array tasks read as `<array>_<task>`, het components as `<het>+<offset>`."""
    s = Store(f"sqlite:///{tmp_path}/b.db", cluster="c")
    s.upgrade()
    s.upsert_jobs(
        [
            {"job_id": 101, "array_job_id": 100, "array_task_id": 3, "start_time": NOV + H},
            {"job_id": 201, "het_job_id": 200, "het_job_offset": 1, "start_time": NOV + H},
            {"job_id": 300, "start_time": NOV + H, "end_time": NOV + 3 * H, "user": None},
        ]
    )
    usage = load_usage(s, since=NOV, until=DEC, now=NOV + 2 * H, sacct_jobs=None, scope=ADMIN)
    assert ["100_3", "200+1", "300"] == list(usage.jobs["job_id_text"])
    assert [H, H, 2 * H] == list(usage.jobs["elapsed_seconds"])
    assert ["", "", ""] == list(usage.jobs["user"])
    assert [0, 0, 0] == list(usage.jobs["alloc_gpus"])


def test_job_listing_fills_a_job_frame_from_the_store(store: Store) -> None:
    """The listing columns a job frame lacks are read from the store, for its jobs."""
    kw = {"since": NOV, "until": DEC, "now": DEC + 10 * H, "sacct_jobs": None, "scope": ADMIN}
    full = load_usage(store, **kw)  # type: ignore[arg-type]
    assert full.jobs is with_job_listing(store, full.jobs, DEC + 10 * H)
    figures = ["job_id", "user", "account", "partition", "start_time", "end_time", "alloc_gpus"]
    listed = with_job_listing(store, full.jobs[figures], DEC + 10 * H)
    pd.testing.assert_frame_equal(full.jobs, listed)


def test_load_keeps_missing_names_blank(tmp_path: Path) -> None:
    """A job with no user or partition reads "" for them."""
    s = Store(f"sqlite:///{tmp_path}/c.db", cluster="c")
    s.upgrade()
    s.upsert_jobs(
        [
            {"job_id": 1, "user": None, "account": "a", "start_time": NOV + H},
            {"job_id": 2, "user": "u", "account": None, "partition": "p", "start_time": NOV + H},
        ]
    )
    usage = load_usage(s, since=NOV, until=DEC, now=NOV + 2 * H, sacct_jobs=None, scope=ADMIN)
    assert [("", "a", ""), ("u", "", "p")] == list(
        zip(usage.jobs["user"], usage.jobs["account"], usage.jobs["partition"], strict=True)
    )


def test_load_of_an_empty_window(store: Store) -> None:
    """A period with no jobs gives empty frames with every column."""
    far = NOV - 400 * 24 * H  # before every job
    usage = load_usage(store, since=far, until=far + H, now=far, sacct_jobs=None, scope=ADMIN)
    assert 0 == len(usage.jobs) == len(usage.gpus)
    assert JOB_COLUMNS == list(usage.jobs.columns)
    assert set(GPU_COLUMNS) <= set(usage.gpus.columns)
