"""Mailing the monthly report once: the whole report to the admins, a statement to coordinators.

`slurm-gpu report monthly --deliver` (and the monthly timer, conf/systemd/) sends each
address in [notify] admin_emails the whole report (index.html and the CSV files
attached), and each coordinator of an account (sacctmgr's Coordinators) that account's
statement alone (reports/statements.py, its CSV files attached), at
<coordinator>@[notify] user_email_domain. Each message is sent once per month and
recipient: the store's `report_deliveries` (store/deliveries.py) is claimed before the
message goes out and released when it fails, so a second run sends nothing and a run
after a failure sends only what failed; `resend` sends everything again.

Messages leave by [notify]'s SMTP server (policy/notify.py `send_email`), or, with an
outbox folder ([reports] mail_outbox, `--outbox`), are written there as .eml files.
It sits beside app.py: above reports/, policy/ and store/, below cli/.
"""

from __future__ import annotations

import smtplib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path
from typing import Protocol

from slurm_gpu.config.policy import NotifySettings
from slurm_gpu.policy.notify import send_email
from slurm_gpu.reports.monthly import MonthlyReport
from slurm_gpu.reports.statements import (
    Statement,
    report_summary_text,
    safe_name,
    statement_files,
    statement_text,
)
from slurm_gpu.store.deliveries import Delivery, DeliveryLog

REPORT = "report"
STATEMENT = "statement"


class Transport(Protocol):
    """Hands one message on; returns where it went, in words. Raises OSError on failure."""

    def __call__(self, mail: EmailMessage, name: str) -> str:
        """Send `mail` (`name`: a file name for it, where one is needed)."""


@dataclass(frozen=True)
class SmtpTransport:
    """Sends by [notify]'s SMTP server."""

    settings: NotifySettings
    timeout: float = 30.0

    def __call__(self, mail: EmailMessage, name: str) -> str:
        """Send `mail` by SMTP (`name` is not used)."""
        try:
            send_email(self.settings, mail, self.timeout)
        except smtplib.SMTPException as exc:  # OSError passes as it is
            where = f"{self.settings.smtp_host}:{self.settings.smtp_port}"
            raise OSError(f"SMTP {where}: {exc}") from exc
        return f"sent by SMTP {self.settings.smtp_host}:{self.settings.smtp_port}"


