"""A node that fails mid-job, on the test bed (issue 25 item 1).

A busy 2-GPU job runs on gpu2; gpu2 fails: its slurmd and the job's processes are killed
(SIGKILL: no epilog will run) and the admin marks gpu2 DOWN, so Slurm ends the job NODE_FAIL
at once (instead of after SlurmdTimeout). The agent, which asks Slurm every 5 s on the
bed, closes the job at the end Slurm records: summary, AdminComment, its state in the
store. slurmd comes back; what gpu2's GPUs do then is not the dead job's, and the next
job on those GPUs is recorded with readings of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import pytest
import sqlalchemy as sa

from slurm_gpu.slurm.admin_comment import parse_token
from slurm_gpu.slurm.squeue import parse_slurm_time
from slurm_gpu.store import Store
from slurm_gpu.store.schema import gpu_intervals
from tests.integration.testbed import TestBed, wait_for, wait_summaries

pytestmark = pytest.mark.slurm

IN_SERVICE = ("idle", "mixed", "allocated")


def node_state(testbed: TestBed, node: str) -> str:
    out = testbed.run("sinfo", "-h", "-n", node, "-N", "-o", "%T").stdout.splitlines()
    return out[0].strip() if out else ""


def covered_after(store: Store, job: int, when: float) -> float:
    """The job's covered GPU-seconds in intervals that begin at or after `when`."""
    t = gpu_intervals.c
    query = sa.select(sa.func.sum(t.covered_seconds)).where(t.job_id == job, t.period_start >= when)
    with store.reading("test") as conn:
        return float(conn.execute(query).scalar_one() or 0.0)


def job_pids(testbed: TestBed, job: int) -> list[int]:
    """The pids of the job's processes on gpu2 (`scontrol listpids`, while slurmd runs)."""
    out = testbed.run("scontrol", "listpids", str(job), "gpu2").stdout
    return [int(line.split()[0]) for line in out.splitlines()[1:] if line.strip()]


@pytest.fixture(scope="module")
def node_failure(testbed: TestBed, store: Store) -> dict[str, Any]:
    """The failed job, then the next job on gpu2's same GPUs once gpu2 is back."""
    assert node_state(testbed, "gpu2") in IN_SERVICE, "gpu2 is not in service"
    load = testbed.gpu_load("--util", "90", "--seconds", "600")
    job = testbed.submit("alice", "-w", "gpu2", "--gres=gpu:2", "--no-requeue", wrap=load)
    testbed.wait_state(job, {"RUNNING"})
    _node, gpus = testbed.job_gpus(job)
    # Beside it, one Slurm requeues when its node fails (JobRequeue=1): it runs again.
    short = testbed.gpu_load("--util", "60", "--seconds", "20")
    requeued = testbed.submit("bob", "-w", "gpu2", "--gres=gpu:1", "--requeue", wrap=short)
    testbed.wait_state(requeued, {"RUNNING"})
    time.sleep(12)  # two ticks of readings
    pids = job_pids(testbed, job) + job_pids(testbed, requeued)
    try:
        testbed.launcher("slurmd", "kill", "gpu2")
        testbed.run("scontrol", "update", "nodename=gpu2", "state=down", "reason=test: node failed")
        # The node failed: its processes died with it (after Slurm's word, or their
        # slurmstepd, which outlives slurmd, would end the jobs FAILED first).
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        state = testbed.wait_state(job, {"NODE_FAIL"}, timeout=60)
        rows = wait_summaries(store, job, 2, timeout=60)
        stored = store.job(job)
    finally:
        testbed.launcher("slurmd", "start", "gpu2")
        wait_for(lambda: node_state(testbed, "gpu2") in IN_SERVICE, 90, "gpu2 back in service")
    sacct = testbed.sacct(job, "Start,End,AdminComment")
    # Slurm holds a requeued job back (BeginTime, about 2 minutes); started sooner by
    # `scontrol update StartTime=now`, 22.05 lost its second run's end on this bed.
    testbed.wait_state(requeued, {"COMPLETED"}, timeout=240)  # its second run
    runs = wait_summaries(store, requeued, 2)
    time.sleep(12)  # gpu2 runs on: two more ticks
    after = testbed.submit(
        "bob",
        "-w",
        "gpu2",
        f"--gres=gpu:{len(gpus)}",
        wrap=testbed.gpu_load("--util", "40", "--seconds", "20"),
    )
    testbed.wait_state(after, {"RUNNING"})
    _node, after_gpus = testbed.job_gpus(after)
    testbed.wait_done(after)
    return {
        "job": job,
        "state": state,
        "rows": rows,
        "stored": stored,
        "sacct": sacct,
        "gpus": gpus,
        "after": after,
        "after_gpus": after_gpus,
        "after_rows": wait_summaries(store, after, len(gpus)),
        "requeued": requeued,
        "requeued_runs": sorted(runs, key=lambda r: r.restart),
        "requeued_sacct": testbed.run(
            "sacct", "-D", "-X", "-n", "-P", "-j", str(requeued), "-o", "Start,End,State"
        ).stdout.split(),
    }


