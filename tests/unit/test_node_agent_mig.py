"""MIG slices through the agent (issue 14): each MIG device is its own slot, never its parent.

The node: an H100 in MIG mode (3g.40gb, 2g.20gb, 1g.10gb; GPM per GPU instance) and an
A100 in MIG mode (one 1g.10gb, no GPM: memory only), numbered by gres.conf
MultipleFiles= lines through the driver's mig-minors, as slurmd numbers them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from slurm_gpu.config import Config
from slurm_gpu.config.core import NodeSettings
from slurm_gpu.errors import ConfigError
from slurm_gpu.models import (
    GpuDevice,
    GpuProcess,
    Measurement,
    MigDevice,
    SlotKind,
)
from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.daemon import node_mig_minors
from slurm_gpu.node.outbox import (
    decode_activity,
    decode_interval,
    decode_inventory,
    decode_physical,
    decode_summary,
)
from slurm_gpu.node.ship_less import outbox_view
from slurm_gpu.node.spool import Spool
from slurm_gpu.slurm.gres import parse_gres_node
from slurm_gpu.slurm.mig_minors import MigMinors, parse_mig_minors
from slurm_gpu.testing import FakeGpuSource, FixedClock
from tests.unit.test_gpu_order_mig import caps, mig_minors_text, stat_dev
from tests.unit.test_node_agent import T0, end_job, write_hook_file

H100 = "GPU-11111111-0000-4000-8000-000000000000"
A100 = "GPU-22222222-0000-4000-8000-000000000000"
MIG_3G = "MIG-aaaaaaaa-0000-4000-8000-000000000003"
MIG_2G = "MIG-aaaaaaaa-0000-4000-8000-000000000002"
MIG_1G = "MIG-aaaaaaaa-0000-4000-8000-000000000001"
MIG_A100 = "MIG-bbbbbbbb-0000-4000-8000-000000000001"
H100_MIGS = (
    MigDevice(MIG_3G, H100, 0, 2, 0, "3g.40gb", 3, 7, 40 * 2**30),
    MigDevice(MIG_2G, H100, 1, 3, 0, "2g.20gb", 2, 7, 20 * 2**30),
    MigDevice(MIG_1G, H100, 2, 9, 0, "1g.10gb", 1, 7, 10 * 2**30),
)
A100_MIGS = (MigDevice(MIG_A100, A100, 0, 1, 0, "1g.10gb", 1, 7, 10 * 2**30),)
DEVICES = [
    GpuDevice(H100, "NVIDIA H100 80GB HBM3", 0, 0, "0000:17:00.0", 80 * 2**30, True),
    GpuDevice(A100, "NVIDIA A100-SXM4-80GB", 1, 1, "0000:18:00.0", 80 * 2**30),
]
# Slurm GPU 0..2: the H100's slices, 3: the A100's (gres.conf listing order)
GRES = "".join(
    f"NodeName=gpu1 Name=gpu MultipleFiles={caps(g, gi)}\n"
    for g, gi in ((0, 2), (0, 3), (0, 9), (1, 1))
)
MINORS = parse_mig_minors(mig_minors_text(2), "mig-minors")
LEVELS = {MIG_3G: 20.0, MIG_2G: 60.0, MIG_1G: 0.0}  # each slice's graphics activity
JOBS = {7: (0, MIG_3G), 8: (1, MIG_2G), 9: (2, MIG_1G)}  # job: (Slurm index, its slice)


def gpm_of(level: float) -> Callable[[float], Mapping[str, float]]:
    # SM activity a little below the graphics activity, as a real kernel mix gives
    return lambda t: {"graphics_active_percent": level, "sm_active_percent": max(0.0, level - 2)}


Rig = tuple[NodeAgent, FixedClock, FakeGpuSource, Path]


def make_agent(tmp_path: Path, minors: MigMinors | None = MINORS) -> Rig:
    clock = FixedClock(T0)
    gpus = FakeGpuSource(
        DEVICES,
        clock,
        gpm={uuid: gpm_of(level) for uuid, level in LEVELS.items()},
        mig={H100: H100_MIGS, A100: A100_MIGS},
    )
    gpus.processes = {
        MIG_3G: (GpuProcess(7001, 2**30),),
        MIG_2G: (GpuProcess(8001, 2**31),),
        MIG_1G: (GpuProcess(9001, 2**28),),
        MIG_A100: (GpuProcess(10001, 3 * 2**30),),
    }
    node_dir = tmp_path / "gpu1"
    agent = NodeAgent(
        "gpu1",
        node_dir,
        gpus,
        Spool(tmp_path / "spool.db"),
        parse_gres_node(GRES, "gpu1"),
        interval=10,
        period=60,
        clock=clock,
        pid_job=lambda pid: pid // 1000,
        stat=stat_dev,
        mig_minors=minors,
    )
    return agent, clock, gpus, node_dir


def start_job(node_dir: Path, job: int, index: int, uuid: str, at: float) -> None:
    """The prolog's files of a job on one MIG slot.

    Its index and (as slurmd always sets for MIG) its MIG UUID from CUDA_VISIBLE_DEVICES.
    """
    common = {"job_id": str(job), "uid": "1001", "user": "alice", "account": "physics"}
    binding = {**common, "gpu_index": str(index), "gpu_uuid": uuid}
    write_hook_file(node_dir / "bindings" / f"{job}.{index}", binding, at)
    event = {**common, "gpu_indices": str(index), "gpu_uuids": uuid}
    write_hook_file(node_dir / "events" / f"{job}.started.1", event, at)


def run(agent: NodeAgent, clock: FixedClock, until: float) -> None:
    while clock.now < until:
        clock.now += 10
        agent.tick()


def rows(agent: NodeAgent, kind: str) -> list[str]:
    return [p for _, k, _, p in agent.spool.pending(10**6) if k == kind]


def test_three_mig_jobs_on_one_h100_are_three_slots(tmp_path: Path) -> None:
    """Jobs at 20, 60 and 0% on three slices: each summary is its own slice's, by its GPM."""
    agent, clock, _, node_dir = make_agent(tmp_path)
    agent.tick()
    for job, (index, uuid) in JOBS.items():
        start_job(node_dir, job, index, uuid, T0 + 15)
    run(agent, clock, T0 + 160)
    for job in JOBS:
        end_job(node_dir, job, T0 + 165)
    run(agent, clock, T0 + 190)

    summaries = {s.job_id: s for s in map(decode_summary, rows(agent, "summary"))}
    assert sorted(summaries) == [7, 8, 9]
    for job, (_, uuid) in JOBS.items():
        s = summaries[job]
        mig = next(m for m in H100_MIGS if m.uuid == uuid)
        assert (s.slot_id, s.gpu_uuid, s.slot_kind, s.mig_profile, s.measured_by) == (
            uuid,
            H100,
            SlotKind.MIG,
            mig.profile,
            Measurement.GPM,
        )
        assert s.share == pytest.approx(mig.slices / 7)  # recorded, not multiplied in
        assert abs(s.gpu_seconds - 150.0) <= 10 and s.missing_seconds == 0.0
        assert s.util_mean_percent == pytest.approx(LEVELS[uuid])
        assert s.sm_active_mean_percent is not None
        assert abs(s.sm_active_mean_percent - LEVELS[uuid]) <= 3
        assert s.energy_joules is None  # the physical GPU's, not a slice's
    assert summaries[7].active_seconds == pytest.approx(150.0)
    assert summaries[9].active_seconds == 0.0


