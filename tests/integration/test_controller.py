"""The controller on the test bed, with thresholds in seconds: it acts through real Slurm.

Scenarios run as module fixtures (each a minute or so of real time); the tests then read
what Slurm, the audit log and the SMTP/webhook receivers saw.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.config import load_config
from slurm_gpu.store import Store
from slurm_gpu.store.control import ControlStore
from tests.integration.controlbed import (
    actions_of,
    audit_of,
    controllers,
    exemption_actions_of,
    slurm_gpu,
    write_config,
)
from tests.integration.testbed import TestBed
from tests.receivers import smtp_receiver, webhook_receiver


@pytest.fixture(scope="module")
def control(testbed: TestBed) -> ControlStore:
    config = load_config(Path(testbed.env["SLURM_GPU_CONFIG"]))
    return ControlStore(Store(config.store.url, cluster=config.cluster.name))


def idle(testbed: TestBed, seconds: int = 300) -> str:
    return testbed.gpu_load("--pattern", "idle", "--seconds", str(seconds))


def half_idle(testbed: TestBed, seconds: int = 300) -> str:
    """A 2-GPU job's script: its first GPU busy at 60%, its second idle.

    Each load narrows CUDA_VISIBLE_DEVICES, as a user pins a CUDA program to one GPU
    (gpu-load, like CUDA, reads it before SLURM_JOB_GPUS).
    """
    busy = testbed.gpu_load("--util", "60", "--seconds", str(seconds))
    return (
        'G="${CUDA_VISIBLE_DEVICES:-$SLURM_JOB_GPUS}"; '
        f'CUDA_VISIBLE_DEVICES="${{G%%,*}}" {busy} & '
        f'CUDA_VISIBLE_DEVICES="${{G##*,}}" {idle(testbed, seconds)}; wait'
    )


@pytest.fixture(scope="module")
def idle_scenario(testbed: TestBed, control: ControlStore) -> Iterator[dict[str, Any]]:
    """Two controllers; an idle 2-GPU job among half-idle, exempt and memory-only ones.

    The exempt job's exemption lasts an hour; the memory-only job's one, 10 s (it expires).
    Seven of the bed's eight GPUs, on whichever nodes are free (a test bed may hold
    other jobs).
    """
    with smtp_receiver() as (port, inbox), webhook_receiver() as (url, hooks):
        config = write_config(testbed, "idle", smtp_port=port, webhook_url=url)
        start = time.time()
        jobs = {
            "idle": testbed.submit("alice", "--gres=gpu:2", wrap=idle(testbed)),
            "memory": testbed.submit(
                "carol",
                "-A",
                "physics",
                "--gres=gpu:1",
                wrap=testbed.gpu_load(
                    "--pattern", "memory-only", "--mem", "4096", "--seconds", "300"
                ),
            ),
            "debug": testbed.submit("alice", "-p", "debug", "--gres=gpu:1", wrap=idle(testbed)),
            "exempt": testbed.submit("bob", "--gres=gpu:1", wrap=idle(testbed)),
            "half": testbed.submit(
                "carol", "-A", "physics", "--gres=gpu:2", wrap=half_idle(testbed)
            ),
        }
        try:
            for job in jobs.values():
                testbed.wait_state(job, {"RUNNING"})
            slurm_gpu(
                testbed,
                config,
                "exempt",
                str(jobs["exempt"]),
                "--for",
                "1h",
                "--reason",
                "benchmark that loads data first",
            )
            slurm_gpu(
                testbed, config, "exempt", str(jobs["memory"]), "--for", "10s", "--reason", "short"
            )
            with controllers(testbed, config, count=2):
                state = testbed.wait_state(jobs["idle"], {"CANCELLED"}, timeout=150)
                time.sleep(10)  # two more cycles: nothing else may be touched
                states = {name: testbed.job_state(job) for name, job in jobs.items()}
            # Free the GPUs for the next scenarios; what the tests read is recorded.
            testbed.run("scancel", *map(str, jobs.values()), check=False)
            end = time.time()
            yield {
                "jobs": jobs,
                "state": state,
                "states": states,
                "inbox": list(inbox),
                "hooks": list(hooks),
                "window": (start, end),
                "config": config,
            }
        finally:
            testbed.run("scancel", *map(str, jobs.values()), check=False)


def test_idle_job_is_warned_then_cancelled_with_our_reason(
    testbed: TestBed, idle_scenario: dict[str, Any], control: ControlStore
) -> None:
    """sacct shows the idle 2-GPU job CANCELLED with slurm-gpu's reason in AdminComment."""
    job = idle_scenario["jobs"]["idle"]
    assert idle_scenario["state"] == "CANCELLED"
    deadline = time.monotonic() + 30
    row: dict[str, str] = {}
    while time.monotonic() < deadline:
        row = testbed.sacct(job, "State,AdminComment")
        if row.get("State", "").startswith("CANCELLED"):
            break
        time.sleep(1)
    assert row["State"].startswith("CANCELLED")
    assert "slurm-gpu: " in row["AdminComment"] and "below 5%" in row["AdminComment"]
    assert actions_of(control, job) == ["warn", "cancel"]


