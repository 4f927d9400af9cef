"""idle_gpu across a gap in the readings, on the test bed (#11 item 8).

An idle 1-GPU job on gpu1 is warned (warn_after 15 s, cancel_after 35 s); gpu1's agent is
then stopped for 25 s, longer than the controller's freshness limit (3 x 5 s) and the
agent's missing_after_intervals, so the audit says the warning is suspended, never that it
was withdrawn. Once the agent is back, the job's idle clock starts where the readings
resumed: the cancellation counts only the measured idle time since then, and says so.
"""

from __future__ import annotations

import time

import pytest

from slurm_gpu.store import Store
from tests.integration.controlbed import audit_of, controllers, write_config
from tests.integration.testbed import TestBed, wait_for
from tests.receivers import smtp_receiver

pytestmark = pytest.mark.slurm


def test_a_gap_suspends_the_warning_and_the_cancel_counts_only_measured_time(
    testbed: TestBed, store: Store, cancel_after: list[int]
) -> None:
    control = store.control
    idle = testbed.gpu_load("--pattern", "idle", "--seconds", "240")
    with smtp_receiver() as (port, _inbox):  # warnings must reach the user to count
        config = write_config(testbed, "idle-gap", smtp_port=port)
        job = testbed.submit("alice", "--gres=gpu:1", "-w", "gpu1", wrap=idle)
        cancel_after.append(job)
        try:
            with controllers(testbed, config):
                testbed.wait_state(job, {"RUNNING"}, 60)
                wait_for(
                    lambda: any(e.action == "warn" for e in audit_of(control, job)),
                    90,
                    "a warning",
                )
                testbed.launcher("agent", "stop", "gpu1")
                stopped = time.time()
                wait_for(
                    lambda: any(
                        e.reason.startswith("Warning suspended") for e in audit_of(control, job)
                    ),
                    60,
                    "the warning suspended",
                )
                time.sleep(max(0.0, stopped + 25 - time.time()))
                testbed.launcher("agent", "start", "gpu1")
                resumed = time.time()
                testbed.wait_state(job, {"CANCELLED"}, 150)
        finally:
            testbed.launcher("agent", "start", "gpu1")  # a no-op when it runs
    entries = audit_of(control, job)
    (suspended,) = [e for e in entries if e.reason.startswith("Warning suspended")]
    assert suspended.action == "none"
    assert suspended.reason.startswith("Warning suspended: no readings from GPU ")
    assert " on gpu1 since " in suspended.reason
    assert not [e for e in entries if e.reason.startswith("Warning withdrawn")]
    (cancel,) = [e for e in entries if e.action == "cancel"]
    # Idle time counted only since the readings resumed (the first read after the restart
    # covers one 5 s interval before it), never the 25 s without readings.
    assert cancel.details["idle_seconds"] <= cancel.time - resumed + 6
    assert cancel.time >= resumed + 25
    assert "when readings resumed after a gap" in cancel.reason
    warnings = [e.time for e in entries if e.action == "warn"]
    assert len(warnings) == 2 and warnings[1] > resumed
