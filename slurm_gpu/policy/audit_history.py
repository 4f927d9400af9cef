"""What the audit log already says, as each controller cycle needs it.

When each job's warning episode began (a grace period counts from there), which verdicts
only repeat the last entry (a warning, notice or report is audited once per episode),
which warnings ended without an action, and which ended exemptions have no EXPIRE row yet.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_gpu.models import Action, SlurmJob, Verdict
from slurm_gpu.policy.exemption_audit import (
    EXPIRY_LOOKBACK_SECONDS,
    expiry_verdicts,
    withdrawal_reason,
)
from slurm_gpu.policy.messages import GRACE_POLICIES
from slurm_gpu.store.control import ControlStore, ExemptionRecord

# Verdicts audited once per episode rather than every cycle.
QUIET_REPEATS = frozenset({Action.WARN, Action.NOTICE, Action.NONE, Action.REPORT, Action.SKIP})

# Details that make a repeated warning, notice or report a new event: a quota fraction
# crossed, or other stray processes on a node's GPU.
_EVENT_IDENTITY = ("fraction", "gpu_uuid", "pids")


def _as_logged(value: object) -> object:
    """A detail as it reads back from the audit log (JSON: tuples become lists)."""
    return list(value) if isinstance(value, tuple) else value


def first_warnings(
    control: ControlStore, running: Sequence[int], dry_run: bool
) -> dict[tuple[int, str], float]:
    """First warning of each job's current episode, in this mode (dry-run or not).

    An episode ends when a later cycle withdrew the warning (the GPUs got busy);
    dry-run warnings never count for enforcement, since nobody received them.
    """
    if not running:
        return {}  # (an empty filter would mean every job)
    entries = control.audit_entries(
        job_ids=running, actions=["warn", "none"], policies=GRACE_POLICIES, dry_run=dry_run
    )
    first: dict[tuple[int, str], float] = {}
    for entry in entries:  # oldest first
        if entry.job_id is None:
            continue
        key = (entry.job_id, entry.policy)
        if entry.action == "none":
            first.pop(key, None)
        elif entry.details.get("delivered") is not False:
            # A warning that never reached its user starts no grace period.
            first.setdefault(key, entry.time)
    return first


def news(control: ControlStore, verdicts: list[Verdict], dry_run: bool) -> list[Verdict]:
    """Drops a warning, notice or report that only repeats the last one audited.

    Acting verdicts are always kept; a warning comes back into the log when
    something changed (it was withdrawn, a quota crossed another fraction, other
    processes appeared on a GPU).
    """
    latest = control.latest_decisions([v.target for v in verdicts], dry_run)
    kept = []
    for v in verdicts:
        last = latest.get((v.target, v.policy))
        repeat = (
            v.action in QUIET_REPEATS
            and last is not None
            and last[0] == v.action.value
            # A warning that did not reach its user is sent again.
            and last[1].get("delivered") is not False
            and all(
                _as_logged(last[1].get(key)) == _as_logged(dict(v.details).get(key))
                for key in _EVENT_IDENTITY
            )
        )
        if not repeat:
            kept.append(v)
    return kept


def withdrawn_warnings(
    control: ControlStore,
    jobs: list[SlurmJob],
    verdicts: list[Verdict],
    dry_run: bool,
    records: Sequence[ExemptionRecord] = (),
) -> list[Verdict]:
    """Audit entries closing warning episodes of jobs no longer warned or cancelled."""
    running = {j.job_id: j for j in jobs if j.state.upper() == "RUNNING"}
    # A NONE verdict (readings unknown) says itself that the warning is suspended.
    active = {
        (v.job_id, v.policy)
        for v in verdicts
        if v.action in (Action.WARN, Action.CANCEL, Action.CAP_TIME, Action.NONE)
    }
    out = []
    for job_id, policy in first_warnings(control, list(running), dry_run):
        if (job_id, policy) in active or job_id not in running:
            continue
        job = running[job_id]
        out.append(
            Verdict(
                policy,
                Action.NONE,
                f"job:{job_id}",
                withdrawal_reason(job, records, policy),
                job_id=job_id,
                user=job.user,
                account=job.account,
            )
        )
    return out


def expired_exemptions(control: ControlStore, jobs: list[SlurmJob], now: float) -> list[Verdict]:
    """EXPIRE records of exemptions that ended since the last cycle (once each)."""
    since = now - EXPIRY_LOOKBACK_SECONDS
    ended = control.exemptions(now, ended_since=since)
    if not ended:
        return []
    audited = {
        e.details.get("exemption_id")
        for e in control.audit_entries(since=since, actions=[Action.EXPIRE.value])
    }
    return expiry_verdicts(ended, audited, jobs)