def test_the_failed_job_is_closed_at_the_end_slurm_records(
    node_failure: dict[str, Any], store: Store
) -> None:
    """NODE_FAIL in the store, its end Slurm's, its GPU-seconds Slurm's elapsed x 2."""
    assert node_failure["state"] == "NODE_FAIL"
    start = parse_slurm_time(node_failure["sacct"]["Start"])
    end = parse_slurm_time(node_failure["sacct"]["End"])
    assert start is not None and end is not None
    stored = node_failure["stored"]
    assert stored["state"] == "NODE_FAIL"
    assert stored["end_time"] == pytest.approx(end, abs=1.0)
    held = sum(r.gpu_seconds for r in node_failure["rows"])
    # Each GPU is held from its prolog (a second or so after Start) to Slurm's end.
    assert 2 * (end - start) - 6 <= held <= 2 * (end - start)
    # Nothing after the end is the dead job's, however long gpu2 ran on.
    assert covered_after(store, node_failure["job"], end + 10) == 0.0
    assert sum(r.gpu_seconds for r in store.job_summaries(node_failure["job"])) == held


def test_the_failed_job_has_its_admin_comment(
    testbed: TestBed, node_failure: dict[str, Any]
) -> None:
    token = parse_token(node_failure["sacct"]["AdminComment"])
    job = node_failure["job"]
    deadline = time.monotonic() + 30
    while not token and time.monotonic() < deadline:
        time.sleep(1)
        token = parse_token(testbed.sacct(job, "AdminComment").get("AdminComment", ""))
    assert token["gpus"] == "2"
    held = sum(r.gpu_seconds for r in node_failure["rows"])
    assert abs(float(token["gpu_s"]) - held) <= 1


def test_the_next_job_on_those_gpus_has_readings_of_its_own(node_failure: dict[str, Any]) -> None:
    assert node_failure["after_gpus"] == node_failure["gpus"]
    for row in node_failure["after_rows"]:
        assert row.missing_seconds <= 6, row
        assert row.util_mean_percent == pytest.approx(40, abs=8), row


def test_a_job_requeued_after_the_failure_has_each_run_recorded(
    node_failure: dict[str, Any],
) -> None:
    """Run 0 closed where gpu2 failed (Slurm's first record), run 1 its own (sacct -D)."""
    first, second = (line.split("|") for line in node_failure["requeued_sacct"][-2:])
    runs = node_failure["requeued_runs"]
    assert [r.restart for r in runs] == [0, 1], runs
    elapsed = [
        parse_slurm_time(record[1]) - parse_slurm_time(record[0])  # type: ignore[operator]
        for record in (first, second)
    ]
    # Run 0 closed at the end sacct -D keeps (squeue shows the job pending, no end);
    # run 1 ended by its epilog. Each is held from its prolog, a second or so late.
    assert elapsed[0] - 6 <= runs[0].gpu_seconds <= elapsed[0] + 1, (runs[0], first)
    assert elapsed[1] - 6 <= runs[1].gpu_seconds <= elapsed[1] + 1, (runs[1], second)
    assert runs[1].util_mean_percent == pytest.approx(60, abs=15), runs[1]
