"""A node's wall clock steps back 30 s and forward 30 s under a running job (issue 25 item 3).

gpu1's agent runs on libfaketime's wall clock (`local-cluster agent start` with
SLURM_GPU_AGENT_FAKETIME: an offset file it re-reads every second; its monotonic clock
stays the real one, as an NTP step leaves CLOCK_MONOTONIC alone). A busy 1-GPU job runs
on gpu1; the clock steps back 30 s, then forward 30 s. The store must hold no GPU time
twice (`slurm-gpu db check`), and the job's GPU-seconds are what it held.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.slurm.squeue import parse_slurm_time
from slurm_gpu.store import Store
from tests.integration.controlbed import slurm_gpu
from tests.integration.testbed import TestBed, wait_summaries

pytestmark = pytest.mark.slurm

FAKETIME_LIBRARY = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")


@pytest.fixture(scope="module")
def stepped(testbed: TestBed, store: Store) -> dict[str, Any]:
    """The job whose node's clock stepped back and forward while it ran."""
    assert FAKETIME_LIBRARY.exists(), "libfaketime is missing (scripts/install-deps)"
    offset = testbed.state_dir / "run" / "gpu1-faketime"
    offset.write_text("+0\n")
    testbed.launcher("agent", "stop", "gpu1")
    testbed.launcher("agent", "start", "gpu1", extra_env={"SLURM_GPU_AGENT_FAKETIME": str(offset)})
    try:
        load = testbed.gpu_load("--util", "80", "--seconds", "45")
        job = testbed.submit("alice", "-w", "gpu1", "--gres=gpu:1", wrap=load)
        testbed.wait_state(job, {"RUNNING"})
        time.sleep(12)
        offset.write_text("-30s\n")  # NTP steps the clock back 30 s
        time.sleep(12)
        offset.write_text("+0\n")  # and forward again
        testbed.wait_done(job, timeout=120)
        rows = wait_summaries(store, job, 1)
    finally:
        offset.write_text("+0\n")
        testbed.launcher("agent", "stop", "gpu1")
        testbed.launcher("agent", "start", "gpu1")
    time.sleep(8)  # the restarted agent ships what the stepped one left in the spool
    return {"job": job, "rows": rows, "sacct": testbed.sacct(job, "Start,End")}


def test_no_gpu_time_is_stored_twice(testbed: TestBed, stepped: dict[str, Any]) -> None:
    """`slurm-gpu db check`: no slot's intervals count a second twice, none is negative."""
    config = Path(testbed.env["SLURM_GPU_CONFIG"])
    out = slurm_gpu(testbed, config, "db", "check", "--no-slurm", "--json", check=False)
    found = {c["check"]: c for c in json.loads(out[out.index("{") :])["checks"]}
    assert found["overlapping-intervals"]["found"] == 0, found["overlapping-intervals"]
    assert found["negative-intervals"]["found"] == 0, found["negative-intervals"]


def test_the_job_is_charged_the_time_it_held(stepped: dict[str, Any]) -> None:
    """Its GPU-seconds are its elapsed time (from its prolog), neither +30 s nor -30 s."""
    start = parse_slurm_time(stepped["sacct"]["Start"])
    end = parse_slurm_time(stepped["sacct"]["End"])
    assert start is not None and end is not None
    (row,) = stepped["rows"]
    assert end - start - 6 <= row.gpu_seconds <= end - start + 2, row
    # Read on through both steps: not lost, not stored as unallocated time.
    assert row.missing_seconds <= 10, row
