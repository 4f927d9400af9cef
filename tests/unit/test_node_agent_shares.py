"""Shares of one GPU through the agent (issue 14): gres/shard and gres/mps, per process.

One A100 (Slurm GPU 0) with `Name=shard Count=8` (or `Name=mps Count=100`). Each job's
share is measured by its own processes (`process_utilization`): the sum of their smUtil.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu.errors import SlurmError
from slurm_gpu.models import GpuDevice, GpuProcess, Measurement, SlotKind
from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.hookfiles import parse_binding, read_events
from slurm_gpu.node.outbox import (
    decode_event,
    decode_interval,
    decode_physical,
    decode_summary,
)
from slurm_gpu.node.ship_less import outbox_view
from slurm_gpu.node.spool import Spool
from slurm_gpu.slurm.gres import parse_gres_node
from slurm_gpu.testing import FakeGpuSource, FixedClock
from tests.unit.test_node_agent import T0, end_job, stat_by_minor, write_hook_file

GPU = "GPU-33333333-0000-4000-8000-000000000000"
DEVICES = [GpuDevice(GPU, "NVIDIA A100-SXM4-80GB", 0, 0, "0000:17:00.0", 80 * 2**30)]
SHARD_GRES = "Name=gpu File=/dev/nvidia0\nName=shard Count=8 File=/dev/nvidia0\n"
MPS_GRES = "Name=gpu File=/dev/nvidia0\nName=mps Count=100 File=/dev/nvidia0\n"

Rig = tuple[NodeAgent, FixedClock, FakeGpuSource, Path]


def make_agent(tmp_path: Path, gres: str = SHARD_GRES) -> Rig:
    clock = FixedClock(T0)
    gpus = FakeGpuSource(
        DEVICES,
        clock,
        util={GPU: lambda t: 70.0},  # the whole GPU's own samples: not any job's
        process_util={GPU: {20001: lambda t: 45.0, 20002: lambda t: 40.0}},  # job 20's two
    )
    gpus.processes = {GPU: (GpuProcess(20001, 2**30), GpuProcess(20002, 2**29))}
    node_dir = tmp_path / "gpu1"
    agent = NodeAgent(
        "gpu1",
        node_dir,
        gpus,
        Spool(tmp_path / "spool.db"),
        parse_gres_node(gres, "gpu1"),
        interval=10,
        period=60,
        clock=clock,
        pid_job=lambda pid: pid // 1000,
        stat=stat_by_minor,
    )
    return agent, clock, gpus, node_dir


def start_share(node_dir: Path, job: int, shards: int, at: float, kind: str = "shard") -> None:
    """The prolog's files of a job holding `shards` gres/<kind> on Slurm GPU 0."""
    common = {"job_id": str(job), "user": "bob", "shards": str(shards), "shard_kind": kind}
    write_hook_file(node_dir / "bindings" / f"{job}.0", {**common, "gpu_index": "0"}, at)
    write_hook_file(node_dir / "events" / f"{job}.started.1", {**common, "gpu_indices": "0"}, at)


def run(agent: NodeAgent, clock: FixedClock, until: float) -> None:
    while clock.now < until:
        clock.now += 10
        agent.tick()


def rows(agent: NodeAgent, kind: str) -> list[tuple[str, str]]:
    return [(key, p) for _, k, key, p in agent.spool.pending(10**6) if k == kind]


def two_shard_jobs(tmp_path: Path) -> Rig:
    """Job 20 (2 shards, two processes at 45 and 40%) and job 21 (4 shards, no process)."""
    agent, clock, gpus, node_dir = make_agent(tmp_path)
    agent.tick()
    start_share(node_dir, 20, 2, T0 + 15)
    start_share(node_dir, 21, 4, T0 + 15)
    run(agent, clock, T0 + 160)
    return agent, clock, gpus, node_dir


