"""The agent's tick with a fake GPU source and an injected clock: attribution and spool."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest

from slurm_gpu.models import GpuDevice, GpuProcess
from slurm_gpu.node.agent import NodeAgent, process_owner
from slurm_gpu.node.outbox import decode_interval, decode_summary
from slurm_gpu.node.spool import Spool
from slurm_gpu.slurm.gres import GresGpuFile
from slurm_gpu.testing import FakeGpuSource, FixedClock

T0 = 1_800_000_000.0  # a round minute, so shipping periods are easy to reason about


# NVML order differs from minors: uuid "B" is minor 0, "A" is minor 1.
DEVICES = [
    GpuDevice("A", "Fake A100", 1, 0, "00:01", 80 * 2**30),
    GpuDevice("B", "Fake A100", 0, 1, "00:02", 80 * 2**30),
]


def write_hook_file(path: Path, fields: dict[str, str], mtime: float) -> None:
    """What the prolog/epilog leave behind: key=value lines, end=1, mtime = event time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in fields.items()) + "end=1\n")
    os.utime(path, (mtime, mtime))


def start_job(node_dir: Path, job: int, indices: list[int], at: float) -> None:
    common = {
        "job_id": str(job),
        "uid": "1001",
        "user": "alice",
        "account": "physics",
        "partition": "gpu",
    }
    for i in indices:
        write_hook_file(node_dir / "bindings" / f"{job}.{i}", {**common, "gpu_index": str(i)}, at)
    gpus = ",".join(map(str, indices))
    write_hook_file(node_dir / "events" / f"{job}.started.1", {**common, "gpu_indices": gpus}, at)


def end_job(node_dir: Path, job: int, at: float) -> None:
    for p in (node_dir / "bindings").glob(f"{job}.*"):
        p.unlink()
    write_hook_file(
        node_dir / "events" / f"{job}.ended.2", {"job_id": str(job), "exit_code": "0"}, at
    )


class DeviceStat:
    """Just the st_rdev of an os.stat result."""

    def __init__(self, rdev: int) -> None:
        self.st_rdev = rdev


def stat_by_minor(path: str) -> os.stat_result:
    """os.stat stand-in: /dev/nvidiaN is character device 195:N."""
    return DeviceStat(os.makedev(195, int(path.rsplit("nvidia", 1)[1])))  # type: ignore[return-value]


GRES = [GresGpuFile(0, "/dev/nvidia0", "a100"), GresGpuFile(1, "/dev/nvidia1", "a100")]


Rig = tuple[NodeAgent, FixedClock, FakeGpuSource, Path]  # the agent, its clock, GPUs, node dir


def make_agent(
    tmp_path: Path, devices: list[GpuDevice] = DEVICES, clock: FixedClock | None = None
) -> Rig:
    """An agent for node gpu1 over fake GPUs, a spool in tmp_path and an injected clock."""
    clock = clock or FixedClock(T0)
    gpus = FakeGpuSource(devices, clock)
    node_dir = tmp_path / "gpu1"
    agent = NodeAgent(
        "gpu1",
        node_dir,
        gpus,
        Spool(tmp_path / "spool.db"),
        GRES,
        interval=10,
        period=60,
        clock=clock,
        pid_job=lambda pid: pid // 1000,
        # the fake pids may be real processes on this machine: never read their /proc
        pid_owner=lambda pid: f"user{pid // 1000}",
        stat=stat_by_minor,
    )
    return agent, clock, gpus, node_dir


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return make_agent(tmp_path)


def run_until(agent: NodeAgent, clock: FixedClock, until: float, step: float = 10) -> None:
    while clock.now < until:
        clock.now += step
        agent.tick()


def outbox(agent: NodeAgent, kind: str) -> list[str]:
    return [p for _, k, _, p in agent.spool.pending(10**6) if k == kind]


def test_slurm_index_maps_to_nvml_device_through_minor(rig: Rig) -> None:
    """Slurm GPU 0 is the device with minor 0 (uuid B), though NVML lists it second."""
    agent, *_ = rig
    assert agent.index_uuid == {0: "B", 1: "A"}