def test_the_parent_of_mig_slices_is_never_a_jobs_whole_gpu(tmp_path: Path) -> None:
    """No interval, summary or activity row is the H100 as a whole-GPU slot."""
    agent, clock, gpus, node_dir = make_agent(tmp_path)
    agent.tick()
    start_job(node_dir, 8, 1, MIG_2G, T0 + 15)
    run(agent, clock, T0 + 100)
    end_job(node_dir, 8, T0 + 105)
    run(agent, clock, T0 + 130)

    intervals = list(map(decode_interval, rows(agent, "interval")))
    activity = list(map(decode_activity, rows(agent, "activity")))
    summaries = list(map(decode_summary, rows(agent, "summary")))
    h100 = [i for i in intervals if i.gpu_uuid == H100]
    assert h100 and all(i.slot_kind is SlotKind.MIG for i in h100)
    assert {i.effective_slot_id for i in h100} == {m.uuid for m in H100_MIGS}
    assert [i for i in intervals if i.effective_slot_id in (H100, A100)] == []
    assert [(a.slot_id, a.gpu_uuid) for a in activity] == [(MIG_2G, H100)]
    assert [(s.slot_id, s.gpu_uuid) for s in summaries] == [(MIG_2G, H100)]
    held = [i for i in h100 if i.job_id == 8]
    assert all(i.power_mean_watts is None and i.energy_joules is None for i in held)
    assert {i.measured_by for i in held} == {Measurement.GPM}
    # an unheld slice's time is its own, as an unheld GPU's is
    assert {i.job_id for i in h100 if i.slot_id == MIG_3G} == {None}
    assert gpus.reads and all(uuid != MIG_2G for uuid, _ in gpus.reads)


