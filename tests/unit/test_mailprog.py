"""The MailProg wrapper's logic: which mail gets a report, the bounded wait, delivery."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from slurm_gpu.config import Config
from slurm_gpu.config.mailprog import MailProgSettings
from slurm_gpu.config.policy import NotifySettings
from slurm_gpu.errors import StoreError
from slurm_gpu.mailprog import wrapper as mailprog
from slurm_gpu.mailprog.delivery import (
    DeliveryError,
    OutboxDelivery,
    OutgoingMail,
    ProgramDelivery,
    SmtpDelivery,
)
from slurm_gpu.models import JobGpuSummary
from slurm_gpu.testing import FixedClock
from tests.receivers import smtp_receiver

SUBJECT = "Slurm Job_id=42 Name=train Ended, Run time 00:10:00, COMPLETED, ExitCode 0"
ENDED = {"SLURM_JOB_ID": "42", "SLURM_JOB_MAIL_TYPE": "Ended", "SLURM_JOB_STATE": "COMPLETED"}


def slurm_mail(
    env: dict[str, str] = ENDED, body: bytes = b"", subject: str = SUBJECT
) -> OutgoingMail:
    return mailprog.parse_mail(["-s", subject, "alice"], body, env)


@dataclass
class Reports:
    """A report source answering `answers` in turn (the last one from then on)."""

    answers: list[bool | None]
    report: str = "Job 42 ...\n"
    asked: int = 0
    texts: int = 0

    def ready(self, job_id: int) -> bool | None:
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return answer

    def text(self, job_id: int) -> str:
        self.texts += 1
        return self.report


@dataclass
class Waits:
    """A monotonic clock that only moves when slept on."""

    clock: FixedClock = field(default_factory=lambda: FixedClock(1000.0))
    slept: list[float] = field(default_factory=list)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)


def added(
    mail: OutgoingMail, reports: Reports, wait: float = 60.0, waits: Waits | None = None
) -> OutgoingMail:
    w = waits or Waits()
    return mailprog.with_report(mail, 42, lambda: reports, wait, clock=w.clock, sleep=w.sleep)


def test_parse_keeps_slurms_arguments_and_reads_subject_and_recipient() -> None:
    """`-s SUBJECT USER` as slurmctld passes it: arguments kept verbatim, parts read."""
    mail = slurm_mail()
    assert ("-s", SUBJECT, "alice") == mail.args
    assert SUBJECT == mail.subject
    assert ("alice",) == mail.recipients


@pytest.mark.parametrize(
    ("mail_type", "state", "expected"),
    [
        ("Ended", "COMPLETED", 42),
        ("Failed", "FAILED", 42),
        ("Ended", "TIMEOUT", 42),
        ("Began", "RUNNING", None),
        ("Requeued", "PENDING", None),
        ("Reached 90% of time limit", "RUNNING", None),
        ("Ended", "RUNNING", None),
    ],
)
def test_only_the_mail_of_a_job_that_is_done_gets_a_report(
    mail_type: str, state: str, expected: int | None
) -> None:
    """Ended and Failed mails of a job in a final state get a report; Began and the rest do not."""
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_MAIL_TYPE": mail_type, "SLURM_JOB_STATE": state}
    assert expected == mailprog.report_job(slurm_mail(env))


def test_an_array_summary_mail_gets_no_report() -> None:
    """The mail summing up an array speaks for many jobs: it goes unchanged."""
    mail = slurm_mail(subject="Slurm Array Summary Job_id=40_* (40) Name=a Ended, COMPLETED")
    assert None is mailprog.report_job(mail)


def test_ready_report_comes_after_slurms_body_untouched() -> None:
    """Slurm's body stays byte for byte; a blank line, then the text of `slurm-gpu job 42`."""
    mail = slurm_mail(body=b"Slurm's own line\n\xff")
    out = added(mail, Reports([True]))
    assert b"Slurm's own line\n\xff\n\nslurm-gpu job 42:\n\nJob 42 ...\n" == out.body
    assert (mail.args, mail.subject, mail.recipients) == (out.args, out.subject, out.recipients)


