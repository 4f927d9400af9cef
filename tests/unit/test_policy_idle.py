"""slurm_gpu.policy.rules, idle_gpu: warn, grace, cancel, notice, unknown is not idle."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from slurm_gpu.config import Config
from slurm_gpu.config.policy import ControllerSettings, IdleGpuSettings, PolicySettings
from slurm_gpu.durations import Duration
from slurm_gpu.models import Action, Exemption, GpuActivity, SlurmJob, Verdict
from slurm_gpu.policy.rules import evaluate

NOW = 1_717_236_000.0  # 2024-06-01 10:00:00 UTC
MIN = 60.0
START = NOW - 3 * 3600  # every job here started three hours ago
GIB = 1024**3


def config(threshold_percent: float = 5.0, **idle: Any) -> Config:
    """Defaults (warn 45m, cancel 60m, 5%, sliding), UTC, max_runtime off; `idle` overrides.

    `threshold_percent` is [node] active_threshold_percent, the idle policy's threshold.
    """
    base = Config()
    policy = PolicySettings(
        idle_gpu=dataclasses.replace(IdleGpuSettings(), **idle),
        max_runtime=dataclasses.replace(base.policy.max_runtime, enabled=False),
    )
    node = dataclasses.replace(base.node, active_threshold_percent=threshold_percent)
    return dataclasses.replace(
        base, node=node, controller=ControllerSettings(timezone="UTC"), policy=policy
    )


CONFIG = config()


def job(job_id: int = 1, gpus: tuple[int, ...] = (0,), **fields: Any) -> SlurmJob:
    values: dict[str, Any] = {
        "job_id": job_id,
        "user": "alice",
        "account": "physics",
        "partition": "gpu",
        "state": "RUNNING",
        "name": "train",
        "qos": "normal",
        "start_time": START,
        "nodes": ("gpu1",),
        "gpus": (("gpu1", gpus),),
        "gpu_count": len(gpus),
    }
    values.update(fields)
    return SlurmJob(**values)


def gpu(
    index: int = 0,
    *,
    job_id: int = 1,
    idle_minutes: float | None = None,
    last_reading: float = NOW - 5,
    mem_used_bytes: int | None = 0,
    process_count: int | None = 0,
    util: float | None = 0.0,
) -> GpuActivity:
    """A GPU last active `idle_minutes` ago (None: never active since the job started)."""
    return GpuActivity(
        job_id=job_id,
        node="gpu1",
        gpu_uuid=f"GPU-{index}",
        slurm_index=index,
        start=START,
        last_reading=last_reading,
        last_active=None if idle_minutes is None else NOW - idle_minutes * MIN,
        util_recent_percent=util,
        mem_used_bytes=mem_used_bytes,
        process_count=process_count,
    )


def actions(verdicts: list[Verdict]) -> list[tuple[str, Action, int | None]]:
    return [(v.policy, v.action, v.job_id) for v in verdicts]


def test_busy_job_gets_no_verdict() -> None:
    """A GPU active a minute ago is not idle."""
    expected: list[Verdict] = []
    assert expected == evaluate([job()], [gpu(idle_minutes=1)], NOW, CONFIG)


def test_warning_after_warn_after() -> None:
    """Idle 47 min (warn at 45): a WARN whose deadline allows the full 15 min grace."""
    expected = [
        Verdict(
            policy="idle_gpu",
            action=Action.WARN,
            target="job:1",
            reason=(
                "GPU 0 on gpu1 of job 1 has been below 5% utilization for 47 min; the job "
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
            ),
        )
    ]
    assert expected == evaluate([job()], [gpu(idle_minutes=47)], NOW, CONFIG)


def test_no_warning_before_warn_after() -> None:
    """Idle 44 min (warn at 45): nothing yet."""
    expected: list[Verdict] = []
    assert expected == evaluate([job()], [gpu(idle_minutes=44)], NOW, CONFIG)


def test_cancel_after_warning_and_grace() -> None:
    """Idle 61 min and warned 16 min ago (grace 15 min): CANCEL."""
    warned = {(1, "idle_gpu"): NOW - 16 * MIN}
    verdicts = evaluate([job()], [gpu(idle_minutes=61)], NOW, CONFIG, warned=warned)
    expected = [("idle_gpu", Action.CANCEL, 1)]
    assert expected == actions(verdicts)


def test_cancel_reason_names_gpus_duration_and_warning() -> None:
    """The cancel reason says which GPUs, how long, and when the user was warned."""
    warned = {(1, "idle_gpu"): NOW - 16 * MIN}
    verdicts = evaluate([job()], [gpu(idle_minutes=61)], NOW, CONFIG, warned=warned)
    expected = (
        "Job 1 cancelled: GPU 0 on gpu1 had been below 5% utilization for 1 h 1 min, and the "
        "warning at 09:44 went unanswered."
    )
    assert expected == verdicts[0].reason


def test_never_cancel_without_a_warning() -> None:
    """Idle 2 h but never warned (e.g. the controller just started): WARN, cancel in 15 min."""
    verdicts = evaluate([job()], [gpu(idle_minutes=120)], NOW, CONFIG)
    expected = [(Action.WARN, NOW + 15 * MIN)]
    assert expected == [(v.action, v.deadline) for v in verdicts]


def test_warning_too_recent_for_cancel() -> None:
    """Idle 61 min, warned 5 min ago: still WARN; the cancel comes 15 min after the warning."""
    warned = {(1, "idle_gpu"): NOW - 5 * MIN}
    verdicts = evaluate([job()], [gpu(idle_minutes=61)], NOW, CONFIG, warned=warned)
    expected = [(Action.WARN, NOW + 10 * MIN)]
    assert expected == [(v.action, v.deadline) for v in verdicts]


def test_warning_from_an_earlier_idle_stretch_does_not_count() -> None:
    """A warning older than the current idle stretch (the job was used since): WARN again."""
    warned = {(1, "idle_gpu"): NOW - 3 * 3600 + 50 * MIN}
    verdicts = evaluate([job()], [gpu(idle_minutes=61)], NOW, CONFIG, warned=warned)
    expected = [(Action.WARN, NOW + 15 * MIN)]
    assert expected == [(v.action, v.deadline) for v in verdicts]


def test_partial_idle_is_a_notice() -> None:
    """GPU 0 idle for 2 h while GPU 1 is busy: a NOTICE, never a cancel."""
    activity = [gpu(0, idle_minutes=120), gpu(1, idle_minutes=1)]
    warned = {(1, "idle_gpu"): NOW - 3600}
    verdicts = evaluate([job(gpus=(0, 1))], activity, NOW, CONFIG, warned=warned)
    expected = [
        (
            Action.NOTICE,
            "GPU 0 on gpu1 of job 1 has been below 5% utilization for 2 h while GPU 1 on gpu1 "
            "is in use; consider asking for fewer GPUs. The job will not be cancelled for this.",
        )
    ]
    assert expected == [(v.action, v.reason) for v in verdicts]


def test_job_idle_time_is_the_least_idle_gpu() -> None:
    """Two idle GPUs (50 and 70 min): the job has been idle 50 min, so only a warning."""
    activity = [gpu(0, idle_minutes=70), gpu(1, idle_minutes=50)]
    warned = {(1, "idle_gpu"): NOW - 3600}
    verdicts = evaluate([job(gpus=(0, 1))], activity, NOW, CONFIG, warned=warned)
    expected = [(Action.WARN, 50 * MIN)]
    assert expected == [(v.action, dict(v.details)["idle_seconds"]) for v in verdicts]


# ---------------------------------------------------------------------------- unknown


def test_gpu_without_activity_row_is_unknown() -> None:
    """A job with one of two GPUs unreported gets NONE ("no fresh readings"), not a cancel.

    (A job warned before gets "Warning suspended": test_policy_idle_gaps.py.)
    """
    verdicts = evaluate([job(gpus=(0, 1))], [gpu(0, idle_minutes=120)], NOW, CONFIG)
    expected = [
        (
            Action.NONE,
            "No fresh readings for job 1 (1 GPU(s) without readings): its GPU use is unknown, "
            "and unknown is never treated as idle.",
        )
    ]
    assert expected == [(v.action, v.reason) for v in verdicts]


def test_stale_reading_is_unknown() -> None:
    """Newest reading 31 s old with freshness 3 x 10 s: unknown, so no cancel."""
    warned = {(1, "idle_gpu"): NOW - 3600}
    activity = [gpu(idle_minutes=None, last_reading=NOW - 31)]
    verdicts = evaluate([job()], activity, NOW, CONFIG, warned=warned)
    expected = [("idle_gpu", Action.NONE, 1)]
    assert expected == actions(verdicts)


def test_reading_within_freshness_is_known() -> None:
    """Newest reading 29 s old (limit 30 s): known, and idle since start."""
    activity = [gpu(idle_minutes=None, last_reading=NOW - 29)]
    expected = [("idle_gpu", Action.WARN, 1)]
    assert expected == actions(evaluate([job()], activity, NOW, CONFIG))


def test_readings_on_their_way_for_ship_interval_are_not_late() -> None:
    """[node] ship_interval 60 s: a reading 80 s old (3 x 10 s + 60 s allowed) is known.

    Rows wait that long in the node's spool: the controller must not call them late
    (unknown) while they travel, nor take longer to call them late than that.
    """
    shipped = dataclasses.replace(CONFIG, node=dataclasses.replace(
        CONFIG.node, ship_interval=Duration(60.0)))  # fmt: skip
    fresh = [gpu(idle_minutes=None, last_reading=NOW - 80)]
    late = [gpu(idle_minutes=None, last_reading=NOW - 91)]
    assert [("idle_gpu", Action.WARN, 1)] == actions(evaluate([job()], fresh, NOW, shipped))
    assert [("idle_gpu", Action.NONE, 1)] == actions(evaluate([job()], late, NOW, shipped))
    assert [("idle_gpu", Action.NONE, 1)] == actions(evaluate([job()], fresh, NOW, CONFIG))


def test_job_with_gpu_count_but_no_indices_needs_that_many_rows() -> None:
    """squeue gave 2 GPUs without indices and one row arrived: unknown."""
    expected = [("idle_gpu", Action.NONE, 1)]
    verdicts = evaluate([job(gpus=(), gpu_count=2)], [gpu(idle_minutes=120)], NOW, CONFIG)
    assert expected == actions(verdicts)


# ---------------------------------------------------------------------------- what idle means


def test_memory_only_gpu_is_idle_by_default() -> None:
    """A GPU holding 10 GiB but computing nothing for 47 min is idle (memory_only_is_idle)."""
    activity = [gpu(idle_minutes=47, mem_used_bytes=10 * GIB, process_count=1)]
    expected = [("idle_gpu", Action.WARN, 1)]
    assert expected == actions(evaluate([job()], activity, NOW, CONFIG))


def test_memory_only_gpu_is_busy_when_configured() -> None:
    """memory_only_is_idle = false: the same GPU counts as in use."""
    activity = [gpu(idle_minutes=47, mem_used_bytes=10 * GIB, process_count=1)]
    expected: list[Verdict] = []
    assert expected == evaluate([job()], activity, NOW, config(memory_only_is_idle=False))


def test_memory_under_the_floor_is_no_memory() -> None:
    """memory_only_is_idle = false, but 32 MiB with no process is driver overhead: idle."""
    activity = [gpu(idle_minutes=47, mem_used_bytes=32 * 1024**2, process_count=0)]
    expected = [("idle_gpu", Action.WARN, 1)]
    assert expected == actions(evaluate([job()], activity, NOW, config(memory_only_is_idle=False)))


def test_recent_utilization_above_threshold_is_activity() -> None:
    """util_recent_percent at the threshold marks the GPU active at its newest reading."""
    expected: list[Verdict] = []
    assert expected == evaluate([job()], [gpu(idle_minutes=None, util=5.0)], NOW, CONFIG)


def test_threshold_is_configurable() -> None:
    """With threshold 50%, a GPU at 30% recent utilization is idle since its last_active."""
    activity = [gpu(idle_minutes=47, util=30.0)]
    expected = [("idle_gpu", Action.WARN, 1)]
    assert expected == actions(evaluate([job()], activity, NOW, config(threshold_percent=50.0)))


def test_sliding_window_counts_from_last_use() -> None:
    """Used once early, idle for the last 2 h: sliding window warns."""
    expected = [("idle_gpu", Action.WARN, 1)]
    assert expected == actions(evaluate([job()], [gpu(idle_minutes=120)], NOW, CONFIG))


def test_from_start_window_ignores_jobs_used_once() -> None:
    """Same GPU with window = "from_start": it was used, so it is not idle."""
    expected: list[Verdict] = []
    verdicts = evaluate([job()], [gpu(idle_minutes=120)], NOW, config(window="from_start"))
    assert expected == verdicts


def test_from_start_window_catches_never_used_gpus() -> None:
    """window = "from_start": a GPU never used in 3 h is idle for 3 h."""
    verdicts = evaluate([job()], [gpu(idle_minutes=None)], NOW, config(window="from_start"))
    expected = [(Action.WARN, 3 * 3600.0)]
    assert expected == [(v.action, dict(v.details)["idle_seconds"]) for v in verdicts]


def test_idle_time_never_predates_job_start() -> None:
    """A job 30 min old whose GPU was never used has been idle 30 min: no warning yet."""
    recent = job(start_time=NOW - 30 * MIN)
    row = dataclasses.replace(gpu(idle_minutes=None), start=NOW - 30 * MIN)
    expected: list[Verdict] = []
    assert expected == evaluate([recent], [row], NOW, CONFIG)


# ---------------------------------------------------------------------------- scope


def test_pending_and_gpu_less_jobs_are_ignored() -> None:
    """Only running jobs holding GPUs are judged."""
    jobs = [job(1, state="PENDING"), job(2, gpus=(), gpu_count=0)]
    expected: list[Verdict] = []
    assert expected == evaluate(jobs, [], NOW, CONFIG)


def test_disabled_policy_gives_nothing() -> None:
    """enabled = false: no verdicts, not even for unknown jobs."""
    expected: list[Verdict] = []
    assert expected == evaluate([job()], [], NOW, config(enabled=False))


@pytest.mark.parametrize(
    ("settings", "fields"),
    [
        ({"exempt_users": ["alice"]}, {}),
        ({"exempt_accounts": ["physics"]}, {}),
        ({}, {"partition": "debug"}),
        ({"exempt_qos": ["long"]}, {"qos": "long"}),
        ({}, {"name": "interactive-bash"}),
    ],
)
def test_config_exemptions(settings: dict[str, Any], fields: dict[str, Any]) -> None:
    """Exempt user, account, partition (debug by default), QOS, name prefix: no verdict."""
    expected: list[Verdict] = []
    assert expected == evaluate([job(**fields)], [gpu(idle_minutes=120)], NOW, config(**settings))


@pytest.mark.parametrize("scope", ["job:1", "user:alice", "account:physics", "job:900"])
def test_explicit_exemption(scope: str) -> None:
    """`slurm-gpu exempt` for the job, its user, its account or its array: no verdict."""
    exemptions = [Exemption(scope, policy="idle_gpu", expires=NOW + 60)]
    row = job(array_job_id=900, array_task_id=3)
    expected: list[Verdict] = []
    assert expected == evaluate([row], [gpu(idle_minutes=120)], NOW, CONFIG, exemptions=exemptions)


def test_expired_exemption_is_ignored() -> None:
    """An exemption that expired a second ago no longer applies."""
    exemptions = [Exemption("user:alice", expires=NOW - 1)]
    verdicts = evaluate([job()], [gpu(idle_minutes=120)], NOW, CONFIG, exemptions=exemptions)
    expected = [("idle_gpu", Action.WARN, 1)]
    assert expected == actions(verdicts)


def test_exemption_from_another_policy_does_not_apply() -> None:
    """An exemption from max_runtime does not exempt from idle_gpu."""
    exemptions = [Exemption("job:1", policy="max_runtime")]
    verdicts = evaluate([job()], [gpu(idle_minutes=120)], NOW, CONFIG, exemptions=exemptions)
    expected = [("idle_gpu", Action.WARN, 1)]
    assert expected == actions(verdicts)


def test_deadline_is_idle_start_plus_cancel_after_when_warned_in_time() -> None:
    """warn 1h, cancel 3h, warned when due (10 min ago): cancel at idle start + 3 h."""
    settings = config(warn_after=Duration(3600.0), cancel_after=Duration(3 * 3600.0))
    warned = {(1, "idle_gpu"): NOW - 10 * MIN}
    verdicts = evaluate([job()], [gpu(idle_minutes=70)], NOW, settings, warned=warned)
    expected = [NOW - 70 * MIN + 3 * 3600]
    assert expected == [v.deadline for v in verdicts]


def test_a_suspended_job_is_neither_warned_nor_cancelled() -> None:
    """Suspended 70 min with its GPUs quiet (a stopped job runs no kernels): no verdict."""
    suspended = job(state="SUSPENDED", suspend_time=NOW - 70 * MIN, pre_suspend_seconds=110 * MIN)
    warned = {(1, "idle_gpu"): NOW - 16 * MIN}
    expected: list[Verdict] = []
    assert expected == evaluate([suspended], [gpu(idle_minutes=70)], NOW, CONFIG, warned=warned)


def test_the_idle_clock_starts_again_at_the_resume() -> None:
    """Active until its suspension 70 min ago, resumed 10 min ago: idle 10 min, not 70."""
    resumed = job(suspend_time=NOW - 10 * MIN, pre_suspend_seconds=110 * MIN)
    assert 60 * MIN == resumed.suspended_seconds(NOW)
    expected: list[Verdict] = []
    assert expected == evaluate([resumed], [gpu(idle_minutes=70)], NOW, CONFIG)
    # Idle 47 min since its resume: warned for those 47 min only.
    later = job(suspend_time=NOW - 47 * MIN, pre_suspend_seconds=60 * MIN)
    verdicts = evaluate([later], [gpu(idle_minutes=120)], NOW, CONFIG)
    assert [("idle_gpu", Action.WARN, 1)] == actions(verdicts)
    assert ("idle_seconds", 47 * MIN) in verdicts[0].details
