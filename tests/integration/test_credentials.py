"""Store credentials readable by root and the slurm-gpu group only.

Users get the setgid command (wrapper/slurm-gpu.c), which sees them as who they are.

The fixture installs the users' command the way an admin would
(scripts/install-user-command) for a config whose store is the test bed's PostgreSQL,
password in the URL, then copies the GPU summaries of one alice job and one bob job from
the test bed's own store into it, so that GPU figures can only come from PostgreSQL.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.config import load_config
from slurm_gpu.models import Action, Verdict
from slurm_gpu.slurm.jobid import JobId, parse_job_id
from slurm_gpu.store import Store
from tests.integration.testbed import TestBed, wait_summaries

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def locked(testbed: TestBed) -> Iterator[dict[str, Any]]:
    base = testbed.state_dir / f"locked-{os.getpid()}"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    config = base / "slurm-gpu.toml"
    text = Path(testbed.env["SLURM_GPU_CONFIG"]).read_text()
    url = testbed.env["SLURM_GPU_TEST_PG_URL"]
    config.write_text(text.replace(text.split("[store]")[1].split("\n")[1], f'url = "{url}"'))
    config.chmod(0o644)
    python = Path(testbed.env.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin" / "python"
    install = subprocess.run(
        [
            str(REPO / "scripts" / "install-user-command"),
            "--prefix",
            str(base / "bin"),
            "--config",
            str(config),
            "--python",
            str(python),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert 0 == install.returncode, install.stdout + install.stderr

    sqlite = Store(load_config(Path(testbed.env["SLURM_GPU_CONFIG"])).store.url, "testbed")
    postgres = Store(url, cluster=load_config(config).cluster.name)
    postgres.upgrade()
    load = testbed.gpu_load("--util", "50", "--seconds", "8")
    jobs = {
        user: testbed.submit(user, "--gres=gpu:1", "-p", "gpu", wrap=load)
        for user in ("alice", "bob")
    }
    try:
        for job in jobs.values():
            testbed.wait_done(job)
            postgres.add_summaries(wait_summaries(sqlite, job, 1))
        yield {
            "base": base,
            "config": config,
            "command": base / "bin" / "slurm-gpu",
            "jobs": jobs,
            "url": url,
        }
    finally:
        sqlite.dispose()
        postgres.dispose()
        shutil.rmtree(base)


def as_user(
    testbed: TestBed, user: str, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs argv as `user` with a login-like environment plus `env`."""
    base = {"PATH": testbed.env["PATH"], "SLURM_CONF": testbed.env["SLURM_CONF"]}
    keep = ",".join([*base, *(env or {})])
    return subprocess.run(
        ["runuser", "-u", user, f"--whitelist-environment={keep}", "--", *argv],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def gpu_hours_by_job(output: str) -> dict[JobId, tuple[str, float]]:
    """`sacct -P -o JobID,User,GPUHours` rows: {job: (user, GPU-hours)}.

    The bed may hold other runs' jobs in any of Slurm's id forms (`8+0`, `12_3`).
    """
    rows = [line.split("|") for line in output.strip().splitlines()[1:]]
    return {parse_job_id(job): (user, float(hours or 0)) for job, user, hours in rows}


def test_config_and_command_modes(locked: dict[str, Any]) -> None:
    """Config root:slurm-gpu 0640; the users' command root:slurm-gpu 2755 (setgid)."""
    group = grp.getgrnam("slurm-gpu").gr_gid
    config, command = os.stat(locked["config"]), os.stat(locked["command"])
    assert (config.st_uid, config.st_gid, stat.S_IMODE(config.st_mode)) == (0, group, 0o640)
    assert (command.st_uid, command.st_gid, stat.S_IMODE(command.st_mode)) == (0, group, 0o2755)


def test_user_cannot_read_the_credentials(testbed: TestBed, locked: dict[str, Any]) -> None:
    """alice can neither read the config nor use it through the venv's console script."""
    cat = as_user(testbed, "alice", "cat", str(locked["config"]))
    assert cat.returncode != 0 and "Permission denied" in cat.stderr
    venv_cli = Path(testbed.env.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin/slurm-gpu"
    direct = as_user(testbed, "alice", str(venv_cli), "--config", str(locked["config"]), "sacct")
    assert direct.returncode == 1
    assert f"{locked['config']}: permission denied" in direct.stderr
    assert "slurm-gpu group only" in direct.stderr


def test_user_command_reads_the_store_as_the_real_user(
    testbed: TestBed, locked: dict[str, Any]
) -> None:
    """Through the users' command alice sees her job, and not bob's; root sees both.

    The GPU-hours come from PostgreSQL.
    """
    argv = [str(locked["command"]), "sacct", "-a", "-S", "now-1days", "-P"]
    argv += ["-o", "JobID,User,GPUHours"]
    alice = as_user(testbed, "alice", *argv)
    assert 0 == alice.returncode, alice.stderr
    rows = gpu_hours_by_job(alice.stdout)
    jobs = {user: JobId(job) for user, job in locked["jobs"].items()}
    assert {user for user, _ in rows.values()} == {"alice"}
    assert jobs["alice"] in rows and rows[jobs["alice"]][1] > 0
    root = subprocess.run(argv, capture_output=True, text=True, check=False, env=testbed.env)
    assert 0 == root.returncode, root.stderr
    everyone = gpu_hours_by_job(root.stdout)
    assert {jobs["alice"], jobs["bob"]} <= set(everyone)
    assert everyone[jobs["bob"]][1] > 0


def test_user_command_refuses_admin_commands(testbed: TestBed, locked: dict[str, Any]) -> None:
    """config (it would print the password), db, exempt, and --config are root's."""
    command = str(locked["command"])
    for argv in (["config", "check"], ["db", "current"], ["exempt", "1"], ["--config", "/x"]):
        done = as_user(testbed, "alice", command, *argv)
        assert (done.returncode, "for administrators" in done.stderr) == (2, True), argv
        assert "s3cret" not in done.stdout and "slurmgpu-testbed" not in done.stdout


def test_user_environment_runs_no_code_with_the_group(
    testbed: TestBed, locked: dict[str, Any]
) -> None:
    """The user's environment runs no code of hers with the slurm-gpu group.

    PYTHONPATH with a sitecustomize, PYTHONSTARTUP, LD_PRELOAD and a config of alice's own
    are all ignored: the command still runs, on the installed config.
    """
    evil = locked["base"] / "evil"
    evil.mkdir(mode=0o777)
    evil.chmod(0o777)
    marker = evil / "ran"
    (evil / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    (evil / "slurm-gpu.toml").write_text('[access]\nadmins = ["alice"]\n')
    hostile = {
        "PYTHONPATH": str(evil),
        "PYTHONSTARTUP": str(evil / "sitecustomize.py"),
        "SLURM_GPU_CONFIG": str(evil / "slurm-gpu.toml"),
        "LD_PRELOAD": str(evil / "nothing.so"),
    }
    argv = [str(locked["command"]), "sacct", "-a", "-S", "now-1days", "-P", "-o", "JobID,User"]
    done = as_user(testbed, "alice", *argv, env=hostile)
    assert 0 == done.returncode, done.stderr
    assert {line.split("|")[1] for line in done.stdout.strip().splitlines()[1:]} == {"alice"}
    assert not marker.exists()


def test_user_command_shows_alice_the_audit_rows_of_her_jobs(
    testbed: TestBed, locked: dict[str, Any]
) -> None:
    """`audit` through the users' command: why alice's job was acted on, never bob's."""
    jobs = locked["jobs"]
    cluster = load_config(locked["config"]).cluster.name
    with Store(locked["url"], cluster=cluster) as postgres:
        postgres.control.audit(
            [
                Verdict("idle_gpu", Action.WARN, f"job:{job}", "idle", job, user, "")
                for user, job in jobs.items()
            ],
            time=time.time(),
            cycle="credentials",
            controller="test",
            dry_run=True,
            outcome="recorded",
        )
    argv = [str(locked["command"]), "audit", "--json", "-j", f"{jobs['alice']},{jobs['bob']}"]
    done = as_user(testbed, "alice", *argv)
    assert 0 == done.returncode, done.stderr
    rows = json.loads(done.stdout)
    assert [f"job:{jobs['alice']}"] == sorted({r["Target"] for r in rows})
    assert {"alice"} == {r["User"] for r in rows}


def alices_folder(locked: dict[str, Any], name: str) -> Path:
    """A folder of alice's own under the fixture's base."""
    folder: Path = locked["base"] / name
    folder.mkdir(mode=0o755)
    os.chown(folder, 1001, 1001)
    return folder


def test_report_files_are_written_without_the_group(
    testbed: TestBed, locked: dict[str, Any]
) -> None:
    """`report monthly --out DIR` as alice: her files, her group, not slurm-gpu's."""
    out = alices_folder(locked, "monthly")
    done = as_user(testbed, "alice", str(locked["command"]), "report", "monthly", "--out", str(out))
    assert 0 == done.returncode, done.stderr
    written = sorted(out.iterdir())
    assert written and {(1001, 1001)} == {(p.stat().st_uid, p.stat().st_gid) for p in written}


def test_a_symlink_in_the_out_folder_cannot_reach_a_file_of_the_group(
    testbed: TestBed, locked: dict[str, Any]
) -> None:
    """A link in alice's --out folder to a group-writable file: the file stays as it was.

    The command says it cannot write there (exit 1), instead of writing with the group.
    """
    target = locked["base"] / "group-writable"
    target.write_text("the group's\n")
    os.chown(target, 0, grp.getgrnam("slurm-gpu").gr_gid)
    target.chmod(0o664)
    out = alices_folder(locked, "trap")
    (out / "index.html").symlink_to(target)
    os.lchown(out / "index.html", 1001, 1001)
    done = as_user(testbed, "alice", str(locked["command"]), "report", "monthly", "--out", str(out))
    assert (1, "the group's\n") == (done.returncode, target.read_text()), done.stderr
    assert "cannot write the report" in done.stderr
