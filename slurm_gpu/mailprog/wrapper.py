"""Slurm's MailProg wrapper: Slurm's mail as it is, plus the job's GPU report at its end.

slurm.conf's `MailProg=` names hooks/slurm-gpu-mailprog, which runs `slurm-gpu
mailprog`. How slurmctld calls it (Slurm 22.05, src/slurmctld/agent.c: mail_job_info,
_build_mail_env, _mail_proc; src/common/run_command.c: run_command):

- argv `MailProg -s "Slurm Job_id=N Name=X Ended, Run time 00:00:05, COMPLETED,
  ExitCode 0" <mail user>`, standard input /dev/null: the subject is the whole text.
- The environment is the job's alone (no PATH): SLURM_JOB_ID, SLURM_JOB_USER,
  SLURM_JOB_ACCOUNT, SLURM_JOB_NAME, SLURM_JOB_STATE (the base state: COMPLETED, FAILED,
  ...), SLURM_JOB_MAIL_TYPE ("Began", "Ended", "Failed", ...), SLURM_JOB_RUN_TIME,
  SLURM_JOB_EXIT_CODE_MAX, SLURM_CLUSTER_NAME ...
- It runs as the SlurmUser (slurmscriptd), in a process group of its own, from a
  detached thread of slurmctld that waits for it: at most 64 at once (MAX_MAIL_THREADS),
  each counted against the threads slurmctld talks to the nodes with, and killed after
  120 s (MAIL_PROG_TIMEOUT).

So a mail that wants a report is handed to a process of its own ([mailprog] detach) and
the wrapper returns at once. That process waits for the job's summaries in the store at
most [mailprog] wait, then sends Slurm's mail with the text of `slurm-gpu job N`, or with
one line saying the report was not ready or could not be added. Every other mail (Began,
a job without GPUs, an array's summary) goes on unchanged, at once. Whatever goes wrong
in slurm-gpu's part, Slurm's own mail is sent, once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from slurm_gpu.config import Config
from slurm_gpu.mailprog.delivery import (
    Delivery,
    DeliveryError,
    OutboxDelivery,
    OutgoingMail,
    ProgramDelivery,
    SmtpDelivery,
)
from slurm_gpu.models import JobGpuSummary

log = logging.getLogger(__name__)

# _mail_type_str in src/slurmctld/agent.c: the types of the mail sent when a job is done.
REPORT_MAIL_TYPES = frozenset({"Ended", "Failed"})
# job_state_string of a job's base state once it is done (src/common/slurm_protocol_defs.c).
ENDED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
# How often the store is asked whether the summaries arrived: the agents ship every
# interval, so a finished job's summaries land within seconds of its end.
POLL_SECONDS = 2.0
# Delivery attempts of a mail that waited for its report (no fallback program behind it).
DELIVERY_ATTEMPTS = 3
DELIVERY_PAUSE_SECONDS = 5.0
# The exit status telling hooks/slurm-gpu-mailprog that nothing was sent (EX_TEMPFAIL):
# it hands Slurm's mail to its fallback program.
NOT_SENT = 75


class JobReports(Protocol):
    """Where the GPU report of a job comes from (the store, `slurm-gpu job`)."""

    def ready(self, job_id: int) -> bool | None:
        """Whether the job's summaries are in the store; None: the job had no GPUs."""

    def text(self, job_id: int) -> str:
        """The text `slurm-gpu job JOB_ID` prints."""


def parse_mail(args: Sequence[str], body: bytes, env: Mapping[str, str]) -> OutgoingMail:
    """Slurm's MailProg call as a mail: `-s SUBJECT RECIPIENT...`, the body, the job's env.

    The arguments are kept exactly as given, for the real mail program; what is not
    `-s SUBJECT` or an option counts as a recipient.
    """
    subject: str | None = None
    recipients: list[str] = []
    items = iter(args)
    for arg in items:
        if arg == "-s":
            subject = next(items, "")
        elif not arg.startswith("-"):
            recipients.append(arg)
    return OutgoingMail(tuple(args), subject, tuple(recipients), body, dict(env))


def report_job(mail: OutgoingMail) -> int | None:
    """The job whose GPU report this mail gets, or None: the mail goes unchanged.

    Only the mail of a job that is done (Ended, Failed) gets one; an array's summary mail
    speaks for many jobs and gets none.
    """
    env = mail.env
    if env.get("SLURM_JOB_MAIL_TYPE") not in REPORT_MAIL_TYPES:
        return None
    if env.get("SLURM_JOB_STATE") not in ENDED_STATES:
        return None
    if (mail.subject or "").startswith("Slurm Array Summary"):
        return None
    try:
        return int(env.get("SLURM_JOB_ID", ""))
    except ValueError:
        return None


