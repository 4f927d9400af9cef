"""No reading lost, none duplicated: a store outage and an agent killed with SIGKILL.

Both scenarios run at once on different nodes to keep the wall time near three minutes:
- gpu2's agent ships to the real PostgreSQL store, which is stopped for two minutes
  while a job runs there;
- gpu1's agent is SIGKILLed during a job and restarted 30 s later.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TypedDict

import pytest

from slurm_gpu.config import load_config
from slurm_gpu.models import GpuInterval, JobGpuSummary
from slurm_gpu.store import Store
from tests.integration.testbed import TestBed, wait_summaries

INTERVAL = 5.0
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def job_intervals(store: Store, summary: JobGpuSummary) -> list[GpuInterval]:
    """The job's stored intervals on one GPU, in time order."""
    rows = store.intervals(node=summary.node, gpu_uuid=summary.gpu_uuid, job_id=summary.job_id)
    return sorted(rows, key=lambda r: r.period_start)


def pg_ctl(testbed: TestBed, action: str) -> None:
    """Stops (fast) the test bed's PostgreSQL server; `up` starts it again."""
    subprocess.run(
        [
            "runuser",
            "-u",
            "postgres",
            "--",
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(testbed.state_dir / "pgdata"),
            "-m",
            "fast",
            "-w",
            action,
        ],
        check=True,
        capture_output=True,
    )


class Scenario(TypedDict):
    """What both fault scenarios left behind, for the tests to check."""

    pg_store: Store
    sqlite_store: Store
    outage: list[JobGpuSummary]
    killed: list[JobGpuSummary]
    outage_window: tuple[float, float]
    killed_at: float


@pytest.fixture(scope="module")
def scenario(testbed: TestBed) -> Scenario:
    """Runs both fault scenarios once; tests then read what the stores hold."""
    pg_url = testbed.env["SLURM_GPU_TEST_PG_URL"]
    base = (testbed.state_dir / "etc" / "slurm-gpu.toml").read_text()
    pg_config = testbed.state_dir / "etc" / "slurm-gpu-pg.toml"
    pg_config.write_text(base.replace(base.split("[store]")[1].split("\n")[1], f'url = "{pg_url}"'))
    pg_store = Store(pg_url, cluster=load_config(pg_config).cluster.name)
    pg_store.upgrade()
    sqlite_store = Store(
        load_config(testbed.state_dir / "etc" / "slurm-gpu.toml").store.url, cluster="testbed"
    )

    testbed.launcher("agent", "stop", "gpu2")
    testbed.launcher("agent", "start", "gpu2", extra_env={"SLURM_GPU_AGENT_CONFIG": str(pg_config)})
    try:
        outage_job = testbed.submit(
            "alice",
            "--gres=gpu:2",
            "-w",
            "gpu2",
            wrap=testbed.gpu_load("--util", "60", "--seconds", "170"),
        )
        killed_job = testbed.submit(
            "bob",
            "--gres=gpu:1",
            "-w",
            "gpu1",
            wrap=testbed.gpu_load("--util", "50", "--seconds", "90"),
        )
        testbed.wait_state(outage_job, {"RUNNING"})
        testbed.wait_state(killed_job, {"RUNNING"})
        time.sleep(20)
        pg_ctl(testbed, "stop")
        down_at = time.time()
        agent_pid = int((testbed.state_dir / "run" / "slurm-gpu-agent-gpu1.pid").read_text())
        os.kill(agent_pid, signal.SIGKILL)
        killed_at = time.time()
        time.sleep(30)
        testbed.launcher("agent", "start", "gpu1")
        time.sleep(max(0.0, down_at + 120 - time.time()))
        testbed.launcher("up")  # starts PostgreSQL again
        up_at = time.time()
        for job in (outage_job, killed_job):
            assert testbed.wait_done(job, timeout=300) == "COMPLETED"
        outage = wait_summaries(pg_store, outage_job, 2)
        killed = wait_summaries(sqlite_store, killed_job, 1)
    finally:
        testbed.launcher("up")
        testbed.launcher("agent", "stop", "gpu2")
        testbed.launcher("agent", "start", "gpu2")
    return {
        "pg_store": pg_store,
        "sqlite_store": sqlite_store,
        "outage": outage,
        "killed": killed,
        "outage_window": (down_at, up_at),
        "killed_at": killed_at,
    }


def test_store_outage_loses_and_duplicates_nothing(scenario: Scenario) -> None:
    """After a 2-minute store outage, every second of the job is stored exactly once."""
    store = scenario["pg_store"]
    assert isinstance(store, Store)
    for summary in scenario["outage"]:
        rows = job_intervals(store, summary)
        covered = sum(r.covered_seconds for r in rows)
        assert (summary.missing, abs(covered - summary.gpu_seconds) <= 1.0) == (False, True)
        # contiguous and non-overlapping: each interval starts where the last ended
        gaps = [b.period_start - a.period_end for a, b in itertools.pairwise(rows)]
        assert [g for g in gaps if abs(g) > 1e-6] == []
        down_at, up_at = scenario["outage_window"]
        assert any(down_at <= r.period_start <= up_at for r in rows)
        assert summary.util_mean_percent is not None and abs(summary.util_mean_percent - 60) <= 3


def test_agent_killed_gap_is_missing_not_idle(scenario: Scenario) -> None:
    """SIGKILL + restart 30 s later: the gap is flagged missing, the mean stays true."""
    store = scenario["sqlite_store"]
    assert isinstance(store, Store)
    (summary,) = scenario["killed"]
    rows = job_intervals(store, summary)
    covered = sum(r.covered_seconds for r in rows)
    assert summary.missing
    assert 25 <= summary.missing_seconds <= 30 + 4 * INTERVAL
    assert abs(covered + summary.missing_seconds - summary.gpu_seconds) <= 1.0
    assert summary.util_mean_percent is not None and abs(summary.util_mean_percent - 50) <= 3
    starts = [r.period_start for r in rows]
    assert len(starts) == len(set(starts))