def test_running_mig_jobs_activity_is_their_slices(tmp_path: Path) -> None:
    """A 60% slice is active to the newest read, a 0% slice never; the parent stays out."""
    agent, clock, _, node_dir = make_agent(tmp_path)
    agent.tick()
    for job, (index, uuid) in JOBS.items():
        start_job(node_dir, job, index, uuid, T0 + 15)
    run(agent, clock, T0 + 50)

    # as the store shows them: carried to the newest heartbeat (issue 16)
    view = outbox_view((k, p) for _, k, _, p in agent.spool.pending(10**6))
    activity = {a.job_id: a for a in view}
    busy, idle = activity[8], activity[9]
    assert (busy.slot_id, busy.util_recent_percent, busy.last_active) == (MIG_2G, 60.0, T0 + 50)
    assert (busy.sm_active_recent_percent, busy.last_sm_active) == (58.0, T0 + 50)
    assert (idle.slot_id, idle.util_recent_percent, idle.last_active) == (MIG_1G, 0.0, None)
    assert (busy.measured_since, busy.process_count, busy.mem_used_bytes) == (T0 - 10, 1, 2**31)
    assert busy.share == pytest.approx(2 / 7) and busy.mig_profile == "2g.20gb"


def test_an_a100_slice_is_measured_by_memory_only(tmp_path: Path) -> None:
    """No GPM on Ampere: utilization unknown (never 0), memory measured, covered in full."""
    agent, clock, _, node_dir = make_agent(tmp_path)
    agent.tick()
    start_job(node_dir, 10, 3, MIG_A100, T0 + 15)
    run(agent, clock, T0 + 50)
    (running,) = map(decode_activity, rows(agent, "activity"))
    end_job(node_dir, 10, T0 + 105)
    run(agent, clock, T0 + 130)

    (s,) = map(decode_summary, rows(agent, "summary"))
    assert (s.slot_id, s.gpu_uuid, s.measured_by, s.mig_profile) == (
        MIG_A100,
        A100,
        Measurement.MEMORY_ONLY,
        "1g.10gb",
    )
    assert (s.util_mean_percent, s.util_max_percent, s.active_seconds) == (None, None, 0.0)
    assert (s.gpm_seconds, s.sm_active_mean_percent, s.mem_max_bytes) == (0.0, None, 3 * 2**30)
    assert (s.gpu_seconds, s.missing_seconds) == (90.0, 0.0)
    assert s.share == pytest.approx(1 / 7)
    held = [i for i in map(decode_interval, rows(agent, "interval")) if i.job_id == 10]
    assert held and all(i.util_mean_percent is None and i.util_sample_count == 0 for i in held)
    assert (running.util_recent_percent, running.last_active) == (None, None)
    assert running.measured_by is Measurement.MEMORY_ONLY


