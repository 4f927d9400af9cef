"""idle_gpu with `signal = "sm_active"` (#13): SM activity decides, utilization where unmeasured.

A fake-busy GPU (duty cycle ~100%, SM activity ~1%) is idle by SM activity: warned, then
cancelled after the grace period; a busy GPU is left alone; a GPU without GPM (an A100)
is judged by utilization and every verdict says so.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from slurm_gpu.config import Config
from slurm_gpu.models import Action, GpuActivity, Verdict
from slurm_gpu.policy.rules import evaluate
from tests.unit.test_policy_idle import MIN, NOW, START, config, job


def sm_config(
    sm_threshold: float = 5.0, signal: Literal["util", "sm_active"] = "sm_active"
) -> Config:
    """The idle tests' config (warn 45m, cancel 60m, UTC) with this signal and SM threshold."""
    base = config(signal=signal)
    node = dataclasses.replace(base.node, sm_active_threshold_percent=sm_threshold)
    return dataclasses.replace(base, node=node)


def gpu(
    index: int = 0,
    *,
    node: str = "gpu1",
    sm_idle_minutes: float | None = None,
    sm: float | None = 1.0,
    util: float = 100.0,
    util_idle_minutes: float | None = 0.1,
) -> GpuActivity:
    """A GPU whose SMs were last active `sm_idle_minutes` ago (sm None: no GPM here).

    Its duty cycle reads `util` now and was last at or above 5% `util_idle_minutes` ago.
    """
    measured = sm is not None
    return GpuActivity(
        job_id=1,
        node=node,
        gpu_uuid=f"GPU-{node}-{index}",
        slurm_index=index,
        start=START,
        last_reading=NOW - 5,
        last_active=None if util_idle_minutes is None else NOW - util_idle_minutes * MIN,
        util_recent_percent=util,
        mem_used_bytes=0,
        process_count=1,
        sm_active_recent_percent=sm,
        last_sm_active=(
            NOW - sm_idle_minutes * MIN if measured and sm_idle_minutes is not None else None
        ),
    )


FAKE_BUSY = gpu(sm_idle_minutes=47)


def test_fake_busy_gpu_is_warned_by_sm_activity() -> None:
    """Duty cycle 100%, SM activity 1% for 47 min: a warning that names SM activity."""
    expected = [
        Verdict(
            policy="idle_gpu",
            action=Action.WARN,
            target="job:1",
            reason=(
                "GPU 0 on gpu1 of job 1 has been below 5% SM activity for 47 min; the job "
                "will be cancelled at 10:15 unless it is used."
            ),
            job_id=1,
            user="alice",
            account="physics",
            deadline=NOW + 15 * MIN,
            details=(
                ("idle_seconds", 47 * MIN),
                ("threshold_percent", 5.0),
                ("window", "sliding"),
                ("gpus", 1),
                ("signal", "sm_active"),
                ("sm_threshold_percent", 5.0),
                ("judged_by_util_gpus", 0),
            ),
        )
    ]
    assert expected == evaluate([job()], [FAKE_BUSY], NOW, sm_config())


def test_fake_busy_gpu_is_cancelled_after_the_grace_period() -> None:
    """Idle by SM activity 61 min, warned 16 min ago (grace 15): cancelled, the reason says why."""
    warned = {(1, "idle_gpu"): NOW - 16 * MIN}
    verdicts = evaluate([job()], [gpu(sm_idle_minutes=61)], NOW, sm_config(), warned=warned)
    expected = [
        (
            Action.CANCEL,
            "Job 1 cancelled: GPU 0 on gpu1 had been below 5% SM activity for 1 h 1 min, and "
            "the warning at 09:44 went unanswered.",
        )
    ]
    assert expected == [(v.action, v.reason) for v in verdicts]


def test_fake_busy_gpu_is_not_cancelled_within_the_grace_period() -> None:
    """Idle 61 min but warned only 10 min ago: still a warning, due 5 min from now."""
    warned = {(1, "idle_gpu"): NOW - 10 * MIN}
    verdicts = evaluate([job()], [gpu(sm_idle_minutes=61)], NOW, sm_config(), warned=warned)
    assert [(Action.WARN, NOW + 5 * MIN)] == [(v.action, v.deadline) for v in verdicts]


