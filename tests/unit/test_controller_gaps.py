"""The controller's cycle when readings go missing, and when an agent reports a lost GPU.

- A warned job whose readings go stale is audited "Warning suspended: no readings from
  ... since ...", never "Warning withdrawn", and the cancellation that follows once
  readings return counts only the time measured since then (#11 item 8).
- A GPU its agent cannot read (the inventory's lost flag) drains the node with a reason
  naming the GPU, audited before the drain (#11 item 5).
"""

from __future__ import annotations

import dataclasses

import pytest

from slurm_gpu.config import Config
from slurm_gpu.durations import Duration
from slurm_gpu.models import GpuActivity, GpuDevice, LostGpu, SlurmJob
from slurm_gpu.policy.controller import Controller
from slurm_gpu.store import Store
from slurm_gpu.testing import FakeSlurmClient

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def config() -> Config:
    """Warn at 30 s, cancel at 120 s, 10 s agent and controller intervals, UTC."""
    base = Config()
    idle = dataclasses.replace(
        base.policy.idle_gpu, warn_after=Duration(30.0), cancel_after=Duration(120.0)
    )
    controller = dataclasses.replace(base.controller, interval=Duration(10.0), timezone="UTC")
    node = dataclasses.replace(base.node, interval=Duration(10.0))
    return dataclasses.replace(
        base,
        policy=dataclasses.replace(base.policy, idle_gpu=idle),
        controller=controller,
        node=node,
    )


def idle_job() -> SlurmJob:
    return SlurmJob(
        7,
        "alice",
        "physics",
        "gpu",
        "RUNNING",
        start_time=T0,
        gpu_count=1,
        nodes=("gpu1",),
        gpus=(("gpu1", (0,)),),
    )


def test_stale_readings_suspend_the_warning_and_the_cancel_counts_measured_time(
    store: Store,
) -> None:
    """Warned at T0+30; no readings T0+40..T0+120; readings resumed at T0+115.

    The audit says the warning was suspended, and since when; the job is warned afresh
    and cancelled only once 120 measured seconds (and the new warning's grace) have passed.
    """
    slurm = FakeSlurmClient([idle_job()])
    now = [T0]
    controller = Controller(config(), slurm, store, clock=lambda: now[0], holder="test")
    cancelled_at = None
    for step in range(10, 300, 10):
        now[0] = T0 + step
        if step <= 40 or step >= 120:  # the agent's readings: none from T0+40 to T0+120
            measured = T0 if step <= 40 else T0 + 115
            store.add_activity(
                [GpuActivity(7, "gpu1", "U", 0, T0, now[0], None, 0.0, 0, 0, measured)]
            )
        controller.cycle(dry_run=False)
        if slurm.cancelled:
            cancelled_at = step
            break
    entries = store.control.audit_entries(job_ids=[7])
    reasons = [(e.action, e.reason) for e in entries]
    assert (
        "none",
        "Warning suspended: no readings from GPU 0 on gpu1 since 08:00. The GPU use of job 7"
        " is unknown, and unknown is never treated as idle: the idle clock starts again when"
        " readings return.",
    ) in reasons
    assert not [r for _, r in reasons if r.startswith("Warning withdrawn")]
    # A new warning once 30 measured seconds have passed (T0+145); the cancel at 120
    # measured seconds and 90 s after that warning.
    assert [("warn", T0 + 30), ("warn", T0 + 150), ("cancel", T0 + 240)] == [
        (e.action, e.time) for e in entries if e.action in ("warn", "cancel")
    ]
    assert 240 == cancelled_at
    (cancel,) = [e for e in entries if e.action == "cancel"]
    assert cancel.reason == (
        "Job 7 cancelled: GPU 0 on gpu1 had been below 5% utilization for 2 min (counted from"
        " 08:01, when readings resumed after a gap), and the warning at 08:02 went unanswered."
    )


def test_a_withdrawn_warning_still_says_withdrawn(store: Store) -> None:
    """Warned, then the GPU got busy: "Warning withdrawn", as before."""
    slurm = FakeSlurmClient([idle_job()])
    now = [T0]
    controller = Controller(config(), slurm, store, clock=lambda: now[0], holder="test")
    for step in (30, 40):
        now[0] = T0 + step
        active = None if step == 30 else now[0] - 1
        store.add_activity([GpuActivity(7, "gpu1", "U", 0, T0, now[0], active, 0.0, 0, 0, T0)])
        controller.cycle(dry_run=False)
    assert [
        "warn",
        "Warning withdrawn: the job no longer meets the policy's condition.",
    ] == [e.action if e.action == "warn" else e.reason for e in store.control.audit_entries()]


A100 = [
    GpuDevice("GPU-a0", "NVIDIA A100", 0, 0, "00:01", None),
    GpuDevice("GPU-a1", "NVIDIA A100", 1, 1, "00:02", None),
]


@pytest.mark.parametrize("drained", [False, True])
def test_a_lost_gpu_drains_its_node_with_the_gpu_named(store: Store, drained: bool) -> None:
    """The agent reported GPU-a1 lost: gpu1 is drained, audited first; not if drained already."""
    from slurm_gpu.slurm.scontrol import NodeInfo

    store.upsert_inventory("gpu1", A100, T0)
    store.set_lost_gpus("gpu1", [LostGpu("GPU-a1", 1, T0 + 5, "GPU is lost")])
    state = "drained" if drained else "idle"
    slurm = FakeSlurmClient(nodes=[NodeInfo("gpu1", state, "", "")])
    controller = Controller(config(), slurm, store, clock=lambda: T0 + 10, holder="test")
    controller.cycle(dry_run=False)
    audited = [
        (e.policy, e.action, e.target, e.reason, e.outcome) for e in store.control.audit_entries()
    ]
    if drained:
        assert ([], []) == (slurm.calls_to("drain"), audited)
        return
    assert [("gpu1", "lost GPU GPU-a1")] == slurm.calls_to("drain")
    assert [("hot_node", "drain", "node:gpu1", "lost GPU GPU-a1", "done")] == audited


def test_a_gpu_that_answers_again_no_longer_drains(store: Store) -> None:
    """The agent's next report lists no lost GPU: nothing to drain."""
    store.upsert_inventory("gpu1", A100, T0)
    store.set_lost_gpus("gpu1", [LostGpu("GPU-a1", 1, T0 + 5, "GPU is lost")])
    store.set_lost_gpus("gpu1", [])
    slurm = FakeSlurmClient()
    Controller(config(), slurm, store, clock=lambda: T0 + 10, holder="test").cycle(dry_run=False)
    assert [] == slurm.calls_to("drain")