@dataclass(frozen=True)
class OutboxTransport:
    """Writes each message as `<folder>/<name>.eml` (a resend replaces the file)."""

    folder: Path

    def __call__(self, mail: EmailMessage, name: str) -> str:
        """Write `mail` into the folder."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{name}.eml"
        path.write_bytes(bytes(mail))
        return f"written to {path}"


@dataclass(frozen=True)
class Outcome:
    """What became of one message.

    Attributes:
        kind: "report" or "statement".
        account: the statement's account ("" for the report).
        recipient: the address.
        status: "sent", "already sent" or "failed" (or "not sent" where there is no
            address to send to).
        detail: where it went, when it went before, or why it failed.
    """

    kind: str
    account: str
    recipient: str
    status: str
    detail: str

    def describe(self) -> str:
        """One line: `statement physics -> dana@example.org: sent (written to ...)`."""
        what = f"{self.kind} {self.account}".strip()
        return f"{what} -> {self.recipient or '(nobody)'}: {self.status} ({self.detail})"


@dataclass(frozen=True)
class Mailing:
    """Who gets what: the admins' addresses and each account's coordinators.

    Attributes:
        admins: [notify] admin_emails.
        coordinators: {account: coordinator user names} (sacctmgr).
        user_email_domain: coordinators are mailed at user@<domain> ("" mails none).
        sender: the From address ([notify] smtp_from).
    """

    admins: Sequence[str]
    coordinators: Mapping[str, set[str]]
    user_email_domain: str
    sender: str

    def statement_accounts(self) -> list[str]:
        """The accounts that have a coordinator, sorted."""
        return sorted(a for a, users in self.coordinators.items() if users)


def _message(sender: str, to: str, subject: str, body: str, now: float) -> EmailMessage:
    mail = EmailMessage()
    mail["From"] = sender
    mail["To"] = to
    mail["Subject"] = subject
    mail["Date"] = formatdate(now, localtime=True)
    domain = sender.rpartition("@")[2] or "localhost"
    mail["Message-ID"] = make_msgid("slurm-gpu", domain=domain)
    mail.set_content(body)
    return mail


def _tag(cluster: str) -> str:
    return f"[slurm-gpu {cluster}]" if cluster else "[slurm-gpu]"


def _attach(mail: EmailMessage, name: str, data: bytes) -> None:
    subtype = "html" if name.endswith(".html") else "csv" if name.endswith(".csv") else "plain"
    mail.add_attachment(data, maintype="text", subtype=subtype, filename=name)


def report_mail(
    report: MonthlyReport,
    files: Sequence[Path],
    to: str,
    sender: str,
    now: float,
    without_coordinator: Sequence[str] = (),
) -> EmailMessage:
    """The admins' message: the headline figures, index.html and every CSV file attached.

    Args:
        report: the monthly report.
        files: `write_monthly`'s files (index.html first).
        to: the admin's address.
        sender: the From address.
        now: POSIX seconds (the Date header).
        without_coordinator: accounts with usage and no coordinator.
    """
    subject = f"{_tag(report.cluster)} GPU usage report {report.month}"
    body = report_summary_text(report, files[0], without_coordinator)
    mail = _message(sender, to, subject, body, now)
    for path in files:
        _attach(mail, path.name, path.read_bytes())
    return mail


def statement_mail(statement: Statement, to: str, sender: str, now: float) -> EmailMessage:
    """A coordinator's message: the account's statement, its CSV files attached."""
    subject = (
        f"{_tag(statement.cluster)} GPU usage statement {statement.month}: "
        f"account {statement.account}"
    )
    mail = _message(sender, to, subject, statement_text(statement), now)
    for name, text in statement_files(statement).items():
        if name.endswith(".csv"):
            _attach(mail, name, text.encode("utf-8"))
    return mail


def deliver(
    report: MonthlyReport,
    files: Sequence[Path],
    statements: Mapping[str, Statement],
    mailing: Mailing,
    log: DeliveryLog,
    transport: Transport,
    *,
    resend: bool = False,
    clock: Callable[[], float] = time.time,
) -> list[Outcome]:
    """Sends what has not gone out yet for `report.month`; returns one outcome per message.

    Args:
        report: the monthly report (an admin's: it shows every account).
        files: its files (`write_monthly`: index.html first).
        statements: {account: statement} of the accounts with coordinators.
        mailing: who gets what.
        log: the store's record of what went out.
        transport: how a message leaves.
        resend: send again what went out before.
        clock: POSIX seconds now.
    """
    month = report.month
    with_usage = {a["key"] for a in report.accounts}
    stated = set(mailing.statement_accounts())
    without = sorted(with_usage - stated)
    outcomes = []
    for admin in dict.fromkeys(mailing.admins):
        now = clock()
        mail = report_mail(report, files, admin, mailing.sender, now, without)
        name = f"{month}-report-{safe_name(admin)}"
        outcomes.append(_send(log, transport, mail, name, (month, REPORT, "", admin), now, resend))
    for account in mailing.statement_accounts():
        statement = statements[account]
        for user in sorted(mailing.coordinators[account]):
            if not mailing.user_email_domain:
                outcomes.append(
                    Outcome(STATEMENT, account, "", "not sent",
                            f"coordinator {user}: no [notify] user_email_domain to mail at")
                )  # fmt: skip
                continue
            to = f"{user}@{mailing.user_email_domain}"
            now = clock()
            mail = statement_mail(statement, to, mailing.sender, now)
            name = f"{month}-statement-{safe_name(account)}-{safe_name(to)}"
            key = (month, STATEMENT, account, to)
            outcomes.append(_send(log, transport, mail, name, key, now, resend))
    return outcomes


def _send(
    log: DeliveryLog,
    transport: Transport,
    mail: EmailMessage,
    name: str,
    key: tuple[str, str, str, str],
    now: float,
    resend: bool,
) -> Outcome:
    month, kind, account, to = key
    delivery = Delivery(month, kind, account, to, now, str(mail["Message-ID"]))
    claimed, before = log.claim(delivery, resend=resend)
    if not claimed:
        sent_at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(before.time)) if before else ""
        return Outcome(kind, account, to, "already sent", f"{sent_at}; --resend sends it again")
    try:
        where = transport(mail, name)
    except OSError as exc:
        log.release(delivery, before)
        return Outcome(kind, account, to, "failed", str(exc))
    return Outcome(kind, account, to, "sent", where)