def test_two_shard_jobs_are_busy_and_idle_by_their_own_processes(tmp_path: Path) -> None:
    agent, clock, _, node_dir = two_shard_jobs(tmp_path)
    # as the store shows them: carried to the newest heartbeat (issue 16)
    view = outbox_view((k, p) for _, k, _, p in agent.spool.pending(10**6))
    activity = {a.job_id: a for a in view}
    for job in (20, 21):
        end_job(node_dir, job, T0 + 165)
    run(agent, clock, T0 + 190)

    summaries = {s.job_id: s for s in (decode_summary(p) for _, p in rows(agent, "summary"))}
    busy, idle = summaries[20], summaries[21]
    assert (busy.slot_id, busy.gpu_uuid, busy.slot_kind, busy.measured_by) == (
        f"{GPU}/shard/20",
        GPU,
        SlotKind.SHARD,
        Measurement.PER_PROCESS,
    )
    assert (busy.share, idle.share, idle.slot_id) == (0.25, 0.5, f"{GPU}/shard/21")
    assert (busy.gpu_seconds, busy.missing_seconds, idle.missing_seconds) == (150.0, 0.0, 0.0)
    assert busy.util_mean_percent == pytest.approx(85.0)  # 45 + 40, its two processes
    assert busy.active_seconds == pytest.approx(150.0)
    assert (idle.util_mean_percent, idle.active_seconds) == (0.0, 0.0)
    assert (busy.mem_max_bytes, idle.mem_max_bytes) == (2**30 + 2**29, 0)
    assert busy.energy_joules is None  # the physical GPU's (its physical rows)
    assert (activity[20].util_recent_percent, activity[20].last_active) == (85.0, T0 + 160)
    assert (activity[21].util_recent_percent, activity[21].last_active) == (0.0, None)
    assert (activity[20].process_count, activity[21].process_count) == (2, 0)
    assert activity[21].slot_id == f"{GPU}/shard/21" and activity[21].share == 0.5


def test_two_shares_in_one_period_are_two_interval_rows(tmp_path: Path) -> None:
    agent, _, _, _ = two_shard_jobs(tmp_path)
    intervals = [(key, decode_interval(p)) for key, p in rows(agent, "interval")]
    period = [(key, i) for key, i in intervals if T0 + 60 <= i.period_start < T0 + 120]
    assert sorted(key for key, _ in period) == [
        f"gpu1:{GPU}/shard/20:{T0 + 60!r}",
        f"gpu1:{GPU}/shard/21:{T0 + 60!r}",
    ]
    assert [(i.job_id, i.util_mean_percent, i.covered_seconds) for _, i in sorted(period)] == [
        (20, pytest.approx(85.0), 60.0),
        (21, 0.0, 60.0),
    ]
    # the GPU's own samples (70%) are no job's: while shares hold it no whole-GPU row
    assert [i for _, i in intervals if i.slot_kind is SlotKind.GPU and i.period_start > T0] == []
    physicals = [decode_physical(p) for _, p in rows(agent, "physical")]
    (physical,) = [p for p in physicals if p.period_start == T0 + 60]
    assert (physical.gpu_uuid, physical.covered_seconds) == (GPU, 60.0)
    assert physical.energy_joules == pytest.approx(6000.0)


def test_an_unreadable_per_process_read_is_unknown_never_idle(tmp_path: Path) -> None:
    """Reads failing for 30 s: both shares are missing those 30 s, not idle; totals read on."""
    agent, clock, gpus, node_dir = make_agent(tmp_path)
    agent.tick()
    start_share(node_dir, 20, 2, T0 + 15)
    start_share(node_dir, 21, 4, T0 + 15)
    run(agent, clock, T0 + 60)
    gpus.unsupported.add("process_utilization")
    run(agent, clock, T0 + 90)  # the reads at T0+70, +80, +90 fail
    gpus.unsupported.discard("process_utilization")
    run(agent, clock, T0 + 120)
    for job in (20, 21):
        end_job(node_dir, job, T0 + 125)
    run(agent, clock, T0 + 140)

    summaries = {s.job_id: s for s in (decode_summary(p) for _, p in rows(agent, "summary"))}
    assert (summaries[20].missing_seconds, summaries[21].missing_seconds) == (30.0, 30.0)
    assert summaries[20].util_mean_percent == pytest.approx(85.0)
    assert summaries[21].active_seconds == 0.0 and summaries[21].util_mean_percent == 0.0
    physical = [decode_physical(p) for _, p in rows(agent, "physical")]
    assert [p.covered_seconds for p in physical if p.period_start == T0 + 60] == [60.0]


