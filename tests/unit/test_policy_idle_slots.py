"""slurm_gpu.policy.rules, idle_gpu per GPU slot (issue 14): MIG slices, shards, MPS.

Each slot is judged by its own activity row: a MIG slice by its GPM activity, a share by
its own processes; a memory-only slice with processes is unknown (never idle); a slot
held with no process is idle, and the reason says so. Reasons name the slot.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slurm_gpu.models import Action, GpuActivity, Measurement, SlotKind, SlurmJob, Verdict
from slurm_gpu.policy.rules import evaluate
from tests.unit.test_policy_idle import CONFIG, MIN, NOW, START, job

PARENT = "GPU-aaaa"


def slot(
    kind: SlotKind,
    *,
    job_id: int = 1,
    index: int = 0,
    idle_minutes: float | None = None,
    util: float | None = 0.0,
    process_count: int | None = 1,
    measured_by: Measurement = Measurement.GPM,
    slot_id: str = "MIG-1111",
    share: float = 1 / 7,
    profile: str = "1g.10gb",
) -> GpuActivity:
    """A slot of GPU-aaaa on gpu3 last active `idle_minutes` ago (None: never)."""
    values: dict[str, Any] = {
        "job_id": job_id,
        "node": "gpu3",
        "gpu_uuid": PARENT,
        "slurm_index": index,
        "start": START,
        "last_reading": NOW - 5,
        "last_active": None if idle_minutes is None else NOW - idle_minutes * MIN,
        "util_recent_percent": util,
        "mem_used_bytes": 0,
        "process_count": process_count,
        "slot_id": slot_id,
        "slot_kind": kind,
        "share": share,
        "mig_profile": profile if kind is SlotKind.MIG else "",
        "measured_by": measured_by,
    }
    return GpuActivity(**values)


def shard(job_id: int, **fields: Any) -> GpuActivity:
    """Job `job_id`'s shard 2/8 of GPU-aaaa, measured per process."""
    values: dict[str, Any] = {
        "job_id": job_id,
        "slot_id": f"{PARENT}/shard/{job_id}",
        "share": 0.25,
        "measured_by": Measurement.PER_PROCESS,
    }
    values.update(fields)
    return slot(SlotKind.SHARD, **values)


def mig_job(job_id: int = 1, *indices: int) -> SlurmJob:
    """Job `job_id` on gpu3 holding Slurm GPU indices `indices` (default 0)."""
    held = indices or (0,)
    return dataclasses.replace(
        job(job_id), nodes=("gpu3",), gpus=(("gpu3", held),), gpu_count=len(held)
    )


def test_busy_mig_slice_gets_no_verdict() -> None:
    """A 1g.10gb slice at 20% GPM activity is in use."""
    expected: list[Verdict] = []
    rows = [slot(SlotKind.MIG, idle_minutes=None, util=20.0)]
    assert expected == evaluate([mig_job()], rows, NOW, CONFIG)


def test_idle_mig_slice_warning_names_the_slice() -> None:
    """A slice idle 47 min by its GPM activity: WARN naming the MIG profile and UUID."""
    verdicts = evaluate([mig_job()], [slot(SlotKind.MIG, idle_minutes=47)], NOW, CONFIG)
    expected = [
        (
            Action.WARN,
            "MIG 1g.10gb slice MIG-1111 on gpu3 of job 1 has been below 5% utilization for "
            "47 min; the job will be cancelled at 10:15 unless it is used.",
        )
    ]
    assert expected == [(v.action, v.reason) for v in verdicts]


def test_idle_mig_slice_cancel_after_warning_names_the_slice() -> None:
    """Warned 16 min ago, idle 61 min: CANCEL, its reason (the audit's) naming the slice."""
    warned = {(1, "idle_gpu"): NOW - 16 * MIN}
    verdicts = evaluate(
        [mig_job()], [slot(SlotKind.MIG, idle_minutes=61)], NOW, CONFIG, warned=warned
    )
    expected = [
        (
            Action.CANCEL,
            "Job 1 cancelled: MIG 1g.10gb slice MIG-1111 on gpu3 had been below 5% utilization "
            "for 1 h 1 min, and the warning at 09:44 went unanswered.",
        )
    ]
    assert expected == [(v.action, v.reason) for v in verdicts]


def test_idle_mig_slice_is_not_cancelled_without_a_warning() -> None:
    """Idle 61 min but never warned: a WARN first, never a CANCEL."""
    verdicts = evaluate([mig_job()], [slot(SlotKind.MIG, idle_minutes=61)], NOW, CONFIG)
    assert [Action.WARN] == [v.action for v in verdicts]


def test_shard_judged_by_its_own_processes_not_its_neighbours() -> None:
    """Two jobs' shards of one GPU: the idle one is warned, the busy one is not."""
    jobs = [mig_job(1), mig_job(2)]
    rows = [shard(1, idle_minutes=50, util=0.0), shard(2, idle_minutes=None, util=80.0)]
    verdicts = evaluate(jobs, rows, NOW, CONFIG)
    expected = [
        (
            1,
            Action.WARN,
            "shard 1/4 of GPU-aaaa on gpu3 of job 1 has been below 5% utilization for 50 min; "
            "the job will be cancelled at 10:15 unless it is used.",
        )
    ]
    assert expected == [(v.job_id, v.action, v.reason) for v in verdicts]


