"""slurm_gpu.activity.is_active: one threshold rule for the node agent and the idle policy.

A reading exactly at the threshold is active on both sides.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from slurm_gpu.activity import is_active
from slurm_gpu.config import Config
from slurm_gpu.config.policy import ControllerSettings
from slurm_gpu.gpu import GpuSnapshot, MigSnapshot, ProcessUtilization, UtilSample
from slurm_gpu.models import GpuActivity, GpuDevice, MigDevice, SlurmJob
from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.attribution import JobSpan, split_window
from slurm_gpu.node.spool import Spool
from slurm_gpu.policy.rules import evaluate
from slurm_gpu.slurm.gres import GresGpuFile

T0 = 1_800_000_000.0
THRESHOLD = 5.0


@pytest.mark.parametrize(
    ("util", "expected"),
    [(0.0, False), (4.9, False), (5.0, True), (5.1, True), (100.0, True)],
)
def test_below_the_threshold_is_idle_at_or_above_is_active(util: float, expected: bool) -> None:
    """With a 5% threshold, 4.9% is idle and 5.0% is in use ("under 5% is idle")."""
    assert expected == is_active(util, THRESHOLD)


def test_zero_threshold_makes_every_reading_active() -> None:
    """Threshold 0: nothing is idle, not even a GPU at 0%."""
    assert True is is_active(0.0, 0.0)


def test_agent_counts_samples_at_the_threshold_as_active() -> None:
    """split_window's active_count (a job's active_s) includes samples exactly at it."""
    samples = tuple(UtilSample(T0 + t, THRESHOLD) for t in range(1, 11))
    snapshot = GpuSnapshot("GPU-0", T0 + 10, samples=samples)
    (piece,) = split_window(T0, T0 + 10, snapshot, [JobSpan(1, 0, T0 - 5)], 60, THRESHOLD, None)
    assert (10, 10) == (piece.util_count, piece.active_count)


class SteadyGpu:
    """One GPU (minor 0) whose every one-second sample reads `util` percent."""

    def __init__(self, util: float, clock: list[float]) -> None:
        self.util = util
        self.clock = clock

    def devices(self) -> list[GpuDevice]:
        return [GpuDevice("GPU-0", "Fake A100", 0, 0, "00:01", 80 * 2**30)]

    def snapshot(self, device: GpuDevice, samples_since: float) -> GpuSnapshot:
        now = self.clock[0]
        times = range(int(samples_since) + 1, int(now) + 1)
        samples = tuple(UtilSample(float(t), self.util) for t in times)
        return GpuSnapshot(device.uuid, now, samples=samples, mem_used_bytes=0, processes=())

    def mig_snapshot(self, device: GpuDevice, mig: MigDevice) -> MigSnapshot:
        return MigSnapshot(mig.uuid, self.clock[0], error="Not Found")  # never in MIG mode

    def process_utilization(self, device: GpuDevice, since: float) -> ProcessUtilization:
        return ProcessUtilization(device.uuid, self.clock[0], last_seen=since)  # none sampled

    def close(self) -> None:
        pass


class DeviceStat:
    """Just the st_rdev of an os.stat result."""

    def __init__(self, rdev: int) -> None:
        self.st_rdev = rdev


def stat_minor_zero(path: str) -> os.stat_result:
    """os.stat stand-in: every GPU device file is character device 195:0."""
    return DeviceStat(os.makedev(195, 0))  # type: ignore[return-value]


def agent_says_active(util: float, tmp_path: Path) -> bool:
    """Whether the agent's activity row (what the controller reads) marks the GPU active."""
    clock = [T0]
    node_dir = tmp_path / "gpu1"
    binding = node_dir / "bindings" / "1.0"
    binding.parent.mkdir(parents=True)
    fields = {"job_id": "1", "uid": "1001", "user": "alice", "account": "physics"}
    fields |= {"partition": "gpu", "gpu_index": "0"}
    binding.write_text("".join(f"{k}={v}\n" for k, v in fields.items()) + "end=1\n")
    os.utime(binding, (T0 - 5, T0 - 5))
    agent = NodeAgent(
        "gpu1",
        node_dir,
        SteadyGpu(util, clock),
        Spool(tmp_path / "spool.db"),
        [GresGpuFile(0, "/dev/nvidia0", "a100")],
        interval=10,
        period=60,
        active_threshold=THRESHOLD,
        clock=lambda: clock[0],
        stat=stat_minor_zero,
    )
    agent.tick()
    clock[0] += 10
    agent.tick()
    (payload,) = [row.payload for row in agent.spool.pending(100) if row.kind == "activity"]
    return json.loads(payload)["last_active"] is not None


def policy_says_active(util: float) -> bool:
    """Whether idle_gpu treats a GPU the agent never saw active, now reading `util`, as used."""
    base = Config()
    config = dataclasses.replace(
        base,
        node=dataclasses.replace(base.node, active_threshold_percent=THRESHOLD),
        controller=ControllerSettings(timezone="UTC"),
    )
    now = T0 + 3 * 3600
    job = SlurmJob(
        job_id=1,
        user="alice",
        account="physics",
        partition="gpu",
        state="RUNNING",
        name="train",
        qos="normal",
        start_time=T0,
        nodes=("gpu1",),
        gpus=(("gpu1", (0,)),),
        gpu_count=1,
    )
    row = GpuActivity(
        job_id=1,
        node="gpu1",
        gpu_uuid="GPU-0",
        slurm_index=0,
        start=T0,
        last_reading=now - 5,
        last_active=None,
        util_recent_percent=util,
        mem_used_bytes=0,
        process_count=0,
    )
    return [] == evaluate([job], [row], now, config)


@pytest.mark.parametrize("util", [4.9, 5.0, 5.1])
def test_agent_and_policy_classify_a_reading_alike(util: float, tmp_path: Path) -> None:
    """The agent's record and the idle policy agree at, just below and just above it.

    They used to disagree at exactly 5.0: `>` in the agent against `>=` in the policy.
    """
    expected = (is_active(util, THRESHOLD), is_active(util, THRESHOLD))
    assert expected == (agent_says_active(util, tmp_path), policy_says_active(util))