def test_mps_shares_are_mps_slots_of_their_count(tmp_path: Path) -> None:
    agent, clock, gpus, node_dir = make_agent(tmp_path, MPS_GRES)
    agent.tick()
    start_share(node_dir, 20, 25, T0 + 15, kind="mps")
    run(agent, clock, T0 + 60)
    end_job(node_dir, 20, T0 + 65)
    run(agent, clock, T0 + 80)

    (summary,) = [decode_summary(p) for _, p in rows(agent, "summary")]
    assert (summary.slot_id, summary.slot_kind, summary.share, summary.gpu_seconds) == (
        f"{GPU}/mps/20",
        SlotKind.MPS,
        0.25,
        50.0,
    )
    # consecutive per-process windows: each read asks from the newest sample of the last
    assert [since for _, since in gpus.process_reads] == [T0 + 10, T0 + 20, T0 + 30, T0 + 40,
                                                          T0 + 50, T0 + 60]  # fmt: skip


def test_hook_files_carry_shards_and_their_kind(tmp_path: Path) -> None:
    node_dir = tmp_path / "gpu1"
    start_share(node_dir, 20, 3, T0, kind="mps")
    (item,) = read_events(node_dir, "gpu1")
    binding = parse_binding(node_dir / "bindings" / "20.0")
    assert (item.event.shards, item.event.shard_kind) == (3, "mps")
    assert (binding.shards, binding.shard_kind) == (3, "mps")


def test_an_event_without_shares_ships_the_payload_of_before(tmp_path: Path) -> None:
    """No shards= line: no shards or shard_kind key in the event row (byte-identical)."""
    agent, _, _, node_dir = make_agent(tmp_path)
    write_hook_file(node_dir / "events" / "5.started.1", {"job_id": "5", "gpu_indices": "0"}, T0)
    start_share(node_dir, 20, 2, T0)
    agent.tick()
    payloads = {decode_event(p).job_id: p for _, p in rows(agent, "event")}
    assert "shard" not in payloads[5]
    assert decode_event(payloads[20]).shards == 2


def test_shares_slurm_gives_a_job_are_asked_once_as_the_prolog_cannot_tell(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent asks Slurm for a job's shares, once, and records them.

    Slurm 22.05's prolog sees SLURM_JOB_GPUS=0 for a shard job as for a whole-GPU one, so
    `scontrol -d show job` (job_shares) is where the count comes from.
    """
    agent, clock, _gpus, node_dir = make_agent(tmp_path)
    asked: list[int] = []

    def job_shares(job_id: int) -> tuple[str, int] | None:
        asked.append(job_id)
        return ("shard", 2) if job_id == 20 else None

    agent.job_shares = job_shares
    for job in (20, 21):  # the hooks' files without shards=, as on the bed
        common = {"job_id": str(job), "user": "bob"}
        write_hook_file(node_dir / "bindings" / f"{job}.0", {**common, "gpu_index": "0"}, T0)
        write_hook_file(
            node_dir / "events" / f"{job}.started.1", {**common, "gpu_indices": "0"}, T0
        )
    run(agent, clock, T0 + 60)
    spans = {s.job_id: (s.shards, s.shard_kind) for s in agent.spool.spans()}
    assert spans == {20: (2, "shard"), 21: (0, "")}
    assert sorted(asked) == [20, 21]  # once each, at its start

    def down(_job_id: int) -> tuple[str, int] | None:
        raise SlurmError("scontrol: slurmctld not responding")

    agent.job_shares = down
    write_hook_file(node_dir / "events" / "22.started.1", {"job_id": "22", "gpu_indices": "0"}, T0)
    with caplog.at_level("ERROR", logger="slurm_gpu.node.agent"):
        run(agent, clock, T0 + 70)
    assert "job 22: cannot tell whether it holds shares of Slurm GPU 0" in caplog.text
    assert {s.job_id: s.shards for s in agent.spool.spans()}[22] == 0
