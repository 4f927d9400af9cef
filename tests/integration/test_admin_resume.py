"""Drains the admin owns on the test bed (issue 25 item 4).

gpu2's GPU minor 1 is made lost (sim-gpu): the controller drains gpu2 and mails the
admins. The GPU comes back and the admin resumes gpu2 at once, before the store has the
agent's report that it answers: gpu2's agent is stopped (SIGSTOP) for that while, so
the inventory row still says lost, as it would behind a slow shipper. The controller must
not drain gpu2 again; the audit log says the admin resumed it and that the drain was
skipped, and why. The agent then goes on, its report clears the flag, and gpu2 stays in
service.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from slurm_gpu.store import Store
from tests.integration.controlbed import controllers, write_config
from tests.integration.testbed import TestBed, wait_for
from tests.receivers import smtp_receiver

pytestmark = pytest.mark.slurm

IN_SERVICE = ("idle", "mixed", "allocated")


def node_state(testbed: TestBed, node: str) -> str:
    """sinfo's long state of a node (a line per partition: the first)."""
    out = testbed.run("sinfo", "-h", "-n", node, "-N", "-o", "%T").stdout.splitlines()
    return out[0].strip() if out else ""


def sim_gpu(testbed: TestBed, *args: str) -> None:
    subprocess.run(
        [str(testbed.bin_dir / "sim-gpu"), *args], check=True, env=testbed.env, capture_output=True
    )


def test_a_resume_right_after_a_lost_gpu_clears_is_not_undone(
    testbed: TestBed, store: Store
) -> None:
    """Drained for a lost GPU, resumed by the admin as it came back: no re-drain, audited."""
    assert "drain" not in node_state(testbed, "gpu2"), "gpu2 is drained already"
    (uuid,) = [e.device.uuid for e in store.inventory("gpu2") if e.device.minor == 1]
    sim_dir = str(testbed.state_dir / "sim-nvml" / "gpu2")
    agent = testbed.pid("slurm-gpu-agent-gpu2")
    states: list[str] = []

    def lost_flag() -> float | None:
        (entry,) = [e for e in store.inventory("gpu2") if e.device.uuid == uuid]
        return entry.lost_since

    started = time.time()
    stopped = False
    with smtp_receiver() as (port, inbox):
        config = write_config(testbed, "admin-resume", smtp_port=port, idle_enabled="false")
        try:
            with controllers(testbed, config):
                sim_gpu(testbed, "fault", "--dir", sim_dir, "--gpu", "minor:1", "lost")
                wait_for(lambda: "drain" in node_state(testbed, "gpu2"), 60, "gpu2 drained")
                os.kill(agent, signal.SIGSTOP)  # its report that the GPU answers waits
                stopped = True
                sim_gpu(testbed, "fault", "--dir", sim_dir, "--gpu", "minor:1", "clear")
                testbed.run("scontrol", "update", "NodeName=gpu2", "State=RESUME")
                assert lost_flag() is not None  # the store still says lost
                # Three controller cycles (5 s apart) with the stale row: none drains.
                until = time.monotonic() + 16
                while time.monotonic() < until:
                    states.append(node_state(testbed, "gpu2"))
                    time.sleep(1)
                os.kill(agent, signal.SIGCONT)
                stopped = False
                wait_for(lambda: lost_flag() is None, 30, "gpu2's agent to report the GPU back")
                time.sleep(6)  # a cycle more, with the report in the store
                states.append(node_state(testbed, "gpu2"))
            rows = store.control.audit_entries(since=started, policies=["hot_node"])
            mails = [m for m in inbox if "node drained (node:gpu2)" in m["Subject"]]
        finally:
            if stopped:
                os.kill(agent, signal.SIGCONT)
            sim_gpu(testbed, "fault", "--dir", sim_dir, "--gpu", "minor:1", "clear")
            wait_for(lambda: lost_flag() is None, 60, "gpu2's agent to report the GPU back")
            if "drain" in node_state(testbed, "gpu2"):
                testbed.run("scontrol", "update", "NodeName=gpu2", "State=RESUME", check=False)
            wait_for(lambda: node_state(testbed, "gpu2") in IN_SERVICE, 120, "gpu2 in service")
    assert [] == [s for s in states if "drain" in s]
    # A controller's first cycle may record an earlier test's resume of gpu2: from the
    # drain on.
    gpu2 = [e for e in rows if e.target == "node:gpu2"]
    actions = [e.action for e in gpu2]
    assert "drain" in actions, actions
    last = len(actions) - 1 - actions[::-1].index("drain")
    assert ["drain", "none", "skip"] == actions[last:]
    drain, resumed, skipped = gpu2[last:]
    assert (f"lost GPU {uuid}", "done") == (drain.reason, drain.outcome)
    assert resumed.reason.startswith("gpu2 was resumed by an admin (slurm-gpu drained it at ")
    assert skipped.reason.startswith("Drain of gpu2 skipped: an admin resumed it at ")
    assert skipped.reason.endswith(f", and no reading since then shows lost GPU {uuid}.")
    # Every drain mailed to the admins.
    assert actions.count("drain") == len(mails)
    assert all("admins@testbed.local" in m["X-Rcpt-To"] for m in mails)
