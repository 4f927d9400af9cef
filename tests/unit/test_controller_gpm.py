"""The controller with GPM (#13): a fake-busy job beside a busy one, cycle by cycle.

A real SQLite store fed the agent's activity rows and intervals every 10 s, a scripted
Slurm, a real SMTP server on loopback, the clock injected. The fake-busy job (duty cycle
99%, SM activity 1%) gets the low_efficiency notice; with `[policy.idle_gpu] signal =
"sm_active"` it is also warned, then cancelled after the grace period, while the busy job
beside it (SM activity 70%) is left alone. With signal "util" nothing cancels it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from email.message import Message
from typing import Literal

import pytest

from slurm_gpu.config import Config
from slurm_gpu.config.policy import NotifySettings
from slurm_gpu.durations import Duration
from slurm_gpu.models import GpuActivity, GpuInterval, SlurmJob
from slurm_gpu.policy.controller import Controller
from slurm_gpu.policy.notify import Notifier
from slurm_gpu.store import Store
from slurm_gpu.testing import FakeSlurmClient
from tests.receivers import smtp_receiver

T0 = 1_800_000_000.0
ADMINS = "admins@cluster.example"
# job id -> (GPU, duty cycle, SM activity)
LOADS = {1: ("GPU-0", 99.0, 1.0), 2: ("GPU-1", 95.0, 70.0)}


def config(port: int, signal: Literal["util", "sm_active"]) -> Config:
    """Ticks, shipping and cycles every 10 s; idle warn 30 s / cancel 60 s; notice at 40 s."""
    base = Config()
    idle = dataclasses.replace(
        base.policy.idle_gpu, warn_after=Duration(30.0), cancel_after=Duration(60.0), signal=signal
    )
    low = dataclasses.replace(base.policy.low_efficiency, notice_after=Duration(40.0))
    notify = NotifySettings(
        smtp_host="127.0.0.1",
        smtp_port=port,
        user_email_domain="cluster.example",
        admin_emails=[ADMINS],
        user_rate_limit=Duration(0.0),
    )
    return dataclasses.replace(
        base,
        policy=dataclasses.replace(base.policy, idle_gpu=idle, low_efficiency=low),
        controller=dataclasses.replace(base.controller, interval=Duration(10.0), enforce=True),
        node=dataclasses.replace(base.node, interval=Duration(10.0)),
        store=dataclasses.replace(base.store, ship_aggregate=Duration(10.0)),
        notify=notify,
    )


def job(job_id: int) -> SlurmJob:
    return SlurmJob(
        job_id, "alice", "physics", "gpu", "RUNNING", start_time=T0,
        gpu_count=1, nodes=("gpu2",), gpus=(("gpu2", (job_id - 1,)),),
    )  # fmt: skip


def agent_ships(store: Store, now: float, running: list[int]) -> None:
    """What the gpu2 agent ships by `now`: the last 10 s interval and activity of each job."""
    intervals, rows = [], []
    for job_id in running:
        uuid, util, sm = LOADS[job_id]
        interval = GpuInterval(
            "gpu2", uuid, now - 10, now, job_id, util, util, util, 10, 10.0, 10.0,
            2**30, 80 * 2**30, 300.0, 3000.0, 50.0, 0,
            gpm_seconds=10.0, sm_active_mean_percent=sm,
        )  # fmt: skip
        intervals.append(interval)
        row = GpuActivity(
            job_id, "gpu2", uuid, job_id - 1, T0, now, now - 1, util, 2**30, 1,
            measured_since=T0, sm_active_recent_percent=sm,
            last_sm_active=now - 1 if sm >= 5 else None,
        )  # fmt: skip
        rows.append(row)
    store.add_intervals(intervals)
    store.add_activity(rows)


Rig = tuple[Store, list[Message], int]


@pytest.fixture
def rig(store: Store) -> Iterator[tuple[Store, list[Message], int]]:
    with smtp_receiver() as (port, inbox):
        yield store, inbox, port


def run(rig: Rig, signal: Literal["util", "sm_active"], until: float) -> FakeSlurmClient:
    """Cycles every 10 s from T0 + 10 to `until`; a cancelled job leaves the queue."""
    store, _, port = rig
    slurm = FakeSlurmClient([job(1), job(2)])
    now = [T0]
    settings = config(port, signal)
    controller = Controller(
        settings, slurm, store, Notifier(settings.notify, "c", timeout=5), lambda: now[0], "t"
    )
    for step in range(10, int(until - T0) + 1, 10):
        now[0] = T0 + step
        slurm.queue = [j for j in slurm.queue if j.job_id not in dict(slurm.cancelled)]
        agent_ships(store, now[0], [j.job_id for j in slurm.queue])
        controller.cycle(dry_run=False)
    return slurm


def subjects(inbox: list[Message], to: str) -> list[str]:
    return [m["Subject"].split("] ", 1)[1] for m in inbox if to in m["X-Rcpt-To"]]


def test_sm_active_warns_then_cancels_the_fake_busy_job_and_notices_it(rig: Rig) -> None:
    """Warned at +30, noticed at +40, cancelled at +60; the busy job 2 hears nothing."""
    store, inbox, _ = rig
    slurm = run(rig, "sm_active", T0 + 120)
    assert [1] == [job_id for job_id, _ in slurm.cancelled]
    expected = [
        "idle_gpu: warning (job 1)",
        "low_efficiency: notice (job 1)",
        "idle_gpu: job cancelled (job 1)",
    ]
    assert expected == subjects(inbox, "alice@cluster.example")
    audited = [
        (e.time - T0, e.policy, e.action, e.job_id)
        for e in store.control.audit_entries()
        if e.action != "none"
    ]
    assert [
        (30.0, "idle_gpu", "warn", 1),
        (40.0, "low_efficiency", "notice", 1),
        (60.0, "idle_gpu", "cancel", 1),
    ] == audited


def test_the_notice_reason_is_what_the_user_reads(rig: Rig) -> None:
    """The audit row's reason and the mail say what the GPU did and that no cancel follows."""
    store, inbox, _ = rig
    run(rig, "util", T0 + 60)
    [entry] = store.control.audit_entries(actions=["notice"])
    expected = (
        "GPU 0 on gpu2 of job 1 has looked busy for 40 s while barely computing: utilization "
        "(the share of time some kernel runs) 99%, but only 1% of its SMs active. The job "
        "holds the GPU while using little of it: larger batches, fewer and bigger kernels, "
        "or a smaller GPU would serve it better. This is a notice: the job will not be "
        "cancelled for it."
    )
    mail = [m for m in inbox if "alice@cluster.example" in m["X-Rcpt-To"]]
    body = mail[0].get_payload(decode=True)
    assert isinstance(body, bytes)
    assert (expected, True) == (entry.reason, expected in body.decode())


def test_util_signal_never_cancels_the_fake_busy_job(rig: Rig) -> None:
    """By utilization the fake-busy job is busy: one notice, no warning, no cancel."""
    _, inbox, _ = rig
    slurm = run(rig, "util", T0 + 150)
    assert ([], ["low_efficiency: notice (job 1)"]) == (
        slurm.cancelled,
        subjects(inbox, "alice@cluster.example"),
    )