def summarized(gpu_rows: Iterable[Mapping[str, Any]], summaries: Iterable[JobGpuSummary]) -> bool:
    """Whether every GPU the job's last run held on each node has its summary.

    Args:
        gpu_rows: the store's `job_gpus` rows of the job (node, restart).
        summaries: the store's summaries of the job.
    """
    rows = list(gpu_rows)
    last = max(int(r.get("restart") or 0) for r in rows)
    held: dict[str, int] = {}
    for r in rows:
        if int(r.get("restart") or 0) == last:
            held[str(r["node"])] = held.get(str(r["node"]), 0) + 1
    done: dict[str, int] = {}
    for s in summaries:
        if s.restart == last:
            done[s.node] = done.get(s.node, 0) + 1
    return all(done.get(node, 0) >= count for node, count in held.items())


def not_ready_line(job_id: int, wait: float) -> str:
    """What the mail says when the report did not arrive within the wait."""
    return f"The GPU report was not ready within {wait:g} s; run `slurm-gpu job {job_id}`.\n"


def failed_line(job_id: int, exc: BaseException) -> str:
    """The one line a mail gets when slurm-gpu's part failed."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    return f"The GPU report could not be added ({reason}); run `slurm-gpu job {job_id}`.\n"


def append(body: bytes, text: str) -> bytes:
    """Slurm's body, untouched, then a blank line and `text`."""
    if not body:
        return text.encode("utf-8")
    head = body if body.endswith(b"\n") else body + b"\n"
    return head + b"\n" + text.encode("utf-8")


def with_report(
    mail: OutgoingMail,
    job_id: int,
    reports: Callable[[], JobReports],
    wait: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> OutgoingMail:
    """The mail with the job's GPU report appended, once its summaries are in the store.

    Waits at most `wait` seconds (polling every POLL_SECONDS); then the mail says the
    report was not ready. A job without GPUs keeps its mail as it is. Any failure
    (store down, Slurm unreachable, a bug) leaves Slurm's mail with one line about it.

    Args:
        mail: Slurm's mail.
        job_id: the job (`report_job`).
        reports: builds the report source (it may fail: the store is opened there).
        wait: seconds to wait for the summaries.
        clock: monotonic seconds (tests pass their own).
        sleep: waits that many seconds (tests pass their own).
    """
    try:
        source = reports()
        deadline = clock() + wait
        while True:
            ready = source.ready(job_id)
            if ready is None:
                return mail
            if ready:
                text = f"slurm-gpu job {job_id}:\n\n{source.text(job_id)}"
                break
            left = deadline - clock()
            if left <= 0:
                text = not_ready_line(job_id, wait)
                break
            sleep(min(POLL_SECONDS, left))
    except Exception as exc:  # slurm-gpu's part must never stop Slurm's mail
        log.warning("job %s: the GPU report could not be added: %r", job_id, exc)
        text = failed_line(job_id, exc)
    return replace(mail, body=append(mail.body, text))


def delivery_for(config: Config) -> Delivery | None:
    """How mail leaves: [mailprog] real_mailprog, else SMTP ([notify]), else outbox_dir.

    Returns None when none is configured: the wrapper's fallback program sends it.
    """
    settings = config.mailprog
    if settings.real_mailprog:
        return ProgramDelivery(settings.real_mailprog)
    if config.notify.smtp_host:
        return SmtpDelivery(config.notify)
    if settings.outbox_dir:
        return OutboxDelivery(Path(settings.outbox_dir), sender=config.notify.smtp_from)
    return None


def deliver_once(
    deliver: Delivery,
    mail: OutgoingMail,
    *,
    attempts: int = DELIVERY_ATTEMPTS,
    pause: float = DELIVERY_PAUSE_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Send `mail`, trying again a few times when delivery fails; whether it went out."""
    for attempt in range(1, attempts + 1):
        try:
            deliver(mail)
            return True
        except DeliveryError as exc:
            log.error(
                "job %s: mail to %s not delivered (try %d of %d): %s",
                mail.env.get("SLURM_JOB_ID", "?"),
                ", ".join(mail.recipients) or "nobody",
                attempt,
                attempts,
                exc,
            )
            if attempt < attempts:
                sleep(pause)
    return False


def detach(log_file: Path | None) -> bool:
    """Go on in a process of its own, out of slurmctld's way; True in that process.

    The caller (the wrapper slurmctld waits for) gets False and exits at once. The new
    process leaves Slurm's process group (slurmctld kills it after 120 s) and its
    output pipe (slurmctld reads it until it closes): its output goes to `log_file`.

    Raises:
        OSError: no process could be made; the caller sends in the foreground.
    """
    if os.fork() != 0:
        return False
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    out = null
    if log_file is not None:
        try:
            out = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            out = null
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    return True
