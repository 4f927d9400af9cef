"""hot_node and unallocated_use on the test bed, from the simulated GPU to Slurm and mail.

- A process started on gpu2's GPU 3 outside Slurm (someone ssh'd in) is seen by gpu2's
  agent, shipped with the interval, listed by `slurm-gpu status`, and reported to the
  admins by the controller.
- Three uncorrected ECC errors injected into one of gpu1's GPUs (sim-gpu, at the NVML
  ABI) after the controller's first cycle drain gpu1 in Slurm, with the reason.
- One of gpu2's GPUs made lost (sim-gpu: every NVML call fails with GPU_IS_LOST) is
  reported by gpu2's agent through the store, and the controller drains gpu2 with a
  reason naming the GPU, audited; the fault is undone and gpu2 resumed at the end.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from email.message import Message
from typing import Any, cast

import pytest

from slurm_gpu.store import Store
from tests.integration.controlbed import controllers, slurm_gpu, write_config
from tests.integration.testbed import TestBed, wait_for
from tests.receivers import smtp_receiver

pytestmark = pytest.mark.slurm


def node_field(testbed: TestBed, node: str, field: str) -> str:
    """One sinfo field of a node (%T state, %E reason); sinfo prints a line per partition."""
    out = testbed.run("sinfo", "-h", "-n", node, "-N", "-o", field).stdout.splitlines()
    return out[0].strip() if out else ""


@pytest.fixture(scope="module")
def node_scenario(testbed: TestBed) -> Iterator[dict[str, Any]]:
    with smtp_receiver() as (port, inbox):
        config = write_config(testbed, "nodes", smtp_port=port, idle_enabled="false")
        stray = subprocess.Popen(
            [str(testbed.bin_dir / "gpu-load"), "--util", "30", "--seconds", "120"],
            env={
                **testbed.env,
                "SLURMD_NODENAME": "gpu2",
                "CUDA_VISIBLE_DEVICES": "3",
                "SLURM_JOB_ID": "",
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            with controllers(testbed, config):
                time.sleep(12)  # the controller's first cycles see the ECC counts as they are
                status = ""

                def status_lists_the_stray() -> bool:
                    nonlocal status
                    status = slurm_gpu(testbed, config, "status")
                    return f"pids {stray.pid}" in status

                wait_for(status_lists_the_stray, 60, "status to list the stray process")
                subprocess.run(
                    [
                        str(testbed.bin_dir / "sim-gpu"),
                        "ecc",
                        "--dir",
                        str(testbed.state_dir / "sim-nvml" / "gpu1"),
                        "--gpu",
                        "minor:0",
                        "--add",
                        "3",
                    ],
                    check=True,
                    env=testbed.env,
                    capture_output=True,
                )
                wait_for(lambda: "drain" in node_field(testbed, "gpu1", "%T"), 90, "gpu1 drained")
                wait_for(
                    lambda: any("unallocated_use" in m["Subject"] for m in inbox),
                    60,
                    "the unallocated-use report",
                )
                reason = node_field(testbed, "gpu1", "%E")
            yield {"stray": stray.pid, "status": status, "reason": reason, "inbox": list(inbox)}
        finally:
            os.killpg(stray.pid, 15)
            stray.wait(timeout=30)
            testbed.run("scontrol", "update", "NodeName=gpu1", "State=RESUME", check=False)
            # A resumed node reads "idle*" until slurmd's next registration: wait for it,
            # so the next test finds gpu1 ready.
            wait_for(
                lambda: node_field(testbed, "gpu1", "%T") in ("idle", "mixed", "allocated"),
                120,
                "gpu1 back in service",
            )


def test_status_lists_gpu_use_outside_any_allocation(node_scenario: dict[str, Any]) -> None:
    lines = node_scenario["status"].splitlines()
    header = lines.index("GPU use outside any allocation (processes no Slurm job owns):")
    stray = [line for line in lines[header + 1 :] if f"pids {node_scenario['stray']}" in line]
    assert len(stray) == 1 and stray[0].split()[0] == "gpu2"


def test_admins_get_the_unallocated_use_report(node_scenario: dict[str, Any]) -> None:
    inbox: list[Message] = node_scenario["inbox"]
    (report,) = [m for m in inbox if "unallocated_use" in m["Subject"]]
    assert report["Subject"].endswith("unallocated_use: report (node:gpu2)")
    assert "admins@testbed.local" in report["X-Rcpt-To"]
    # A single-part message: decode=True gives its body as bytes.
    body = cast(bytes, report.get_payload(decode=True)).decode()
    assert f"Process {node_scenario['stray']} uses GPU-" in body
    assert "on gpu2 without a Slurm allocation." in body


def test_new_ecc_errors_drain_the_node_with_the_reason(
    testbed: TestBed, node_scenario: dict[str, Any]
) -> None:
    assert node_scenario["reason"] == "slurm-gpu: 3 new GPU ECC error(s)"
    assert node_field(testbed, "gpu2", "%T") in ("idle", "mixed", "allocated")


def sim_gpu(testbed: TestBed, *args: str) -> None:
    subprocess.run(
        [str(testbed.bin_dir / "sim-gpu"), *args], check=True, env=testbed.env, capture_output=True
    )


def test_a_lost_gpu_drains_its_node_with_the_gpu_named(testbed: TestBed, store: Store) -> None:
    """gpu2's GPU minor 1 lost: gpu2 drained, "slurm-gpu: lost GPU <uuid>", one audit row."""
    assert "drain" not in node_field(testbed, "gpu2", "%T"), "gpu2 is drained already"
    (uuid,) = [e.device.uuid for e in store.inventory("gpu2") if e.device.minor == 1]
    sim_dir = str(testbed.state_dir / "sim-nvml" / "gpu2")
    config = write_config(testbed, "lost-gpu", idle_enabled="false")
    started = time.time()
    reason = ""

    def lost_flag() -> float | None:
        (entry,) = [e for e in store.inventory("gpu2") if e.device.uuid == uuid]
        return entry.lost_since

    try:
        with controllers(testbed, config):
            sim_gpu(testbed, "fault", "--dir", sim_dir, "--gpu", "minor:1", "lost")
            wait_for(lambda: "drain" in node_field(testbed, "gpu2", "%T"), 90, "gpu2 drained")
            reason = node_field(testbed, "gpu2", "%E")
        # (a controller's first cycle also records the earlier tests' resumes: "none")
        drains = store.control.audit_entries(
            since=started, policies=["hot_node"], actions=["drain"]
        )
    finally:
        sim_gpu(testbed, "fault", "--dir", sim_dir, "--gpu", "minor:1", "clear")
        # The agent clears the flag at its next read; resume only then, so that no
        # controller drains gpu2 again for a GPU that answers.
        wait_for(lambda: lost_flag() is None, 60, "gpu2's agent to report the GPU back")
        testbed.run("scontrol", "update", "NodeName=gpu2", "State=RESUME", check=False)
        wait_for(
            lambda: node_field(testbed, "gpu2", "%T") in ("idle", "mixed", "allocated"),
            120,
            "gpu2 back in service",
        )
    assert f"slurm-gpu: lost GPU {uuid}" == reason
    assert [("drain", "node:gpu2", f"lost GPU {uuid}", "done")] == [
        (e.action, e.target, e.reason, e.outcome) for e in drains
    ]
    assert [uuid] == drains[0].details["lost_gpus"]
