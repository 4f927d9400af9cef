"""idle_gpu and missing readings: unknown suspends a warning, a gap resets the idle clock.

Only measured time is idle (#11 item 8): a GPU's idle clock never starts before
`GpuActivity.measured_since`, where its current unbroken run of readings began, and a
warned job whose readings go stale is told that the warning is suspended.
"""

from __future__ import annotations

import dataclasses

from slurm_gpu.models import Action, Verdict
from slurm_gpu.policy.rules import evaluate
from tests.unit.test_policy_idle import CONFIG, MIN, NOW, START, config, gpu, job

WARNED = {(1, "idle_gpu"): NOW - 16 * MIN}


def test_stale_readings_of_a_warned_job_suspend_the_warning_and_say_since_when() -> None:
    """Warned, then no reading for 3 min: NONE, "Warning suspended", with the last reading."""
    activity = [gpu(idle_minutes=61, last_reading=NOW - 3 * MIN)]
    verdicts = evaluate([job()], activity, NOW, CONFIG, warned=WARNED)
    expected = [
        Verdict(
            policy="idle_gpu",
            action=Action.NONE,
            target="job:1",
            reason=(
                "Warning suspended: no readings from GPU 0 on gpu1 since 09:57. The GPU use of"
                " job 1 is unknown, and unknown is never treated as idle: the idle clock starts"
                " again when readings return."
            ),
            job_id=1,
            user="alice",
            account="physics",
            details=(("missing_gpus", 0), ("stale_gpus", 1), ("suspended", True)),
        )
    ]
    assert expected == verdicts


def test_a_warned_job_with_a_gpu_never_reported_is_suspended_too() -> None:
    """One of two GPUs has no activity row: the warning is suspended, naming the count."""
    verdicts = evaluate([job(gpus=(0, 1))], [gpu(0, idle_minutes=61)], NOW, CONFIG, warned=WARNED)
    assert [
        "Warning suspended: no readings from 1 of its GPU(s). The GPU use of job 1 is unknown,"
        " and unknown is never treated as idle: the idle clock starts again when readings"
        " return."
    ] == [v.reason for v in verdicts]


def test_a_gap_resets_the_idle_clock() -> None:
    """Last busy 50 min ago (warn at 45), but readings resumed 10 min ago: not idle yet."""
    activity = [dataclasses.replace(gpu(idle_minutes=50), measured_since=NOW - 10 * MIN)]
    assert [] == evaluate([job()], activity, NOW, CONFIG)


def test_no_cancel_for_time_nobody_measured() -> None:
    """Idle 61 min by the clock, warned 16 min ago, but measured only for the last 50 min.

    The warning came after the gap, so it stands; the job is warned, not cancelled, and the
    deadline is where 60 measured minutes end.
    """
    activity = [dataclasses.replace(gpu(idle_minutes=61), measured_since=NOW - 50 * MIN)]
    verdicts = evaluate([job()], activity, NOW, CONFIG, warned=WARNED)
    expected = [
        (
            Action.WARN,
            NOW + 10 * MIN,
            "GPU 0 on gpu1 of job 1 has been below 5% utilization for 50 min (counted from"
            " 09:10, when readings resumed after a gap); the job will be cancelled at 10:10"
            " unless it is used.",
        )
    ]
    assert expected == [(v.action, v.deadline, v.reason) for v in verdicts]
    assert NOW - 50 * MIN == dict(verdicts[0].details)["readings_resumed_at"]


def test_cancel_after_a_gap_counts_and_says_only_the_measured_time() -> None:
    """61 measured minutes after the gap and a warning 16 min old: CANCEL, saying from when."""
    activity = [dataclasses.replace(gpu(idle_minutes=None), measured_since=NOW - 61 * MIN)]
    verdicts = evaluate([job()], activity, NOW, CONFIG, warned=WARNED)
    expected = [
        (
            Action.CANCEL,
            "Job 1 cancelled: GPU 0 on gpu1 had been below 5% utilization for 1 h 1 min"
            " (counted from 08:59, when readings resumed after a gap), and the warning at 09:44"
            " went unanswered.",
        )
    ]
    assert expected == [(v.action, v.reason) for v in verdicts]


def test_a_warning_from_before_the_gap_does_not_count() -> None:
    """Warned 50 min ago, then a gap; 47 measured idle minutes since: a new WARN, full grace."""
    activity = [dataclasses.replace(gpu(idle_minutes=120), measured_since=NOW - 47 * MIN)]
    warned = {(1, "idle_gpu"): NOW - 50 * MIN}
    verdicts = evaluate([job()], activity, NOW, CONFIG, warned=warned)
    assert [(Action.WARN, NOW + 15 * MIN)] == [(v.action, v.deadline) for v in verdicts]


def test_from_start_window_after_a_gap_says_since_readings_resumed() -> None:
    """Never used, readings resumed 50 min ago: "not been used since readings resumed"."""
    activity = [dataclasses.replace(gpu(idle_minutes=None), measured_since=NOW - 50 * MIN)]
    verdicts = evaluate([job()], activity, NOW, config(window="from_start"))
    assert [
        "GPU 0 on gpu1 of job 1 has not been used since readings resumed at 09:10 for 50 min;"
        " the job will be cancelled at 10:15 unless it is used."
    ] == [v.reason for v in verdicts]


def test_activity_after_the_gap_counts_from_the_activity() -> None:
    """Busy after readings resumed, idle 47 min since: the usual warning, no gap note."""
    activity = [dataclasses.replace(gpu(idle_minutes=47), measured_since=NOW - 90 * MIN)]
    verdicts = evaluate([job()], activity, NOW, CONFIG)
    assert [
        "GPU 0 on gpu1 of job 1 has been below 5% utilization for 47 min; the job will be"
        " cancelled at 10:15 unless it is used."
    ] == [v.reason for v in verdicts]


def test_readings_since_before_the_job_started_change_nothing() -> None:
    """measured_since before the job's start (the GPU was read all along): start counts."""
    activity = [dataclasses.replace(gpu(idle_minutes=None), measured_since=START - 3600)]
    verdicts = evaluate([job()], activity, NOW, CONFIG, warned=WARNED)
    assert [Action.CANCEL] == [v.action for v in verdicts]
