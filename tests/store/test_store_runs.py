"""Runs of a requeued job in the store (issue #11): every backend, old rows kept as run 0.

Slurm requeues a job under its id and counts its runs (SLURM_RESTART_COUNT, `sacct -D`
lists each). Each run has its own events, `job_gpus` rows and summaries; the jobs row
shows the newest run, as `sacct` does, and says how many GPUs the job held at once.
"""

from __future__ import annotations

from dataclasses import replace

import sqlalchemy as sa

from slurm_gpu.models import JobEvent, JobEventKind, JobGpuSummary
from slurm_gpu.store import Store

T0 = 1_700_000_000.0


def event(kind: JobEventKind, t: float, restart: int, index: int, node: str = "gpu1") -> JobEvent:
    """A prolog or epilog event of job 77's run `restart` on one GPU."""
    return JobEvent(
        node=node,
        job_id=77,
        kind=kind,
        time=t,
        user="alice",
        account="physics",
        gpu_indices=(index,),
        exit_code=0 if kind is JobEventKind.ENDED else None,
        restart=restart,
    )


def requeued() -> list[JobEvent]:
    """Run 0 on GPU 0 for 100 s, requeued, run 1 on GPU 1 for 200 s."""
    return [
        event(JobEventKind.STARTED, T0, 0, 0),
        event(JobEventKind.ENDED, T0 + 100, 0, 0),
        event(JobEventKind.STARTED, T0 + 160, 1, 1),
        event(JobEventKind.ENDED, T0 + 360, 1, 1),
    ]


def summary(restart: int, start: float, end: float) -> JobGpuSummary:
    """Job 77's summary of one run on one GPU (the same GPU for both runs)."""
    return JobGpuSummary(
        job_id=77, node="gpu1", gpu_uuid="GPU-0000", gpu_model="A100", start=start, end=end,
        gpu_seconds=end - start, util_mean_percent=50.0, util_max_percent=60.0,
        active_seconds=end - start, mem_max_bytes=2**30, mem_gib_seconds=end - start,
        energy_joules=100.0 * (end - start), reading_count=10, missing_seconds=0.0,
        user="alice", account="physics", partition="gpu", restart=restart,
    )  # fmt: skip


def test_each_run_has_its_own_gpu_rows_that_end_after_they_start(store: Store) -> None:
    """Run 0's GPU ends at run 0's epilog, run 1's at run 1's: no row ends before it starts."""
    store.add_events(requeued())
    rows = [(g["restart"], g["slurm_index"], g["start"], g["end"]) for g in store.job_gpus(77)]
    assert [(0, 0, T0, T0 + 100), (1, 1, T0 + 160, T0 + 360)] == rows


def test_requeued_job_held_one_gpu_and_shows_its_newest_run(store: Store) -> None:
    """The jobs row: 1 GPU held at once (not 2), the newest run's start and end, as sacct."""
    store.add_events(requeued())
    job = store.job(77)
    assert job is not None
    expected = (1, T0 + 160, T0 + 360, "COMPLETED", 1)
    assert expected == (
        job["gpus"],
        job["start_time"],
        job["end_time"],
        job["state"],
        job["restart"],
    )


def test_events_out_of_order_give_the_same_job(store: Store) -> None:
    """The newest run wins whatever order the events arrive in; a late old event changes nothing."""
    events = requeued()
    store.add_events([events[2], events[3]])
    store.add_events([events[1], events[0]])
    job = store.job(77)
    assert job is not None
    assert (T0 + 160, T0 + 360, "COMPLETED") == (job["start_time"], job["end_time"], job["state"])


def test_requeued_job_is_running_again_after_its_second_prolog(store: Store) -> None:
    """Run 0 ended, run 1 started: the job is RUNNING, with no end time."""
    store.add_events(requeued()[:3])
    job = store.job(77)
    assert job is not None
    assert ("RUNNING", T0 + 160, None) == (job["state"], job["start_time"], job["end_time"])


def test_both_runs_on_one_gpu_keep_two_summaries(store: Store) -> None:
    """Runs 0 and 1 on the same GPU: two summaries, the job's GPU-seconds are their sum."""
    runs = [summary(0, T0, T0 + 100), summary(1, T0 + 160, T0 + 360)]
    store.add_summaries(runs)
    stored = store.job_summaries(77)
    assert runs == stored
    assert 300.0 == sum(s.gpu_seconds for s in stored)


def test_rows_written_before_runs_were_counted_are_run_0(store: Store) -> None:
    """A summary and GPU row from before revision 0004 read back as run 0, keys unchanged."""
    with store.writing("old rows") as conn:
        conn.execute(
            sa.text(
                "INSERT INTO job_gpus (cluster, job_id, node, slurm_index, gpu_uuid, start)"
                " VALUES ('alpha', 78, 'gpu1', 0, '', :t)"
            ),
            {"t": T0},
        )
    first = JobEvent(node="gpu1", job_id=78, kind=JobEventKind.ENDED, time=T0 + 50)
    store.add_events([first])
    (row,) = store.job_gpus(78)
    assert (0, T0, T0 + 50) == (row["restart"], row["start"], row["end"])
    assert "gpu1:78:ended" == first.key


def test_runs_are_told_apart_when_the_hooks_do_not_count_them(store: Store) -> None:
    """No restart count from slurmd: run 1 on gpu2 after run 0's epilog on gpu1 is run 1.

    Its summary, sent by gpu2's agent as run 0, is stored as run 1; sending again
    changes nothing.
    """
    events = [
        event(JobEventKind.STARTED, T0, 0, 0),
        event(JobEventKind.ENDED, T0 + 100, 0, 0),
        event(JobEventKind.STARTED, T0 + 160, 0, 1, node="gpu2"),
        event(JobEventKind.ENDED, T0 + 360, 0, 1, node="gpu2"),
    ]
    store.add_events(events[:2])
    store.add_events(events[2:])
    later = replace(summary(0, T0 + 160, T0 + 360), node="gpu2")
    store.add_summaries([summary(0, T0, T0 + 100), later])
    assert 0 == store.add_events(events)
    store.add_summaries([later])
    rows = [(g["restart"], g["node"], g["start"], g["end"]) for g in store.job_gpus(77)]
    assert [(0, "gpu1", T0, T0 + 100), (1, "gpu2", T0 + 160, T0 + 360)] == rows
    assert [(0, "gpu1"), (1, "gpu2")] == [(s.restart, s.node) for s in store.job_summaries(77)]
    job = store.job(77)
    assert job is not None and (1, T0 + 160) == (job["gpus"], job["start_time"])
