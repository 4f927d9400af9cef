"""Telling users and admins what the controller saw and will do: email and a webhook.

One message per job and alert kind (the store's `notifications` table remembers what went
out). `user_rate_limit` spaces out only the messages that neither announce nor report an
action on a user's jobs (`RATE_LIMITED`: notices and reports); warnings, which announce a
cancellation, and actions always go out, and the admins' copy is never held back. A
failing channel is logged; it never stops the controller from acting (the controller
makes a cancellation wait for its warning: `slurm_gpu.policy.messages`).
"""

from __future__ import annotations

import json
import logging
import smtplib
import time as time_module
import urllib.request
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

from slurm_gpu.config.policy import NotifySettings
from slurm_gpu.models import Action, Verdict

log = logging.getLogger(__name__)

# Alerts a user always gets, whatever the rate limit: they change what happens to a job.
URGENT = frozenset({Action.CANCEL, Action.CAP_TIME, Action.HOLD, Action.BLOCK})
# The only messages `[notify] user_rate_limit` holds back from a user (never from the
# admins): they tell about a job's use but announce nothing. A warning announces a
# cancellation, cap, hold or block, so it is never held back (issue #11).
RATE_LIMITED = frozenset({Action.NOTICE, Action.REPORT})


@dataclass(frozen=True)
class Message:
    """One rendered notification."""

    subject: str
    body: str
    to: tuple[str, ...]


def render(verdict: Verdict, cluster: str, contact: str, dry_run: bool = False) -> Message:
    """The text users and admins read: what was seen, what happens and when, how to ask.

    Args:
        verdict: the decision.
        cluster: cluster name for the subject line.
        contact: how to ask for an exemption ([notify] exemption_contact).
        dry_run: the controller is not enforcing: say so, so nobody panics.
    """
    what = {
        Action.WARN: "warning",
        Action.CANCEL: "job cancelled",
        Action.NOTICE: "notice",
        Action.CAP_TIME: "time limit lowered",
        Action.HOLD: "jobs held",
        Action.BLOCK: "new jobs blocked",
        Action.RELEASE: "jobs released",
        Action.UNBLOCK: "jobs unblocked",
        Action.DRAIN: "node drained",
        Action.REPORT: "report",
    }.get(verdict.action, verdict.action.value)
    subject_target = f"job {verdict.job_id}" if verdict.job_id is not None else verdict.target
    subject = f"[slurm-gpu {cluster}] {verdict.policy}: {what} ({subject_target})"
    lines = [verdict.reason, ""]
    if verdict.deadline is not None and verdict.action in (Action.WARN, Action.NOTICE):
        when = time_module.strftime("%Y-%m-%d %H:%M:%S %Z", time_module.localtime(verdict.deadline))
        lines.append(f"Next step at: {when}")
    if verdict.details:
        lines.append("Figures: " + ", ".join(f"{k}={v}" for k, v in verdict.details))
    if dry_run:
        lines.append("(The controller runs in dry-run mode: nothing was changed in Slurm.)")
    if contact:
        lines += ["", f"To ask for an exemption: {contact}"]
    return Message(subject, "\n".join(lines) + "\n", ())


