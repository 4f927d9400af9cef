"""The controller's cycle: read Slurm and the store, evaluate, audit, then act.

Order matters: every verdict is in the audit log before anything happens in Slurm, so a
controller killed mid-cycle leaves a record of what it was about to do ("planned"), and
every action's outcome replaces it ("done", "failed: ...").

Only one controller acts at a time: the holder of a lease row in the store. A Slurm error
ends the cycle cleanly (nothing half-read is acted on); the next cycle retries.

While the store is unavailable (down, or locked past its busy timeout) the cycle does not
wait on it: the policies that need only Slurm (max_runtime) go on at the same cadence for
as long as this controller's lease lasts (nobody else can take it before it expires), with
the warnings it knew of when the store went away. Their decisions are spooled to
`[controller] audit_spool` before they are acted on (`slurm_gpu.policy.audit_spool`) and
written to the audit log when the store answers again; the store is probed in the
background meanwhile. After the lease ends, nothing is acted on until the store is back.

Messages go out after acting (`slurm_gpu.policy.messages`): a warning of a policy that
cancels after a grace period counts as given only once it reached the user, so an
unsent one delays its cancellation. Exemptions' audit rows (relied on, ended) come from
`slurm_gpu.policy.exemption_audit`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_gpu.config import Config
from slurm_gpu.errors import SlurmError, SlurmGpuError, StoreError
from slurm_gpu.models import (
    Action,
    Exemption,
    GpuActivity,
    GpuInterval,
    QuotaApplied,
    QuotaUsage,
    SlurmJob,
    UnallocatedUse,
    Verdict,
)
from slurm_gpu.policy.audit_spool import AuditSpool
from slurm_gpu.policy.exemption_audit import (
    EXPIRY_LOOKBACK_SECONDS,
    expiry_verdicts,
    skip_verdicts,
    withdrawal_reason,
)
from slurm_gpu.policy.messages import GRACE_POLICIES, Messenger
from slurm_gpu.policy.node_health import admin_resumes, node_health, owned_drains
from slurm_gpu.policy.notify import Notifier
from slurm_gpu.policy.quota_periods import cluster_timezone, is_rolling, period_bounds
from slurm_gpu.policy.rules import MAX_RUNTIME, evaluate
from slurm_gpu.policy.rules.context import span_text
from slurm_gpu.slurm.client import SlurmClient
from slurm_gpu.store import Store
from slurm_gpu.store.control import ExemptionRecord, QuotaAction, audit_row

log = logging.getLogger(__name__)

LEASE = "controller"
# Verdicts audited once per episode rather than every cycle.
QUIET_REPEATS = frozenset({Action.WARN, Action.NOTICE, Action.NONE, Action.REPORT, Action.SKIP})
# Policies evaluated from Slurm alone while the store is unavailable.
SLURM_ONLY_POLICIES = (MAX_RUNTIME,)


@dataclass
class CycleReport:
    """What one cycle did: for logs, `--once` output and tests."""

    time: float
    dry_run: bool
    skipped: str = ""
    verdicts: list[Verdict] = field(default_factory=list)
    outcomes: dict[int, str] = field(default_factory=dict)
    notified: int = 0
    store_down_since: float | None = None
    """When the store stopped answering, while it has not come back (None: it answers)."""
    spooled: int = 0
    """Audit rows this cycle put in the local spool instead of the store."""


QuotaMeter = Callable[[str, str, float, float, float], float]
"""(scope, unit, since, until, now) -> what the scope used in [since, until], in unit."""

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
        quota_meter: QuotaMeter | None = None,
    ) -> None:
        if config.quota and quota_meter is None:
            # One road for what a quota counts: the bill's (reports/quota.py), given by
            # the composition root; the controller has no second way to measure it.
            raise ValueError("[[quota]] rules need a quota meter (slurm_gpu.app App.quota_meter)")
        self.quota_meter = quota_meter
        self.config = config
        self.slurm = slurm
        self.store = store
        self.control = store.control
        self.messages = Messenger(store.control, notifier, config.notify)
        self.clock = clock
        self.holder = holder or default_holder()
        self._ecc_seen: dict[str, int] = {}
        # (node, GPU) -> stray pids already reported.
        self._unallocated_reported: dict[tuple[str, str], set[int]] = {}
        self.spool = AuditSpool(config.controller.audit_spool)
        # What a cycle without the store works from: the lease's end, the warnings and
        # exemptions the last cycle with the store saw, messages sent meanwhile.
        self.store_down_since: float | None = None
        self._lease_until: float | None = None
        self._known_warned: dict[tuple[int, str], float] = {}
        self._known_exemptions: list[Exemption] = []
        self._lease_attempt: threading.Thread | None = None
        # This cycle's inputs, for the exemptions' SKIP rows.
        self._activity: list[GpuActivity] = []
        self._intervals: list[GpuInterval] = []
        self._warned_now: dict[tuple[int, str], float] = {}

    @property
    def notifier(self) -> Notifier | None:
        """The channels messages go out on (None sends nothing)."""
        return self.messages.notifier

    @notifier.setter
    def notifier(self, notifier: Notifier | None) -> None:
        self.messages.notifier = notifier

    # ---- the cycle ------------------------------------------------------------------

    def cycle(self, dry_run: bool) -> CycleReport:
        """One read-evaluate-audit-act round. Never raises for Slurm or store trouble."""
        now = self.clock()
        report = CycleReport(time=now, dry_run=dry_run)
        cycle_id = f"{int(now)}-{uuid.uuid4().hex[:6]}"
        try:
            won = self._take_lease(now)
            if won is None:
                return self._cycle_without_store(report, cycle_id, "it did not answer in time")
            if not won:
                report.skipped = "another controller holds the lease"
                return report
            self._store_is_back(now)
            jobs = self.slurm.jobs()
            nodes = self.slurm.nodes()
            # Drains an admin undid stay undone until newer readings (issue 25 item 4).
            resumes = admin_resumes(self.control, nodes, now, self.config)
            verdicts, records = self._evaluate(
                jobs, [n.name for n in nodes if "drain" in n.state], now, dry_run, resumes.since
            )
            skipped = self._exempt_skips(jobs, records, now)
            withdrawn = resumes.records + self._withdrawn_warnings(jobs, verdicts, dry_run, records)
            withdrawn += self._expired_exemptions(jobs, now)
            verdicts = self._news([*verdicts, *skipped], dry_run)
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
        except SlurmError as exc:
            log.error("cycle abandoned before acting: %s", exc)
            report.skipped = str(exc)
            return report
        except StoreError as exc:
            # Nothing of this cycle was acted on: the policies that need only Slurm run
            # now, from Slurm, with their decisions spooled.
            return self._cycle_without_store(report, cycle_id, str(exc))
        for audit_id, verdict in zip(ids, verdicts, strict=True):
            if dry_run:
                continue
            outcome = self._act(verdict, now)
            report.outcomes[audit_id] = outcome
            try:
                self.control.set_outcome(audit_id, outcome)
            except StoreError as exc:
                log.error("could not record outcome of %s: %s", verdict.target, exc)
        undelivered: set[tuple[int | None, str]] = set()
        if not dry_run:
            audited = list(zip(ids, verdicts, strict=True))
            report.notified, undelivered = self.messages.send_audited(audited, now)
        for v in verdicts:  # for cycles while the store is unavailable
            given = v.action is Action.WARN and (v.job_id, v.policy) not in undelivered
            if given and v.job_id is not None:
                self._known_warned.setdefault((v.job_id, v.policy), now)
        return report

    # ---- while the store is unavailable ----------------------------------------------

    def _take_lease(self, now: float) -> bool | None:
        """Takes or renews the lease; None when the store did not answer within half an interval.

        The attempt runs in a thread, so a store that waits out its busy timeout (SQLite
        locked) or a connect timeout does not hold the cycle up. An attempt still waiting
        from an earlier cycle is the probe: no second one is started beside it.

        Raises:
            StoreError: the store answered with an error.
        """
        if self._lease_attempt is not None and self._lease_attempt.is_alive():
            return None
        ttl = float(self.config.controller.lease_seconds)
        result: dict[str, Any] = {}

        def attempt() -> None:
            try:
                result["won"] = self.control.acquire_lease(LEASE, self.holder, now, ttl)
            except StoreError as exc:
                result["error"] = exc

        thread = threading.Thread(target=attempt, name="slurm-gpu-lease", daemon=True)
        thread.start()
        thread.join(float(self.config.controller.interval) / 2)
        if thread.is_alive():
            self._lease_attempt = thread
            return None
        self._lease_attempt = None
        if "error" in result:
            raise result["error"]
        won = bool(result["won"])
        self._lease_until = now + ttl if won else None
        return won

    def _cycle_without_store(self, report: CycleReport, cycle_id: str, why: str) -> CycleReport:
        """The Slurm-only policies, from Slurm alone, their decisions spooled before acting."""
        now, dry_run = report.time, report.dry_run
        if self.store_down_since is None:
            self.store_down_since = now
            log.warning(
                "the store is unavailable (%s): the policies that need only Slurm (%s) go "
                "on while this controller's lease lasts%s; their decisions are spooled to "
                "%s until the store is back",
                why,
                ", ".join(SLURM_ONLY_POLICIES),
                ""
                if self._lease_until is None
                else f" (until {time.strftime('%H:%M:%S', time.localtime(self._lease_until))})",
                self.spool.path,
            )
        report.store_down_since = self.store_down_since
        down = span_text(now - self.store_down_since)
        if self._lease_until is None or now >= self._lease_until:
            report.skipped = (
                f"the store is unavailable (for {down}) and this controller holds no "
                "unexpired lease: nothing is acted on until the store is back"
            )
            return report
        try:
            jobs = self.slurm.jobs()
        except SlurmError as exc:
            log.error("cycle abandoned before acting: %s", exc)
            report.skipped = str(exc)
            return report
        verdicts = [
            v
            for v in evaluate(
                jobs,
                (),
                now,
                self.config,
                exemptions=self._known_exemptions,
                warned=self._known_warned,
            )
            if v.policy in SLURM_ONLY_POLICIES
            and v.action is not Action.NONE
            # A warning already given is not news (as `_news` would drop it).
            and not (v.action is Action.WARN and (v.job_id, v.policy) in self._known_warned)
        ]
        report.verdicts = verdicts
        rows = [
            audit_row(
                v,
                time=now,
                cycle=cycle_id,
                controller=self.holder,
                dry_run=dry_run,
                outcome="dry-run" if dry_run else "planned",
            )
            for v in verdicts
        ]
        try:
            spool_ids = self.spool.add(rows)
        except OSError as exc:
            log.error(
                "the store is unavailable and the audit spool %s cannot be written (%s): "
                "%d decision(s) not acted on",
                self.spool.path,
                exc,
                len(verdicts),
            )
            report.skipped = f"neither the store nor the audit spool can be written: {exc}"
            report.verdicts = []
            return report
        report.spooled = len(rows)
        for spool_id, verdict in zip(spool_ids, verdicts, strict=True):
            details: dict[str, object] = {}
            given = True
            outcome = "dry-run"
            if not dry_run:
                outcome = self._act(verdict, now)
                details, given = self.messages.send_while_store_down(verdict, now)
                report.notified += bool(details.get("notified"))
            if verdict.action is Action.WARN and given:
                self._known_warned.setdefault((verdict.job_id or 0, verdict.policy), now)
            try:
                self.spool.update(spool_id, outcome=outcome, **details)
            except OSError as exc:
                log.error("could not spool the outcome of %s: %s", verdict.target, exc)
            if verdict.action in (Action.CANCEL, Action.CAP_TIME):
                self._known_warned.pop((verdict.job_id or 0, verdict.policy), None)
        log.info(
            "store unavailable for %s: %d %s decision(s) spooled to %s",
            down,
            len(rows),
            "/".join(SLURM_ONLY_POLICIES),
            self.spool.path,
        )
        return report

    def _store_is_back(self, now: float) -> None:
        """Writes what was spooled while the store was unavailable, then forgets it."""
        try:
            rows = self.spool.rows()
        except OSError as exc:  # kept for a later cycle: never lost, never acted on twice
            log.error("cannot read the audit spool %s: %s", self.spool.path, exc)
            rows = []
        if rows:
            self.control.audit_rows(rows)
            self.spool.clear()
        self.messages.store_is_back()
        if self.store_down_since is not None:
            log.warning(
                "the store is back after %s: %d spooled audit row(s) written",
                span_text(now - self.store_down_since),
                len(rows),
            )
        elif rows:
            log.warning(
                "%d audit row(s) left in %s written to the store", len(rows), self.spool.path
            )
        self.store_down_since = None

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
                    "cycle: %d verdicts (%s), %d notified%s",
                    len(report.verdicts),
                    "dry-run" if dry_run else "enforcing",
                    report.notified,
                    "" if report.store_down_since is None else ", store unavailable",
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
        self,
        jobs: list[SlurmJob],
        drained: list[str],
        now: float,
        dry_run: bool,
        resumed: dict[str, float] | None = None,
    ) -> tuple[list[Verdict], list[ExemptionRecord]]:
        """This cycle's verdicts, and the exemptions in force that they were judged with.

        resumed: {node: when an admin resumed it after slurm-gpu drained it}.
        """
        running = [j.job_id for j in jobs if j.state.upper() == "RUNNING"]
        self._activity = self.store.activity(running)
        # One read serves node health and stray processes (the last few shipping periods)
        # and low_efficiency (its notice_after, and a shipping period more, of the
        # running jobs' intervals).
        recent_since = self._recent_intervals_window(now)
        since = recent_since
        if self.config.policy.low_efficiency.enabled and running:
            since = min(since, self._efficiency_window(now))
        read = self.store.intervals(since=since)
        recent = [r for r in read if r.period_end > recent_since]
        running_ids = set(running)
        self._intervals = [r for r in read if r.job_id in running_ids]
        records = self.control.exemptions(now)
        exemptions = [
            Exemption(e.scope, e.policy, e.until, e.reason, e.created_by) for e in records
        ]
        warned = self._warned(running, dry_run)
        resumed = resumed or {}
        readings = node_health(
            recent,
            self.store.inventory(),
            drained,
            resumed,
            self.control.heartbeat_ticks(sorted(resumed)),
            self._ecc_seen,
        )
        # Kept for cycles while the store is unavailable.
        self._known_warned = dict(warned)
        self._known_exemptions = exemptions
        verdicts = evaluate(
            jobs,
            self._activity,
            now,
            self.config,
            exemptions=exemptions,
            warned=warned,
            quota_usage=self._quota_usage(now),
            quota_applied=self._quota_applied({j.job_id for j in jobs}),
            node_health=readings.evidence,
            unallocated=self._unallocated(recent),
            intervals=self._intervals,
        )
        verdicts = owned_drains(verdicts, readings, resumed, self.config, now)
        self._warned_now = warned
        return verdicts, records

    # ---- exemptions in the audit log ---------------------------------------------------

    def _exempt_skips(
        self, jobs: list[SlurmJob], records: list[ExemptionRecord], now: float
    ) -> list[Verdict]:
        """SKIP verdicts: a job policy would have acted on a job but for an exemption."""
        return skip_verdicts(
            jobs, records, self._activity, now, self.config, self._warned_now, self._intervals
        )

    def _expired_exemptions(self, jobs: list[SlurmJob], now: float) -> list[Verdict]:
        """EXPIRE records of exemptions that ended since the last cycle (once each)."""
        since = now - EXPIRY_LOOKBACK_SECONDS
        ended = self.control.exemptions(now, ended_since=since)
        if not ended:
            return []
        audited = {
            e.details.get("exemption_id")
            for e in self.control.audit_entries(since=since, actions=[Action.EXPIRE.value])
        }
        return expiry_verdicts(ended, audited, jobs)

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
            elif entry.details.get("delivered") is not False:
                # A warning that never reached its user starts no grace period.
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

    def _withdrawn_warnings(
        self,
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
        for job_id, policy in self._warned(list(running), dry_run):
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

    def _quota_usage(self, now: float) -> list[QuotaUsage]:
        tz = cluster_timezone(self.config.controller.timezone)
        usage = []
        for rule in self.config.quota:
            start, end = period_bounds(now, rule.period, tz)
            assert self.quota_meter is not None  # __init__ refuses quota rules without one
            used = self.quota_meter(rule.scope, rule.unit, start, min(end, now), now)
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

    def _efficiency_window(self, now: float) -> float:
        """How far back low_efficiency reads: its notice_after and two shipping periods."""
        notice_after = float(self.config.policy.low_efficiency.notice_after)
        return now - notice_after - 2 * float(self.store_period())

    def store_period(self) -> float:
        """How far back "recent" readings reach: a shipping period plus an agent interval."""
        return float(self.config.store.ship_aggregate) + float(self.config.node.interval)

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
