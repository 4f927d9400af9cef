"""The controller's cycle: read Slurm and the store, evaluate, audit, then act.

Order matters: every verdict is in the audit log before anything happens in Slurm, so a
controller killed mid-cycle leaves a record of what it was about to do ("planned"), and
every action's outcome replaces it ("done", "failed: ...").

Only one controller acts at a time: the holder of the lease (`slurm_gpu.policy.lease`).
A Slurm error ends the cycle cleanly (nothing half-read is acted on); the next cycle
retries. While the store is unavailable, the policies that need only Slurm go on for as
long as the lease lasts (`slurm_gpu.policy.store_outage`).

What the policies see is read by `slurm_gpu.policy.inputs`; what the audit log already
says (warning episodes, repeats) by `slurm_gpu.policy.audit_history`; verdicts are carried
out through Slurm by `slurm_gpu.policy.enforcer`. Messages go out after acting
(`slurm_gpu.policy.messages`): a warning of a policy that cancels after a grace period
counts as given only once it reached the user, so an unsent one delays its cancellation.
Exemptions' audit rows (relied on, ended) come from `slurm_gpu.policy.exemption_audit`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from slurm_gpu.config import Config
from slurm_gpu.errors import SlurmError, StoreError
from slurm_gpu.models import Action, SlurmJob, Verdict
from slurm_gpu.policy.audit_history import expired_exemptions, news, withdrawn_warnings
from slurm_gpu.policy.audit_spool import AuditSpool
from slurm_gpu.policy.cycle_report import CycleReport
from slurm_gpu.policy.enforcer import Enforcer
from slurm_gpu.policy.exemption_audit import skip_verdicts
from slurm_gpu.policy.inputs import CycleInputs, PolicyInputs, QuotaMeter
from slurm_gpu.policy.lease import ControllerLease, default_holder
from slurm_gpu.policy.messages import Messenger
from slurm_gpu.policy.node_health import admin_resumes, owned_drains
from slurm_gpu.policy.notify import Notifier
from slurm_gpu.policy.rules import evaluate
from slurm_gpu.policy.rules.context import IDLE_GPU, LOW_EFFICIENCY
from slurm_gpu.policy.store_outage import StoreOutage
from slurm_gpu.slurm.client import SlurmClient
from slurm_gpu.store import Store

# Asks nodes to ship now: {node: the time its data runs through, None: no answer}.
Flusher = Callable[[Sequence[str]], Mapping[str, float | None]]

log = logging.getLogger(__name__)


class Controller:
    """Applies the policies through Slurm.

    Args:
        config: the loaded configuration.
        slurm: the Slurm client (the CLI backend in production).
        store: the accounting store.
        notifier: sends email/webhook messages; None sends nothing.
        clock: POSIX time, injectable.
        holder: this controller's lease identity.
        quota_meter: what a quota counts (the bill's); required with [[quota]] rules.
        flusher: asks nodes to ship what they hold now, returning when they have (or
            gave up: jetstream/flush.py `ask_to_flush`); None asks nobody.
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
        flusher: Flusher | None = None,
    ) -> None:
        if config.quota and quota_meter is None:
            # One road for what a quota counts: the bill's (reports/quota.py), given by
            # the composition root; the controller has no second way to measure it.
            raise ValueError("[[quota]] rules need a quota meter (slurm_gpu.app App.quota_meter)")
        self.config = config
        self.slurm = slurm
        self.store = store
        self.control = store.control
        self.messages = Messenger(store.control, notifier, config.notify)
        self.clock = clock
        self.holder = holder or default_holder()
        self.lease = ControllerLease(self.control, self.holder, config.controller)
        self.inputs = PolicyInputs(config, store, quota_meter)
        self.enforcer = Enforcer(slurm, self.control)
        self.flusher = flusher
        self.spool = AuditSpool(config.controller.audit_spool)
        self.outage = StoreOutage(
            config, slurm, self.control, self.messages, self.enforcer, self.spool, self.holder
        )

    @property
    def notifier(self) -> Notifier | None:
        """The channels messages go out on (None sends nothing)."""
        return self.messages.notifier

    @notifier.setter
    def notifier(self, notifier: Notifier | None) -> None:
        self.messages.notifier = notifier

    def cycle(self, dry_run: bool) -> CycleReport:
        """One read-evaluate-audit-act round. Never raises for Slurm or store trouble."""
        now = self.clock()
        report = CycleReport(time=now, dry_run=dry_run)
        cycle_id = f"{int(now)}-{uuid.uuid4().hex[:6]}"
        try:
            won = self.lease.take(now)
            if won is None:
                return self._cycle_without_store(report, cycle_id, "it did not answer in time")
            if not won:
                report.skipped = "another controller holds the lease"
                return report
            self.outage.store_is_back(now)
            jobs = self.slurm.jobs()
            nodes = self.slurm.nodes()
            # Drains an admin undid stay undone until newer readings (issue 25 item 4).
            resumes = admin_resumes(self.control, nodes, now, self.config)
            drained = [n.name for n in nodes if "drain" in n.state]
            verdicts, seen = self._evaluate(jobs, drained, now, dry_run, resumes.since)
            asked = nodes_to_flush(verdicts, jobs) if self.flusher is not None else []
            if asked and self.flusher is not None:
                # A cancel for what GPUs did, judged on readings that may still wait in
                # the nodes' spools ([node] ship_interval): once more on what they hold.
                answered = self.flusher(asked)
                late = sorted(n for n, through in answered.items() if through is None)
                log.info("asked %s to ship before judging again%s", ",".join(asked),
                         f"; no answer from {','.join(late)}" if late else "")  # fmt: skip
                verdicts, seen = self._evaluate(jobs, drained, now, dry_run, resumes.since)
            # SKIP verdicts: a job policy would have acted on a job but for an exemption.
            skipped = skip_verdicts(
                jobs,
                seen.exemption_records,
                seen.activity,
                now,
                self.config,
                seen.warned,
                seen.intervals,
            )
            withdrawn = resumes.records + withdrawn_warnings(
                self.control, jobs, verdicts, dry_run, seen.exemption_records
            )
            withdrawn += expired_exemptions(self.control, jobs, now)
            verdicts = news(self.control, [*verdicts, *skipped], dry_run)
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
            outcome = self.enforcer.act(verdict, now)
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
                self.outage.warning_given(v.job_id, v.policy, now)
        return report

    def _cycle_without_store(self, report: CycleReport, cycle_id: str, why: str) -> CycleReport:
        """The Slurm-only policies, from Slurm alone, while this controller's lease lasts."""
        return self.outage.cycle(report, cycle_id, why, self.lease.until)

    def _evaluate(
        self,
        jobs: list[SlurmJob],
        drained: list[str],
        now: float,
        dry_run: bool,
        resumed: dict[str, float],
    ) -> tuple[list[Verdict], CycleInputs]:
        """This cycle's verdicts, and the inputs they were judged with.

        resumed: {node: when an admin resumed it after slurm-gpu drained it}.
        """
        seen = self.inputs.read(jobs, drained, now, dry_run, resumed)
        # Kept for cycles while the store is unavailable.
        self.outage.remember(seen.warned, seen.exemptions)
        verdicts = evaluate(
            jobs,
            seen.activity,
            now,
            self.config,
            exemptions=seen.exemptions,
            warned=seen.warned,
            quota_usage=self.inputs.quota_usage(now),
            quota_applied=self.inputs.quota_applied({j.job_id for j in jobs}),
            node_health=seen.node_health.evidence,
            unallocated=self.inputs.unallocated(seen.recent),
            intervals=seen.intervals,
        )
        return owned_drains(verdicts, seen.node_health, resumed, self.config, now), seen

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
        self.lease.release()


# Policies that cancel for what a job's GPUs did: judged on readings, which a node with
# [node] ship_interval may still hold.
READINGS_POLICIES = frozenset({IDLE_GPU, LOW_EFFICIENCY})


def nodes_to_flush(verdicts: Sequence[Verdict], jobs: Sequence[SlurmJob]) -> list[str]:
    """The nodes of the jobs about to be cancelled on their readings, sorted."""
    cancelled = {
        v.job_id for v in verdicts if v.action is Action.CANCEL and v.policy in READINGS_POLICIES
    }
    return sorted({n for j in jobs if j.job_id in cancelled for n in j.nodes})