def test_empty_slurm_body_gets_the_report_alone() -> None:
    """Slurm 22.05 gives MailProg no body (stdin is /dev/null): the body is the report."""
    out = added(slurm_mail(), Reports([True]))
    assert b"slurm-gpu job 42:\n\nJob 42 ...\n" == out.body


def test_wait_is_bounded_and_the_mail_says_the_report_was_not_ready() -> None:
    """Summaries never arriving: after exactly `wait` seconds the mail goes with one line."""
    waits = Waits()
    reports = Reports([False])
    out = added(slurm_mail(), reports, wait=60.0, waits=waits)
    expected = b"The GPU report was not ready within 60 s; run `slurm-gpu job 42`.\n"
    assert expected == out.body
    assert 60.0 == sum(waits.slept)
    assert all(s <= mailprog.POLL_SECONDS for s in waits.slept)
    assert 0 == reports.texts


def test_summaries_arriving_during_the_wait_are_used() -> None:
    """Ready at the third look: the report is added after two polls, not the full wait."""
    waits = Waits()
    out = added(slurm_mail(), Reports([False, False, True]), waits=waits)
    assert out.body.startswith(b"slurm-gpu job 42:")
    assert [mailprog.POLL_SECONDS] * 2 == waits.slept


def test_a_job_without_gpus_keeps_its_mail_unchanged() -> None:
    """No GPU: the very mail Slurm gave, without a wait."""
    mail = slurm_mail(body=b"x")
    waits = Waits()
    assert mail == added(mail, Reports([None]), waits=waits)
    assert [] == waits.slept


def test_store_down_leaves_slurms_mail_with_one_line() -> None:
    """A failing store (building the source raises) costs the mail one line, no more."""

    def broken() -> Reports:
        raise StoreError("store sqlite:///x: unable to open database file")

    out = mailprog.with_report(slurm_mail(body=b"body\n"), 42, broken, 60.0)
    head, line = out.body.split(b"\n\n")
    assert b"body" == head
    assert [
        b"The GPU report could not be added (store sqlite:///x: unable to open database "
        b"file); run `slurm-gpu job 42`."
    ] == line.splitlines()


def test_a_bug_while_rendering_leaves_one_line() -> None:
    """An exception in the report's rendering is one line too; the mail still goes."""

    class Failing(Reports):
        def text(self, job_id: int) -> str:
            raise KeyError("util_mean_percent")

    out = added(slurm_mail(), Failing([True]))
    assert 1 == len(out.body.splitlines())
    assert out.body.startswith(b"The GPU report could not be added ('util_mean_percent')")


def summary(node: str, uuid: str, restart: int = 0) -> JobGpuSummary:
    return JobGpuSummary(
        job_id=42, node=node, gpu_uuid=uuid, gpu_model="A100", start=0.0, end=60.0,
        gpu_seconds=60.0, util_mean_percent=50.0, util_max_percent=60.0, active_seconds=60.0,
        mem_max_bytes=1, mem_gib_seconds=1.0, energy_joules=1.0, reading_count=1,
        missing_seconds=0.0, restart=restart,
    )  # fmt: skip


def test_summarized_needs_every_gpu_of_the_last_run_on_every_node() -> None:
    """Ready only once each node has a summary per GPU its last run held."""
    rows = [
        {"node": "gpu1", "restart": 0}, {"node": "gpu1", "restart": 1},
        {"node": "gpu1", "restart": 1}, {"node": "gpu2", "restart": 1},
    ]  # fmt: skip
    some = [summary("gpu1", "a", 1), summary("gpu1", "b", 1), summary("gpu2", "c", 0)]
    assert not mailprog.summarized(rows, some)
    assert mailprog.summarized(rows, [*some, summary("gpu2", "c", 1)])


