"""The controller's cycle with a scripted Slurm and a real SQLite store, clock injected."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import pytest

from slurm_gpu.config import Config
from slurm_gpu.durations import Duration
from slurm_gpu.errors import SlurmError
from slurm_gpu.models import GpuActivity, GpuInterval, SlurmJob
from slurm_gpu.policy.controller import Controller, Flusher
from slurm_gpu.policy.lease import LEASE
from slurm_gpu.store import Store
from slurm_gpu.store.control import ControlStore
from slurm_gpu.testing import FakeSlurmClient

T0 = 1_800_000_000.0


class AuditingSlurm(FakeSlurmClient):
    """A FakeSlurmClient that also notes what the audit log held when each cancel came."""

    def __init__(self, control: ControlStore) -> None:
        super().__init__()
        self.control = control
        self.audited_at_cancel: list[tuple[int, list[str]]] = []

    def cancel(self, job_ids: Iterable[int], reason: str) -> dict[int, str | None]:
        ids = list(job_ids)
        for job in ids:
            audited = [f"{e.action}:{e.outcome}" for e in self.control.audit_entries(job_ids=[job])]
            self.audited_at_cancel.append((job, audited))
        return super().cancel(ids, reason)


def config() -> Config:
    base = Config()
    idle = dataclasses.replace(
        base.policy.idle_gpu, warn_after=Duration(30.0), cancel_after=Duration(60.0)
    )
    controller = dataclasses.replace(base.controller, interval=Duration(10.0))
    node = dataclasses.replace(base.node, interval=Duration(10.0))
    return dataclasses.replace(
        base,
        policy=dataclasses.replace(base.policy, idle_gpu=idle),
        controller=controller,
        node=node,
    )


Rig = tuple[Controller, AuditingSlurm, Store, list[float]]
"""The controller, its Slurm, its store, and the clock's time (set now[0] to move it)."""


@pytest.fixture
def rig(store: Store) -> Rig:
    slurm = AuditingSlurm(store.control)
    now = [T0]
    controller = Controller(config(), slurm, store, clock=lambda: now[0], holder="test")
    return controller, slurm, store, now


def idle_job(store: Store, now: float) -> SlurmJob:
    store.add_activity([GpuActivity(7, "gpu1", "U", 0, T0, now, None, 0.0, 0, 0)])
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


def test_no_running_jobs_is_a_quiet_cycle(rig: Rig) -> None:
    """With nothing running, a cycle audits nothing (and does not trip on empty filters)."""
    controller, _, _, _ = rig
    report = controller.cycle(dry_run=False)
    assert ("", []) == (report.skipped, report.verdicts)


def test_cancel_is_audited_before_slurm_is_asked(rig: Rig) -> None:
    """When scancel runs, the audit log already holds the cancel as planned."""
    controller, slurm, store, now = rig
    for step in range(0, 80, 10):
        now[0] = T0 + step
        slurm.queue = [idle_job(store, now[0])]
        controller.cycle(dry_run=False)
    (job, audited) = slurm.audited_at_cancel[0]
    assert 7 == job
    assert "cancel:planned" in audited and "warn:recorded" in audited


def test_slurm_down_skips_the_cycle_and_audits_nothing(rig: Rig) -> None:
    """squeue failing ends the cycle cleanly: skipped, with Slurm's message, no verdicts."""
    controller, slurm, store, _ = rig
    slurm.outage = SlurmError("squeue failed (exit 1): Unable to contact slurm controller")
    report = controller.cycle(dry_run=False)
    assert "Unable to contact slurm controller" in report.skipped
    assert [] == store.control.audit_entries()


def test_release_lease_lets_another_controller_act_at_once(rig: Rig) -> None:
    """After release_lease, a second controller takes the lease without waiting it out."""
    controller, _, store, now = rig
    controller.cycle(dry_run=False)
    controller.release_lease()
    assert store.control.acquire_lease(LEASE, "other", now=now[0] + 1, ttl=30.0)


def stray_interval(end: float, pids: tuple[int, ...]) -> GpuInterval:
    """A 10 s interval of gpu2's GPU-X with processes of no job on it."""
    return GpuInterval(
        "gpu2", "GPU-X", end - 10, end, None, 30.0, 30.0, 30.0, 10, 10.0, 10.0,
        None, None, None, None, None, None, pids,
    )  # fmt: skip


def test_stray_process_is_reported_once_even_when_its_interval_arrives_late(
    rig: Rig,
) -> None:
    """An interval reaching the store after the cycle that covered its end is still seen.

    A process already reported is not reported again.
    """
    controller, _, store, now = rig
    arrivals = {
        20: [stray_interval(T0 + 15, (501,))],
        30: [stray_interval(T0 + 19, (501, 600))],  # ended before the cycle at T0+20
        40: [stray_interval(T0 + 35, (501, 600))],
    }
    reports = []
    for step in (10, 20, 30, 40):
        now[0] = T0 + step
        store.add_intervals(arrivals.get(step, []))
        verdicts = controller.cycle(dry_run=False).verdicts
        reports += [(step, v.reason) for v in verdicts if v.policy == "unallocated_use"]
    expected = [
        (20, "Process 501 uses GPU-X on gpu2 without a Slurm allocation."),
        (30, "Processes 501, 600 use GPU-X on gpu2 without a Slurm allocation."),
    ]
    assert expected == reports


def run_idle_job(store: Store, flusher: Flusher) -> AuditingSlurm:
    """Eight cycles, 10 s apart, of a job idle since it started (cancel_after 60 s)."""
    slurm = AuditingSlurm(store.control)
    now = [T0]
    controller = Controller(
        config(), slurm, store, clock=lambda: now[0], holder="test", flusher=flusher
    )
    for step in range(0, 80, 10):
        now[0] = T0 + step
        slurm.queue = [idle_job(store, now[0])]
        controller.cycle(dry_run=False)
    return slurm


def test_a_cancel_on_readings_is_judged_again_on_what_the_nodes_ship_when_asked(
    store: Store,
) -> None:
    """[controller] flush_over_nats: before cancelling, the job's nodes are asked to ship.

    The job looked idle past cancel_after; asked, gpu1 ships readings that show it busy:
    judged again on them, nothing is cancelled.
    """
    asked: list[list[str]] = []

    def busy_now(nodes: Sequence[str]) -> dict[str, float | None]:
        asked.append(list(nodes))
        at = T0 + 70
        store.add_activity([GpuActivity(7, "gpu1", "U", 0, T0, at, at, 90.0, 2**30, 1)])
        return dict.fromkeys(nodes, at)

    slurm = run_idle_job(store, busy_now)
    assert ([], [["gpu1"]]) == (slurm.audited_at_cancel, asked)


def test_nodes_that_ship_nothing_new_leave_the_cancel_as_it_was(store: Store) -> None:
    """Asked, gpu1 does not answer (or has nothing new): the cancel goes ahead."""
    asked: list[list[str]] = []

    def silent(nodes: Sequence[str]) -> dict[str, float | None]:
        asked.append(list(nodes))
        return dict.fromkeys(nodes)

    slurm = run_idle_job(store, silent)
    cancels = [job for job, _ in slurm.audited_at_cancel]
    assert (7, [["gpu1"]] * len(cancels)) == (cancels[0], asked)  # asked before each
