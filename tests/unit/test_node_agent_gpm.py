"""The agent's GPM figures (issue #13): per interval, per job summary and in the activity row.

GPU "B" (Slurm index 0) has GPM, as an H100 does; GPU "A" (index 1) has none, as an A100.
The fake GPUs' GPM metrics are the mean of a function over the whole seconds between two
reads, as NVML's are the exact time-weighted mean between two samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from slurm_gpu.models import GpuInterval, JobGpuSummary
from slurm_gpu.node.outbox import decode_interval, decode_summary
from slurm_gpu.node.ship_less import outbox_view
from tests.unit.test_node_agent import T0, end_job, make_agent, outbox, run_until, start_job


def sm_then(change: float, before: float, after: float) -> Callable[[float], float]:
    """SM activity `before` up to and including T0 + change, `after` from then on."""
    return lambda t: before if t <= T0 + change else after


def truth(level: Callable[[float], float], start: float, end: float) -> float:
    """The time-weighted mean of `level` over (T0 + start, T0 + end], second by second."""
    seconds = [T0 + s for s in range(int(start) + 1, int(end) + 1)]
    return sum(level(t) for t in seconds) / len(seconds)


def gpm_of(row: GpuInterval | JobGpuSummary) -> tuple[float | None, ...]:
    return (
        row.gpm_seconds,
        row.sm_active_mean_percent,
        row.sm_occupancy_mean_percent,
        row.tensor_active_mean_percent,
        row.dram_bw_mean_percent,
    )


def run_job(
    tmp_path: Path, gpm: Mapping[str, Callable[[float], Mapping[str, float]]], gpu: int = 0
) -> tuple[list[GpuInterval], list[JobGpuSummary]]:
    """Job 7 on Slurm GPU `gpu` from T0+15 to T0+105, read every 10 s; its intervals and summary."""
    agent, clock, gpus, node_dir = make_agent(tmp_path)
    gpus.gpm.update(gpm)
    agent.tick()
    start_job(node_dir, 7, [gpu], T0 + 15)
    run_until(agent, clock, T0 + 100)
    end_job(node_dir, 7, T0 + 105)
    run_until(agent, clock, T0 + 120)
    intervals = [decode_interval(p) for p in outbox(agent, "interval")]
    summaries = [decode_summary(p) for p in outbox(agent, "summary")]
    return [i for i in intervals if i.job_id == 7], summaries


def test_summary_gpm_means_are_the_time_weighted_truth(tmp_path: Path) -> None:
    """SM 20% then 50% from T0+45 (inside a read window), tensor 60%: the job's true means.

    Job 7 holds the GPU over (T0+15, T0+105]: 30 s at 20% and 60 s at 50%, SM 40% overall;
    occupancy and DRAM are not measured by this GPU, so they stay None (never 0%).
    """
    sm = sm_then(45, 20.0, 50.0)

    _, (summary,) = run_job(
        tmp_path, {"B": lambda t: {"sm_active_percent": sm(t), "tensor_active_percent": 60.0}}
    )

    assert (90.0, truth(sm, 15, 105), None, 60.0, None) == gpm_of(summary)
    assert 40.0 == truth(sm, 15, 105)


def test_interval_gpm_means_are_the_time_weighted_truth_of_their_period(tmp_path: Path) -> None:
    """The job's two minutes: (T0+15, T0+60] at 30% (the truth of its seconds), then 50%."""
    sm = sm_then(45, 20.0, 50.0)

    intervals, _ = run_job(tmp_path, {"B": lambda t: {"sm_active_percent": sm(t)}})

    expected = [
        (T0 + 15, T0 + 60, 45.0, truth(sm, 15, 60)),
        (T0 + 60, T0 + 105, 45.0, truth(sm, 60, 105)),
    ]
    actual = [
        (i.period_start, i.period_end, i.gpm_seconds, i.sm_active_mean_percent)
        for i in sorted(intervals, key=lambda i: i.period_start)
    ]
    assert expected == actual
    assert (30.0, 50.0) == (truth(sm, 15, 60), truth(sm, 60, 105))


