"""A job that runs while its node's agent is stopped: missing, never idle, charged (#11).

gpu2's agent is stopped before the job starts and started again after it ended (the
test bed is shared: whatever else runs keeps running). While it is down, `status` shows
gpu2's GPUs as stale and `job` names gpu2 as silent; afterwards `sacct` shows the job's
GPU-hours as missing, no idle and no utilization, its GPU model's price charged, and the
AdminComment token says missing without claiming a utilization.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.slurm.admin_comment import parse_token
from slurm_gpu.store import Store
from tests.integration.testbed import TestBed, wait_summaries

NODE = "gpu2"
INTERVAL = 5.0  # [node] interval and [store] ship_aggregate of the test bed's config
LAG = INTERVAL + 2 * INTERVAL
PRICES = {"a100": 3.6, "h100": 7.2}  # per GPU-hour: a cent is 10 s of an A100
CLI = str(Path(os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin" / "slurm-gpu")


@pytest.fixture(scope="module")
def config_file(testbed: TestBed) -> Iterator[Path]:
    """The test bed's config plus GPU prices, in its world-readable jobs folder."""
    base = Path(testbed.env["SLURM_GPU_CONFIG"]).read_text()
    path = testbed.jobs_dir / f"slurm-gpu-missing-{os.getpid()}.toml"
    prices = ", ".join(f"{k} = {v}" for k, v in PRICES.items())
    path.write_text(base + f'\n[cost]\ncurrency = "EUR"\nprices = {{ {prices} }}\n')
    path.chmod(0o644)
    yield path
    path.unlink(missing_ok=True)


def cli(testbed: TestBed, config: Path, *args: str) -> str:
    """Runs slurm-gpu as root; returns stdout, fails on exit != 0."""
    argv = [CLI, "--config", str(config), *args]
    done = subprocess.run(argv, env=testbed.env, capture_output=True, text=True, timeout=120)
    assert 0 == done.returncode, done.stderr
    return done.stdout


def sacct(testbed: TestBed, config: Path, job_id: int) -> dict[str, Any]:
    fields = "JobIDRaw,GPUModel,GPUHours,GPUUtilAvg,IdleGPUHours,MissingGPUHours,Cost"
    out = cli(testbed, config, "sacct", "-a", "-j", str(job_id), "--json", "-o", fields)
    (row,) = json.loads(out)
    return dict(row)


def price(model: str) -> float:
    """The [cost] price of a GPU model (the test bed's nodes hold A100s and H100s)."""
    return next(v for k, v in PRICES.items() if k in model.lower())


def poll(what: str, check: Any, timeout: float = 60) -> str:
    """Calls `check()` until it returns a true text; fails naming `what`."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        last = check()
        if last:
            return str(last)
        time.sleep(1)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")


@pytest.fixture(scope="module")
def unmeasured(testbed: TestBed, store: Store, config_file: Path) -> Iterator[dict[str, Any]]:
    """A 1-GPU job on gpu2 that runs wholly while gpu2's agent is stopped.

    Yields what `status`, `job` and `sacct` said while the agent was down, and the job id.
    """
    seen: dict[str, Any] = {}
    job_id = 0
    testbed.launcher("agent", "stop", NODE)
    try:
        job_id = testbed.submit(
            "alice",
            "--gres=gpu:1",
            "-w",
            NODE,
            "-p",
            "gpu",
            "-A",
            "physics",
            "--job-name=missing-data",
            wrap=testbed.gpu_load("--util", "60", "--seconds", "25"),
        )
        seen["job_id"] = job_id
        testbed.wait_state(job_id, {"RUNNING"}, timeout=120)

        def silent() -> str:
            text = cli(testbed, config_file, "job", str(job_id))
            named = f"Node {NODE} has sent no readings" in text
            return text if named and "Missing GPU-hours" in text else ""

        seen["job"] = poll("`slurm-gpu job` naming the silent node", silent)
        seen["status"] = cli(testbed, config_file, "status")
        testbed.wait_done(job_id, timeout=120)
        # Past the job's end by more than the readings' lag (ship_aggregate 5 s + two 5 s
        # intervals) and an agent interval: nothing of it is "not shipped yet", and the
        # restarted agent's first read window starts after it.
        time.sleep(LAG + INTERVAL)
        seen["sacct_down"] = sacct(testbed, config_file, job_id)
    finally:
        testbed.launcher("agent", "start", NODE)
    wait_summaries(store, job_id, 1)
    seen["summaries"] = store.job_summaries(job_id)

    def token() -> str:
        comment = testbed.sacct(job_id, "AdminComment").get("AdminComment", "")
        return comment if parse_token(comment) else ""

    seen["token"] = parse_token(poll("the AdminComment token", token))
    seen["sacct"] = sacct(testbed, config_file, job_id)
    yield seen


def test_status_shows_the_stopped_agents_gpus_as_stale(unmeasured: dict[str, Any]) -> None:
    """`status` while gpu2's agent is down: its GPUs stopped reporting, stale."""
    assert f"{NODE}: " in unmeasured["status"] and "stopped reporting" in unmeasured["status"]


def test_job_view_names_the_node_and_counts_missing(unmeasured: dict[str, Any]) -> None:
    """`job` while running: gpu2 named, missing GPU-hours, no idle, no utilization."""
    text = unmeasured["job"]
    assert "Missing GPU-hours" in text
    assert "idle -" in text and "mean utilization -" in text


def test_sacct_while_the_agent_is_down_charges_missing_hours(unmeasured: dict[str, Any]) -> None:
    """Ended, nothing recorded yet: every GPU-hour missing, none idle, the model's price paid."""
    row = unmeasured["sacct_down"]
    assert row["MissingGPUHours"] is not None and row["MissingGPUHours"] > 0
    assert pytest.approx(row["GPUHours"]) == row["MissingGPUHours"]
    assert (None, None) == (row["IdleGPUHours"], row["GPUUtilAvg"])
    assert price(row["GPUModel"]) > 0 and row["Cost"] > 0


def test_sacct_after_the_agent_is_back_shows_missing_not_idle(unmeasured: dict[str, Any]) -> None:
    """The summary the restarted agent wrote: all missing, no idle, a model, a cost."""
    row = unmeasured["sacct"]
    (summary,) = unmeasured["summaries"]
    assert 20 <= summary.gpu_seconds <= 60 and summary.missing_seconds == summary.gpu_seconds
    assert pytest.approx(summary.gpu_seconds / 3600.0, abs=1e-4) == row["MissingGPUHours"]
    assert (None, None) == (row["IdleGPUHours"], row["GPUUtilAvg"])
    expected = summary.gpu_seconds / 3600.0 * price(row["GPUModel"])
    assert pytest.approx(expected, abs=0.01) == row["Cost"]


def test_admin_comment_claims_no_utilization(unmeasured: dict[str, Any]) -> None:
    """The token says missing and leaves util_avg and util_max out (never 0.0)."""
    token = unmeasured["token"]
    assert ("1", "1") == (token.get("missing"), token.get("gpus"))
    assert "util_avg" not in token and "util_max" not in token