def test_fake_busy_gpu_is_busy_by_utilization() -> None:
    """The same GPU with signal "util": its duty cycle is 100%, so no verdict (why sm_active)."""
    expected: list[Verdict] = []
    assert expected == evaluate([job()], [FAKE_BUSY], NOW, sm_config(signal="util"))


def test_busy_gpu_is_left_alone() -> None:
    """SM activity 60% now, last active 5 s ago: in use, no verdict."""
    expected: list[Verdict] = []
    assert expected == evaluate([job()], [gpu(sm=60.0, sm_idle_minutes=0.1)], NOW, sm_config())


def test_recent_sm_activity_at_the_threshold_is_use() -> None:
    """The newest GPM window at 20% with [node] sm_active_threshold_percent = 20 is use."""
    rows = [gpu(sm=20.0, sm_idle_minutes=50)]
    expected: list[Verdict] = []
    assert expected == evaluate([job()], rows, NOW, sm_config(sm_threshold=20.0))


def test_sm_threshold_is_the_node_key() -> None:
    """SM activity 15% (newest window) is idle under a threshold of 20: warned, "below 20%"."""
    verdicts = evaluate([job()], [gpu(sm=15.0, sm_idle_minutes=50)], NOW, sm_config(20.0))
    assert ["GPU 0 on gpu1 of job 1 has been below 20% SM activity for 50 min"] == [
        v.reason.split(";")[0] for v in verdicts
    ]


def test_a100_falls_back_to_utilization_and_says_so() -> None:
    """No GPM (an A100), duty cycle under 5% for 47 min: warned by utilization, with the note."""
    a100 = gpu(sm=None, util=0.0, util_idle_minutes=47)
    verdicts = evaluate([job()], [a100], NOW, sm_config())
    expected = [
        (
            Action.WARN,
            "GPU 0 on gpu1 of job 1 has been below 5% utilization for 47 min; the job will be "
            "cancelled at 10:15 unless it is used. SM activity not measured on GPU 0 on gpu1: "
            "judged by utilization.",
            1,
        )
    ]
    assert expected == [
        (v.action, v.reason, dict(v.details)["judged_by_util_gpus"]) for v in verdicts
    ]


def test_a100_with_a_busy_duty_cycle_is_left_alone() -> None:
    """Without GPM nothing says its SMs idle: a 100% duty cycle is use (unknown is not idle)."""
    expected: list[Verdict] = []
    assert expected == evaluate([job()], [gpu(sm=None)], NOW, sm_config())


def test_mixed_job_names_both_signals() -> None:
    """A fake-busy H100 and an idle A100, both idle 50 min: one warning that names each rule."""
    rows = [
        gpu(0, node="gpu2", sm_idle_minutes=50),
        gpu(0, sm=None, util=0.0, util_idle_minutes=50),
    ]
    two = dataclasses.replace(job(), gpus=(("gpu1", (0,)), ("gpu2", (0,))), gpu_count=2)
    verdicts = evaluate([two], rows, NOW, sm_config())
    expected = [
        "GPU 0 on gpu1 and GPU 0 on gpu2 of job 1 have been below 5% SM activity (5% "
        "utilization where it is not measured) for 50 min; the job will be cancelled at 10:15 "
        "unless they are used. SM activity not measured on GPU 0 on gpu1: judged by "
        "utilization."
    ]
    assert expected == [v.reason for v in verdicts]


def test_fake_busy_and_busy_gpu_get_a_notice_not_a_cancel() -> None:
    """One fake-busy GPU beside a busy one: a notice (fewer GPUs), never a warning."""
    two = dataclasses.replace(job(), gpus=(("gpu1", (0, 1)),), gpu_count=2)
    rows = [gpu(0, sm_idle_minutes=61), gpu(1, sm=70.0, sm_idle_minutes=0.1)]
    verdicts = evaluate([two], rows, NOW, sm_config())
    expected = [
        (
            Action.NOTICE,
            "GPU 0 on gpu1 of job 1 has been below 5% SM activity for 1 h 1 min while GPU 1 on "
            "gpu1 is in use; consider asking for fewer GPUs. The job will not be cancelled for "
            "this.",
        )
    ]
    assert expected == [(v.action, v.reason) for v in verdicts]
