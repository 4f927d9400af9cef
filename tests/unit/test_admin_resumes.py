"""Drains the admin owns (issue 25 item 4): a resume is never undone silently.

slurm-gpu drained gpu1 for a lost GPU; an admin resumed it. The controller drains it
again only on a reading newer than the resume (the GPU lost after it, or the node's
agent heartbeat after it with the GPU still lost, or a hot interval that began after
it); otherwise the drain it would have made is audited as a SKIP with its reason. Every
real drain is mailed to the admins. A real SQLite store, a scripted Slurm, a real SMTP
server on loopback; the clock injected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from email.message import Message
from typing import cast

import pytest

from slurm_gpu.config import Config
from slurm_gpu.config.policy import NotifySettings
from slurm_gpu.durations import Duration
from slurm_gpu.models import GpuDevice, GpuInterval, LostGpu, NodeHeartbeat
from slurm_gpu.policy.controller import Controller
from slurm_gpu.policy.node_health import node_health
from slurm_gpu.policy.notify import Notifier
from slurm_gpu.slurm.scontrol import NodeInfo
from slurm_gpu.store import Store
from slurm_gpu.testing import FakeSlurmClient
from tests.receivers import smtp_receiver

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
ADMINS = "admins@cluster.example"
A100 = [
    GpuDevice("GPU-a0", "NVIDIA A100", 0, 0, "00:01", None),
    GpuDevice("GPU-a1", "NVIDIA A100", 1, 1, "00:02", None),
]
LOST = LostGpu("GPU-a1", 1, T0 + 5, "GPU is lost")


def config(port: int) -> Config:
    base = Config()
    notify = NotifySettings(smtp_host="127.0.0.1", smtp_port=port, admin_emails=[ADMINS])
    return dataclasses.replace(
        base,
        controller=dataclasses.replace(base.controller, interval=Duration(10.0), timezone="UTC"),
        node=dataclasses.replace(base.node, interval=Duration(10.0)),
        notify=notify,
    )


@dataclasses.dataclass
class Rig:
    controller: Controller
    slurm: FakeSlurmClient
    store: Store
    inbox: list[Message]

    def cycle(self, at: float, state: str, dry_run: bool = False) -> None:
        """One controller cycle at `at`, sinfo listing gpu1 in `state`."""
        self.slurm.node_rows = [NodeInfo("gpu1", state)]
        self.controller.clock = lambda: at
        self.controller.cycle(dry_run=dry_run)

    def audited(self) -> list[tuple[float, str, str, str]]:
        return [
            (e.time, e.action, e.reason, e.outcome)
            for e in self.store.control.audit_entries(policies=["hot_node"])
        ]

    def drain_mails(self) -> list[str]:
        return [m["Subject"] for m in self.inbox if "node drained" in m["Subject"]]


@pytest.fixture
def rig(store: Store) -> Iterator[Rig]:
    with smtp_receiver() as (port, inbox):
        settings = config(port)
        slurm = FakeSlurmClient()
        notifier = Notifier(settings.notify, "c", timeout=5)
        controller = Controller(settings, slurm, store, notifier, holder="test")
        store.upsert_inventory("gpu1", A100, T0)
        store.set_lost_gpus("gpu1", [LOST])
        yield Rig(controller, slurm, store, inbox)


def drained_then_resumed(rig: Rig) -> None:
    """slurm-gpu drains gpu1 at T0+10; the admin's resume is first seen at T0+20."""
    rig.cycle(T0 + 10, "idle")
    rig.cycle(T0 + 20, "idle")  # the admin resumed it; the inventory still says lost


DRAIN = (T0 + 10, "drain", "lost GPU GPU-a1", "done")
RESUMED = (
    T0 + 20,
    "none",
    "gpu1 was resumed by an admin (slurm-gpu drained it at 08:00:10; first seen back in"
    " service at 08:00:20): slurm-gpu drains it again only on a reading taken after that.",
    "recorded",
)
SKIPPED = (
    T0 + 20,
    "skip",
    "Drain of gpu1 skipped: an admin resumed it at 08:00:20, and no reading since then shows"
    " lost GPU GPU-a1.",
    "recorded",
)


def test_a_resume_right_after_a_lost_gpu_clears_is_not_undone(rig: Rig) -> None:
    """The GPU came back, the admin resumed gpu1, the inventory row is not yet refreshed.

    No second scontrol drain; the audit says the admin resumed it and that the drain was
    skipped, and why. The agent's report that the GPU answers then clears it for good.
    """
    drained_then_resumed(rig)
    rig.cycle(T0 + 30, "idle")  # the skip is not repeated every cycle
    rig.store.set_lost_gpus("gpu1", [])
    rig.store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 35, ("GPU-a0", "GPU-a1"))])
    rig.cycle(T0 + 40, "idle")
    assert [("gpu1", "lost GPU GPU-a1")] == rig.slurm.calls_to("drain")
    assert [DRAIN, RESUMED, SKIPPED] == rig.audited()
    assert ["[slurm-gpu c] hot_node: node drained (node:gpu1)"] == rig.drain_mails()


def test_an_old_heartbeat_is_no_evidence(rig: Rig) -> None:
    """The agent's newest heartbeat is from before the resume: the lost flag may be stale."""
    rig.store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 15, ("GPU-a0",))])
    drained_then_resumed(rig)
    assert 1 == len(rig.slurm.calls_to("drain"))
    assert [DRAIN, RESUMED, SKIPPED] == rig.audited()