class Notifier:
    """Sends rendered messages by SMTP and to a Slack-compatible webhook.

    Args:
        settings: the [notify] section.
        cluster: cluster name for subjects.
        timeout: seconds for each SMTP or HTTP exchange.
    """

    def __init__(self, settings: NotifySettings, cluster: str, timeout: float = 10.0) -> None:
        self.settings = settings
        self.cluster = cluster
        self.timeout = timeout

    def channels(self) -> list[str]:
        """The channels configured: "email", "webhook"."""
        return [
            name
            for name, on in (
                ("email", self.settings.smtp_host),
                ("webhook", self.settings.webhook_url),
            )
            if on
        ]

    def reaches_user(self, verdict: Verdict) -> bool:
        """Whether a message about `verdict` can be mailed to its user at all.

        Only e-mail reaches a user (user@user_email_domain); the webhook is the admins'.
        """
        return bool(self.settings.smtp_host and self.settings.user_email_domain and verdict.user)

    def recipients(self, verdict: Verdict, to_user: bool = True) -> tuple[str, ...]:
        """The user's address (user@user_email_domain) and the admins'.

        Args:
            verdict: the decision the message is about.
            to_user: include the user; False for the admins' copy alone (a message the
                rate limit holds back from the user).
        """
        to: list[str] = []
        if to_user and verdict.user and self.settings.user_email_domain:
            to.append(f"{verdict.user}@{self.settings.user_email_domain}")
        to += self.settings.admin_emails
        return tuple(dict.fromkeys(to))

    def send(self, verdict: Verdict, dry_run: bool = False, to_user: bool = True) -> list[str]:
        """Sends one verdict on every configured channel; returns the channels that worked.

        Args:
            verdict: the decision.
            dry_run: say that nothing was changed in Slurm.
            to_user: mail the user too; False sends the admins' copy (and the webhook) only.
        """
        message = render(verdict, self.cluster, self.settings.exemption_contact, dry_run)
        sent: list[str] = []
        to = self.recipients(verdict, to_user)
        if self.settings.smtp_host and to:
            try:
                self._email(message, to)
                sent.append("email")
            except (OSError, smtplib.SMTPException) as exc:
                log.warning("email about %s to %s failed: %s", verdict.target, to, exc)
        if self.settings.webhook_url:
            try:
                self._webhook(message)
                sent.append("webhook")
            except OSError as exc:
                log.warning("webhook about %s failed: %s", verdict.target, exc)
        return sent

    def _email(self, message: Message, to: tuple[str, ...]) -> None:
        mail = EmailMessage()
        mail["From"] = self.settings.smtp_from
        mail["To"] = ", ".join(to)
        mail["Subject"] = message.subject
        mail.set_content(message.body)
        send_email(self.settings, mail, self.timeout)

    def _webhook(self, message: Message) -> None:
        # Slack's incoming-webhook format: {"text": "..."}; Mattermost and Teams accept it.
        body = json.dumps({"text": f"*{message.subject}*\n{message.body}"}).encode()
        request = urllib.request.Request(
            self.settings.webhook_url,
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            response.read()


def send_email(settings: NotifySettings, mail: EmailMessage, timeout: float = 10.0) -> None:
    """Sends one message through [notify]'s SMTP server (STARTTLS and login as set).

    Raises:
        OSError, smtplib.SMTPException: the server is unreachable or refused it.
    """
    with smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=timeout) as smtp:
        if settings.smtp_starttls:
            smtp.starttls()
        if settings.smtp_user and settings.smtp_password_file:
            smtp.login(settings.smtp_user, Path(settings.smtp_password_file).read_text().strip())
        smtp.send_message(mail)


def notification_key(verdict: Verdict, now: float) -> str:
    """At most one message per job (or target) and alert kind, and per event for nodes.

    A job's warning or cancellation happens once. A node's events recur: the stray
    processes on a GPU are reported once per set of processes, and every drain once: a
    node drained again after an admin resumed it carries `resumed_at` (issue 25 item 4),
    while a drain retried after a failure is the same message.
    """
    details = dict(verdict.details)
    # Quota warnings recur each period: one per crossed fraction per period.
    suffix = f":{details['fraction']}" if "fraction" in details else ""
    if "period_start" in details:
        suffix += f":{details['period_start']}"
    if "pids" in details:
        suffix += f":{details.get('gpu_uuid')}:{details['pids']}"
    if verdict.action is Action.DRAIN:
        suffix += f":{verdict.reason}:resumed{details.get('resumed_at', 0)}"
    return f"{verdict.target}:{verdict.policy}:{verdict.action.value}{suffix}"
