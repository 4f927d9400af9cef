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

Messages (`_notify`): a warning of a policy that cancels after a grace period counts as
given only once it reached the user (when [notify] can mail users at all); until then it
is sent again each cycle and the cancellation waits, as the log and the audit row's
`delivered` detail say. `[notify] user_rate_limit` holds back only notices and reports,
and only from the user: the admins get every copy. The log names each message held back
and why.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_gpu.config import Config
from slurm_gpu.errors import SlurmError, SlurmGpuError, StoreError
from slurm_gpu.models import (
    Action,
    Exemption,
    GpuActivity,
    GpuInterval,
    NodeHealth,
    QuotaApplied,
    QuotaUsage,
    SlurmJob,
    UnallocatedUse,
    Verdict,
)
from slurm_gpu.policy.audit_spool import AuditSpool
from slurm_gpu.policy.notify import RATE_LIMITED, Notifier, notification_key
from slurm_gpu.policy.quota_periods import cluster_timezone, is_rolling, period_bounds
from slurm_gpu.policy.rules import MAX_RUNTIME, evaluate
from slurm_gpu.policy.rules.context import span_text
from slurm_gpu.slurm.client import SlurmClient
from slurm_gpu.store import Store
from slurm_gpu.store.control import EVERY_POLICY, ExemptionRecord, QuotaAction, audit_row

log = logging.getLogger(__name__)