def test_delivery_for_prefers_the_real_mail_program_then_smtp_then_the_outbox() -> None:
    """real_mailprog, else [notify] smtp_host, else outbox_dir; none of them: None."""
    base = Config()
    program = replace(base, mailprog=MailProgSettings(real_mailprog="/usr/bin/mail"))
    smtp = replace(base, notify=NotifySettings(smtp_host="mx"))
    outbox = replace(base, mailprog=MailProgSettings(outbox_dir="/tmp/out"))
    assert ProgramDelivery("/usr/bin/mail") == mailprog.delivery_for(program)
    assert isinstance(mailprog.delivery_for(smtp), SmtpDelivery)
    assert isinstance(mailprog.delivery_for(outbox), OutboxDelivery)
    assert None is mailprog.delivery_for(base)


def test_deliver_once_tries_again_only_after_a_failure() -> None:
    """A failed send is tried again (3 tries); a sent mail is never sent again."""
    tries: list[int] = []

    def flaky(mail: OutgoingMail) -> None:
        tries.append(1)
        if len(tries) < 2:
            raise DeliveryError("SMTP mx:25: connection refused")

    assert mailprog.deliver_once(flaky, slurm_mail(), sleep=lambda s: None)
    assert 2 == len(tries)

    def down(mail: OutgoingMail) -> None:
        raise DeliveryError("down")

    assert not mailprog.deliver_once(down, slurm_mail(), sleep=lambda s: None)


def fake_mail_program(tmp_path: Path, exit_code: int = 0) -> Path:
    """A mail program recording its arguments (NUL-separated), stdin and SLURM_JOB_ID."""
    program = tmp_path / "mail"
    program.write_text(
        "#!/bin/sh\n"
        f"printf '%s\\0' \"$@\" >{tmp_path}/args\n"
        f"cat >{tmp_path}/stdin\n"
        f'printf %s "$SLURM_JOB_ID" >{tmp_path}/job\n'
        f"exit {exit_code}\n"
    )
    program.chmod(0o755)
    return program


def test_program_delivery_passes_arguments_body_and_environment_byte_for_byte(
    tmp_path: Path,
) -> None:
    """The real mail program gets Slurm's arguments, the body's bytes and the job's env."""
    program = fake_mail_program(tmp_path)
    body = b"line one\n\x00\xfe\xff no newline at the end"
    ProgramDelivery(str(program))(slurm_mail(body=body))
    assert f"-s\0{SUBJECT}\0alice\0".encode() == (tmp_path / "args").read_bytes()
    assert body == (tmp_path / "stdin").read_bytes()
    assert "42" == (tmp_path / "job").read_text()


def test_program_delivery_failing_program_is_a_delivery_error(tmp_path: Path) -> None:
    """A mail program exiting 1 raises DeliveryError naming it and its status."""
    program = fake_mail_program(tmp_path, exit_code=1)
    with pytest.raises(DeliveryError, match=r"mail failed \(exit 1\)"):
        ProgramDelivery(str(program))(slurm_mail())


def test_smtp_delivery_sends_slurms_subject_to_the_users_address() -> None:
    """By SMTP: Slurm's subject, user@user_email_domain, the body as text."""
    with smtp_receiver() as (port, inbox):
        settings = NotifySettings(
            smtp_host="127.0.0.1", smtp_port=port, user_email_domain="cluster.example"
        )
        SmtpDelivery(settings)(slurm_mail(body="GPU 0: 97 % ▇▇▇\n".encode()))
    (message,) = inbox
    assert SUBJECT == message["Subject"]
    assert "alice@cluster.example" == message["X-Rcpt-To"]
    body = message.get_payload(decode=True).decode()  # type: ignore[union-attr]
    assert "GPU 0: 97 % ▇▇▇\n" == body.replace("\r\n", "\n")  # SMTP's line ends


def test_outbox_delivery_writes_one_complete_file(tmp_path: Path) -> None:
    """The outbox gets one .eml file (no partial file left) holding the mail."""
    OutboxDelivery(tmp_path / "out", clock=lambda: 1.5)(slurm_mail(body=b"hello\n"))
    files = sorted(os.listdir(tmp_path / "out"))
    assert [f"1.500000-42-{os.getpid()}.eml"] == files
    text = (tmp_path / "out" / files[0]).read_text()
    assert f"Subject: {SUBJECT}" in text.replace("\n ", " ")
    assert text.endswith("\nhello\n")