def test_job_edge_inside_a_window_shares_the_window_mean(tmp_path: Path) -> None:
    """The job starts at T0+15, inside (T0+10, T0+20]: its first 5 s get that window's mean.

    SM is 90% up to T0+15 (before the job) and 10% after: the window's mean is 50%, and
    the finest truth one GPM window gives is that mean for both sides of the job's edge.
    """
    sm = sm_then(15, 90.0, 10.0)

    _, (summary,) = run_job(tmp_path, {"B": lambda t: {"sm_active_percent": sm(t)}})

    assert (90.0, (5 * 50.0 + 85 * 10.0) / 90) == (
        summary.gpm_seconds,
        summary.sm_active_mean_percent,
    )


def test_gpu_without_gpm_has_none_and_zero_seconds_never_zero_percent(tmp_path: Path) -> None:
    """Job 7 on GPU A (no GPM, as an A100): its summary and intervals say "not measured"."""
    intervals, (summary,) = run_job(tmp_path, {"B": lambda t: {"sm_active_percent": 30.0}}, gpu=1)

    unmeasured = (0.0, None, None, None, None)
    assert [unmeasured, unmeasured] == [gpm_of(i) for i in intervals]
    assert unmeasured == gpm_of(summary)


def test_first_read_has_no_gpm_window(tmp_path: Path) -> None:
    """The agent's first read is the GPU's first GPM sample: nothing to compare it with."""
    agent, clock, gpus, _ = make_agent(tmp_path)
    gpus.gpm["B"] = lambda t: {"sm_active_percent": 30.0}

    first = agent.tick().snapshots["B"].gpm
    clock.advance(10)
    second = agent.tick().snapshots["B"].gpm

    assert (None, (T0, T0 + 10, 30.0)) == (
        first,
        None if second is None else (second.start, second.end, second.sm_active_percent),
    )


def activity_after(
    tmp_path: Path, sm: Callable[[float], float], until: float, gpu: int = 0
) -> tuple[float | None, float | None]:
    """(sm_active_recent_percent, last_sm_active) of job 7 running from T0+5 on GPU `gpu`."""
    agent, clock, gpus, node_dir = make_agent(tmp_path)
    gpus.gpm["B"] = lambda t: {"sm_active_percent": sm(t)}
    agent.tick()
    start_job(node_dir, 7, [gpu], T0 + 5)
    run_until(agent, clock, T0 + until)
    # as the store shows it: the row carried to the newest heartbeat (issue 16)
    (activity,) = outbox_view((k, p) for _, k, _, p in agent.spool.pending(10**6))
    return activity.sm_active_recent_percent, activity.last_sm_active


def test_activity_names_the_end_of_the_newest_sm_active_window(tmp_path: Path) -> None:
    """SM 30% until T0+50, then 2% (below 5): last SM-active at T0+50, recent 2%."""
    assert (2.0, T0 + 50) == activity_after(tmp_path, sm_then(50, 30.0, 2.0), 80)


def test_sm_activity_at_the_threshold_is_active(tmp_path: Path) -> None:
    """Exactly 5% is active (activity.is_active, the one rule): the newest window counts."""
    assert (5.0, T0 + 40) == activity_after(tmp_path, lambda t: 5.0, 40)


def test_sm_activity_below_the_threshold_was_never_active(tmp_path: Path) -> None:
    """A job whose SMs stay at 4.5% (below 5) was never SM-active: last_sm_active None."""
    assert (4.5, None) == activity_after(tmp_path, lambda t: 4.5, 40)


def test_activity_of_a_gpu_without_gpm_is_not_measured(tmp_path: Path) -> None:
    """On GPU A (no GPM) both SM activity fields are None: unknown, not idle."""
    assert (None, None) == activity_after(tmp_path, lambda t: 30.0, 40, gpu=1)
