"""Config section of the MailProg wrapper: [mailprog].

The wrapper (hooks/slurm-gpu-mailprog, `slurm-gpu mailprog`) is what slurm.conf's
`MailProg=` names: it passes Slurm's mail on and adds the job's GPU report to the mail
of a GPU job that ended. This section says how the mail leaves and how long the report
is waited for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurm_gpu.config._loader import doc
from slurm_gpu.durations import Duration

# slurmctld kills MailProg's process group after 120 s (MAIL_PROG_TIMEOUT in Slurm's
# src/slurmctld/agent.c, 22.05 to 25.11): a mail that waits for its report longer than
# this is late by any measure, and a wrapper that could not detach still gets it out.
MAX_WAIT_SECONDS = 90.0


def _check_program(path: str) -> str | None:
    if path and not path.startswith("/"):
        return f"expected an absolute path (Slurm runs MailProg with no PATH), got {path!r}"
    return None


def _check_dir(path: str) -> str | None:
    if path and not path.startswith("/"):
        return f"expected an absolute path, got {path!r}"
    return None


@dataclass(frozen=True)
class MailProgSettings:
    """[mailprog]: Slurm's end-of-job mail with the job's GPU report."""

    real_mailprog: str = field(
        default="",
        metadata=doc(
            "The mail program that delivers Slurm's mail (e.g. /usr/bin/mail), called as "
            'Slurm calls MailProg (-s SUBJECT USER, the body on stdin); "" sends it by SMTP '
            "with [notify]'s smtp_* settings, or into outbox_dir when smtp_host is empty.",
            check=_check_program,
        ),
    )
    wait: Duration = field(
        default=Duration(60.0),
        metadata=doc(
            "How long the mail of a GPU job that ended waits for the job's summaries in the "
            "store; then it goes without the report, saying so.",
            above=0,
            maximum=MAX_WAIT_SECONDS,
        ),
    )
    outbox_dir: str = field(
        default="",
        metadata=doc(
            "Directory the mails are written into (one .eml file each) when neither "
            'real_mailprog nor [notify] smtp_host is set (a test bed); "" delivers nothing '
            "then, and the wrapper hands the mail to its fallback program.",
            check=_check_dir,
        ),
    )
    detach: bool = field(
        default=True,
        metadata=doc(
            "Return to slurmctld at once and wait for the report in a process of its own: "
            "slurmctld's MailProg threads count against the threads it talks to the nodes "
            "with."
        ),
    )
