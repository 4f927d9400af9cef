"""How a mail Slurm asked for leaves: the real mail program, SMTP, or an outbox folder.

The MailProg wrapper (wrapper.py) decides what the mail says; a `Delivery`
sends it, once. Slurm calls MailProg as `MailProg -s SUBJECT RECIPIENT` with the body on
standard input (src/slurmctld/agent.c, _mail_proc; 22.05 gives /dev/null, so the body
is empty and Slurm's text is the subject), and with the job's environment only: no
PATH, no HOME. So every program here is named by its absolute path.
"""

from __future__ import annotations

import contextlib
import os
import signal
import smtplib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from email.policy import SMTP
from pathlib import Path
from typing import Protocol

from slurm_gpu.config.policy import NotifySettings
from slurm_gpu.policy.notify import send_email


class DeliveryError(Exception):
    """The mail could not be handed on (program failed, SMTP refused, folder unwritable)."""


@dataclass(frozen=True)
class OutgoingMail:
    """One mail as Slurm asked for it, with the body that goes out.

    Attributes:
        args: MailProg's arguments after the program name, exactly as Slurm gave them
            (`-s`, the subject, the recipient).
        subject: the subject (Slurm's text), None if the arguments carried none.
        recipients: who it is for, as Slurm wrote them (a user name or an address).
        body: the body's bytes.
        env: the environment Slurm gave MailProg (SLURM_JOB_ID, SLURM_JOB_MAIL_TYPE...).
    """

    args: tuple[str, ...]
    subject: str | None
    recipients: tuple[str, ...]
    body: bytes
    env: Mapping[str, str]


class Delivery(Protocol):
    """Sends one mail. Raises DeliveryError when it could not."""

    def __call__(self, mail: OutgoingMail) -> None:
        """Send `mail` once."""


@dataclass(frozen=True)
class ProgramDelivery:
    """Hands the mail to the real mail program, called as Slurm calls MailProg.

    Args:
        program: absolute path of the mail program ([mailprog] real_mailprog).
        timeout: seconds the program may take before it is killed.
    """

    program: str
    timeout: float = 30.0

    def __call__(self, mail: OutgoingMail) -> None:
        """Run `program` with Slurm's arguments and environment, the body on stdin."""
        read_end, write_end = os.pipe()
        try:
            pid = os.posix_spawn(
                self.program,
                [self.program, *mail.args],
                dict(mail.env),
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, read_end, 0),
                    (os.POSIX_SPAWN_CLOSE, write_end),
                ],
                setpgroup=0,
            )
        except OSError as exc:
            os.close(write_end)
            raise DeliveryError(f"cannot run {self.program}: {exc.strerror or exc}") from exc
        finally:
            os.close(read_end)
        try:
            with os.fdopen(write_end, "wb") as stdin:
                stdin.write(mail.body)
        except BrokenPipeError:
            pass  # the program did not read it all; its exit status tells
        status = _wait(pid, self.timeout)
        if status is None:
            raise DeliveryError(f"{self.program} did not finish within {self.timeout:g}s")
        if status != 0:
            raise DeliveryError(f"{self.program} failed (exit {status})")


def _wait(pid: int, timeout: float) -> int | None:
    """The exit status of `pid` (128+N for signal N), or None after killing it at `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.02)


def message(mail: OutgoingMail, sender: str, domain: str) -> EmailMessage:
    """The mail as an RFC 5322 message: Slurm's subject, its recipients, the body.

    Args:
        mail: the mail.
        sender: the From address ([notify] smtp_from).
        domain: mail domain of a recipient Slurm names by user name only ([notify]
            user_email_domain; "" leaves the name as it is, for a local MTA).
    """
    # Slurm's subject is one line of ~80 characters and more: kept whole (RFC 5322 allows
    # 998), where folding at 78 breaks it for mail filters that match on it.
    out = EmailMessage(policy=SMTP.clone(max_line_length=998))
    out["From"] = sender
    out["To"] = ", ".join(addresses(mail.recipients, domain))
    out["Subject"] = mail.subject or ""
    job = mail.env.get("SLURM_JOB_ID")
    if job:
        out["X-Slurm-Job-Id"] = job
    text = mail.body.decode("utf-8", "replace")
    out.set_content(text, cte="7bit" if text.isascii() else "quoted-printable")
    return out


def addresses(recipients: Sequence[str], domain: str) -> list[str]:
    """Slurm's --mail-user values as addresses: a bare user name gets `@domain`."""
    out: list[str] = []
    for entry in recipients:
        for name in entry.split(","):
            name = name.strip()
            if name:
                out.append(name if "@" in name or not domain else f"{name}@{domain}")
    return out


@dataclass(frozen=True)
class SmtpDelivery:
    """Sends the mail by SMTP with [notify]'s smtp_* settings.

    Args:
        settings: the [notify] section (smtp_host must be set).
        timeout: seconds for the SMTP exchange.
    """

    settings: NotifySettings
    timeout: float = 20.0

    def __call__(self, mail: OutgoingMail) -> None:
        """One SMTP session: STARTTLS and login as configured, one message."""
        s = self.settings
        out = message(mail, s.smtp_from, s.user_email_domain)
        if not out["To"]:
            raise DeliveryError("the mail names no recipient")
        try:
            send_email(s, out, self.timeout)
        except (OSError, smtplib.SMTPException) as exc:
            raise DeliveryError(f"SMTP {s.smtp_host}:{s.smtp_port}: {exc}") from exc


@dataclass(frozen=True)
class OutboxDelivery:
    """Writes the mail as one .eml file into a folder (a test bed's default: harmless).

    Args:
        folder: where the files go; made when missing.
        sender: the From address.
        clock: POSIX seconds now, for the file's name.
    """

    folder: Path
    sender: str = "slurm@localhost"
    clock: Callable[[], float] = time.time

    def __call__(self, mail: OutgoingMail) -> None:
        """Write `<folder>/<time>-<job>-<pid>.eml`, complete or not at all (a rename)."""
        name = f"{self.clock():.6f}-{mail.env.get('SLURM_JOB_ID', 'nojob')}-{os.getpid()}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            partial = self.folder / f".{name}.tmp"
            out = message(mail, self.sender, "")
            # A file on disk: the host's line ends, not SMTP's CRLF.
            partial.write_bytes(out.as_bytes(policy=out.policy.clone(linesep="\n")))
            partial.rename(self.folder / f"{name}.eml")
        except OSError as exc:
            raise DeliveryError(f"cannot write into {self.folder}: {exc.strerror or exc}") from exc
