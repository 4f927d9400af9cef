"""Acting on a verdict through Slurm, and remembering what the quota policy set.

The controller calls `Enforcer.act` only for a verdict already in the audit log (or the
audit spool) as planned; the outcome it returns replaces "planned" there. A hold, a QOS
change, a block or a fair-share change is remembered in the store (`ControlStore`'s quota
actions) so that the quota policy can undo it when its period ends.
"""

from __future__ import annotations

import logging

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.models import Action, Verdict
from slurm_gpu.policy.quota_periods import is_rolling
from slurm_gpu.slurm.client import SlurmClient
from slurm_gpu.store.control import ControlStore, QuotaAction

# The controller's modules log under one name, as before they were split (issue 25 item 7).
log = logging.getLogger("slurm_gpu.policy.controller")


class Enforcer:
    """Carries out verdicts through Slurm.

    Args:
        slurm: the Slurm client (the CLI backend in production).
        control: the store's controller bookkeeping, where quota actions are remembered.
    """

    def __init__(self, slurm: SlurmClient, control: ControlStore) -> None:
        self.slurm = slurm
        self.control = control

    def act(self, verdict: Verdict, now: float) -> str:
        """Carries out one verdict through Slurm; returns its outcome for the audit log."""
        d = dict(verdict.details)
        job = verdict.job_id
        try:
            match verdict.action:
                case Action.CANCEL if job is not None:
                    error = self.slurm.cancel([job], verdict.reason).get(job)
                    return f"failed: {error}" if error else "done"
                case Action.CAP_TIME if job is not None:
                    self.slurm.set_time_limit(job, float(str(d["time_limit_seconds"])))
                case Action.HOLD if job is not None:
                    error = self.slurm.hold([job], verdict.reason).get(job)
                    if error:
                        return f"failed: {error}"
                    self._remember(verdict, now)
                case Action.RELEASE if job is not None:
                    error = self.slurm.release([job]).get(job)
                    if error and "already" not in error.lower():
                        return f"failed: {error}"
                    self._forget(verdict, Action.HOLD)
                case Action.SET_QOS if job is not None:
                    self.slurm.set_qos(job, str(d["qos"]))
                    if d.get("restore"):
                        self._forget(verdict, Action.SET_QOS)
                    else:
                        self._remember(verdict, now, previous=str(d.get("previous", "")))
                case Action.BLOCK | Action.UNBLOCK:
                    self._set_assoc(verdict.target, GrpTRES=str(d["tres"]))
                    if verdict.action is Action.BLOCK:
                        self._remember(verdict, now)
                    else:
                        self._forget(verdict, Action.BLOCK)
                case Action.SET_FAIRSHARE:
                    if d.get("restore"):
                        self._set_assoc(verdict.target, Fairshare=int(str(d["shares"])))
                        self._forget(verdict, Action.SET_FAIRSHARE)
                    else:
                        previous = self._shares(verdict.target)
                        self._set_assoc(verdict.target, Fairshare=int(str(d["shares"])))
                        self._remember(verdict, now, previous=previous)
                case Action.DRAIN:
                    # The client prefixes "slurm-gpu: "; Slurm keeps a reason short.
                    self.slurm.drain(
                        verdict.node or verdict.target.split(":", 1)[1], verdict.reason[:240]
                    )
                case _:
                    return "recorded"
        except (SlurmGpuError, KeyError, ValueError) as exc:
            log.error("acting on %s (%s) failed: %s", verdict.target, verdict.action.value, exc)
            return f"failed: {exc}"
        return "done"

    def _set_assoc(self, scope: str, **fields: object) -> None:
        """Sets fields on the association(s) of "account:NAME" or "user:NAME"."""
        kind, _, name = scope.partition(":")
        if kind == "account":
            self.slurm.set_association(name, None, **fields)
            return
        for assoc in self.slurm.associations(user=name):
            self.slurm.set_association(assoc.account, name, **fields)

    def _shares(self, scope: str) -> str:
        kind, _, name = scope.partition(":")
        assocs = (
            self.slurm.associations(account=name)
            if kind == "account"
            else self.slurm.associations(user=name)
        )
        own = [a for a in assocs if (a.user == "") == (kind == "account")]
        return "" if not own or own[0].shares is None else str(own[0].shares)

    def _remember(self, verdict: Verdict, now: float, previous: str = "") -> None:
        d = dict(verdict.details)
        scope = f"account:{verdict.account}" if verdict.account else f"user:{verdict.user}"
        if verdict.target.startswith(("account:", "user:")):
            scope = verdict.target
        period = str(d.get("period", ""))
        self.control.record_quota_action(
            QuotaAction(
                scope=scope,
                action=verdict.action.value,
                target=verdict.target,
                applied_at=now,
                details={
                    "unit": d.get("unit", ""),
                    "period": period,
                    "job_id": verdict.job_id,
                    "previous": previous,
                    "period_end": None if not period or is_rolling(period) else d.get("period_end"),
                },
            )
        )

    def _forget(self, verdict: Verdict, undone: Action) -> None:
        for entry in self.control.quota_actions():
            if entry.target == verdict.target and entry.action == undone.value:
                self.control.forget_quota_action(entry.scope, entry.action, entry.target)
