"""A busy job suspended for 45 s, on the test bed (issue 25 item 2).

`scontrol suspend` stops every process of the job (SIGSTOP; the simulated GPUs then read
idle, as real ones do: a stopped process launches no kernels) and `scontrol resume`
continues them. A controller with the bed's short idle policy (warn after 15 s, cancel
after 35 s) runs all along. What the user must see afterwards:

- the job neither warned nor cancelled: suspended time is not idle, and the idle clock
  starts again at the resume;
- its GPU-hours are what Slurm charges (Elapsed, which leaves the suspension out), the
  suspension is SuspendedGPUHours of its own, and its idle time is the few seconds around
  the job's start and end, not the time it was suspended;
- `slurm-gpu job` and the AdminComment token (`susp_s`) say it was suspended.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from slurm_gpu.slurm.admin_comment import parse_token
from slurm_gpu.slurm.timespec import parse_elapsed
from slurm_gpu.store import Store
from tests.integration.controlbed import (
    actions_of,
    control_store,
    controllers,
    slurm_gpu,
    write_config,
)
from tests.integration.testbed import TestBed, wait_summaries
from tests.receivers import smtp_receiver

pytestmark = pytest.mark.slurm

BUSY_BEFORE = 10  # seconds of busy readings before the suspension
SUSPENDED_FOR = 45  # longer than the idle policy's cancel_after (35 s)
WORK = 24  # the job's busy seconds in all (gpu-load does not count its pauses)
EDGES = 15  # idle seconds allowed around the job's start and end (prolog, last tick)


def seconds(duration: str) -> float:
    """sacct's [D-]HH:MM:SS as seconds."""
    value = parse_elapsed(duration)
    assert value is not None, duration
    return value


@pytest.fixture(scope="module")
def suspended(testbed: TestBed, store: Store) -> dict[str, Any]:
    with smtp_receiver() as (port, _inbox):
        config = write_config(testbed, "suspension", smtp_port=port)
        job = testbed.submit(
            "alice",
            "--gres=gpu:1",
            wrap=testbed.gpu_load("--util", "80", "--seconds", str(WORK)),
        )
        try:
            testbed.wait_state(job, {"RUNNING"})
            with controllers(testbed, config):
                time.sleep(BUSY_BEFORE)
                testbed.run("scontrol", "suspend", str(job))
                testbed.wait_state(job, {"SUSPENDED"}, timeout=10)
                time.sleep(SUSPENDED_FOR)
                state_before_resume = testbed.job_state(job)
                testbed.run("scontrol", "resume", str(job))
                # The controller's cycles right after the resume see the GPU idle since
                # before the suspension until the agent's next tick: the race to lose.
                testbed.wait_done(job, timeout=120)
        finally:
            testbed.run("scancel", str(job), check=False)
        summaries = wait_summaries(store, job, 1)
        # Slurm's record of the suspension reaches the store as an admin's timer syncs it.
        slurm_gpu(testbed, config, "sync")
        return {
            "job": job,
            "config": config,
            "state_before_resume": state_before_resume,
            "summaries": summaries,
            "slurm": testbed.sacct(job, "State,Elapsed,Suspended"),
        }


def test_the_suspended_job_is_neither_warned_nor_cancelled(
    testbed: TestBed, suspended: dict[str, Any]
) -> None:
    assert "SUSPENDED" == suspended["state_before_resume"]
    assert "COMPLETED" == suspended["slurm"]["State"]
    assert [] == actions_of(control_store(testbed), suspended["job"])


def test_gpu_hours_are_slurms_and_the_suspension_is_apart(
    testbed: TestBed, suspended: dict[str, Any]
) -> None:
    slurm = suspended["slurm"]
    assert SUSPENDED_FOR <= seconds(slurm["Suspended"]) <= SUSPENDED_FOR + 10, slurm
    fields = "JobID,Elapsed,Suspended,GPUHours,SuspendedGPUHours,IdleGPUHours,MissingGPUHours"
    out = slurm_gpu(
        testbed, suspended["config"], "sacct", "-j", str(suspended["job"]), "-P", "-n",
        "-o", fields,
    )  # fmt: skip
    row = dict(zip(fields.split(","), out.strip().splitlines()[0].split("|"), strict=True))
    assert (slurm["Elapsed"], slurm["Suspended"]) == (row["Elapsed"], row["Suspended"]), row
    # One GPU: its GPU-hours are Slurm's Elapsed, to the agent's edges of the job.
    assert abs(float(row["GPUHours"]) * 3600 - seconds(slurm["Elapsed"])) <= 5, (row, slurm)
    assert abs(float(row["SuspendedGPUHours"]) * 3600 - seconds(slurm["Suspended"])) <= 2, row
    assert float(row["IdleGPUHours"]) * 3600 <= EDGES, row  # not the time suspended
    assert 0.0 == float(row["MissingGPUHours"]), row


def test_its_admin_comment_says_how_long_its_gpu_was_suspended(
    testbed: TestBed, suspended: dict[str, Any]
) -> None:
    job, slurm = suspended["job"], suspended["slurm"]
    deadline = time.monotonic() + 60
    token: dict[str, str] = {}
    while not token and time.monotonic() < deadline:
        token = parse_token(testbed.sacct(job, "AdminComment").get("AdminComment", ""))
        time.sleep(0.5 if not token else 0)
    assert abs(float(token["susp_s"]) - seconds(slurm["Suspended"])) <= 1, token
    # gpu_s less susp_s is what Slurm charges (one GPU: Elapsed).
    charged = float(token["gpu_s"]) - float(token["susp_s"])
    assert abs(charged - seconds(slurm["Elapsed"])) <= 5, (token, slurm)


def test_the_job_view_says_it_was_suspended(testbed: TestBed, suspended: dict[str, Any]) -> None:
    text = slurm_gpu(testbed, suspended["config"], "job", str(suspended["job"]))
    assert f"Suspended {suspended['slurm']['Suspended']}" in text, text
    assert "Suspended GPU-hours" in text, text
