"""No reading lost, none duplicated: the collector killed, the store down, a node cut off.

The bed's agents ship through its collector into its PostgreSQL store, each agent in its
node's network namespace (docker/slurm-cluster/collector.sh). One run, with R the moment
the jobs run, injects on a schedule (each node has one fault stream, so each job's check
sees the faults it was meant to):
- R+20 s: the collector is SIGKILLed, and started again 30 s later; R+55 s: the store
  (PostgreSQL) is stopped for 30 s; job A on gpu1 runs through both;
- R+20 s: gpu2's link to the head node is taken down for 125 s (its agent reaches
  nothing: no collector, no store) while job C runs there;
- R+115 s: gpu1's agent is SIGKILLed and restarted 30 s later during job B.
A's and C's every second of every GPU must be stored exactly once; B's gap is flagged
missing (never idle), the rest of B stored once. Ground truth: the load the jobs put on
the simulated GPUs (gpu-load --util) and Slurm's allocation.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import TypedDict

import pytest

from slurm_gpu.models import GpuInterval, JobGpuSummary
from slurm_gpu.store import Store
from tests.integration.testbed import TestBed, wait_summaries

INTERVAL = 5.0
PG_BIN = Path("/usr/lib/postgresql/15/bin")
CUT_SECONDS = 125.0


def job_intervals(store: Store, summary: JobGpuSummary) -> list[GpuInterval]:
    """The job's stored intervals on one GPU, in time order."""
    rows = store.intervals(node=summary.node, gpu_uuid=summary.gpu_uuid, job_id=summary.job_id)
    return sorted(rows, key=lambda r: r.period_start)


def pg_stop(testbed: TestBed) -> None:
    """Stops (fast) the test bed's PostgreSQL server; `up` starts it again."""
    subprocess.run(
        ["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D",
         str(testbed.state_dir / "pgdata"), "-m", "fast", "-w", "stop"],
        check=True, capture_output=True,
    )  # fmt: skip


def spool_backlog(testbed: TestBed, node: str) -> float:
    """slurm_gpu_agent_spool_backlog_rows of the node's agent (rows waiting to ship)."""
    with urllib.request.urlopen(testbed.metrics_url(node), timeout=10) as answer:
        text = answer.read().decode()
    values = [
        float(ln.split()[-1])
        for ln in text.splitlines()
        if ln.startswith("slurm_gpu_agent_spool_backlog_rows")
    ]
    return sum(values)


class Scenario(TypedDict):
    """What the fault run left behind, for the tests to check."""

    store: Store
    through_collector: list[JobGpuSummary]
    cut_off: list[JobGpuSummary]
    killed: list[JobGpuSummary]
    collector_down: tuple[float, float]
    store_down: tuple[float, float]
    cut: tuple[float, float]
    killed_at: float
    backlog_collector_down: float
    stored_at_cut: int
    stored_before_mend: int


def stored(store: Store, node: str, job: int) -> int:
    return len(store.intervals(node=node, job_id=job))


