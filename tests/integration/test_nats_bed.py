"""The bed in the NATS layout: nodes publish over JetStream, two ingest workers write (issue 26).

A bed of its own (its ports, its state dir) with SLURM_GPU_BED_STORE=nats
(docker/slurm-cluster/nats.sh): each agent in its node's network namespace publishes with
its own nkey to nats-server on the head node's bridge; two `slurm-gpu ingest run` write
the bed's PostgreSQL. One run, R the moment both jobs run:
- R+10 s: ingest worker 1 is SIGKILLed (worker 2 goes on) and gpu2's link to the head
  node is cut;
- R+20 s: nats-server is restarted (its JetStream store kept);
- R+30 s: PostgreSQL is stopped, and started again (with worker 1) at R+50 s;
- R+55 s: gpu2's link is mended.
Job A (gpu1) and job C (gpu2) must each have every second of every GPU stored exactly
once: no reading lost, none duplicated. Ground truth: the load the jobs put on the
simulated GPUs and Slurm's allocation.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import pytest

from slurm_gpu.config import load_config
from slurm_gpu.models import JobGpuSummary
from slurm_gpu.slurm.admin_comment import parse_token
from slurm_gpu.store import Store
from tests.integration.test_resilience import every_second_once, pg_stop
from tests.integration.testbed import LAUNCHER, TestBed, wait_for, wait_summaries

pytestmark = pytest.mark.slurm

STATE = Path("/var/tmp/slurm-gpu-cluster-nats-test")
PORTS = {
    "SLURM_GPU_CTLD_PORT": "17837",
    "SLURM_GPU_DBD_PORT": "17839",
    "SLURM_GPU_DB_PORT": "14326",
    "SLURM_GPU_PG_PORT": "16452",
    "SLURM_GPU_NODE1_PORT": "17921",
    "SLURM_GPU_NODE2_PORT": "17922",
    "SLURM_GPU_CLUSTER_NAME": "natsbed",
    "SLURM_GPU_METRICS_PORT_BASE": "19970",
    "SLURM_GPU_PROM_PORT": "19210",
    "SLURM_GPU_BED_STORE": "nats",
}


class Run(TypedDict):
    bed: TestBed
    store: Store
    through_faults: list[JobGpuSummary]
    cut_off: list[JobGpuSummary]
    status: str


@pytest.fixture(scope="module")
def nats_bed() -> Iterator[TestBed]:
    shutil.rmtree(STATE, ignore_errors=True)
    try:
        yield TestBed.up(STATE, PORTS)
    finally:
        env = dict(os.environ, SLURM_GPU_CLUSTER_DIR=str(STATE), **PORTS)
        subprocess.run([str(LAUNCHER), "down"], env=env, check=False)
        shutil.rmtree(STATE, ignore_errors=True)


@pytest.fixture(scope="module")
def run(nats_bed: TestBed) -> Iterator[Run]:
    bed = nats_bed
    config = load_config(Path(bed.env["SLURM_GPU_CONFIG"]))
    store = Store(config.store.url, cluster=config.cluster.name)
    job_a = bed.submit(
        "alice", "--gres=gpu:1", "-w", "gpu1",
        wrap=bed.gpu_load("--util", "50", "--seconds", "75"),
    )  # fmt: skip
    job_c = bed.submit(
        "carol", "-A", "physics", "--gres=gpu:2", "-w", "gpu2",
        wrap=bed.gpu_load("--util", "60", "--seconds", "75"),
    )  # fmt: skip
    try:
        for job in (job_a, job_c):
            bed.wait_state(job, {"RUNNING"})
        running = time.time()

        def at(offset: float) -> None:
            time.sleep(max(0.0, running + offset - time.time()))

        at(10)
        os.kill(bed.pid("slurm-gpu-ingest-1"), signal.SIGKILL)
        bed.launcher("link", "gpu2", "down")
        at(20)
        bed.launcher("nats", "restart")
        at(30)
        pg_stop(bed)
        at(50)
        bed.launcher("up")  # PostgreSQL again, and the killed worker
        at(55)
        bed.launcher("link", "gpu2", "up")
        for job in (job_a, job_c):
            assert bed.wait_done(job, timeout=240) == "COMPLETED"
        through = wait_summaries(store, job_a, 1, timeout=180)
        cut_off = wait_summaries(store, job_c, 2, timeout=180)
        status = bed.launcher("status", check=False).stdout
    finally:
        bed.launcher("link", "gpu2", "up", check=False)
    yield {
        "bed": bed,
        "store": store,
        "through_faults": through,
        "cut_off": cut_off,
        "status": status,
    }
    store.dispose()


def test_the_bed_ships_over_nats_to_two_workers_and_no_collector(run: Run) -> None:
    status = run["status"]
    assert "through NATS JetStream at nats://" in status
    for daemon in ("nats-server", "slurm-gpu-ingest-1", "slurm-gpu-ingest-2"):
        assert any(line.split()[:2] == [daemon, "running"] for line in status.splitlines()), status
    assert "slurm-gpu-collector" not in status


def test_a_killed_worker_a_restarted_server_and_the_store_down_lose_nothing(run: Run) -> None:
    for summary in run["through_faults"]:
        assert (True, True, []) == every_second_once(run["store"], summary), summary


def test_a_node_cut_off_loses_and_duplicates_nothing(run: Run) -> None:
    assert 2 == len(run["cut_off"])
    for summary in run["cut_off"]:
        assert (True, True, []) == every_second_once(run["store"], summary), summary


def test_the_workers_write_the_admincomment_the_agents_cannot(run: Run) -> None:
    """[node] write_admin_comment on the head: an ingest worker writes the job's token."""
    summaries = run["cut_off"]
    job = summaries[0].job_id

    def token() -> dict[str, str]:
        return parse_token(run["bed"].sacct(job, "AdminComment").get("AdminComment", ""))

    found = wait_for(token, 60, f"job {job}'s AdminComment")
    assert "2" == found["gpus"]
    assert abs(float(found["gpu_s"]) - sum(s.gpu_seconds for s in summaries)) <= 1
