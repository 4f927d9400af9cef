"""Running slurm-gpu controllers against the test bed, with per-scenario configs."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from slurm_gpu.config import load_config
from slurm_gpu.store import Store
from slurm_gpu.store.control import AuditEntry, ControlStore
from tests.integration.testbed import TestBed

CONTROLLER_BASE = """
[controller]
enforce = {enforce}
interval = "5s"
lease_seconds = {lease_seconds}
audit_spool = "{audit_spool}"

[policy.idle_gpu]
enabled = {idle_enabled}
warn_after = "15s"
cancel_after = "35s"
memory_only_is_idle = {memory_only_is_idle}
exempt_partitions = ["debug"]

[policy.max_runtime]
accounts = {{ {max_runtime_accounts} }}
warn_before = "20s"
action = "cancel"

[notify]
smtp_host = "127.0.0.1"
smtp_port = {smtp_port}
smtp_from = "slurm-gpu@testbed.local"
user_email_domain = "testbed.local"
admin_emails = ["admins@testbed.local"]
webhook_url = "{webhook_url}"
user_rate_limit = "{user_rate_limit}"
exemption_contact = "hpc-help@testbed.local"
{extra}
"""


def write_config(testbed: TestBed, name: str, **values: Any) -> Path:
    """The test bed's slurm-gpu.toml plus controller sections for one scenario."""
    settings = {
        "enforce": "true",
        "idle_enabled": "true",
        "memory_only_is_idle": "false",
        "max_runtime_accounts": "",
        "smtp_port": 1,
        "webhook_url": "",
        "user_rate_limit": "0s",
        "lease_seconds": 30,
        "store_url": "",
        "audit_spool": testbed.state_dir / "controller" / f"audit-spool-{name}.jsonl",
        "extra": "",
        **values,
    }
    base = Path(testbed.env["SLURM_GPU_CONFIG"]).read_text()
    if settings["store_url"]:  # a store of the scenario's own, in place of the bed's
        base = re.sub(r'(?m)^url = ".*"$', f'url = "{settings["store_url"]}"', base, count=1)
    path = testbed.state_dir / "etc" / f"controller-{name}.toml"
    path.write_text(base + CONTROLLER_BASE.format(**settings))
    return path


def slurm_gpu(testbed: TestBed, config: Path, *args: str, check: bool = True) -> str:
    """Runs the slurm-gpu CLI with a config, as root; returns stdout."""
    venv = Path(testbed.env.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv"))
    done = subprocess.run(
        [str(venv / "bin" / "slurm-gpu"), "--config", str(config), *args],
        env=testbed.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"slurm-gpu {' '.join(args)} failed: {done.stderr}")
    return done.stdout + done.stderr


@contextmanager
def controllers(testbed: TestBed, config: Path, count: int = 1) -> Iterator[None]:
    """`count` controller daemons running together (they share one lease)."""
    venv = Path(testbed.env.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv"))
    logs = [open(testbed.state_dir / "log" / f"test-controller-{n}.log", "a") for n in range(count)]  # noqa: SIM115
    procs = [
        subprocess.Popen(
            [str(venv / "bin" / "slurm-gpu"), "--config", str(config), "controller", "run"],
            env=testbed.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for log in logs
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        for log in logs:
            log.close()


def control_store(testbed: TestBed) -> ControlStore:
    """The bed's control store (audit, warnings), as the bed's config names it."""
    config = load_config(Path(testbed.env["SLURM_GPU_CONFIG"]))
    return ControlStore(Store(config.store.url, cluster=config.cluster.name))


def audit_of(control: ControlStore, job: int) -> list[AuditEntry]:
    """The audit log's entries about one job."""
    return control.audit_entries(job_ids=[job])


EXEMPTION_ACTIONS = ("exempt", "skip", "expire")
"""Audit rows of `slurm-gpu exempt` exemptions: granted, relied on, ended."""


def actions_of(control: ControlStore, job: int) -> list[str]:
    """The distinct policy actions the audit log holds for a job, in first-seen order.

    Records (`none`) and exemption rows are left out: see `exemption_actions_of`.
    """
    return list(
        dict.fromkeys(
            e.action
            for e in audit_of(control, job)
            if e.action != "none" and e.action not in EXEMPTION_ACTIONS
        )
    )


def exemption_actions_of(control: ControlStore, job: int) -> list[str]:
    """The distinct exemption rows (granted, relied on, ended) of a job, in first-seen order."""
    return list(
        dict.fromkeys(e.action for e in audit_of(control, job) if e.action in EXEMPTION_ACTIONS)
    )