def test_job_summary_has_true_mean_not_diluted_by_time_before_start(rig: Rig) -> None:
    """A job starting mid-window at 80% then ending mid-window reads 80%, not less."""
    agent, clock, gpus, node_dir = rig
    gpus.util["B"] = lambda t: 80.0 if T0 + 15 < t <= T0 + 105 else 0.0
    agent.tick()
    start_job(node_dir, 7, [0], T0 + 15)
    run_until(agent, clock, T0 + 100)
    end_job(node_dir, 7, T0 + 105)
    run_until(agent, clock, T0 + 120)
    (summary,) = [decode_summary(p) for p in outbox(agent, "summary")]
    expected = (7, "B", 90.0, 80.0, 90.0, 0.0)
    actual = (
        summary.job_id,
        summary.gpu_uuid,
        summary.gpu_seconds,
        summary.util_mean_percent,
        summary.active_seconds,
        summary.missing_seconds,
    )
    assert expected == actual


def test_job_intervals_reach_the_outbox_before_its_summary(rig: Rig) -> None:
    """A job ending mid-period: its last interval is queued ahead of its summary.

    So a store that has the summary has every second of it.
    """
    agent, clock, gpus, node_dir = rig
    gpus.util["B"] = lambda t: 40.0
    agent.tick()
    start_job(node_dir, 9, [0], T0 + 5)
    run_until(agent, clock, T0 + 80)
    end_job(node_dir, 9, T0 + 85)
    clock.now += 10
    agent.tick()  # the job's period (T0+60..T0+120) is still open
    queued = [(k, p) for _, k, _, p in agent.spool.pending(10**6) if k in ("interval", "summary")]
    mine = [(k, p) for k, p in queued if k == "summary" or decode_interval(p).job_id == 9]
    kinds = [k for k, _ in mine]
    covered = sum(decode_interval(p).covered_seconds for k, p in mine if k == "interval")
    (summary,) = [decode_summary(p) for k, p in mine if k == "summary"]
    assert (kinds[-1], covered, summary.gpu_seconds) == ("summary", 80.0, 80.0)


def test_intervals_are_per_minute_and_cover_every_second(rig: Rig) -> None:
    """Sealed intervals of one GPU tile the time read, split at minute boundaries."""
    agent, clock, _, _ = rig
    agent.tick()
    run_until(agent, clock, T0 + 130)
    rows = sorted(
        (decode_interval(p) for p in outbox(agent, "interval")), key=lambda r: r.period_start
    )
    a_rows = [r for r in rows if r.gpu_uuid == "A"]
    expected = [(T0 - 10, T0), (T0, T0 + 60), (T0 + 60, T0 + 120)]
    assert expected == [(r.period_start, r.period_end) for r in a_rows]
    assert [10.0, 60.0, 60.0] == [r.covered_seconds for r in a_rows]


def test_agent_down_gap_is_missing_not_idle(rig: Rig) -> None:
    """A job whose GPUs went unread for minutes is flagged missing for that time."""
    agent, clock, gpus, node_dir = rig
    gpus.util["B"] = lambda t: 50.0
    agent.tick()
    start_job(node_dir, 8, [0], T0 + 5)
    run_until(agent, clock, T0 + 60)
    clock.now += 120  # the agent was down: no ticks
    run_until(agent, clock, T0 + 200)
    end_job(node_dir, 8, T0 + 205)
    run_until(agent, clock, T0 + 220)
    (summary,) = [decode_summary(p) for p in outbox(agent, "summary")]
    assert 200.0 == summary.gpu_seconds
    assert summary.missing
    assert 50.0 == summary.util_mean_percent
    # the 120 s unread plus the 10 s the first read after restart could not claim
    assert 110.0 <= summary.missing_seconds <= 130.0


def test_lost_gpu_does_not_stop_the_other(rig: Rig) -> None:
    """A lost GPU leaves its window unread; the other GPU is still recorded."""
    agent, clock, gpus, _ = rig
    gpus.lost.add("A")
    agent.tick()
    run_until(agent, clock, T0 + 70)
    rows = [decode_interval(p) for p in outbox(agent, "interval")]
    assert {"B"} == {r.gpu_uuid for r in rows}


