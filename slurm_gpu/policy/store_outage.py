"""Running without the store: what the controller does while the store is unavailable.

While the store is unavailable (down, or locked past its busy timeout) the cycle does not
wait on it: the policies that need only Slurm (max_runtime) go on at the same cadence for
as long as this controller's lease lasts (nobody else can take it before it expires), with
the warnings and exemptions it knew of when the store went away. Their decisions are
spooled to `[controller] audit_spool` before they are acted on
(`slurm_gpu.policy.audit_spool`) and written to the audit log when the store answers
again; the store is probed in the background meanwhile (`slurm_gpu.policy.lease`). After
the lease ends, nothing is acted on until the store is back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from slurm_gpu.config import Config
from slurm_gpu.errors import SlurmError
from slurm_gpu.models import Action, Exemption
from slurm_gpu.policy.audit_spool import AuditSpool
from slurm_gpu.policy.cycle_report import CycleReport
from slurm_gpu.policy.enforcer import Enforcer
from slurm_gpu.policy.messages import Messenger
from slurm_gpu.policy.rules import MAX_RUNTIME, evaluate
from slurm_gpu.policy.rules.context import span_text
from slurm_gpu.slurm.client import SlurmClient
from slurm_gpu.store.control import ControlStore, audit_row

# The controller's modules log under one name, as before they were split (issue 25 item 7).
log = logging.getLogger("slurm_gpu.policy.controller")

# Policies evaluated from Slurm alone while the store is unavailable.
SLURM_ONLY_POLICIES = (MAX_RUNTIME,)


class StoreOutage:
    """The controller's cycles without the store, and what it keeps for them.

    Args:
        config: the loaded configuration.
        slurm: the Slurm client.
        control: the store's controller bookkeeping (written to when the store is back).
        messages: sends the messages of the decisions made without the store.
        enforcer: carries the decisions out through Slurm.
        spool: where the decisions wait for the store.
        holder: this controller's lease identity, for the audit rows.
    """

    def __init__(
        self,
        config: Config,
        slurm: SlurmClient,
        control: ControlStore,
        messages: Messenger,
        enforcer: Enforcer,
        spool: AuditSpool,
        holder: str,
    ) -> None:
        self.config = config
        self.slurm = slurm
        self.control = control
        self.messages = messages
        self.enforcer = enforcer
        self.spool = spool
        self.holder = holder
        self.down_since: float | None = None
        """When the store stopped answering, while it has not come back (None: it answers)."""
        # What a cycle without the store works from: the warnings and exemptions the last
        # cycle with the store saw, and warnings given since.
        self.known_warned: dict[tuple[int, str], float] = {}
        self.known_exemptions: list[Exemption] = []

    def remember(
        self, warned: Mapping[tuple[int, str], float], exemptions: list[Exemption]
    ) -> None:
        """Keeps what a cycle with the store read, for cycles while it is unavailable."""
        self.known_warned = dict(warned)
        self.known_exemptions = exemptions

    def warning_given(self, job_id: int, policy: str, now: float) -> None:
        """Notes a warning that reached its user (its grace period counts from the first)."""
        self.known_warned.setdefault((job_id, policy), now)

    def cycle(
        self, report: CycleReport, cycle_id: str, why: str, lease_until: float | None
    ) -> CycleReport:
        """The Slurm-only policies, from Slurm alone, their decisions spooled before acting.

        Args:
            report: this cycle's report, filled in here.
            cycle_id: this cycle's id in the audit rows.
            why: why the store is unavailable, for the log.
            lease_until: when this controller's lease ends (None: it holds none).
        """
        now, dry_run = report.time, report.dry_run
        if self.down_since is None:
            self.down_since = now
            log.warning(
                "the store is unavailable (%s): the policies that need only Slurm (%s) go "
                "on while this controller's lease lasts%s; their decisions are spooled to "
                "%s until the store is back",
                why,
                ", ".join(SLURM_ONLY_POLICIES),
                ""
                if lease_until is None
                else f" (until {time.strftime('%H:%M:%S', time.localtime(lease_until))})",
                self.spool.path,
            )
        report.store_down_since = self.down_since
        down = span_text(now - self.down_since)
        if lease_until is None or now >= lease_until:
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
                exemptions=self.known_exemptions,
                warned=self.known_warned,
            )
            if v.policy in SLURM_ONLY_POLICIES
            and v.action is not Action.NONE
            # A warning already given is not news (as `audit_history.news` would drop it).
            and not (v.action is Action.WARN and (v.job_id, v.policy) in self.known_warned)
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
                outcome = self.enforcer.act(verdict, now)
                details, given = self.messages.send_while_store_down(verdict, now)
                report.notified += bool(details.get("notified"))
            if verdict.action is Action.WARN and given:
                self.warning_given(verdict.job_id or 0, verdict.policy, now)
            try:
                self.spool.update(spool_id, outcome=outcome, **details)
            except OSError as exc:
                log.error("could not spool the outcome of %s: %s", verdict.target, exc)
            if verdict.action in (Action.CANCEL, Action.CAP_TIME):
                self.known_warned.pop((verdict.job_id or 0, verdict.policy), None)
        log.info(
            "store unavailable for %s: %d %s decision(s) spooled to %s",
            down,
            len(rows),
            "/".join(SLURM_ONLY_POLICIES),
            self.spool.path,
        )
        return report

    def store_is_back(self, now: float) -> None:
        """Writes what was spooled while the store was unavailable, then forgets it.

        Raises:
            StoreError: the store did not take the spooled rows (they stay spooled).
        """
        try:
            rows = self.spool.rows()
        except OSError as exc:  # kept for a later cycle: never lost, never acted on twice
            log.error("cannot read the audit spool %s: %s", self.spool.path, exc)
            rows = []
        if rows:
            self.control.audit_rows(rows)
            self.spool.clear()
        self.messages.store_is_back()
        if self.down_since is not None:
            log.warning(
                "the store is back after %s: %d spooled audit row(s) written",
                span_text(now - self.down_since),
                len(rows),
            )
        elif rows:
            log.warning(
                "%d audit row(s) left in %s written to the store", len(rows), self.spool.path
            )
        self.down_since = None
