"""The controller's records on all three real backends: audit, lease, exemptions, notices."""

from __future__ import annotations

import pytest

from slurm_gpu.models import Action, Verdict
from slurm_gpu.store import Store
from slurm_gpu.store.control import ControlStore, QuotaAction


@pytest.fixture
def control(store: Store) -> ControlStore:
    """The controller's records in a fresh store of each backend."""
    return store.control


def verdict(job: int, action: Action = Action.WARN) -> Verdict:
    return Verdict(
        "idle_gpu",
        action,
        f"job:{job}",
        "idle",
        job_id=job,
        user="alice",
        account="physics",
        details=(("idle_seconds", 60.0),),
    )


def test_audit_round_trips_and_filters(control: ControlStore) -> None:
    """Audited verdicts come back with their outcome, filtered by user and job."""
    (first,) = control.audit(
        [verdict(1)], time=10.0, cycle="c", controller="h", dry_run=True, outcome="dry-run"
    )
    control.audit(
        [verdict(2, Action.CANCEL)],
        time=20.0,
        cycle="c",
        controller="h",
        dry_run=False,
        outcome="planned",
    )
    control.set_outcome(first, "done")
    rows = control.audit_entries(job_ids=[1])
    assert [(1, "warn", "done", True, {"idle_seconds": 60.0})] == [
        (r.job_id, r.action, r.outcome, r.dry_run, r.details) for r in rows
    ]
    assert [2] == [r.job_id for r in control.audit_entries(actions=["cancel"], users=["alice"])]


def test_only_one_holder_gets_the_lease_until_it_expires(control: ControlStore) -> None:
    """A second controller waits; it takes over once the first one's lease expired."""
    assert control.acquire_lease("ctl", "a", now=0.0, ttl=30.0)
    assert not control.acquire_lease("ctl", "b", now=10.0, ttl=30.0)
    assert control.acquire_lease("ctl", "a", now=20.0, ttl=30.0)  # renewal
    assert control.acquire_lease("ctl", "b", now=51.0, ttl=30.0)
    assert not control.acquire_lease("ctl", "a", now=52.0, ttl=30.0)


def test_a_notification_goes_out_once(control: ControlStore) -> None:
    """claim_notification is True once per key; last_notified reports the time."""
    assert control.claim_notification("job:1:idle_gpu:warn", "alice", 5.0, "email")
    assert not control.claim_notification("job:1:idle_gpu:warn", "alice", 6.0, "email")
    assert 5.0 == control.last_notified("alice")
    assert control.last_notified("bob") is None


def test_exemptions_expire(control: ControlStore) -> None:
    """An exemption is in force until its time."""
    control.add_exemption("job", "7", until=100.0, reason="demo", created_by="root", created_at=0.0)
    assert ["7"] == [e.target for e in control.exemptions(now=50.0)]
    assert [] == control.exemptions(now=150.0)


def test_quota_actions_are_remembered_until_undone(control: ControlStore) -> None:
    """A recorded quota action is listed until forgotten."""
    action = QuotaAction("account:physics", "hold", "job:9", 1.0, {"reason": "over"})
    control.record_quota_action(action)
    control.record_quota_action(action)  # idempotent
    assert [action] == control.quota_actions()
    control.forget_quota_action("account:physics", "hold", "job:9")
    assert [] == control.quota_actions()