def test_process_of_another_job_is_unallocated_use(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A pid of job 9 on a GPU bound to job 8 is reported.

    It is logged once, with its job and the Slurm GPU index.
    """
    agent, clock, gpus, node_dir = rig
    start_job(node_dir, 8, [0], T0 - 5)
    gpus.processes["B"] = (GpuProcess(8001, 2**30), GpuProcess(9001, 2**30))  # job: pid // 1000
    clock.now += 10
    result = agent.tick()
    clock.now += 10
    agent.tick()
    assert {"B": (9001,)} == result.unallocated
    logged = [r.getMessage() for r in caplog.records if "unallocated" in r.getMessage()]
    assert [
        "unallocated GPU use: pid 9001 (user user9, Slurm job 9) on GPU 0 (B) belongs to no job"
        " holding it"
    ] == logged


def test_events_are_spooled_once_and_files_removed(rig: Rig) -> None:
    """Hook event files become outbox rows and are deleted from the events dir."""
    agent, clock, _, node_dir = rig
    start_job(node_dir, 5, [0, 1], T0)
    clock.now += 10
    agent.tick()
    agent.tick()
    assert 1 == len(outbox(agent, "event"))
    assert [] == list((node_dir / "events").iterdir())


def test_running_job_activity_tracks_the_last_busy_sample(rig: Rig) -> None:
    """The activity row of a running job names the newest sample above the threshold."""
    agent, clock, gpus, node_dir = rig
    gpus.util["B"] = lambda t: 90.0 if t <= T0 + 12 else 0.0
    start_job(node_dir, 4, [0], T0 - 5)
    run_until(agent, clock, T0 + 30)
    (payload,) = outbox(agent, "activity")
    activity = json.loads(payload)
    expected = (4, "B", 0, T0 + 12, T0 + 30, 0.0)
    actual = (
        activity["job_id"],
        activity["gpu_uuid"],
        activity["slurm_index"],
        activity["last_active"],
        activity["last_reading"],
        activity["util_recent_percent"],
    )
    assert expected == actual


def test_binding_without_started_event_is_adopted(rig: Rig) -> None:
    """The prolog's event was lost (disk full, crash): the binding alone suffices.

    It attributes the GPU to the job from the binding's time, and the job is summarized
    at its end.
    """
    agent, clock, gpus, node_dir = rig
    gpus.util["B"] = lambda t: 70.0
    agent.tick()
    start_job(node_dir, 11, [0], T0 + 5)
    (node_dir / "events" / "11.started.1").unlink()
    run_until(agent, clock, T0 + 60)
    end_job(node_dir, 11, T0 + 65)
    run_until(agent, clock, T0 + 80)
    (summary,) = [decode_summary(p) for p in outbox(agent, "summary")]
    expected = (11, "B", "alice", 60.0, 70.0, 0.0)
    actual = (
        summary.job_id,
        summary.gpu_uuid,
        summary.user,
        summary.gpu_seconds,
        summary.util_mean_percent,
        summary.missing_seconds,
    )
    assert expected == actual


def test_process_owner_reads_the_real_uid(tmp_path: Path) -> None:
    """This process's owner by name; a gone process or an unnamed uid do not raise."""
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "status").write_text("Name:\tx\nUid:\t987654\t0\t0\t0\n")
    owners = (process_owner(os.getpid()), process_owner(77, tmp_path), process_owner(78, tmp_path))
    assert (pwd.getpwuid(os.getuid()).pw_name, "987654", "?") == owners


def test_ending_job_never_gets_the_next_jobs_memory(rig: Rig) -> None:
    """Job 7 ends and job 8 starts on one GPU within one tick: 7 keeps its own peak memory.

    The read at T0+20 sees job 8's 40 GiB; job 7 used 1 GiB until it ended at T0+15.
    """
    agent, clock, gpus, node_dir = rig
    gpus.mem_used_bytes = 2**30
    start_job(node_dir, 7, [0], T0 - 15)
    clock.now += 10
    agent.tick()  # T0+10: job 7 reads 1 GiB
    end_job(node_dir, 7, T0 + 15)
    start_job(node_dir, 8, [0], T0 + 17)
    gpus.mem_used_bytes = 40 * 2**30
    clock.now += 10
    agent.tick()  # T0+20: 40 GiB, job 8's
    (summary,) = [decode_summary(p) for p in outbox(agent, "summary")]
    expected = (7, 2**30, 15.0)  # job, peak bytes, GiB-seconds (1 GiB for the 15 s read)
    assert expected == (summary.job_id, summary.mem_max_bytes, summary.mem_gib_seconds)


