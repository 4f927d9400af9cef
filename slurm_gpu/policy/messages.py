"""The controller's messages: which verdicts are told, to whom, and what reached whom.

One message per job and alert kind (claimed in the store's `notifications` table before
it is sent). `[notify] user_rate_limit` holds back only notices and reports, and only
from the user: the admins get every copy, and the log names each message held back and
why. A grace-period warning (`GRACE_POLICIES`) counts as given only once it reached its
user, when [notify] can mail users at all: one that did not is released, sent again next
cycle, and its cancellation waits, as the log and the audit row's `delivered` detail say.
"""

from __future__ import annotations

import logging

from slurm_gpu.config.policy import NotifySettings
from slurm_gpu.errors import StoreError
from slurm_gpu.models import Action, Verdict
from slurm_gpu.policy.notify import RATE_LIMITED, Notifier, notification_key
from slurm_gpu.policy.rules.context import span_text
from slurm_gpu.store.control import ControlStore

log = logging.getLogger(__name__)

# Policies whose warnings start a grace period that a cancel must wait out.
GRACE_POLICIES = ("idle_gpu", "max_runtime")
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

JobPolicy = tuple[int | None, str]
"""(job id, policy) of a warning."""


class Messenger:
    """Tells users and admins about audited verdicts, and records what reached whom.

    Args:
        control: the controller's records (claims, rate limit, audit details).
        notifier: the channels; None sends nothing (and every warning counts as given).
        settings: the [notify] section.
    """

    def __init__(
        self, control: ControlStore, notifier: Notifier | None, settings: NotifySettings
    ) -> None:
        self.control = control
        self.notifier = notifier
        self.settings = settings
        self._claims_while_down: list[tuple[str, str, float, str]] = []

    def send_audited(
        self, audited: list[tuple[int, Verdict]], now: float
    ) -> tuple[int, set[JobPolicy]]:
        """Sends the messages of a cycle's audited verdicts.

        What reached whom goes into each verdict's audit details (`notified`, `held_back`,
        and for a grace-period warning `delivered`).

        Returns:
            How many messages went out, and the (job, policy) of each grace-period
            warning that did not reach its user.
        """
        undelivered: set[JobPolicy] = set()
        if self.notifier is None:
            return 0, undelivered
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
            if is_grace_warning(verdict):
                delivered = held == "" and self._reached_user(verdict, sent)
                details["delivered"] = delivered
                if not delivered:
                    undelivered.add((verdict.job_id, verdict.policy))
                    _log_undelivered(verdict)
            try:
                if details.get("delivered") is False or not sent:
                    self.control.release_notification(key)
                self.control.note_details(audit_id, **details)
            except StoreError as exc:
                log.error("could not record the message about %s: %s", verdict.target, exc)
        return sent_count, undelivered

    def send_while_store_down(self, verdict: Verdict, now: float) -> tuple[dict[str, object], bool]:
        """Sends a spooled verdict's message; its claim is kept for `store_is_back`.

        Returns:
            The details for the spooled audit row, and whether a warning counts as given.
        """
        if self.notifier is None or verdict.action not in NOTIFIED:
            return {}, True
        sent = self.notifier.send(verdict)
        delivered = self._reached_user(verdict, sent)
        if sent and delivered:
            channels = ",".join(self.notifier.channels())
            self._claims_while_down.append(
                (notification_key(verdict, now), verdict.user, now, channels)
            )
        details: dict[str, object] = {"notified": ",".join(sent)}
        if is_grace_warning(verdict):
            details["delivered"] = delivered
            if not delivered:
                _log_undelivered(verdict)
        return details, delivered

    def store_is_back(self) -> None:
        """Claims, in the store, the messages sent while it was unavailable.

        Raises:
            StoreError: the store failed again (the claims are kept for the next try).
        """
        while self._claims_while_down:
            key, user, at, channels = self._claims_while_down[0]
            self.control.claim_notification(key, user, at, channels)
            self._claims_while_down.pop(0)

    def _reached_user(self, verdict: Verdict, sent: list[str]) -> bool:
        """The message reached its user, or no channel could reach them at all."""
        reachable = self.notifier is not None and self.notifier.reaches_user(verdict)
        return not reachable or "email" in sent

    def _held_back(self, verdict: Verdict, now: float) -> str:
        """Why the user does not get this message now ("" when they do): the rate limit.

        Only notices and reports are held back, and only from the user (`RATE_LIMITED`).
        """
        limit = float(self.settings.user_rate_limit)
        if not verdict.user or verdict.action not in RATE_LIMITED or limit <= 0:
            return ""
        last = self.control.last_notified(verdict.user)
        if last is None or now - last >= limit:
            return ""
        return (
            f"{verdict.user} was sent a message {span_text(now - last)} ago, and "
            f"[notify] user_rate_limit is {span_text(limit)}"
        )


def is_grace_warning(verdict: Verdict) -> bool:
    """A warning whose policy cancels (or caps) only once it was given long enough."""
    return verdict.action is Action.WARN and verdict.policy in GRACE_POLICIES


def _log_undelivered(verdict: Verdict) -> None:
    log.warning(
        "the %s warning about %s did not reach %s: it is sent again next cycle, and "
        "the cancellation waits until it went out",
        verdict.policy,
        verdict.target,
        verdict.user,
    )
