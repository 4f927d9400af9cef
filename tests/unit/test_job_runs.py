"""A requeued job's runs in what users read: the AdminComment token and `slurm-gpu job`.

Slurm requeues a job under its id (issue #11): a 1-GPU job that ran twice, on two GPUs,
held 1 GPU at once, and its figures add up both runs.
"""

from __future__ import annotations

from typing import Any

from slurm_gpu.models import JobGpuSummary
from slurm_gpu.reports.jobview import Thresholds, notes, render_job
from slurm_gpu.slurm.admin_comment import parse_token, summary_token

GIB = 2**30
T0 = 1_800_000_000.0


def summary(restart: int, uuid: str, seconds: float) -> JobGpuSummary:
    return JobGpuSummary(
        job_id=9, node="gpu1", gpu_uuid=uuid, gpu_model="A100", start=T0, end=T0 + seconds,
        gpu_seconds=seconds, util_mean_percent=50.0, util_max_percent=60.0,
        active_seconds=seconds, mem_max_bytes=GIB, mem_gib_seconds=seconds,
        energy_joules=10.0 * seconds, reading_count=5, missing_seconds=0.0, restart=restart,
    )  # fmt: skip


def gpu_row(restart: int, uuid: str, util: float) -> dict[str, Any]:
    return {
        "node": "gpu1", "gpu_uuid": uuid, "gpu_model": "A100", "gpu_seconds": 600.0,
        "active_seconds": 600.0, "util_mean_percent": util, "util_max_percent": util,
        "mem_max_bytes": GIB, "mem_gib_seconds": 600.0, "energy_joules": 1000.0,
        "missing_seconds": 0.0, "cost": 1.0, "data_until": 0.0, "restart": restart,
    }  # fmt: skip


JOB = {
    "job_id": 9, "job_id_text": "9", "name": "train", "user": "alice", "account": "physics",
    "partition": "gpu", "state": "COMPLETED", "submit_time": T0, "start_time": T0,
    "end_time": T0 + 600, "elapsed_seconds": 600.0, "time_limit_seconds": 3600.0,
    "nodes": "gpu1", "alloc_gpus": 1, "util_mean_percent": 50.0, "queue_wait_seconds": 0.0,
}  # fmt: skip


def test_token_of_a_requeued_job_says_one_gpu_and_two_runs() -> None:
    """gpus= is the GPUs held at once (1), gpu_s= the sum of both runs, runs=2."""
    token = parse_token(summary_token([summary(0, "GPU-a", 100.0), summary(1, "GPU-b", 200.0)]))
    assert ("1", "300", "2") == (token["gpus"], token["gpu_s"], token.get("runs"))


def test_token_of_a_job_run_once_is_unchanged() -> None:
    """A 2-GPU job run once: gpus=2 and no runs field (the v1 token as before)."""
    token = parse_token(summary_token([summary(0, "GPU-a", 100.0), summary(0, "GPU-b", 100.0)]))
    assert ("2", None) == (token["gpus"], token.get("runs"))


def test_requeued_job_is_not_told_it_needed_fewer_gpus() -> None:
    """Two runs on one GPU each at 50%: no "1 GPU(s) would have done", the runs are said."""
    text = notes(JOB, [gpu_row(0, "GPU-a", 50.0), gpu_row(1, "GPU-b", 50.0)], Thresholds())
    assert not any("would have done" in n for n in text)
    assert text[0].startswith("This job ran 2 times (requeued")


def test_requeued_job_view_shows_each_run_under_one_gpu() -> None:
    """The view says GPUs 1 and Runs 2, and lists each run's GPU under its run."""
    text = render_job(
        JOB,
        [gpu_row(1, "GPU-b", 50.0), gpu_row(0, "GPU-a", 50.0)],
        memory_total={},
        limits=Thresholds(),
        currency="EUR",
    )
    # The utilization table's rows (the notes name the model too).
    rows = [line.split()[:3] for line in text.splitlines() if " A100 " in line]
    assert "GPUs 1  Runs 2" in text
    assert [["0", "gpu1", "GPU-a"], ["1", "gpu1", "GPU-b"]] == rows


def test_idle_run_is_named_in_the_advice() -> None:
    """Run 0 busy, run 1 idle: the idle note names run 1, and is not said of the job."""
    text = notes(JOB, [gpu_row(0, "GPU-a", 80.0), gpu_row(1, "GPU-b", 0.0)], Thresholds())
    said = [n for n in text if "GPU-b" in n and "SM activity is not measured" not in n]
    assert [True] == [n.startswith("Run 1: Memory-only use on gpu1/GPU-b") for n in said]
