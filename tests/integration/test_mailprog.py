"""Slurm's end-of-job mail carries the job's GPU report: the real slurmctld, MailProg, SMTP.

The test bed's slurm.conf names hooks/slurm-gpu-mailprog as MailProg (installed by
docker/slurm-cluster/lib.sh, its config $STATE/etc/slurm-gpu-mailprog.toml, which
writes mails into $STATE/mail). This test points that config at its own SMTP receiver
while it runs (the wrapper reads it at every mail) and puts it back after.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest

from slurm_gpu.config import load_config, render_config
from slurm_gpu.durations import Duration
from tests.integration.testbed import TestBed
from tests.receivers import smtp_receiver

pytestmark = pytest.mark.slurm

CLI = str(Path(os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin" / "slurm-gpu")
DOMAIN = "testbed.example"


@pytest.fixture
def inbox(testbed: TestBed) -> Iterator[list[Message]]:
    """An SMTP receiver that the test bed's MailProg sends to, for this test."""
    wrapper = testbed.state_dir / "hooks" / "slurm-gpu-mailprog"
    shown = testbed.run("scontrol", "show", "config").stdout
    assert f"MailProg                = {wrapper}" in shown, (
        "slurmctld does not run the MailProg wrapper: bring the test bed up afresh "
        "(local-cluster down && local-cluster up)"
    )
    path = testbed.state_dir / "etc" / "slurm-gpu-mailprog.toml"
    before = path.read_bytes()
    config = load_config(path)
    with smtp_receiver() as (port, messages):
        notify = dataclasses.replace(
            config.notify, smtp_host="127.0.0.1", smtp_port=port, user_email_domain=DOMAIN
        )
        mailprog = dataclasses.replace(config.mailprog, wait=Duration(60.0), detach=True)
        ours = dataclasses.replace(config, notify=notify, mailprog=mailprog)
        path.write_text(render_config(ours))
        try:
            yield messages
        finally:
            path.write_bytes(before)


def wait_mail(inbox: list[Message], timeout: float) -> Message:
    deadline = time.monotonic() + timeout
    while not inbox and time.monotonic() < deadline:
        time.sleep(0.5)
    assert inbox, f"no mail within {timeout:g} s"
    return inbox[0]


def job_text(testbed: TestBed, job_id: int) -> str:
    """`slurm-gpu job JOBID` as root, UTF-8."""
    done = subprocess.run(
        [CLI, "--config", testbed.env["SLURM_GPU_CONFIG"], "job", str(job_id)],
        env={**testbed.env, "PYTHONIOENCODING": "utf-8"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert 0 == done.returncode, done.stderr
    return done.stdout


def test_end_mail_carries_slurms_text_and_the_jobs_gpu_report(
    testbed: TestBed, inbox: list[Message]
) -> None:
    """--mail-type=END: one mail, Slurm's subject, then the text of `slurm-gpu job N`."""
    load = testbed.gpu_load("--util", "70", "--sm", "40", "--mem", "2048", "--seconds", "20")
    job = testbed.submit(
        "alice", "--gres=gpu:h100:1", "--mail-type=END", "--mail-user=alice", wrap=load
    )
    try:
        assert "COMPLETED" == testbed.wait_done(job, timeout=300)
        ended = time.monotonic()
        mail = wait_mail(inbox, timeout=120)
        waited = time.monotonic() - ended
        time.sleep(5)  # a second mail, were one sent, comes as fast as the first
    finally:
        testbed.run("scancel", str(job), check=False)
    assert 1 == len(inbox), [m["Subject"] for m in inbox]
    subject = mail["Subject"]
    assert subject.startswith(f"Slurm Job_id={job} Name=wrap Ended, Run time "), subject
    assert subject.endswith(", COMPLETED, ExitCode 0"), subject
    assert f"alice@{DOMAIN}" == mail["X-Rcpt-To"]
    payload = mail.get_payload(decode=True)
    assert isinstance(payload, bytes)
    body = payload.decode("utf-8").replace("\r\n", "\n")
    assert f"slurm-gpu job {job}:\n\n{job_text(testbed, job)}" == body
    assert "not ready" not in body and "could not be added" not in body
    assert "Util avg/max" in body and "SM active" in body  # the H100 measures SM activity
    assert waited < 60 + 30, f"the mail came {waited:.0f} s after the job ended"
