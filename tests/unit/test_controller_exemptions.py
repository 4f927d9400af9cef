"""Exemptions in the audit log (#11 item 9): granted, relied on and ended are rows.

A real SQLite store, a scripted Slurm, the clock injected; `slurm-gpu exempt` through click.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.config import Config
from slurm_gpu.durations import Duration
from slurm_gpu.models import GpuActivity, SlurmJob
from slurm_gpu.policy.controller import Controller
from slurm_gpu.store import Store
from slurm_gpu.testing import FakeSlurmClient

T0 = 1_800_000_000.0


def config() -> Config:
    base = Config()
    idle = dataclasses.replace(
        base.policy.idle_gpu, warn_after=Duration(30.0), cancel_after=Duration(60.0)
    )
    return dataclasses.replace(
        base,
        policy=dataclasses.replace(base.policy, idle_gpu=idle),
        controller=dataclasses.replace(base.controller, interval=Duration(10.0)),
        node=dataclasses.replace(base.node, interval=Duration(10.0)),
    )


def idle_job(store: Store, now: float) -> SlurmJob:
    store.add_activity([GpuActivity(7, "gpu1", "U", 0, T0, now, None, 0.0, 0, 0)])
    return SlurmJob(
        7, "alice", "physics", "gpu", "RUNNING", start_time=T0,
        gpu_count=1, nodes=("gpu1",), gpus=(("gpu1", (0,)),),
    )  # fmt: skip


Rig = tuple[Controller, FakeSlurmClient, list[float]]


@pytest.fixture
def rig(store: Store) -> Rig:
    slurm = FakeSlurmClient()
    now = [T0]
    controller = Controller(config(), slurm, store, clock=lambda: now[0], holder="t")
    return controller, slurm, now


def rows(store: Store, job: int = 7) -> list[tuple[str, str, str]]:
    return [(e.policy, e.action, e.outcome) for e in store.control.audit_entries(job_ids=[job])]


def test_exempt_command_writes_an_audit_row_the_job_owner_can_find(
    store: Store, tmp_path: Path
) -> None:
    """`slurm-gpu exempt 7 ...` leaves a row under job 7, with its user, policy and reason."""
    store.upsert_jobs([{"job_id": 7, "user": "alice", "account": "physics"}])
    toml = tmp_path / "slurm-gpu.toml"
    toml.write_text(f'[cluster]\nname = "c"\n[store]\nurl = "{store.engine.url}"\n')
    app = AppContext(env={}, default_path=toml)
    args = ["exempt", "7", "--for", "6h", "--reason", "checkpoint restore", "--policy", "idle_gpu"]
    result = CliRunner().invoke(cli, args, obj=app)
    assert (0, None) == (result.exit_code, result.exception)
    (entry,) = store.control.audit_entries(job_ids=[7])
    assert ("idle_gpu", "exempt", "job:7", "alice", "physics") == (
        entry.policy, entry.action, entry.target, entry.user, entry.account,
    )  # fmt: skip
    assert entry.reason.startswith("Exemption 1 of job 7 from idle_gpu until ")
    assert entry.reason.endswith("granted: checkpoint restore")


def test_controller_audits_once_that_an_exemption_kept_a_policy_off_a_job(
    rig: Rig, store: Store
) -> None:
    """An idle exempt job: one SKIP row naming the exemption, no warning, no cancel."""
    controller, slurm, now = rig
    store.control.add_exemption("job", "7", T0 + 3600, "benchmark", "root", T0)
    for step in range(0, 90, 10):
        now[0] = T0 + step
        slurm.queue = [idle_job(store, now[0])]
        controller.cycle(dry_run=False)
    assert [("all", "exempt", "recorded"), ("idle_gpu", "skip", "recorded")] == rows(store)
    skip = store.control.audit_entries(job_ids=[7])[1]
    assert skip.time == T0 + 30  # when idle_gpu would first have warned
    assert "Exemption 1 of job 7 from every policy" in skip.reason
    assert "would have warned" in skip.reason and skip.reason.endswith("benchmark")
    assert [] == slurm.cancelled


def test_expired_exemption_is_audited_once_and_the_policy_applies_again(
    rig: Rig, store: Store
) -> None:
    """The exemption ends at +40: one EXPIRE row, then the job is warned as any other."""
    controller, slurm, now = rig
    store.control.add_exemption("job", "7", T0 + 40, "short", "root", T0, policy="idle_gpu")
    for step in range(0, 70, 10):
        now[0] = T0 + step
        slurm.queue = [idle_job(store, now[0])]
        controller.cycle(dry_run=False)
    assert [
        ("idle_gpu", "exempt", "recorded"),
        ("idle_gpu", "skip", "recorded"),
        ("idle_gpu", "expire", "recorded"),
        ("idle_gpu", "warn", "recorded"),
    ] == rows(store)
    expire = store.control.audit_entries(job_ids=[7], actions=["expire"])[0]
    assert (T0 + 40, "alice") == (expire.time, expire.user)
    assert "ended: the policies apply again" in expire.reason


def test_warning_withdrawn_by_an_exemption_says_so(rig: Rig, store: Store) -> None:
    """A warned job exempted afterwards: the withdrawal names the exemption, not the GPUs."""
    controller, slurm, now = rig
    for step in (0, 30):
        now[0] = T0 + step
        slurm.queue = [idle_job(store, now[0])]
        controller.cycle(dry_run=False)
    store.control.add_exemption("user", "alice", T0 + 3600, "deadline", "root", T0 + 35)
    now[0] = T0 + 40
    slurm.queue = [idle_job(store, now[0])]
    controller.cycle(dry_run=False)
    withdrawn = store.control.audit_entries(job_ids=[7], actions=["none"])
    assert 1 == len(withdrawn)
    assert withdrawn[0].reason.startswith("Warning withdrawn: Exemption 1 of user alice")