def test_a_heartbeat_after_the_resume_with_the_gpu_still_lost_drains_again(rig: Rig) -> None:
    """The agent read gpu1 after the resume and GPU-a1 is still lost: drained again, mailed.

    The drain's details (audit log, mail) carry the resume's time.
    """
    drained_then_resumed(rig)
    rig.store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 25, ("GPU-a0",))])
    rig.cycle(T0 + 30, "idle")
    assert [("gpu1", "lost GPU GPU-a1")] * 2 == rig.slurm.calls_to("drain")
    again = (T0 + 30, "drain", "lost GPU GPU-a1", "done")
    assert [DRAIN, RESUMED, SKIPPED, again] == rig.audited()
    last = rig.store.control.audit_entries(actions=["drain"])[-1]
    assert T0 + 20 == last.details["resumed_at"]
    mails = rig.drain_mails()
    assert 2 == len(mails)
    body = cast(bytes, rig.inbox[-1].get_payload(decode=True)).decode()
    assert "resumed_at=1800000020.0" in body


def test_a_gpu_lost_again_after_the_resume_drains_again(rig: Rig) -> None:
    """GPU-a1 answered, then fell off the bus again after the resume: drained, mailed."""
    drained_then_resumed(rig)
    rig.store.set_lost_gpus("gpu1", [LostGpu("GPU-a1", 1, T0 + 26, "GPU is lost")])
    rig.cycle(T0 + 30, "idle")
    assert 2 == len(rig.slurm.calls_to("drain"))
    assert ["drain", "none", "skip", "drain"] == [a for _, a, _, _ in rig.audited()]
    assert 2 == len(rig.drain_mails())


def test_a_resumed_node_resumed_again_gets_a_new_record(rig: Rig) -> None:
    """Drained again on new evidence, resumed again: a second resume row, its own R."""
    drained_then_resumed(rig)
    rig.store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 25, ("GPU-a0",))])
    rig.cycle(T0 + 30, "idle")
    rig.cycle(T0 + 40, "drained")
    rig.cycle(T0 + 50, "idle")  # resumed again; the heartbeat of T0+25 is old now
    expected = ["10 drain", "20 none", "20 skip", "30 drain", "50 none", "50 skip"]
    assert expected == [f"{t - T0:.0f} {a}" for t, a, _, _ in rig.audited()]
    assert 2 == len(rig.slurm.calls_to("drain"))


def test_a_node_still_drained_is_not_a_resume(rig: Rig) -> None:
    """sinfo lists gpu1 drained after slurm-gpu's drain: nothing more is audited."""
    rig.cycle(T0 + 10, "idle")
    rig.cycle(T0 + 20, "drained")
    rig.cycle(T0 + 30, "draining")
    assert [DRAIN] == rig.audited()


def test_dry_run_audits_the_skip_as_dry_run(rig: Rig) -> None:
    """A dry-run controller after the resume: the skip is in the audit, marked dry-run."""
    rig.cycle(T0 + 10, "idle")
    rig.cycle(T0 + 20, "idle", dry_run=True)
    entries = rig.store.control.audit_entries(policies=["hot_node"], actions=["skip"])
    assert [(True, SKIPPED[2], "dry-run")] == [(e.dry_run, e.reason, e.outcome) for e in entries]
    assert 1 == len(rig.slurm.calls_to("drain"))


def test_a_drain_that_failed_is_no_drain_to_resume(rig: Rig) -> None:
    """scontrol refused the drain: the node never was drained, so it is drained next cycle."""
    rig.cycle(T0 + 10, "idle")
    rig.store.control.set_outcome(rig.store.control.audit_entries()[0].id, "failed: refused")
    rig.cycle(T0 + 20, "idle")
    assert 2 == len(rig.slurm.calls_to("drain"))
    assert ["drain", "drain"] == [a for _, a, _, _ in rig.audited()]


def interval(start: float, temperature: float, ecc: int | None = None) -> GpuInterval:
    return GpuInterval(
        "gpu1", "GPU-a0", start, start + 10, None, 0.0, 0.0, 0.0, 1, 0.0, 10.0,
        None, None, None, None, temperature, ecc,
    )  # fmt: skip


def test_a_hot_interval_from_before_the_resume_is_skipped_one_after_drains() -> None:
    """Resumed at T0+20: a 95C interval from T0+15 is stale; one from T0+20 is evidence."""
    stale = node_health([interval(T0 + 15, 95.0)], [], [], {"gpu1": T0 + 20}, {}, {})
    assert ([None], 95.0) == (
        [h.max_temperature_celsius for h in stale.evidence],
        stale.stale["gpu1"].max_temperature_celsius,
    )
    fresh = node_health([interval(T0 + 20, 95.0)], [], [], {"gpu1": T0 + 20}, {}, {})
    assert [95.0] == [h.max_temperature_celsius for h in fresh.evidence]


def test_ecc_errors_counted_before_the_resume_are_the_baseline() -> None:
    """ECC 3 before the resume, 3 then 5 after it: 2 new errors count, not 5."""
    rows = [interval(T0 + 10, 40.0, 3), interval(T0 + 20, 40.0, 3), interval(T0 + 30, 40.0, 5)]
    seen = {"GPU-a0": 0}
    readings = node_health(rows, [], [], {"gpu1": T0 + 20}, {}, seen)
    assert ([2], {"GPU-a0": 5}) == ([h.new_ecc_errors for h in readings.evidence], seen)
