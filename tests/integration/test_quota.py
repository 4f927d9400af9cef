"""GPU-hour quotas on the test bed.

Over budget, physics' pending jobs are held (or the account blocked); bio's jobs still
start; raising the budget undoes everything.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.app import App
from slurm_gpu.config import load_config
from slurm_gpu.policy.quota_periods import cluster_timezone, period_bounds
from tests.integration.controlbed import controllers, write_config
from tests.integration.testbed import TestBed

QUOTA = """
[[quota]]
account = "physics"
period = "month"
unit = "gpu_hours"
limit = {limit}
warn_at = [0.5]
action = "{action}"
"""


@pytest.fixture(scope="module")
def control(testbed: TestBed) -> App:
    return App(load_config(Path(testbed.env["SLURM_GPU_CONFIG"])))


def physics_usage(control: App) -> float:
    """physics' GPU-hours this month, as the controller measures them (the bill's)."""
    now = time.time()
    start, end = period_bounds(now, "month", cluster_timezone(""))
    return control.quota_meter("account:physics", "gpu_hours", start, min(end, now), now)


def quota_config(testbed: TestBed, name: str, limit: float, action: str) -> Path:
    return write_config(
        testbed, name, idle_enabled="false", extra=QUOTA.format(limit=limit, action=action)
    )


def pending_reason(testbed: TestBed, job: int) -> str:
    return testbed.run("squeue", "-h", "-j", str(job), "-o", "%r").stdout.strip()


def wait_for(what: str, check: Any, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def burn_physics_gpu_time(testbed: TestBed, control: App, above: float) -> None:
    """Runs a busy 2-GPU physics job until physics' measured usage passes `above`."""
    job = testbed.submit(
        "alice", "--gres=gpu:2", wrap=testbed.gpu_load("--util", "80", "--seconds", "25")
    )
    assert testbed.wait_done(job, timeout=120) == "COMPLETED"
    wait_for("physics usage to pass the budget", lambda: physics_usage(control) > above)


def assoc_grp_tres(testbed: TestBed) -> str:
    out = testbed.run(
        "sacctmgr", "-n", "-P", "show", "assoc", "account=physics", "format=User,GrpTRES"
    ).stdout
    return next(line.split("|")[1] for line in out.splitlines() if line.split("|")[0] == "")


@pytest.fixture(scope="module")
def hold_scenario(testbed: TestBed, control: App) -> Iterator[dict[str, Any]]:
    """Budget = current usage + 18 GPU-seconds, then a 50 GPU-second job."""
    used = physics_usage(control)
    over = quota_config(testbed, "quota-hold", round(used + 0.005, 6), "hold")
    raised = quota_config(testbed, "quota-raised", round(used + 100, 6), "hold")
    burn_physics_gpu_time(testbed, control, used + 0.005)
    later = ("--begin=now+1hour", "--gres=gpu:1")
    pending = testbed.submit("carol", "-A", "physics", *later, wrap="true")
    bio = testbed.submit("bob", "--gres=gpu:1", wrap=testbed.gpu_load("--seconds", "5"))
    try:
        with controllers(testbed, over):
            wait_for(
                "physics' pending job to be held",
                lambda: "Held" in pending_reason(testbed, pending),
            )
            held_reason = pending_reason(testbed, pending)
            bio_state = testbed.wait_done(bio, timeout=120)
        with controllers(testbed, raised):
            wait_for(
                "the hold to be released", lambda: "Held" not in pending_reason(testbed, pending)
            )
            released_reason = pending_reason(testbed, pending)
            priority = testbed.run("squeue", "-h", "-j", str(pending), "-o", "%Q").stdout.strip()
        yield {
            "held_reason": held_reason,
            "bio_state": bio_state,
            "released_reason": released_reason,
            "priority": int(priority),
            "pending": pending,
        }
    finally:
        testbed.run("scancel", str(pending), str(bio), check=False)


def test_over_budget_account_pending_jobs_are_held(hold_scenario: dict[str, Any]) -> None:
    """physics over its GPU-hour budget: its pending job is held by an admin hold."""
    assert hold_scenario["held_reason"] == "JobHeldAdmin"


def test_other_accounts_jobs_still_start(hold_scenario: dict[str, Any]) -> None:
    """bio's job starts and completes while physics is held."""
    assert hold_scenario["bio_state"] == "COMPLETED"


def test_raising_the_budget_releases_the_hold(hold_scenario: dict[str, Any], control: App) -> None:
    """With the budget raised the hold is gone: a priority again, no admin hold."""
    # Slurm shows "None" until its next scheduling pass re-evaluates the begin time.
    assert hold_scenario["released_reason"] in ("BeginTime", "None")
    assert hold_scenario["priority"] > 0
    assert control.control.quota_actions() == []


@pytest.fixture(scope="module")
def block_scenario(
    testbed: TestBed, control: App, hold_scenario: dict[str, Any]
) -> Iterator[dict[str, str]]:
    """The same budget overrun with action = "block": an association limit."""
    used = physics_usage(control)
    over = quota_config(testbed, "quota-block", round(used * 0.5, 6), "block")
    raised = quota_config(testbed, "quota-unblock", round(used + 100, 6), "block")
    try:
        with controllers(testbed, over):
            wait_for(
                "GrpTRES gres/gpu=0 on physics", lambda: "gres/gpu=0" in assoc_grp_tres(testbed)
            )
            blocked = assoc_grp_tres(testbed)
        with controllers(testbed, raised):
            wait_for("the block to be lifted", lambda: "gres/gpu" not in assoc_grp_tres(testbed))
            lifted = assoc_grp_tres(testbed)
        yield {"blocked": blocked, "lifted": lifted}
    finally:
        testbed.run(
            "sacctmgr",
            "-i",
            "modify",
            "account",
            "physics",
            "set",
            "GrpTRES=gres/gpu=-1",
            check=False,
        )


def test_block_sets_an_association_limit_visible_in_sacctmgr(
    block_scenario: dict[str, str],
) -> None:
    """`sacctmgr show assoc` shows GrpTRES=gres/gpu=0 on physics while over budget."""
    assert block_scenario["blocked"] == "gres/gpu=0"


def test_raising_the_budget_lifts_the_block(block_scenario: dict[str, str]) -> None:
    """Back under budget, the controller clears the limit it set."""
    assert block_scenario["lifted"] == ""
