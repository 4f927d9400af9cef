"""The controller's cycle: read Slurm and the store, evaluate, audit, then act.

Order matters: every verdict is in the audit log before anything happens in Slurm, so a
controller killed mid-cycle leaves a record of what it was about to do ("planned"), and
every action's outcome replaces it ("done", "failed: ...").

Only one controller acts at a time: the holder of a lease row in the store. A Slurm or
store error ends the cycle cleanly (nothing half-read is acted on); the next cycle retries.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slurm_gpu.config import Config
from slurm_gpu.errors import SlurmError, SlurmGpuError, StoreError
from slurm_gpu.models import (
    Action,
    Exemption,
    GpuInterval,
    NodeHealth,
    QuotaApplied,
    QuotaUsage,
    SlurmJob,
    UnallocatedUse,
    Verdict,
)
from slurm_gpu.policy.notify import URGENT, Notifier, notification_key
from slurm_gpu.policy.quota_periods import cluster_timezone, is_rolling, period_bounds
from slurm_gpu.policy.rules import evaluate
from slurm_gpu.slurm.client import SlurmClient
from slurm_gpu.store import Store
from slurm_gpu.store.control import QuotaAction

log = logging.getLogger(__name__)

LEASE = "controller"
# Policies whose warnings start a grace period that a cancel must wait out.
GRACE_POLICIES = ("idle_gpu", "max_runtime")
# Verdicts audited once per episode rather than every cycle.
QUIET_REPEATS = frozenset({Action.WARN, Action.NOTICE, Action.NONE, Action.REPORT})
NOTIFIED = frozenset(
    {
        Action.WARN,
        Action.NOTICE,
        Action.CANCEL,
        Action.CAP_TIME,
        Action.HOLD,
        Action.RELEASE,
        Action.BLOCK,
        Action.UNBLOCK,
        Action.SET_QOS,
        Action.SET_FAIRSHARE,
        Action.DRAIN,
        Action.REPORT,
    }
)


@dataclass
class CycleReport:
    """What one cycle did: for logs, `--once` output and tests."""

    time: float
    dry_run: bool
    skipped: str = ""
    verdicts: list[Verdict] = field(default_factory=list)
    outcomes: dict[int, str] = field(default_factory=dict)
    notified: int = 0


# Details that make a repeated warning, notice or report a new event: a quota fraction
# crossed, or other stray processes on a node's GPU.
_EVENT_IDENTITY = ("fraction", "gpu_uuid", "pids")


def _as_logged(value: object) -> object:
    """A detail as it reads back from the audit log (JSON: tuples become lists)."""
    return list(value) if isinstance(value, tuple) else value


def default_holder() -> str:
    """host:pid:random, unique per controller process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Controller:
    """Applies the policies through Slurm.

    Args:
        config: the loaded configuration.
        slurm: the Slurm client (the CLI backend in production).
        store: the accounting store.
        notifier: sends email/webhook messages; None sends nothing.
        clock: POSIX time, injectable.
        holder: this controller's lease identity.
    """

    def __init__(
        self,
        config: Config,
        slurm: SlurmClient,
        store: Store,
        notifier: Notifier | None = None,
        clock: Callable[[], float] = time.time,
        holder: str | None = None,
    ) -> None:
        self.config = config
        self.slurm = slurm
        self.store = store
        self.control = store.control
        self.notifier = notifier
        self.clock = clock
        self.holder = holder or default_holder()
        self._ecc_seen: dict[str, int] = {}
        # (node, GPU) -> stray pids already reported.
        self._unallocated_reported: dict[tuple[str, str], set[int]] = {}

    # ---- the cycle ------------------------------------------------------------------

    def cycle(self, dry_run: bool) -> CycleReport:
        """One read-evaluate-audit-act round. Never raises for Slurm or store trouble."""
        now = self.clock()
        report = CycleReport(time=now, dry_run=dry_run)
        cycle_id = f"{int(now)}-{uuid.uuid4().hex[:6]}"
        try:
            lease = float(self.config.controller.lease_seconds)
            if not self.control.acquire_lease(LEASE, self.holder, now, lease):
                report.skipped = "another controller holds the lease"
                return report
            jobs = self.slurm.jobs()
            nodes = self.slurm.nodes()
            verdicts = self._evaluate(
                jobs, [n.name for n in nodes if "drain" in n.state], now, dry_run
            )
            withdrawn = self._withdrawn_warnings(jobs, verdicts, dry_run)
            verdicts = self._news(verdicts, dry_run)
            report.verdicts = verdicts
            planned = "dry-run" if dry_run else "planned"
            self.control.audit(
                withdrawn,
                time=now,
                cycle=cycle_id,
                controller=self.holder,
                dry_run=dry_run,
                outcome="recorded",
            )
            ids = self.control.audit(
                verdicts,
                time=now,
                cycle=cycle_id,
                controller=self.holder,
                dry_run=dry_run,
                outcome=planned,
            )
        except (SlurmError, StoreError) as exc:
            log.error("cycle abandoned before acting: %s", exc)
            report.skipped = str(exc)
            return report
        for audit_id, verdict in zip(ids, verdicts, strict=True):
            if dry_run:
                continue
            outcome = self._act(verdict, now)
            report.outcomes[audit_id] = outcome
            try:
                self.control.set_outcome(audit_id, outcome)
            except StoreError as exc:
                log.error("could not record outcome of %s: %s", verdict.target, exc)
        if not dry_run:
            report.notified = self._notify(verdicts, now)
        return report

    def run(
        self, dry_run: bool, stop: Callable[[], bool], sleep: Callable[[float], object]
    ) -> None:
        """Cycles every [controller] interval until `stop()`; gives the lease back at the end."""
        interval = float(self.config.controller.interval)
        while not stop():
            started = time.monotonic()
            try:
                report = self.cycle(dry_run)
            except Exception:  # a bug in one cycle must not stop enforcement for good
                log.exception("cycle failed")
                sleep(interval)
                continue
            if report.skipped:
                log.info("cycle skipped: %s", report.skipped)
            else:
                log.info(
                    "cycle: %d verdicts (%s), %d notified",
                    len(report.verdicts),
                    "dry-run" if dry_run else "enforcing",
                    report.notified,
                )
            sleep(max(0.0, interval - (time.monotonic() - started)))
        self.release_lease()

    def release_lease(self) -> None:
        """Gives the controller lease back (clean shutdown), so another need not wait.

        (Not to be confused with `SlurmClient.release`, which releases held jobs.)
        """
        try:
            self.control.release_lease(LEASE, self.holder)
        except StoreError as exc:
            log.warning("could not release the lease: %s", exc)

    # ---- inputs ---------------------------------------------------------------------

    def _evaluate(
        self, jobs: list[SlurmJob], drained: list[str], now: float, dry_run: bool
    ) -> list[Verdict]:
        running = [j.job_id for j in jobs if j.state.upper() == "RUNNING"]
        activity = self.store.activity(running)
        recent = self.store.intervals(since=self._recent_intervals_window(now))
        exemptions = [
            Exemption(f"{e.kind}:{e.target}", e.policy, e.until, e.reason, e.created_by)
            for e in self.control.exemptions(now)
        ]
        return evaluate(
            jobs,
            activity,
            now,
            self.config,
            exemptions=exemptions,
            warned=self._warned(running, dry_run),
            quota_usage=self._quota_usage(now),
            quota_applied=self._quota_applied({j.job_id for j in jobs}),
            node_health=self._node_health(recent, drained),
            unallocated=self._unallocated(recent),
        )

    def _warned(self, running: Sequence[int], dry_run: bool) -> dict[tuple[int, str], float]:
        """First warning of each job's current episode, in this mode (dry-run or not).

        An episode ends when a later cycle withdrew the warning (the GPUs got busy);
        dry-run warnings never count for enforcement, since nobody received them.
        """
        if not running:
            return {}  # (an empty filter would mean every job)
        entries = self.control.audit_entries(
            job_ids=running, actions=["warn", "none"], policies=GRACE_POLICIES, dry_run=dry_run
        )
        first: dict[tuple[int, str], float] = {}
        for entry in entries:  # oldest first
            if entry.job_id is None:
                continue
            key = (entry.job_id, entry.policy)
            if entry.action == "none":
                first.pop(key, None)
            else:
                first.setdefault(key, entry.time)
        return first

    def _news(self, verdicts: list[Verdict], dry_run: bool) -> list[Verdict]:
        """Drops a warning, notice or report that only repeats the last one audited.

        Acting verdicts are always kept; a warning comes back into the log when
        something changed (it was withdrawn, a quota crossed another fraction, other
        processes appeared on a GPU).
        """
        latest = self.control.latest_decisions([v.target for v in verdicts], dry_run)
        kept = []
        for v in verdicts:
            last = latest.get((v.target, v.policy))
            repeat = (
                v.action in QUIET_REPEATS
                and last is not None
                and last[0] == v.action.value
                and all(
                    _as_logged(last[1].get(key)) == _as_logged(dict(v.details).get(key))
                    for key in _EVENT_IDENTITY
                )
            )
            if not repeat:
                kept.append(v)
        return kept

    def _withdrawn_warnings(
        self, jobs: list[SlurmJob], verdicts: list[Verdict], dry_run: bool
    ) -> list[Verdict]:
        """Audit entries closing warning episodes of jobs no longer warned or cancelled."""
        running = {j.job_id: j for j in jobs if j.state.upper() == "RUNNING"}
        active = {
            (v.job_id, v.policy)
            for v in verdicts
            if v.action in (Action.WARN, Action.CANCEL, Action.CAP_TIME)
        }
        out = []
        for job_id, policy in self._warned(list(running), dry_run):
            if (job_id, policy) in active or job_id not in running:
                continue
            job = running[job_id]
            out.append(
                Verdict(
                    policy,
                    Action.NONE,
                    f"job:{job_id}",
                    "Warning withdrawn: the job no longer meets the policy's condition.",
                    job_id=job_id,
                    user=job.user,
                    account=job.account,
                )
            )
        return out

    def _quota_usage(self, now: float) -> list[QuotaUsage]:
        tz = cluster_timezone(self.config.controller.timezone)
        usage = []
        for rule in self.config.quota:
            start, end = period_bounds(now, rule.period, tz)
            used = self.control.usage(rule.scope, rule.unit, start, min(end, now))
            usage.append(QuotaUsage(rule.scope, rule.unit, rule.period, used, start, end))
        return usage

    def _quota_applied(self, live_jobs: set[int]) -> list[QuotaApplied]:
        """What the quota policy set and has not undone; entries of vanished jobs are dropped."""
        applied = []
        for entry in self.control.quota_actions():
            d = entry.details
            job_id = d.get("job_id")
            if job_id is not None and job_id not in live_jobs:
                # Held or re-QOSed job that has since ended or was cancelled: nothing to undo.
                self.control.forget_quota_action(entry.scope, entry.action, entry.target)
                continue
            applied.append(
                QuotaApplied(
                    scope=entry.scope,
                    unit=str(d.get("unit", "")),
                    period=str(d.get("period", "")),
                    action=Action(entry.action),
                    target=entry.target,
                    job_id=d.get("job_id"),
                    previous=str(d.get("previous", "")),
                    period_end=d.get("period_end"),
                    applied_at=entry.applied_at,
                )
            )
        return applied

    def _recent_intervals_window(self, now: float) -> float:
        return now - 3 * float(self.store_period())

    def store_period(self) -> float:
        """How far back "recent" readings reach: a shipping period plus an agent interval."""
        return float(self.config.store.ship_aggregate) + float(self.config.node.interval)

    def _node_health(self, recent: list[GpuInterval], drained: list[str]) -> list[NodeHealth]:
        newest: dict[str, tuple[float, float | None]] = {}
        ecc: dict[str, int] = {}
        nodes: dict[str, str] = {}
        for row in recent:
            nodes[row.gpu_uuid] = row.node
            last = newest.get(row.gpu_uuid)
            if last is None or row.period_end > last[0]:
                newest[row.gpu_uuid] = (row.period_end, row.temperature_max_celsius)
            if row.ecc_errors_total is not None:
                ecc[row.gpu_uuid] = max(ecc.get(row.gpu_uuid, 0), row.ecc_errors_total)
        health: dict[str, NodeHealth] = {}
        for gpu, node in nodes.items():
            temp = newest[gpu][1]
            new_ecc = max(0, ecc.get(gpu, 0) - self._ecc_seen.get(gpu, ecc.get(gpu, 0)))
            if gpu in ecc:
                self._ecc_seen[gpu] = ecc[gpu]
            old = health.get(node, NodeHealth(node, drained=node in drained))
            hottest = max(
                (t for t in (old.max_temperature_celsius, temp) if t is not None), default=None
            )
            health[node] = NodeHealth(node, hottest, old.new_ecc_errors + new_ecc, (), old.drained)
        return list(health.values())

    def _unallocated(self, recent: list[GpuInterval]) -> list[UnallocatedUse]:
        """Stray processes in the recent intervals, once per new process.

        The window looks back several shipping periods, since intervals reach the store
        a little after they end; a GPU is reported again only when a process it had not
        reported appears (with all its current processes).
        """
        found: dict[tuple[str, str], set[int]] = {}
        for row in recent:
            if row.unallocated_pids:
                found.setdefault((row.node, row.gpu_uuid), set()).update(row.unallocated_pids)
        uses = [
            UnallocatedUse(node, gpu, tuple(sorted(pids)))
            for (node, gpu), pids in sorted(found.items())
            if not pids <= self._unallocated_reported.get((node, gpu), set())
        ]
        # Forget GPUs gone quiet, so the dict stays the size of what is happening now.
        self._unallocated_reported = {
            key: pids | self._unallocated_reported.get(key, set()) for key, pids in found.items()
        }
        return uses

    # ---- acting ---------------------------------------------------------------------

    def _act(self, verdict: Verdict, now: float) -> str:
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

    # ---- telling people ---------------------------------------------------------------

    def _notify(self, verdicts: list[Verdict], now: float) -> int:
        if self.notifier is None:
            return 0
        limit = float(self.config.notify.user_rate_limit)
        sent = 0
        for verdict in verdicts:
            if verdict.action not in NOTIFIED:
                continue
            try:
                if verdict.user and verdict.action not in URGENT:
                    last = self.control.last_notified(verdict.user)
                    if last is not None and now - last < limit:
                        continue
                channels = ",".join(self.notifier.channels())
                if not self.control.claim_notification(
                    notification_key(verdict, now), verdict.user, now, channels
                ):
                    continue
            except StoreError as exc:
                log.error("notification bookkeeping failed: %s", exc)
                continue
            if self.notifier.send(verdict):
                sent += 1
        return sent