def test_job_inside_one_window_has_unknown_memory(rig: Rig) -> None:
    """A job that started and ended between two reads was never measured: memory unknown.

    It does not get the memory the GPU held at the next read (another job's).
    """
    agent, clock, gpus, node_dir = rig
    gpus.mem_used_bytes = 30 * 2**30
    agent.tick()
    start_job(node_dir, 5, [0], T0 + 2)
    end_job(node_dir, 5, T0 + 4)
    start_job(node_dir, 6, [0], T0 + 6)
    clock.now += 10
    agent.tick()
    (summary,) = [decode_summary(p) for p in outbox(agent, "summary")]
    assert (5, None, 0.0) == (summary.job_id, summary.mem_max_bytes, summary.mem_gib_seconds)


def start_run(node_dir: Path, job: int, index: int, restart: int, at: float) -> None:
    """The prolog of one run of a requeued job (SLURM_RESTART_COUNT=restart)."""
    common = {"job_id": str(job), "user": "alice", "account": "physics"}
    if restart:
        common["restart"] = str(restart)
    binding = {**common, "gpu_index": str(index)}
    write_hook_file(node_dir / "bindings" / f"{job}.{index}", binding, at)
    event = {**common, "gpu_indices": str(index)}
    write_hook_file(node_dir / "events" / f"{job}.started.{100 + restart}", event, at)


def end_run(node_dir: Path, job: int, restart: int, at: float) -> None:
    """The epilog of one run of a requeued job."""
    for p in (node_dir / "bindings").glob(f"{job}.*"):
        p.unlink()
    fields = {"job_id": str(job), "exit_code": "0"}
    if restart:
        fields["restart"] = str(restart)
    write_hook_file(node_dir / "events" / f"{job}.ended.{200 + restart}", fields, at)


def test_requeued_job_has_one_summary_per_run(rig: Rig) -> None:
    """Run 0 on GPU 0, run 1 on GPU 1: two summaries, each with its own run's time.

    Run 1 starts on the same tick as run 0's end is seen, and its span is kept.
    """
    agent, clock, gpus, node_dir = rig
    gpus.util["B"] = lambda t: 60.0
    gpus.util["A"] = lambda t: 30.0
    agent.tick()
    start_run(node_dir, 21, 0, 0, T0 + 5)
    run_until(agent, clock, T0 + 40)
    end_run(node_dir, 21, 0, T0 + 45)
    start_run(node_dir, 21, 1, 1, T0 + 48)
    run_until(agent, clock, T0 + 100)
    end_run(node_dir, 21, 1, T0 + 105)
    run_until(agent, clock, T0 + 120)
    summaries = sorted((decode_summary(p) for p in outbox(agent, "summary")), key=lambda s: s.start)
    expected = [("B", 40.0, 60.0, 0.0), ("A", 57.0, 30.0, 0.0)]
    actual = [
        (s.gpu_uuid, s.gpu_seconds, s.util_mean_percent, s.missing_seconds) for s in summaries
    ]
    assert expected == actual
    assert [0, 1] == [getattr(s, "restart", None) for s in summaries]


def test_requeued_job_on_the_same_gpu_keeps_both_runs(rig: Rig) -> None:
    """Both runs on GPU 0, the second starting 3 s after the first ended: two summaries.

    Neither run's time nor readings are merged into the other's.
    """
    agent, clock, gpus, node_dir = rig
    gpus.util["B"] = lambda t: 80.0 if t <= T0 + 45 else 20.0
    agent.tick()
    start_run(node_dir, 22, 0, 0, T0 + 5)
    run_until(agent, clock, T0 + 40)
    end_run(node_dir, 22, 0, T0 + 45)
    start_run(node_dir, 22, 0, 1, T0 + 48)
    run_until(agent, clock, T0 + 100)
    end_run(node_dir, 22, 1, T0 + 105)
    run_until(agent, clock, T0 + 120)
    summaries = sorted((decode_summary(p) for p in outbox(agent, "summary")), key=lambda s: s.start)
    expected = [(T0 + 5, T0 + 45, 80.0), (T0 + 48, T0 + 105, 20.0)]
    assert expected == [(s.start, s.end, s.util_mean_percent) for s in summaries]
    events = [json.loads(p) for p in outbox(agent, "event")]
    assert [0, 0, 1, 1] == sorted(e.get("restart", 0) for e in events)