def test_two_controllers_cancel_once(idle_scenario: dict[str, Any], control: ControlStore) -> None:
    """With two controllers running, the audit log holds exactly one cancel, done."""
    job = idle_scenario["jobs"]["idle"]
    cancels = [e for e in audit_of(control, job) if e.action == "cancel"]
    assert [(e.outcome, e.dry_run) for e in cancels] == [("done", False)]


def test_other_jobs_are_untouched(idle_scenario: dict[str, Any], control: ControlStore) -> None:
    """Exempt-partition, exempted and memory-only jobs keep running, unwarned.

    The half-idle job (one GPU busy) runs on with a notice only.
    """
    jobs = idle_scenario["jobs"]
    states = idle_scenario["states"]
    assert {n: states[n] for n in ("memory", "debug", "exempt", "half")} == {
        "memory": "RUNNING",
        "debug": "RUNNING",
        "exempt": "RUNNING",
        "half": "RUNNING",
    }
    for name in ("memory", "debug", "exempt"):
        assert actions_of(control, jobs[name]) == [], name
    assert actions_of(control, jobs["half"]) == ["notice"]


def test_exemptions_are_in_the_audit_of_their_jobs(
    testbed: TestBed, idle_scenario: dict[str, Any], control: ControlStore
) -> None:
    """`audit -j` shows each exemption granted, relied on (the idle job) and ended."""
    jobs = idle_scenario["jobs"]
    assert exemption_actions_of(control, jobs["exempt"]) == ["exempt", "skip"]
    assert exemption_actions_of(control, jobs["memory"]) == ["exempt", "expire"]
    out = slurm_gpu(testbed, idle_scenario["config"], "audit", "-j", str(jobs["exempt"]), "-P")
    rows = [line.split("|") for line in out.strip().splitlines()[1:]]
    assert [(r[2], r[3], r[5]) for r in rows] == [
        ("all", "exempt", "bob"),
        ("idle_gpu", "skip", "bob"),
    ]
    assert "benchmark that loads data first" in rows[0][8]
    assert "would have warned" in rows[1][8]


def test_user_and_admins_got_the_warning_and_the_cancellation(
    idle_scenario: dict[str, Any],
) -> None:
    """The SMTP and webhook receivers each got the warning and the cancellation."""
    job = idle_scenario["jobs"]["idle"]
    inbox: list[Message] = idle_scenario["inbox"]
    mine = [m for m in inbox if f"(job {job})" in m["Subject"]]
    assert sorted(m["Subject"].split(": ", 1)[1] for m in mine) == [
        f"job cancelled (job {job})",
        f"warning (job {job})",
    ]
    assert all("alice@testbed.local" in m["X-Rcpt-To"] for m in mine)
    assert all("admins@testbed.local" in m["X-Rcpt-To"] for m in mine)
    texts = [h["text"] for h in idle_scenario["hooks"] if f"(job {job})" in h["text"]]
    assert len(texts) == 2