LEASE = "controller"
# Policies whose warnings start a grace period that a cancel must wait out.
GRACE_POLICIES = ("idle_gpu", "max_runtime")
# Verdicts audited once per episode rather than every cycle.
QUIET_REPEATS = frozenset({Action.WARN, Action.NOTICE, Action.NONE, Action.REPORT, Action.SKIP})
# Policies evaluated from Slurm alone while the store is unavailable.
SLURM_ONLY_POLICIES = (MAX_RUNTIME,)
# What a policy would have done to an exempt job, for the audit row of the skip.
_WOULD = {
    Action.WARN: "warned",
    Action.NOTICE: "sent a notice about",
    Action.CANCEL: "cancelled",
    Action.CAP_TIME: "capped",
}
# How far back the controller looks for exemptions that ended unaudited.
EXPIRY_LOOKBACK_SECONDS = 7 * 86400.0
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
    store_down_since: float | None = None
    """When the store stopped answering, while it has not come back (None: it answers)."""
    spooled: int = 0
    """Audit rows this cycle put in the local spool instead of the store."""


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
        self.spool = AuditSpool(config.controller.audit_spool)
        # What a cycle without the store works from: the lease's end, the warnings and
        # exemptions the last cycle with the store saw, messages sent meanwhile.
        self.store_down_since: float | None = None
        self._lease_until: float | None = None
        self._known_warned: dict[tuple[int, str], float] = {}
        self._known_exemptions: list[Exemption] = []
        self._claims_while_down: list[tuple[str, str, float, str]] = []
        self._lease_attempt: threading.Thread | None = None
        # This cycle's inputs, for the exemptions' SKIP rows.
        self._activity: list[GpuActivity] = []
        self._warned_now: dict[tuple[int, str], float] = {}

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
            verdicts, records = self._evaluate(
                jobs, [n.name for n in nodes if "drain" in n.state], now, dry_run
            )
            skipped = self._exempt_skips(jobs, records, now)
            withdrawn = self._withdrawn_warnings(jobs, verdicts, dry_run, records)
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
            report.notified = self._notify(list(zip(ids, verdicts, strict=True)), now, undelivered)
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
            if not dry_run:
                outcome = self._act(verdict, now)
                details = self._notify_without_store(verdict, now)
                report.notified += bool(details.get("notified"))
            else:
                outcome = "dry-run"
                if verdict.action is Action.WARN:
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

    def _notify_without_store(self, verdict: Verdict, now: float) -> dict[str, object]:
        """Sends a spooled verdict's message; its claim is written when the store is back."""
        if self.notifier is None or verdict.action not in NOTIFIED:
            if verdict.action is Action.WARN:
                self._known_warned.setdefault((verdict.job_id or 0, verdict.policy), now)
            return {}
        sent = self.notifier.send(verdict)
        delivered = not self._must_reach_user(verdict) or "email" in sent
        if verdict.action is Action.WARN and delivered:
            self._known_warned.setdefault((verdict.job_id or 0, verdict.policy), now)
        if sent and delivered:
            channels = ",".join(self.notifier.channels())
            self._claims_while_down.append(
                (notification_key(verdict, now), verdict.user, now, channels)
            )
        details: dict[str, object] = {"notified": ",".join(sent)}
        if verdict.action is Action.WARN and self._grace_warning(verdict):
            details["delivered"] = delivered
            if not delivered:
                self._log_undelivered(verdict)
        return details

    def _store_is_back(self, now: float) -> None:
        """Writes what was spooled while the store was unavailable, then forgets it."""
        rows = self.spool.rows()
        if rows:
            self.control.audit_rows(rows)
            self.spool.clear()
        for key, user, at, channels in self._claims_while_down:
            self.control.claim_notification(key, user, at, channels)
        self._claims_while_down = []
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
        self, jobs: list[SlurmJob], drained: list[str], now: float, dry_run: bool
    ) -> tuple[list[Verdict], list[ExemptionRecord]]:
        """This cycle's verdicts, and the exemptions in force that they were judged with."""
        running = [j.job_id for j in jobs if j.state.upper() == "RUNNING"]
        self._activity = self.store.activity(running)
        recent = self.store.intervals(since=self._recent_intervals_window(now))
        records = self.control.exemptions(now)
        exemptions = [
            Exemption(e.scope, e.policy, e.until, e.reason, e.created_by) for e in records
        ]
        warned = self._warned(running, dry_run)
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
            node_health=self._node_health(recent, drained),
            unallocated=self._unallocated(recent),
        )
        self._warned_now = warned
        return verdicts, records

    # ---- exemptions in the audit log ---------------------------------------------------

    def _exempt_skips(
        self, jobs: list[SlurmJob], records: list[ExemptionRecord], now: float
    ) -> list[Verdict]:
        """SKIP verdicts: a job policy would have acted on a job but for an exemption.

        The job policies are evaluated again for the exempt jobs with no `slurm-gpu
        exempt` exemptions (the config's exempt lists still apply); each warning, notice,
        cancel or cap they give becomes one audit row naming the exemption relied on.
        """
        covered = {job.job_id: found for job in jobs if (found := _exemptions_of(job, records))}
        if not covered:
            return []
        exempt_jobs = [j for j in jobs if j.job_id in covered]
        by_id = {j.job_id: j for j in exempt_jobs}
        out = []
        for v in evaluate(exempt_jobs, self._activity, now, self.config, warned=self._warned_now):
            if v.job_id is None or v.action not in _WOULD:
                continue
            record = next((r for r in covered[v.job_id] if r.policy in ("", v.policy)), None)
            if record is None:
                continue
            job = by_id[v.job_id]
            out.append(
                Verdict(
                    v.policy,
                    Action.SKIP,
                    v.target,
                    f"{record.describe()}: {v.policy} skipped job {job.job_id}, which it "
                    f"would have {_WOULD[v.action]}. {record.reason}".rstrip(),
                    job_id=job.job_id,
                    user=job.user,
                    account=job.account,
                    details=(
                        ("exemption_id", record.id),
                        ("would", v.action.value),
                        ("until", record.until),
                    ),
                )
            )
        return out

    def _expired_exemptions(self, jobs: list[SlurmJob], now: float) -> list[Verdict]:
        """EXPIRE records of exemptions that ended since the last cycle (once each)."""
        since = now - EXPIRY_LOOKBACK_SECONDS
        ended = self.control.exemptions(now, ended_since=since)
        if not ended:
            return []
        seen = {
            e.details.get("exemption_id")
            for e in self.control.audit_entries(since=since, actions=[Action.EXPIRE.value])
        }
        by_id = {str(j.job_id): j for j in jobs}
        out = []
        for record in ended:
            if record.id in seen:
                continue
            job = by_id.get(record.target) if record.kind == "job" else None
            out.append(
                Verdict(
                    record.policy or EVERY_POLICY,
                    Action.EXPIRE,
                    record.scope,
                    f"{record.describe()} ended: the policies apply again.",
                    job_id=int(record.target) if record.kind == "job" else None,
                    user=job.user if job else record.target if record.kind == "user" else "",
                    account=(
                        job.account if job else record.target if record.kind == "account" else ""
                    ),
                    details=tuple(sorted(record.details().items())),
                )
            )
        return out

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
            exempt = [r for r in _exemptions_of(job, records) if r.policy in ("", policy)]
            reason = (
                f"Warning withdrawn: {exempt[0].describe()}."
                if exempt
                else "Warning withdrawn: the job no longer meets the policy's condition."
            )
            out.append(
                Verdict(
                    policy,
                    Action.NONE,
                    f"job:{job_id}",
                    reason,
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

    def _notify(
        self,
        audited: list[tuple[int, Verdict]],
        now: float,
        undelivered: set[tuple[int | None, str]],
    ) -> int:
        """Sends the messages of this cycle's audited verdicts; returns how many went out.

        What reached whom goes into each verdict's audit details (`notified`, and for a
        grace-period warning `delivered`); a warning that did not reach its user is
        released, so the next cycle sends it again and its cancellation waits for it; its
        (job, policy) goes into `undelivered`.
        """
        if self.notifier is None:
            return 0
        sent_count = 0
        channels = ",".join(self.notifier.channels())
        for audit_id, verdict in audited:
            if verdict.action not in NOTIFIED:
                continue
            key = notification_key(verdict, now)
            try:
                held = self._held_back(verdict, now)
                if not self.control.claim_notification(
                    key, "" if held else verdict.user, now, channels
                ):
                    log.debug("message %s already went out", key)
                    continue
            except StoreError as exc:
                log.error("notification bookkeeping failed: %s", exc)
                continue
            sent = self.notifier.send(verdict, to_user=not held)
            if sent:
                sent_count += 1
            details: dict[str, object] = {"notified": ",".join(sent)}
            if held:
                details["held_back"] = held
                log.info(
                    "held back from %s: %s %s about %s (%s); the admins' copy went by %s",
                    verdict.user,
                    verdict.policy,
                    verdict.action.value,
                    verdict.target,
                    held,
                    ",".join(sent) or "no channel",
                )
            if verdict.action is Action.WARN and self._grace_warning(verdict):
                delivered = held == "" and (not self._must_reach_user(verdict) or "email" in sent)
                details["delivered"] = delivered
                if not delivered:
                    undelivered.add((verdict.job_id, verdict.policy))
                    self._log_undelivered(verdict)
            try:
                if details.get("delivered") is False or not sent:
                    self.control.release_notification(key)
                self.control.note_details(audit_id, **details)
            except StoreError as exc:
                log.error("could not record the message about %s: %s", verdict.target, exc)
        return sent_count

    def _held_back(self, verdict: Verdict, now: float) -> str:
        """Why the user does not get this message now ("" when they do): the rate limit.

        Only notices and reports are held back, and only from the user (`RATE_LIMITED`).
        """
        limit = float(self.config.notify.user_rate_limit)
        if not verdict.user or verdict.action not in RATE_LIMITED or limit <= 0:
            return ""
        last = self.control.last_notified(verdict.user)
        if last is None or now - last >= limit:
            return ""
        return (
            f"{verdict.user} was sent a message {span_text(now - last)} ago, and "
            f"[notify] user_rate_limit is {span_text(limit)}"
        )

    def _grace_warning(self, verdict: Verdict) -> bool:
        """A warning whose policy cancels (or caps) only once it was given long enough."""
        return verdict.action is Action.WARN and verdict.policy in GRACE_POLICIES

    def _must_reach_user(self, verdict: Verdict) -> bool:
        """The user can be mailed at all ([notify] smtp_host and user_email_domain)."""
        return self.notifier is not None and self.notifier.reaches_user(verdict)

    def _log_undelivered(self, verdict: Verdict) -> None:
        log.warning(
            "the %s warning about %s did not reach %s: it is sent again next cycle, and "
            "the cancellation waits until it went out",
            verdict.policy,
            verdict.target,
            verdict.user,
        )


def _exemptions_of(job: SlurmJob, records: Iterable[ExemptionRecord]) -> list[ExemptionRecord]:
    """The `slurm-gpu exempt` exemptions covering a job (itself, its array, user, account)."""
    scopes = {f"job:{job.job_id}", f"user:{job.user}", f"account:{job.account}"}
    if job.array_job_id is not None:
        scopes.add(f"job:{job.array_job_id}")
    return [r for r in records if r.scope in scopes]
