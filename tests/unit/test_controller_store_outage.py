"""The controller while its store is locked (#11 item 14): max_runtime keeps its cadence.

A real SQLite store that a second connection locks (as a long migration or a stuck
writer does: every write waits out the busy timeout), a scripted Slurm, the clock
injected; the cycles' wall time is what is measured.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from slurm_gpu.config import Config
from slurm_gpu.durations import Duration
from slurm_gpu.models import SlurmJob
from slurm_gpu.policy.audit_spool import AuditSpool
from slurm_gpu.policy.controller import Controller
from slurm_gpu.store import Store
from slurm_gpu.testing import FakeSlurmClient

T0 = 1_800_000_000.0
INTERVAL = 2.0


class SpoolWatchingSlurm(FakeSlurmClient):
    """Notes what the audit spool held when each cancel came; a cancelled job leaves squeue."""

    def __init__(self, spool: AuditSpool) -> None:
        super().__init__()
        self.spool = spool
        self.spooled_at_cancel: list[list[tuple[str, str]]] = []

    def cancel(self, job_ids: Iterable[int], reason: str) -> dict[int, str | None]:
        rows = self.spool.rows()
        self.spooled_at_cancel.append([(r["action"], r["outcome"]) for r in rows])
        ids = list(job_ids)
        answer = super().cancel(ids, reason)
        self.queue = [job for job in self.queue if job.job_id not in ids]
        return answer


def config(tmp_path: Path, lease_seconds: int = 300) -> Config:
    base = Config()
    runtime = dataclasses.replace(
        base.policy.max_runtime, accounts={"bio": Duration(40.0)}, warn_before=Duration(20.0)
    )
    return dataclasses.replace(
        base,
        policy=dataclasses.replace(base.policy, max_runtime=runtime),
        controller=dataclasses.replace(
            base.controller,
            interval=Duration(INTERVAL),
            lease_seconds=lease_seconds,
            audit_spool=tmp_path / "controller" / "audit-spool.jsonl",
        ),
    )


def bio_job() -> SlurmJob:
    return SlurmJob(
        1, "bob", "bio", "gpu", "RUNNING", start_time=T0,
        gpu_count=1, nodes=("gpu1",), gpus=(("gpu1", (0,)),),
    )  # fmt: skip


@contextmanager
def locked(store: Store) -> Iterator[None]:
    """Another connection holds the store's write lock until the block ends."""
    database = store.engine.url.database
    assert database is not None
    conn = sqlite3.connect(database, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


Rig = tuple[Controller, SpoolWatchingSlurm, list[float]]


def rig(store: Store, settings: Config) -> Rig:
    now = [T0]
    slurm = SpoolWatchingSlurm(AuditSpool(settings.controller.audit_spool))
    slurm.queue = [bio_job()]
    controller = Controller(settings, slurm, store, clock=lambda: now[0], holder="test")
    return controller, slurm, now


def timed_cycle(controller: Controller) -> float:
    started = time.monotonic()
    controller.cycle(dry_run=False)
    return time.monotonic() - started


def until_store_back(controller: Controller, now: list[float]) -> None:
    """Cycles (a little real time apart) until the store answered again."""
    for _ in range(50):
        now[0] += 0.1
        if controller.cycle(dry_run=False).store_down_since is None:
            return
        time.sleep(0.1)
    raise AssertionError("the store never came back")


def test_max_runtime_cancels_on_time_while_the_store_is_locked(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Warned with the store up, the job is cancelled at its limit with the store locked.

    Every cycle under the lock takes at most half an interval (not the busy timeout);
    the cancel is in the local spool, planned, before scancel runs; once the store
    answers, the audit log holds it, done, and the log said the store was down.
    """
    controller, slurm, now = rig(store, config(tmp_path))
    now[0] = T0 + 20
    controller.cycle(dry_run=False)  # the warning, audited in the store
    with caplog.at_level(logging.INFO, logger="slurm_gpu.policy.controller"), locked(store):
        durations = []
        for step in (30, 40):
            now[0] = T0 + step
            durations.append(timed_cycle(controller))
        assert max(durations) < INTERVAL
        assert [1] == [job for job, _ in slurm.cancelled]
        assert [[("cancel", "planned")]] == slurm.spooled_at_cancel
    until_store_back(controller, now)
    entries = store.control.audit_entries(job_ids=[1], policies=["max_runtime"])
    actions = [(e.action, e.outcome) for e in entries]
    assert [("warn", "recorded"), ("cancel", "done")] == actions
    assert [] == AuditSpool(controller.spool.path).rows()
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "the store is unavailable" in logged and "the store is back" in logged


def test_nothing_is_acted_on_once_the_lease_ran_out_during_the_outage(
    store: Store, tmp_path: Path
) -> None:
    """The lease (10 s) ends while the store is locked: no cancel, the cycle says why."""
    controller, slurm, now = rig(store, config(tmp_path, lease_seconds=10))
    now[0] = T0 + 20
    controller.cycle(dry_run=False)
    with locked(store):
        now[0] = T0 + 40
        report = controller.cycle(dry_run=False)
    assert [] == slurm.cancelled
    assert "holds no unexpired lease" in report.skipped


def test_a_decision_that_cannot_be_spooled_is_not_acted_on(store: Store, tmp_path: Path) -> None:
    """Store locked and the spool's directory unwritable: no cancel, and the cycle says so."""
    settings = config(tmp_path)
    blocker = tmp_path / "controller"
    blocker.write_text("a file where the spool's directory should be")
    controller, slurm, now = rig(store, settings)
    now[0] = T0 + 20
    controller.cycle(dry_run=False)
    with locked(store):
        now[0] = T0 + 40
        report = controller.cycle(dry_run=False)
    assert [] == slurm.cancelled
    assert "audit spool" in report.skipped
