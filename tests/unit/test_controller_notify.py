"""The controller's messages (#11 item 7): a warning before a cancel is never held back.

A real SQLite store, a scripted Slurm, a real SMTP server on loopback; the clock injected.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from email.message import Message

import pytest

from slurm_gpu.config import Config
from slurm_gpu.config.policy import NotifySettings
from slurm_gpu.durations import Duration
from slurm_gpu.models import GpuActivity, SlurmJob
from slurm_gpu.policy.controller import Controller
from slurm_gpu.policy.notify import Notifier
from slurm_gpu.store import Store
from slurm_gpu.testing import FakeSlurmClient
from tests.receivers import smtp_receiver

T0 = 1_800_000_000.0
ADMINS = "admins@cluster.example"


def config(port: int) -> Config:
    base = Config()
    runtime = dataclasses.replace(
        base.policy.max_runtime, accounts={"bio": Duration(40.0)}, warn_before=Duration(20.0)
    )
    idle = dataclasses.replace(
        base.policy.idle_gpu, warn_after=Duration(30.0), cancel_after=Duration(60.0)
    )
    notify = NotifySettings(
        smtp_host="127.0.0.1",
        smtp_port=port,
        user_email_domain="cluster.example",
        admin_emails=[ADMINS],
        user_rate_limit=Duration(600.0),
    )
    return dataclasses.replace(
        base,
        policy=dataclasses.replace(base.policy, max_runtime=runtime, idle_gpu=idle),
        controller=dataclasses.replace(base.controller, interval=Duration(10.0)),
        node=dataclasses.replace(base.node, interval=Duration(10.0)),
        notify=notify,
    )


def bio_job(
    job_id: int, start: float, gpus: tuple[int, ...] = (0,), account: str = "bio"
) -> SlurmJob:
    return SlurmJob(
        job_id, "bob", account, "gpu", "RUNNING", start_time=start,
        gpu_count=len(gpus), nodes=("gpu1",), gpus=(("gpu1", gpus),),
    )  # fmt: skip


Rig = tuple[Controller, FakeSlurmClient, list[float], list[Message]]


@pytest.fixture
def rig(store: Store) -> Iterator[Rig]:
    with smtp_receiver() as (port, inbox):
        settings = config(port)
        slurm = FakeSlurmClient()
        now = [T0]
        notifier = Notifier(settings.notify, "c", timeout=5)
        controller = Controller(
            settings, slurm, store, notifier, clock=lambda: now[0], holder="test"
        )
        yield controller, slurm, now, inbox


def subjects(inbox: list[Message], to: str) -> list[str]:
    return [m["Subject"].split(": ", 1)[1] for m in inbox if to in m["X-Rcpt-To"]]


def test_second_max_runtime_warning_of_a_user_is_mailed_before_its_cancel(rig: Rig) -> None:
    """Two bio jobs of bob 5 s apart: each is warned by mail, then cancelled, and mailed.

    The user was mailed about the first job seconds before the second job's warning; the
    rate limit must not drop that warning (it announces a cancel), and the admins get
    every copy.
    """
    controller, slurm, now, inbox = rig
    slurm.queue = [bio_job(1, T0), bio_job(2, T0 + 5)]
    for step in range(20, 80, 5):
        now[0] = T0 + step
        controller.cycle(dry_run=False)
        slurm.queue = [j for j in slurm.queue if j.job_id not in dict(slurm.cancelled)]
    expected = [
        "warning (job 1)",
        "warning (job 2)",
        "job cancelled (job 1)",
        "job cancelled (job 2)",
    ]
    assert expected == subjects(inbox, "bob@cluster.example")
    assert expected == subjects(inbox, ADMINS)
    assert [1, 2] == [job for job, _ in slurm.cancelled]


def test_notice_held_back_from_the_user_goes_to_the_admins_and_is_logged(
    rig: Rig, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A notice within the rate limit of a warning: admins get it, the log says why not bob."""
    controller, slurm, now, inbox = rig
    partial = bio_job(3, T0 + 60, gpus=(0, 1), account="physics")
    now[0] = T0 + 20
    slurm.queue = [bio_job(1, T0)]
    controller.cycle(dry_run=False)  # warns bob about job 1
    now[0] = T0 + 100
    store.add_activity(
        [
            GpuActivity(3, "gpu1", "U0", 0, T0 + 60, now[0], T0 + 99, 80.0, 0, 1),
            GpuActivity(3, "gpu1", "U1", 1, T0 + 60, now[0], None, 0.0, 0, 0),
        ]
    )
    slurm.queue = [partial]
    with caplog.at_level(logging.INFO, logger="slurm_gpu.policy"):
        controller.cycle(dry_run=False)
    assert ["warning (job 1)", "notice (job 3)"] == subjects(inbox, ADMINS)
    assert ["warning (job 1)"] == subjects(inbox, "bob@cluster.example")
    held = [r.getMessage() for r in caplog.records if r.getMessage().startswith("held back")]
    assert 1 == len(held) and "user_rate_limit" in held[0] and "job:3" in held[0]


def test_a_warning_that_could_not_be_mailed_delays_the_cancel(rig: Rig, store: Store) -> None:
    """SMTP down at the warning: no cancel at the limit; the warning is resent, then waited out."""
    controller, slurm, now, inbox = rig
    assert controller.notifier is not None
    working = controller.notifier
    controller.notifier = Notifier(
        dataclasses.replace(working.settings, smtp_port=1), "c", timeout=2
    )
    slurm.queue = [bio_job(1, T0)]
    for step in (20, 30, 40, 45):
        now[0] = T0 + step
        controller.cycle(dry_run=False)
    assert [] == slurm.cancelled  # the limit passed, but bob never heard of it
    controller.notifier = working
    for step in (50, 65):
        now[0] = T0 + step
        controller.cycle(dry_run=False)
    assert [] == slurm.cancelled  # warned at +50: the 20 s grace runs from there
    now[0] = T0 + 70
    controller.cycle(dry_run=False)
    assert [1] == [job for job, _ in slurm.cancelled]
    warns = store.control.audit_entries(job_ids=[1], actions=["warn"])
    assert [False] * 4 + [True] == [e.details.get("delivered") for e in warns]
    assert ["warning (job 1)", "job cancelled (job 1)"] == subjects(inbox, "bob@cluster.example")
