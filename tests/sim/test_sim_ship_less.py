"""Ship less (issue 16) over the simulated NVML: the agent's real read path, real time.

Job 42 runs gpu-load at 70% on Slurm GPU 0, job 43 holds GPU 1 idle. An agent ticking
every two seconds ships each job's activity row once, then heartbeats only; the controller's
view (Store.activity, the idle rule) stays fresh. GPU 1 is then lost: its slot leaves the
heartbeat, and job 43 goes stale (unknown, never idle) at the time it was last read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slurm_gpu.config import Config
from slurm_gpu.config.policy import ControllerSettings
from slurm_gpu.durations import Duration
from slurm_gpu.models import Action, SlurmJob
from slurm_gpu.policy.rules import evaluate
from slurm_gpu.store import Store
from tests.sim.conftest import BIN, REPO, Node, uuid_of

PROBE = Path(__file__).with_name("ship_less_probe.py")
TICKS = 8
INTERVAL = 2.0  # seconds: each window holds a sample of the library's one a second
FAULT_AT = 6  # GPU 1 lost before the 6th tick


def hook_file(path: Path, fields: dict[str, str], mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in fields.items()) + "end=1\n")
    os.utime(path, (mtime, mtime))


def start_job(node_dir: Path, job: int, index: int, at: float) -> None:
    fields = {"job_id": str(job), "user": "alice", "account": "physics", "partition": "gpu"}
    hook_file(node_dir / "bindings" / f"{job}.{index}", {**fields, "gpu_index": str(index)}, at)
    started = {**fields, "gpu_indices": str(index)}
    hook_file(node_dir / "events" / f"{job}.started.1", started, at)


def job(job_id: int, index: int, start: float) -> SlurmJob:
    return SlurmJob(
        job_id=job_id, user="alice", account="physics", partition="gpu", state="RUNNING",
        name="train", qos="normal", start_time=start, nodes=("gpu1",),
        gpus=(("gpu1", (index,)),), gpu_count=1,
    )  # fmt: skip


def run_agent(node: Node, tmp_path: Path) -> dict[str, Any]:
    ask = {
        "node_dir": str(tmp_path / "state" / "gpu1"),
        "spool": str(tmp_path / "spool.db"),
        "store": f"sqlite:///{tmp_path / 'store.db'}",
        "ticks": TICKS,
        "interval": INTERVAL,
        "fault_at": FAULT_AT,
        "fault": [sys.executable, str(BIN / "sim-gpu"), "fault", "--dir", str(node.dir),
                  "--gpu", "minor:1", "lost"],
    }  # fmt: skip
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(node.libdir),
        "SIM_NVML_DIR": str(node.dir),
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, str(PROBE)],
        input=json.dumps(ask),
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_agent_ships_rows_once_then_heartbeats_and_a_lost_gpu_goes_stale(
    node: Node, tmp_path: Path
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'store.db'}", cluster="c")
    store.upgrade()
    started = time.time() - 5  # before the agent's first window
    node.start_load("0", "--util", "70", "--seconds", "60")
    time.sleep(INTERVAL + 1.2)  # the load behind every sample of the agent's first window
    start_job(tmp_path / "state" / "gpu1", 42, 0, started)
    start_job(tmp_path / "state" / "gpu1", 43, 1, started)
    gpu0, gpu1 = uuid_of(node, 0), uuid_of(node, 1)

    ticks = run_agent(node, tmp_path)["ticks"]
    now = ticks[-1]["time"] + 1
    rows = {r.job_id: r for r in store.activity()}
    base = Config()
    config = dataclasses.replace(
        base,
        node=dataclasses.replace(base.node, interval=Duration(INTERVAL)),
        controller=ControllerSettings(timezone="UTC"),
    )
    judged = {v.job_id: v for v in evaluate([job(42, 0, started), job(43, 1, started)],
                                            list(rows.values()), now, config)}  # fmt: skip
    store.dispose()

    # one row per job at the first tick, none while nothing changes
    queued = [t["activity"] for t in ticks[: FAULT_AT - 1]]
    assert [2] + [0] * (FAULT_AT - 2) == queued, json.dumps([t["rows"] for t in ticks[:2]])
    # every GPU in the heartbeat until GPU 1 is lost, then all but GPU 1
    assert all(gpu1 in t["slots"] and gpu0 in t["slots"] for t in ticks[: FAULT_AT - 1])
    assert all(gpu1 not in t["slots"] and gpu0 in t["slots"] for t in ticks[FAULT_AT - 1 :])
    # the controller: job 42 read at the newest tick and busy, job 43 last read before the
    # loss and stale: unknown, never idle
    assert (ticks[-1]["time"], 70.0) == (rows[42].last_reading, rows[42].util_recent_percent)
    assert ticks[FAULT_AT - 2]["time"] == rows[43].last_reading
    assert 42 not in judged
    assert (Action.NONE, 1) == (judged[43].action, dict(judged[43].details)["stale_gpus"])