def test_audit_command_lists_the_decisions(testbed: TestBed, idle_scenario: dict[str, Any]) -> None:
    """`slurm-gpu audit -j JOB -P` prints the warn and the cancel, sacct-style."""
    job = idle_scenario["jobs"]["idle"]
    out = slurm_gpu(
        testbed, idle_scenario["config"], "audit", "-j", str(job), "-P", "--action", "warn,cancel"
    )
    header, *rows = out.strip().splitlines()
    assert header == "Time|Mode|Policy|Action|Target|User|Account|Outcome|Reason"
    # A warning is re-audited every cycle until the cancel; show each decision once.
    assert list(dict.fromkeys(tuple(r.split("|")[2:8]) for r in rows)) == [
        ("idle_gpu", "warn", f"job:{job}", "alice", "physics", "recorded"),
        ("idle_gpu", "cancel", f"job:{job}", "alice", "physics", "done"),
    ]


def test_backtest_reports_the_jobs_the_live_run_acted_on(
    testbed: TestBed, idle_scenario: dict[str, Any], control: ControlStore
) -> None:
    """Replaying the same thresholds over the recorded window: the same warnings, notices, cancels.

    Compared with what the enforcing run audited for the scenario's jobs.
    """
    start, end = idle_scenario["window"]
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start - 1))
    until = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end + 1))
    out = slurm_gpu(
        testbed, idle_scenario["config"], "policy", "backtest", "-S", since, "-E", until, "--json"
    )
    result = json.loads(out[out.index("{") :])
    jobs = idle_scenario["jobs"]
    ours = set(jobs.values())
    idle_gpu = result["policies"]["idle_gpu"]
    assert [j for j in idle_gpu["cancelled"] if j in ours] == [jobs["idle"]]
    assert [j for j in idle_gpu["warned"] if j in ours] == [jobs["idle"]]
    assert [j for j in idle_gpu["noticed"] if j in ours] == [jobs["half"]]
    live = {
        action: sorted(
            job
            for job in ours
            if any(e.action == action and e.policy == "idle_gpu" for e in audit_of(control, job))
        )
        for action in ("warn", "notice", "cancel")
    }
    replayed = {
        action: sorted(j for j in idle_gpu[key] if j in ours)
        for action, key in (("warn", "warned"), ("notice", "noticed"), ("cancel", "cancelled"))
    }
    assert replayed == live