def test_shard_job_without_gpus_in_squeue_is_judged_by_its_share() -> None:
    """squeue shows no GPU for a gres/shard job; its share row makes it judged anyway."""
    bare = dataclasses.replace(job(3), nodes=("gpu3",), gpus=(), gpu_count=0)
    verdicts = evaluate([bare], [shard(3, idle_minutes=50)], NOW, CONFIG)
    assert [(3, Action.WARN)] == [(v.job_id, v.action) for v in verdicts]


def test_memory_only_slice_with_processes_is_never_idle() -> None:
    """An Ampere slice (memory only, no utilization) with a process: no verdict at all."""
    row = slot(SlotKind.MIG, util=None, idle_minutes=None, measured_by=Measurement.MEMORY_ONLY)
    expected: list[Verdict] = []
    assert expected == evaluate([mig_job()], [row], NOW, CONFIG)


def test_memory_only_slice_next_to_an_idle_gpu_is_unknown_not_idle() -> None:
    """An idle whole GPU and a memory-only slice in use by processes: NONE, saying why."""
    whole = GpuActivity(
        job_id=1,
        node="gpu3",
        gpu_uuid="GPU-bbbb",
        slurm_index=1,
        start=START,
        last_reading=NOW - 5,
        last_active=None,
        util_recent_percent=0.0,
        mem_used_bytes=0,
        process_count=0,
    )
    row = slot(SlotKind.MIG, util=None, measured_by=Measurement.MEMORY_ONLY)
    both = mig_job(1, 0, 1)
    verdicts = evaluate([both], [row, whole], NOW, CONFIG)
    expected = [
        (
            Action.NONE,
            "Not judged idle: MIG 1g.10gb slice MIG-1111 on gpu3 is measured by memory only "
            "(utilization not measured on an Ampere MIG slice), with processes of the job: the "
            "GPU use of job 1 is unknown, and unknown is never treated as idle.",
            (("unmeasured_slots", 1),),
        )
    ]
    assert expected == [(v.action, v.reason, v.details) for v in verdicts]


def test_warned_job_whose_slice_becomes_unknown_is_suspended() -> None:
    """A warned job whose other slot is unknown: the warning is suspended, no cancel."""
    idle = slot(SlotKind.MIG, idle_minutes=70, index=0)
    unknown = slot(
        SlotKind.MIG,
        index=1,
        slot_id="MIG-2222",
        util=None,
        measured_by=Measurement.MEMORY_ONLY,
    )
    both = mig_job(1, 0, 1)
    warned = {(1, "idle_gpu"): NOW - 30 * MIN}
    verdicts = evaluate([both], [idle, unknown], NOW, CONFIG, warned=warned)
    expected = [
        (
            Action.NONE,
            "Warning suspended: MIG 1g.10gb slice MIG-2222 on gpu3 is measured by memory only "
            "(utilization not measured on an Ampere MIG slice), with processes of the job: the "
            "GPU use of job 1 is unknown, and unknown is never treated as idle.",
        )
    ]
    assert expected == [(v.action, v.reason) for v in verdicts]


def test_memory_only_slice_held_with_no_process_is_idle_and_says_so() -> None:
    """A memory-only slice with no process of its job: idle, "held, no process"."""
    row = slot(SlotKind.MIG, util=None, process_count=0, measured_by=Measurement.MEMORY_ONLY)
    verdicts = evaluate([mig_job()], [row], NOW, CONFIG)
    expected = [
        (
            Action.WARN,
            "MIG 1g.10gb slice MIG-1111 on gpu3 of job 1 has been below 5% utilization for "
            "3 h; the job will be cancelled at 10:15 unless it is used. MIG 1g.10gb slice "
            "MIG-1111 on gpu3: held, no process.",
        )
    ]
    assert expected == [(v.action, v.reason) for v in verdicts]


def test_share_whose_per_process_read_failed_is_unknown() -> None:
    """A share with no per-process figure and processes: not idle (no verdict)."""
    row = shard(1, util=None, idle_minutes=None, process_count=None)
    expected: list[Verdict] = []
    assert expected == evaluate([mig_job()], [row], NOW, CONFIG)


def test_mps_share_held_with_no_process_is_idle_and_says_so() -> None:
    """An MPS share with no process of its job: idle, the note says so."""
    row = slot(
        SlotKind.MPS,
        slot_id=f"{PARENT}/mps/1",
        share=0.5,
        process_count=0,
        measured_by=Measurement.PER_PROCESS,
        idle_minutes=50,
    )
    verdicts = evaluate([mig_job()], [row], NOW, CONFIG)
    expected = [
        "MPS 1/2 of GPU-aaaa on gpu3 of job 1 has been below 5% utilization for 50 min; the "
        "job will be cancelled at 10:15 unless it is used. MPS 1/2 of GPU-aaaa on gpu3: held, "
        "no process."
    ]
    assert expected == [v.reason for v in verdicts]