def test_requeued_runs_epilog_with_the_bumped_restart_count_ends_its_own_run(rig: Rig) -> None:
    """Slurm counts the requeue before the requeued run's epilog: that epilog says 1.

    Seen on Slurm 22.05: run 0's prolog has no count, its epilog SLURM_JOB_RESTART_COUNT=1,
    and run 1's prolog and epilog 1. The epilog ends the run open on the node (run 0), so
    both runs are summarized with their own times and nothing is left open.
    """
    agent, clock, gpus, node_dir = rig
    gpus.util["B"] = lambda t: 80.0 if t <= T0 + 45 else 20.0
    agent.tick()
    start_run(node_dir, 24, 0, 0, T0 + 5)
    run_until(agent, clock, T0 + 40)
    for p in (node_dir / "bindings").glob("24.*"):
        p.unlink()
    run0_end = {"job_id": "24", "exit_code": "0", "restart": "1"}
    write_hook_file(node_dir / "events" / "24.ended.301", run0_end, T0 + 45)
    start_run(node_dir, 24, 0, 1, T0 + 48)
    run_until(agent, clock, T0 + 100)
    end_run(node_dir, 24, 1, T0 + 105)
    run_until(agent, clock, T0 + 120)
    summaries = sorted((decode_summary(p) for p in outbox(agent, "summary")), key=lambda s: s.start)
    expected = [(0, T0 + 5, T0 + 45, 80.0), (1, T0 + 48, T0 + 105, 20.0)]
    assert expected == [(s.restart, s.start, s.end, s.util_mean_percent) for s in summaries]


def start_het_component(node_dir: Path, job: int, leader: int, offset: int, index: int) -> None:
    """The prolog of one component of a heterogeneous job (SLURM_HET_JOB_ID/OFFSET set)."""
    common = {
        "job_id": str(job),
        "user": "alice",
        "het_job_id": str(leader),
        "het_job_offset": str(offset),
    }
    write_hook_file(
        node_dir / "bindings" / f"{job}.{index}", {**common, "gpu_index": str(index)}, T0
    )
    event = {**common, "gpu_indices": str(index)}
    write_hook_file(node_dir / "events" / f"{job}.started.{job}", event, T0)


def test_het_component_process_with_the_leaders_job_id_is_its_own(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """Component 31 (leader 30) holds GPU 0; its task says SLURM_JOB_ID=30: not unallocated.

    `srun --het-group=1` tasks carry the leader's job id; the GPU is the component's.
    A pid of an unrelated job 9 on that GPU is still reported.
    """
    agent, clock, gpus, node_dir = rig
    start_het_component(node_dir, 30, 30, 0, 1)
    start_het_component(node_dir, 31, 30, 1, 0)
    gpus.processes["B"] = (GpuProcess(30001, 2**30), GpuProcess(9001, 2**30))  # job: pid // 1000
    gpus.processes["A"] = (GpuProcess(30002, 2**30),)
    clock.now += 10
    result = agent.tick()
    assert {"B": (9001,)} == result.unallocated
    assert 1 == sum("unallocated GPU use" in r.getMessage() for r in caplog.records)


def test_requeued_job_without_a_restart_count_is_two_runs(rig: Rig) -> None:
    """slurmd gave no SLURM_RESTART_COUNT: a prolog after the job's epilog is run 1.

    Both runs on GPU 0, the second starting 3 s after the first ended.
    """
    agent, clock, gpus, node_dir = rig
    gpus.util["B"] = lambda t: 80.0 if t <= T0 + 45 else 20.0
    agent.tick()
    start_run(node_dir, 23, 0, 0, T0 + 5)
    run_until(agent, clock, T0 + 40)
    end_run(node_dir, 23, 0, T0 + 45)
    start_job(node_dir, 23, [0], T0 + 48)
    run_until(agent, clock, T0 + 100)
    end_job(node_dir, 23, T0 + 105)
    run_until(agent, clock, T0 + 120)
    summaries = sorted((decode_summary(p) for p in outbox(agent, "summary")), key=lambda s: s.start)
    expected = [(0, T0 + 5, 80.0), (1, T0 + 48, 20.0)]
    assert expected == [(s.restart, s.start, s.util_mean_percent) for s in summaries]
    keys = sorted(k for _, kind, k, _ in agent.spool.pending(10**6) if kind == "event")
    assert ["gpu1:23:ended", "gpu1:23:ended:1", "gpu1:23:started", "gpu1:23:started:1"] == keys
