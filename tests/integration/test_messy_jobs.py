"""Messy jobs on the test bed (issue #11): a requeued job, and a heterogeneous job.

A requeued job keeps its id and runs again (Slurm counts its runs: SLURM_RESTART_COUNT,
`sacct -D` lists each); each run is recorded as a run, and the views say how many GPUs
the job held at once. Every `srun --het-group` task of a heterogeneous job carries the
leader's SLURM_JOB_ID; the component's own process is not GPU use outside an allocation,
and `slurm-gpu job <leader>` shows the components together, as `sacct -j` does.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from slurm_gpu.slurm.admin_comment import parse_token
from slurm_gpu.store import Store
from tests.integration.testbed import TestBed, wait_summaries

INTERVAL = 5.0  # node.interval in the test bed's slurm-gpu.toml
_T = TypeVar("_T")


def poll(what: str, probe: Callable[[], _T | None], timeout: float = 90) -> _T:
    """`probe()` until it returns something, or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def elapsed_seconds(text: str) -> float:
    """sacct's Elapsed ([D-]HH:MM:SS) in seconds."""
    days, _, hms = text.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def slurm_gpu(testbed: TestBed, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs `slurm-gpu ARGS` as root with the test bed's config."""
    venv = Path(testbed.env.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv"))
    return subprocess.run(
        [str(venv / "bin" / "slurm-gpu"), *args],
        env=testbed.env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# ---------------------------------------------------------------------- requeue


@pytest.fixture(scope="module")
def requeued(testbed: TestBed, store: Store) -> int:
    """A 1-GPU job: run 0 on gpu1 for ~15 s, requeued, run 1 on gpu2 to its end."""
    job = testbed.submit(
        "alice",
        "--gres=gpu:1",
        "-w",
        "gpu1",
        wrap=testbed.gpu_load("--util", "60", "--seconds", "30"),
    )
    try:
        testbed.wait_state(job, {"RUNNING"})
        time.sleep(3 * INTERVAL)
        testbed.run("scontrol", "requeuehold", str(job))
        testbed.wait_state(job, {"PENDING", "REQUEUE_HOLD"}, timeout=60)

        def moved() -> bool:  # refused while the first run's epilog still runs
            done = testbed.run(
                "scontrol", "update", f"JobId={job}", "ReqNodeList=gpu2", check=False
            )
            return done.returncode == 0

        poll("the requeued job to take gpu2", moved, timeout=60)
        testbed.run("scontrol", "release", str(job))
        assert "COMPLETED" == testbed.wait_done(job, timeout=180)
    except BaseException:
        testbed.run("scancel", str(job), check=False)
        raise
    return job


def runs_in_sacct(testbed: TestBed, job: int) -> list[list[str]]:
    """`sacct -D -X`: one line per run of the job (State, Elapsed, NodeList)."""
    out = testbed.run(
        "sacct", "-D", "-X", "-n", "-P", "-j", str(job), "-o", "State,Elapsed,NodeList"
    ).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


def test_each_run_of_a_requeued_job_has_its_own_summary(
    testbed: TestBed, store: Store, requeued: int
) -> None:
    """Two runs in sacct -D, two summaries (runs 0 and 1), each as long as its run."""
    runs = runs_in_sacct(testbed, requeued)
    summaries = sorted(wait_summaries(store, requeued, 2), key=lambda s: s.restart)
    assert [(0, "gpu1"), (1, "gpu2")] == [(s.restart, s.node) for s in summaries]
    assert ["REQUEUED", "COMPLETED"] == [r[0] for r in runs], runs
    for run, summary in zip(runs, summaries, strict=True):
        assert abs(summary.gpu_seconds - elapsed_seconds(run[1])) <= 2 * INTERVAL, (run, summary)
        assert summary.energy_joules is not None and summary.energy_joules > 0


def test_requeued_job_gpu_rows_end_after_they_start(store: Store, requeued: int) -> None:
    """Each run's job_gpus row ends at its own epilog; the job held 1 GPU at once."""
    wait_summaries(store, requeued, 2)
    rows = store.job_gpus(requeued)
    assert [(0, "gpu1"), (1, "gpu2")] == [(r["restart"], r["node"]) for r in rows]
    assert all(r["end"] is not None and r["end"] >= r["start"] for r in rows), rows
    job = store.job(requeued)
    assert job is not None and (1, 1) == (job["gpus"], job["restart"])


def test_requeued_job_admin_comment_says_one_gpu_two_runs(
    testbed: TestBed, store: Store, requeued: int
) -> None:
    """The AdminComment token: gpus=1 (held at once), runs=2, gpu_s the sum of both runs."""
    summaries = wait_summaries(store, requeued, 2)

    def token() -> dict[str, str] | None:
        found = parse_token(testbed.sacct(requeued, "AdminComment").get("AdminComment", ""))
        return found if found.get("runs") == "2" else None

    found = poll("the token of both runs", token)
    assert "1" == found["gpus"]
    assert abs(float(found["gpu_s"]) - sum(s.gpu_seconds for s in summaries)) <= 1


def test_requeued_job_view_says_one_gpu_and_its_runs(
    testbed: TestBed, store: Store, requeued: int
) -> None:
    """`slurm-gpu job`: GPUs 1, Runs 2, a row per run, no "would have done the same work"."""
    wait_summaries(store, requeued, 2)
    done = slurm_gpu(testbed, "job", str(requeued))
    assert 0 == done.returncode, done.stderr
    assert "GPUs 1  Runs 2" in done.stdout, done.stdout
    assert "would have done the same work" not in done.stdout, done.stdout


# ---------------------------------------------------------------------- het job

# Components may not share a node ("Invalid node name specified"): one on each.
HET_SCRIPT = """#!/bin/bash
#SBATCH --gres=gpu:1 -w gpu1
#SBATCH hetjob
#SBATCH --gres=gpu:2 -w gpu2
srun --het-group=1 {load} --util 50 --seconds 25 &
srun --het-group=0 {load} --util 70 --seconds 25 &
wait
"""


@pytest.fixture(scope="module")
def het_job(testbed: TestBed, store: Store) -> tuple[int, int]:
    """A het job of two components (1 GPU on gpu1, 2 on gpu2), each running its own srun task.

    Returns (leader id, component 1's job id).
    """
    script = testbed.jobs_dir / f"messy-het-{time.time_ns()}.sh"
    script.write_text(HET_SCRIPT.format(load=testbed.bin_dir / "gpu-load"))
    script.chmod(0o755)
    out = testbed.run(
        "sbatch",
        "--parsable",
        f"--chdir={testbed.jobs_dir}",
        f"--output={testbed.jobs_dir}/%j.out",
        str(script),
        user="alice",
    ).stdout
    leader = int(out.strip().split(";")[0].split("+")[0])
    try:
        assert "COMPLETED" == testbed.wait_done(leader, timeout=180)
        ids = testbed.run(
            "sacct", "-X", "-n", "-P", "-j", str(leader), "-o", "JobIDRaw,JobID"
        ).stdout.split()
        parts = {text: raw for raw, text in (line.split("|") for line in ids)}  # {"L+1": "C"}
        component = int(parts[f"{leader}+1"])
    except BaseException:
        testbed.run("scancel", str(leader), check=False)
        raise
    finally:
        script.unlink(missing_ok=True)
    return leader, component


def test_het_component_process_is_not_unallocated_use(
    store: Store, het_job: tuple[int, int]
) -> None:
    """The component's GPU ran the component's task: no interval names it unallocated."""
    leader, component = het_job
    wait_summaries(store, component, 1)
    wait_summaries(store, leader, 1)
    rows = [
        i
        for node, job in zip(("gpu1", "gpu2"), het_job, strict=True)
        for i in store.intervals(node=node, job_id=job)
    ]
    busy = [i for i in rows if (i.util_mean_percent or 0) > 10]
    assert busy, rows  # each component's task really used its GPU
    assert [] == [(i.job_id, i.unallocated_pids) for i in rows if i.unallocated_pids]


def test_each_component_task_drives_its_own_gpus(store: Store, het_job: tuple[int, int]) -> None:
    """Every GPU of each component is busy with that component's task (issue 25 item 6).

    Slurm 22.05 gives a het step's every task the leader's SLURM_JOB_GPUS; a CUDA program
    (and gpu-load) uses the task's own CUDA_VISIBLE_DEVICES: the component's second GPU
    is busy too, not idle while the leader's index is driven twice.
    """
    leader, component = het_job
    for job, gpus in ((leader, 1), (component, 2)):
        rows = wait_summaries(store, job, gpus)
        assert len(rows) == gpus
        # 25 s of load in a job of about 30 s: well above idle, whatever the edges.
        assert all((r.util_mean_percent or 0) > 25 for r in rows), rows


def test_leader_id_shows_every_component(testbed: TestBed, het_job: tuple[int, int]) -> None:
    """`slurm-gpu job <leader>` shows L+0 and L+1 together (sacct -j lists both)."""
    leader, component = het_job
    done = slurm_gpu(testbed, "job", str(leader))
    assert 0 == done.returncode, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"Heterogeneous job {leader}: 2 components ({leader}+0, {leader}+1)")
    assert f"Job {leader}+1 ({component})" in done.stdout