@pytest.fixture(scope="module")
def scenario(testbed: TestBed, store: Store) -> Scenario:
    """Runs the fault schedule once; the tests then read what the store holds."""
    if not testbed.through_collector:
        pytest.fail("the bed runs SLURM_GPU_BED_STORE=sqlite: no collector, no node links")
    job_a = testbed.submit(
        "alice",
        "--gres=gpu:1",
        "-w",
        "gpu1",
        wrap=testbed.gpu_load("--util", "50", "--seconds", "100"),
    )
    job_b = testbed.submit(
        "bob",
        "--gres=gpu:1",
        "-w",
        "gpu1",
        wrap=testbed.gpu_load("--util", "40", "--seconds", "170"),
    )
    job_c = testbed.submit(
        "carol", "-A", "physics", "--gres=gpu:2", "-w", "gpu2",
        wrap=testbed.gpu_load("--util", "60", "--seconds", "200"),
    )  # fmt: skip
    cut_at = mended_at = 0.0
    try:
        for job in (job_a, job_b, job_c):
            testbed.wait_state(job, {"RUNNING"})
        running = time.time()

        def at(offset: float) -> None:
            time.sleep(max(0.0, running + offset - time.time()))

        at(20)
        testbed.launcher("link", "gpu2", "down")
        cut_at = time.time()
        os.kill(testbed.pid("slurm-gpu-collector"), signal.SIGKILL)
        collector_down = time.time()
        time.sleep(10)
        stored_at_cut = stored(store, "gpu2", job_c)
        at(45)
        backlog = spool_backlog(testbed, "gpu1")
        at(50)
        testbed.launcher("collector", "start")
        collector_up = time.time()
        at(55)
        pg_stop(testbed)
        store_down = time.time()
        at(85)
        testbed.launcher("up")  # starts PostgreSQL again; gpu2's link stays down
        store_up = time.time()
        at(115)
        os.kill(testbed.pid("slurm-gpu-agent-gpu1"), signal.SIGKILL)
        killed_at = time.time()
        time.sleep(max(0.0, cut_at + CUT_SECONDS - 1 - time.time()))
        stored_before_mend = stored(store, "gpu2", job_c)
        time.sleep(max(0.0, cut_at + CUT_SECONDS - time.time()))
        testbed.launcher("link", "gpu2", "up")
        mended_at = time.time()
        testbed.launcher("agent", "start", "gpu1")
        for job in (job_a, job_b, job_c):
            assert testbed.wait_done(job, timeout=300) == "COMPLETED"
        through = wait_summaries(store, job_a, 1)
        killed = wait_summaries(store, job_b, 1)
        cut_off = wait_summaries(store, job_c, 2, timeout=180)
    finally:
        testbed.launcher("link", "gpu2", "up", check=False)
        testbed.launcher("up")
    return {
        "store": store,
        "through_collector": through,
        "cut_off": cut_off,
        "killed": killed,
        "collector_down": (collector_down, collector_up),
        "store_down": (store_down, store_up),
        "cut": (cut_at, mended_at),
        "killed_at": killed_at,
        "backlog_collector_down": backlog,
        "stored_at_cut": stored_at_cut,
        "stored_before_mend": stored_before_mend,
    }


def every_second_once(store: Store, summary: JobGpuSummary) -> tuple[bool, bool, list[float]]:
    """(no data missing, stored seconds = the job's GPU-seconds, gaps or overlaps)."""
    rows = job_intervals(store, summary)
    covered = sum(r.covered_seconds for r in rows)
    gaps = [b.period_start - a.period_end for a, b in itertools.pairwise(rows)]
    return (
        not summary.missing,
        abs(covered - summary.gpu_seconds) <= 1.0,
        [g for g in gaps if abs(g) > 1e-6],
    )


def measured_during(store: Store, summary: JobGpuSummary, window: tuple[float, float]) -> bool:
    """Whether a stored interval of the job was measured inside `window`."""
    return any(window[0] <= r.period_start <= window[1] for r in job_intervals(store, summary))


def test_collector_killed_and_store_down_lose_and_duplicate_nothing(scenario: Scenario) -> None:
    """Job A through a SIGKILLed collector and a stopped store: every second stored once."""
    store = scenario["store"]
    (summary,) = scenario["through_collector"]
    # The faults were real: the agent's spool held rows while the collector was dead.
    assert scenario["backlog_collector_down"] > 0
    assert every_second_once(store, summary) == (True, True, [])
    assert measured_during(store, summary, scenario["collector_down"])
    assert measured_during(store, summary, scenario["store_down"])
    assert summary.util_mean_percent is not None and abs(summary.util_mean_percent - 50) <= 3


def test_node_cut_off_for_two_minutes_loses_and_duplicates_nothing(scenario: Scenario) -> None:
    """gpu2 cut off from the head node for 125 s: nothing arrived meanwhile, all of it after."""
    store = scenario["store"]
    assert scenario["stored_before_mend"] == scenario["stored_at_cut"]
    assert scenario["cut"][1] - scenario["cut"][0] >= 120
    for summary in scenario["cut_off"]:
        assert every_second_once(store, summary) == (True, True, [])
        assert measured_during(store, summary, scenario["cut"])
        assert summary.util_mean_percent is not None and abs(summary.util_mean_percent - 60) <= 3


def test_agent_killed_gap_is_missing_not_idle(scenario: Scenario) -> None:
    """SIGKILL + restart 30 s later: the gap is flagged missing, the mean stays true."""
    store = scenario["store"]
    (summary,) = scenario["killed"]
    rows = job_intervals(store, summary)
    covered = sum(r.covered_seconds for r in rows)
    assert summary.missing
    assert 25 <= summary.missing_seconds <= 30 + 4 * INTERVAL
    assert abs(covered + summary.missing_seconds - summary.gpu_seconds) <= 1.0
    assert summary.util_mean_percent is not None and abs(summary.util_mean_percent - 40) <= 3
    starts = [r.period_start for r in rows]
    assert len(starts) == len(set(starts))