def test_a_memory_only_slice_without_any_process_is_idle_with_a_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent, clock, gpus, node_dir = make_agent(tmp_path)
    gpus.processes[MIG_A100] = ()
    agent.tick()
    start_job(node_dir, 10, 3, MIG_A100, T0 + 15)
    with caplog.at_level(logging.INFO, logger="slurm_gpu.node.agent"):
        run(agent, clock, T0 + 50)

    (activity,) = map(decode_activity, rows(agent, "activity"))
    assert (activity.util_recent_percent, activity.last_active, activity.process_count) == (
        0.0,
        None,
        0,
    )
    notes = [r.getMessage() for r in caplog.records if "runs no process" in r.getMessage()]
    assert notes == [f"job 10: MIG 1g.10gb {MIG_A100} (memory only, no GPM) runs no process: idle"]


def test_each_mig_gpu_ships_its_physical_totals(tmp_path: Path) -> None:
    """Power, energy, temperature, ECC and memory per GPU and period, whatever its slices."""
    agent, clock, _, node_dir = make_agent(tmp_path)
    agent.tick()
    start_job(node_dir, 7, 0, MIG_3G, T0 + 15)
    run(agent, clock, T0 + 130)

    physical = [p for p in map(decode_physical, rows(agent, "physical")) if p.gpu_uuid == H100]
    assert [(p.period_start, p.period_end) for p in physical] == [
        (T0 - 10, T0),  # the first read's window reaches back one interval
        (T0, T0 + 60),
        (T0 + 60, T0 + 120),
    ]
    full = physical[-1]
    assert (full.covered_seconds, full.temperature_max_celsius, full.ecc_errors_total) == (
        60.0,
        40.0,
        0,
    )
    assert full.power_mean_watts == pytest.approx(100.0)
    assert full.energy_joules == pytest.approx(6000.0)
    assert (full.mem_used_max_bytes, full.mem_total_bytes) == (2**30, 80 * 2**30)


def test_a_slurm_index_follows_the_mig_uuid_slurmd_names(tmp_path: Path) -> None:
    """Without mig-minors no MIG line is numbered: CUDA_VISIBLE_DEVICES binds the slice."""
    agent, clock, _, node_dir = make_agent(tmp_path, minors=None)
    assert agent.index_slot == {}
    agent.tick()
    start_job(node_dir, 9, 2, MIG_1G, T0 + 15)
    run(agent, clock, T0 + 60)
    end_job(node_dir, 9, T0 + 65)
    run(agent, clock, T0 + 80)

    (s,) = map(decode_summary, rows(agent, "summary"))
    assert (s.slot_id, s.gpu_uuid, s.slot_kind, s.gpu_seconds) == (
        MIG_1G,
        H100,
        SlotKind.MIG,
        50.0,
    )
    assert s.util_mean_percent == 0.0 and s.missing_seconds == 0.0
    # MIG GPUs NVML lists, whose lines could not be bound, are not lost GPUs
    (inventory,) = rows(agent, "inventory")
    assert decode_inventory(inventory)[2] == []


def test_inventory_carries_the_mig_devices(tmp_path: Path) -> None:
    agent, _, _, _ = make_agent(tmp_path)
    agent.tick()
    (payload,) = rows(agent, "inventory")
    devices, _, lost = decode_inventory(payload)
    assert [(d.uuid, d.mig_enabled, d.mig_devices) for d in devices] == [
        (H100, True, H100_MIGS),
        (A100, True, A100_MIGS),
    ]
    assert json.loads(payload)["devices"][0]["mig_devices"][0]["profile"] == "3g.40gb"
    assert lost == []


def test_build_agent_reads_mig_minors_where_the_file_exists(tmp_path: Path) -> None:
    minors = tmp_path / "mig-minors"
    minors.write_text(mig_minors_text(1))
    found = node_mig_minors(Config(node=NodeSettings(mig_minors=minors)))
    assert found is not None and found.capability(4) is not None
    assert node_mig_minors(Config(node=NodeSettings(mig_minors=tmp_path / "absent"))) is None
    minors.write_text("config x\n")
    with pytest.raises(ConfigError, match="mig-minors"):
        node_mig_minors(Config(node=NodeSettings(mig_minors=minors)))