@pytest.fixture(scope="module")
def runtime_scenario(
    testbed: TestBed, control: ControlStore, idle_scenario: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    """Max runtime, memory-only-is-idle, and a node whose agent is down, in one run.

    bob's two bio jobs start 6 s apart under a 10 min user_rate_limit: both warnings
    must still reach him (and the admins) before the cancellations.
    """
    with smtp_receiver() as (port, inbox):
        config = write_config(
            testbed,
            "runtime",
            memory_only_is_idle="true",
            max_runtime_accounts='bio = "40s"',
            smtp_port=port,
            user_rate_limit="10m",
        )
        busy = testbed.gpu_load("--util", "60", "--seconds", "300")
        jobs = {
            "long": testbed.submit("bob", "--gres=gpu:1", wrap=busy),
            "memory": testbed.submit(
                "carol",
                "-A",
                "physics",
                "--gres=gpu:1",
                "-w",
                "gpu1",
                wrap=testbed.gpu_load(
                    "--pattern", "memory-only", "--mem", "4096", "--seconds", "300"
                ),
            ),
            "blind": testbed.submit("alice", "--gres=gpu:1", "-w", "gpu2", wrap=idle(testbed)),
        }
        testbed.launcher("agent", "stop", "gpu2")
        try:
            for job in jobs.values():
                testbed.wait_state(job, {"RUNNING"})
            time.sleep(6)  # a cycle later: its warning comes right after the first one's
            jobs["long2"] = testbed.submit("bob", "--gres=gpu:1", wrap=busy)
            testbed.wait_state(jobs["long2"], {"RUNNING"})
            with controllers(testbed, config):
                for name in ("long", "memory", "long2"):
                    testbed.wait_state(jobs[name], {"CANCELLED"}, timeout=150)
                time.sleep(10)
                blind_state = testbed.job_state(jobs["blind"])
            yield {"jobs": jobs, "blind_state": blind_state, "inbox": list(inbox)}
        finally:
            testbed.run("scancel", *map(str, jobs.values()), check=False)
            testbed.launcher("agent", "start", "gpu2")


def test_rate_limit_never_drops_a_warning_that_precedes_a_cancel(
    runtime_scenario: dict[str, Any],
) -> None:
    """Both of bob's jobs: warned by mail, then cancelled and mailed; admins got every copy."""
    jobs = runtime_scenario["jobs"]
    inbox: list[Message] = runtime_scenario["inbox"]
    for name in ("long", "long2"):
        job = jobs[name]
        mine = [m for m in inbox if f"(job {job})" in m["Subject"]]
        to_bob = [m["Subject"].split(": ", 1)[1] for m in mine if "bob@" in m["X-Rcpt-To"]]
        to_admins = [m["Subject"].split(": ", 1)[1] for m in mine if "admins@" in m["X-Rcpt-To"]]
        expected = [f"warning (job {job})", f"job cancelled (job {job})"]
        assert (to_bob, to_admins) == (expected, expected), name


def test_job_past_its_max_runtime_is_warned_then_cancelled(
    runtime_scenario: dict[str, Any], control: ControlStore
) -> None:
    """bio's 40 s limit: bob's busy jobs are warned, then cancelled by max_runtime."""
    for name in ("long", "long2"):
        job = runtime_scenario["jobs"][name]
        policies = {(e.policy, e.action) for e in audit_of(control, job)}
        assert {("max_runtime", "warn"), ("max_runtime", "cancel")} <= policies
        assert not any(p == "idle_gpu" and a in ("warn", "cancel") for p, a in policies)


def test_memory_only_job_is_cancelled_when_configured(
    runtime_scenario: dict[str, Any], control: ControlStore
) -> None:
    """With memory_only_is_idle = true the memory-only job is idle: warned, cancelled."""
    assert actions_of(control, runtime_scenario["jobs"]["memory"]) == ["warn", "cancel"]


def test_job_without_fresh_readings_is_left_alone(
    runtime_scenario: dict[str, Any], control: ControlStore
) -> None:
    """gpu2's agent is down: its idle job is unknown, never warned nor cancelled."""
    job = runtime_scenario["jobs"]["blind"]
    assert runtime_scenario["blind_state"] == "RUNNING"
    assert actions_of(control, job) == []
    assert any("unknown" in e.reason for e in audit_of(control, job))


@pytest.fixture(scope="module")
def dry_run_scenario(
    testbed: TestBed, control: ControlStore, runtime_scenario: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    """The idle scenario's idle job again, under a dry-run controller."""
    with smtp_receiver() as (port, inbox):
        config = write_config(testbed, "dry", enforce="false", smtp_port=port)
        # On gpu1: gpu2's agent was just restarted by the runtime scenario.
        job = testbed.submit("alice", "--gres=gpu:2", "-w", "gpu1", wrap=idle(testbed))
        try:
            testbed.wait_state(job, {"RUNNING"})
            with controllers(testbed, config):
                deadline = time.monotonic() + 150
                while time.monotonic() < deadline and "cancel" not in actions_of(control, job):
                    time.sleep(2)
                time.sleep(6)
                state = testbed.job_state(job)
            yield {"job": job, "state": state, "inbox": list(inbox)}
        finally:
            testbed.run("scancel", str(job), check=False)


def test_dry_run_audits_the_same_verdicts_and_changes_nothing(
    testbed: TestBed, dry_run_scenario: dict[str, Any], control: ControlStore
) -> None:
    """Warn then cancel verdicts, marked dry-run; the job runs on, nobody is emailed."""
    job = dry_run_scenario["job"]
    entries = [e for e in audit_of(control, job) if e.action != "none"]
    assert list(dict.fromkeys(e.action for e in entries)) == ["warn", "cancel"]
    assert {(e.dry_run, e.outcome) for e in entries} == {(True, "dry-run")}
    assert dry_run_scenario["state"] == "RUNNING"
    assert dry_run_scenario["inbox"] == []
    assert "slurm-gpu" not in testbed.sacct(job, "AdminComment").get("AdminComment", "")


@contextmanager
def store_locked(url: str) -> Iterator[None]:
    """Another connection holds the SQLite store's write lock until the block ends."""
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


def test_max_runtime_keeps_its_cadence_while_the_store_is_locked(testbed: TestBed) -> None:
    """The controller's store locked for 40 s: bob's bio job is still cancelled at its limit.

    Cycles go on every 5 s (not every busy timeout, 30 s), the log says the store is
    unavailable, and once the lock is gone the audit log holds the warning and the
    cancel (spooled meanwhile). The controller has a store of its own here, so that the
    lock stops no agent.
    """
    url = f"sqlite:///{testbed.state_dir / 'controller-outage.db'}"
    Path(url.removeprefix("sqlite:///")).unlink(missing_ok=True)
    log_path = testbed.state_dir / "log" / "test-controller-0.log"
    log_start = log_path.stat().st_size if log_path.exists() else 0
    job = testbed.submit(
        "bob", "--gres=gpu:1", wrap=testbed.gpu_load("--util", "60", "--seconds", "300")
    )
    try:
        with smtp_receiver() as (port, _inbox):
            config = write_config(
                testbed,
                "outage",
                max_runtime_accounts='bio = "40s"',
                lease_seconds=120,
                store_url=url,
                smtp_port=port,
            )
            slurm_gpu(testbed, config, "db", "upgrade")
            own = ControlStore(Store(url, cluster="testbed"))
            testbed.wait_state(job, {"RUNNING"})
            with controllers(testbed, config):
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and "warn" not in actions_of(own, job):
                    time.sleep(1)
                assert "warn" in actions_of(own, job)
                with store_locked(url):
                    locked_at = time.time()
                    state = testbed.wait_state(job, {"CANCELLED"}, timeout=40)
                    cancelled_at = time.time()
                    time.sleep(max(0.0, locked_at + 40 - time.time()))
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and "cancel" not in actions_of(own, job):
                    time.sleep(1)
        log = log_path.read_bytes()[log_start:].decode(errors="replace")
    finally:
        testbed.run("scancel", str(job), check=False)
    assert state == "CANCELLED" and cancelled_at < locked_at + 40
    assert [(e.action, e.outcome) for e in audit_of(own, job) if e.policy == "max_runtime"] == [
        ("warn", "recorded"),
        ("cancel", "done"),
    ]
    assert "the store is unavailable" in log and "the store is back" in log
    stamps = [
        time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
        for line in log.splitlines()
        if "store unavailable for" in line
    ]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert len(stamps) >= 5 and max(gaps) <= 7, stamps


def test_controller_survives_slurmctld_down_and_acts_on_nothing(
    testbed: TestBed, control: ControlStore, dry_run_scenario: dict[str, Any]
) -> None:
    """slurmctld stopped: the cycle is skipped with a clear message and no verdict."""
    config = write_config(testbed, "down")
    conf = testbed.state_dir / "etc" / "slurm.conf"
    pid = int(testbed.run("pgrep", "-f", f"slurmctld -D -i -f {conf}").stdout.split()[0])
    before = len(control.audit_entries())
    subprocess.run(["kill", str(pid)], check=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.5)
        out = slurm_gpu(testbed, config, "controller", "run", "--once", check=False)
        assert "cycle skipped" in out
        assert len(control.audit_entries()) == before
    finally:
        testbed.launcher("up")
        testbed.wait_gres_ready()
