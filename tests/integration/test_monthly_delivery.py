"""The monthly timer's service on the test bed: the report and the statements, mailed once.

The command is the ExecStart of conf/systemd/slurm-gpu-monthly.service, with --month set
to the current month and SLURM_GPU_CONFIG (its Environment=) to a config for this test:
[notify] SMTP to a receiver on loopback (tests/receivers.py), addresses of a domain of
this run's own (so what earlier runs sent does not count), prices so that costs are not
zero. The coordinators are the test bed's (lib.sh: dana of physics, erin of bio, read back
from sacctmgr). alice (physics) and bob (bio) each run a GPU job first.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import shlex
import subprocess
import time
import uuid
from email.message import Message
from pathlib import Path

import pytest

from slurm_gpu.store import Store
from tests.integration.testbed import TestBed
from tests.receivers import smtp_receiver

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "conf" / "systemd" / "slurm-gpu-monthly.service"


def unit_command(month: str, config: Path, venv: Path) -> tuple[list[str], dict[str, str]]:
    """The unit's ExecStart (as argv) for `month`, and its Environment= with `config`."""
    service: dict[str, list[str]] = {}
    section = ""
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            service.setdefault(key, []).append(value)
    assert ["oneshot"] == service["Type"]
    (exec_start,) = service["ExecStart"]
    argv = shlex.split(exec_start)
    assert "/opt/slurm-gpu/venv/bin/slurm-gpu" == argv[0]
    argv[0] = str(venv / "bin" / "slurm-gpu")  # the test bed's venv, where it is elsewhere
    argv[argv.index("--month") + 1] = month
    env = dict(value.split("=", 1) for value in service.get("Environment", []))
    assert "SLURM_GPU_CONFIG" in env
    env["SLURM_GPU_CONFIG"] = str(config)
    return argv, env


def write_config(testbed: TestBed, smtp_port: int, domain: str, folder: Path) -> Path:
    """The test bed's slurm-gpu.toml plus prices, [notify] for the receiver, [reports]."""
    base = Path(testbed.env["SLURM_GPU_CONFIG"]).read_text()
    path = testbed.state_dir / "etc" / f"monthly-{domain.split('.')[0]}.toml"
    path.write_text(
        base
        + f"""
[cost]
prices = {{ a100 = 2.5, h100 = 4.0 }}

[notify]
smtp_host = "127.0.0.1"
smtp_port = {smtp_port}
smtp_from = "slurm-gpu@{domain}"
user_email_domain = "{domain}"
admin_emails = ["admins@{domain}"]

[reports]
monthly_dir = "{folder / "reports"}"
"""
    )
    return path


@pytest.fixture(scope="module")
def jobs(testbed: TestBed, store: Store) -> dict[str, int]:
    """alice's job in physics and bob's in bio, ended, with their summaries in the store."""
    load = testbed.gpu_load("--util", "70", "--seconds", "15")
    ids = {
        "alice": testbed.submit("alice", "-A", "physics", "--gres=gpu:1", wrap=load),
        "bob": testbed.submit("bob", "-A", "bio", "--gres=gpu:1", wrap=load),
    }
    try:
        for job_id in ids.values():
            testbed.wait_done(job_id, timeout=600)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(store.job_summaries(j) for j in ids.values()):
            time.sleep(1)
        assert all(store.job_summaries(j) for j in ids.values()), "no summaries after 120 s"
    finally:
        testbed.run("scancel", *map(str, ids.values()), check=False)
    return ids


def coordinators(testbed: TestBed) -> dict[str, set[str]]:
    out = testbed.run(
        "sacctmgr", "-n", "-P", "show", "account", "withcoord", "format=Account,Coordinators"
    ).stdout
    found: dict[str, set[str]] = {}
    for line in out.splitlines():
        account, _, users = line.partition("|")
        found[account] = {u for u in users.strip("|").split(",") if u}
    return found


def text_of(mail: Message) -> str:
    """The body and every attachment, decoded."""
    parts = []
    for part in mail.walk():
        payload = part.get_payload(decode=True)
        if isinstance(payload, bytes):
            parts.append(payload.decode("utf-8"))
    return "\n".join(parts)


def attachment(mail: Message, name: str) -> str:
    for part in mail.walk():
        if part.get_filename() == name:
            payload = part.get_payload(decode=True)
            assert isinstance(payload, bytes)
            return payload.decode("utf-8")
    raise AssertionError(f"no attachment {name} in {mail['Subject']}")


def test_monthly_service_mails_each_coordinator_their_account_once(
    testbed: TestBed, jobs: dict[str, int], tmp_path: Path
) -> None:
    """The monthly service for this month: one message per admin and coordinator, once.

    The admins get the whole report; each coordinator the statement of their account
    alone (no user of the other account in it); a second run sends nothing.
    """
    coordinated = coordinators(testbed)
    assert {"dana"} <= coordinated["physics"] and {"erin"} <= coordinated["bio"]
    month = dt.datetime.now().strftime("%Y-%m")
    domain = f"run{uuid.uuid4().hex[:10]}.example.org"
    venv = Path(testbed.env.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv"))
    with smtp_receiver() as (port, inbox):
        config = write_config(testbed, port, domain, tmp_path)
        argv, unit_env = unit_command(month, config, venv)
        env = {**testbed.env, **unit_env}

        first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert 0 == first.returncode, first.stdout + first.stderr
        assert (tmp_path / "reports" / month / "index.html").is_file()
        expected = {f"admins@{domain}"} | {
            f"{user}@{domain}" for users in coordinated.values() for user in users
        }
        received = sorted(str(m["X-Rcpt-To"]) for m in inbox)
        assert sorted(expected) == received, first.stdout  # one message per recipient

        by_to = {str(m["X-Rcpt-To"]): m for m in inbox}
        admin = by_to[f"admins@{domain}"]
        assert f"GPU usage report {month}" in str(admin["Subject"])
        assert "<!DOCTYPE html>" in attachment(admin, "index.html")
        accounts = attachment(admin, "accounts.csv")
        assert {"physics", "bio"} <= {r["name"] for r in csv.DictReader(io.StringIO(accounts))}

        for coordinator, account, own, other in (
            ("dana", "physics", "alice", "bob"),
            ("erin", "bio", "bob", "alice"),
        ):
            mail = by_to[f"{coordinator}@{domain}"]
            assert f"account {account}" in str(mail["Subject"])
            assert other not in text_of(mail), f"{other} in {account}'s statement"
            rows = list(csv.DictReader(io.StringIO(
                attachment(mail, f"statement-{month}-{account}.csv")
            )))  # fmt: skip
            users = {r["user"]: r for r in rows}
            assert own in users
            assert float(users[own]["gpu_hours"]) > 0 and float(users[own]["cost"]) > 0

        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert 0 == second.returncode, second.stdout + second.stderr
        assert len(expected) == len(inbox)  # nothing sent twice
        lines = [line for line in second.stdout.splitlines() if " -> " in line]
        assert len(expected) == len(lines)
        assert all(": already sent (" in line for line in lines), second.stdout


def test_unit_files_run_last_month_on_the_first_at_six() -> None:
    """The service runs `--month last --deliver`; the timer fires on the 1st at 06:00."""
    service = UNIT.read_text()
    timer = UNIT.with_suffix(".timer").read_text()
    assert "ExecStart=/opt/slurm-gpu/venv/bin/slurm-gpu report monthly --month last --deliver" in (
        service.splitlines()
    )
    assert {"OnCalendar=*-*-01 06:00", "Persistent=true"} <= set(timer.splitlines())
