"""`slurm-gpu sacct` says what Slurm's sacct says (#11 item 11), on the test bed.

A job that its user cancels is `CANCELLED by <uid>` in Slurm's sacct, and stays so in
`slurm-gpu sacct`; sacct's `--delimiter` lets `-P` output carry a job name with `|`.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.testbed import TestBed

pytestmark = pytest.mark.slurm
CLI = str(Path(os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin" / "slurm-gpu")


@pytest.fixture(scope="module")
def cancelled_by_alice(testbed: TestBed) -> Iterator[int]:
    """A job named `a|b` that alice starts and then cancels herself."""
    job = testbed.submit("alice", "--job-name=a|b", "-t", "5", wrap="sleep 120")
    try:
        testbed.wait_state(job, {"RUNNING"})
        testbed.run("scancel", str(job), user="alice")
        testbed.wait_done(job)
        wait_slurm_knows_name(testbed, job, "a|b")
        yield job
    finally:
        testbed.run("scancel", str(job), check=False)


def wait_slurm_knows_name(testbed: TestBed, job: int, name: str) -> None:
    """Until Slurm's own sacct shows the job's name.

    A job cancelled seconds after it started can reach slurmdbd's database first by its
    completion message, which carries no name: sacct then says "allocation" until the
    start message lands (Slurm's as_mysql_job_complete calls as_mysql_job_start with the
    completion's fields, as_mysql_job.c, jname = "allocation"). Both sacct views read the
    same database; this test compares them once it holds the name.
    """
    deadline = time.monotonic() + 90
    shown = ""
    while time.monotonic() < deadline:
        shown = testbed.run("sacct", "-X", "-n", "-P", "-j", str(job), "-o", "JobName").stdout
        if shown.strip() == name:
            return
        time.sleep(1)
    raise AssertionError(f"Slurm's sacct still names job {job} {shown.strip()!r}, not {name!r}")


def slurm_gpu_sacct(testbed: TestBed, *args: str) -> str:
    """`slurm-gpu sacct ARGS` as root on the test bed's config; its stdout."""
    done = subprocess.run(
        [CLI, "sacct", *args],
        env=testbed.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    return done.stdout


def test_state_says_which_user_cancelled(testbed: TestBed, cancelled_by_alice: int) -> None:
    """Slurm says `CANCELLED by 1001` (alice's uid); so does `slurm-gpu sacct`."""
    expected = f"CANCELLED by {pwd.getpwnam('alice').pw_uid}"
    assert expected == testbed.sacct(cancelled_by_alice, "State")["State"]
    out = slurm_gpu_sacct(testbed, "-j", str(cancelled_by_alice), "-P", "-n", "-o", "JobID,State")
    assert f"{cancelled_by_alice}|{expected}\n" == out


def test_delimiter_keeps_a_name_with_a_bar_parsable(
    testbed: TestBed, cancelled_by_alice: int
) -> None:
    """`-P --delimiter=,`: three fields, the name `a|b` whole, as sacct's own output."""
    fields = ["-o", "JobID,JobName,User"]
    out = slurm_gpu_sacct(testbed, "-j", str(cancelled_by_alice), "-P", "--delimiter=,", *fields)
    assert f"JobID,JobName,User\n{cancelled_by_alice},a|b,alice\n" == out
    slurm = testbed.run(
        "sacct", "-X", "-P", "--delimiter=,", "-j", str(cancelled_by_alice), *fields
    ).stdout
    assert slurm == out
