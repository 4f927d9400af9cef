"""low_efficiency: a notice about GPUs that look busy but barely compute (issue #13).

NVML's utilization is a duty cycle, the share of time in which any kernel ran: one tiny
kernel keeping a single SM busy reads 100%. GPM (Hopper and newer) measures SM activity,
the share of SMs at work. A GPU whose utilization stayed at or above `min_util_percent`
while its SM activity stayed below `max_sm_active_percent`, for `notice_after` without a
break, earns its job a NOTICE naming it, with the figures and what the user can do.

The stretch is read from the job's stored GPU intervals, newest first: it is the unbroken
run of intervals that each looked busy and barely computed, back to the first that did
not, was not measured by GPM, or lies after a gap in the readings. Unknown is never
inefficient: a GPU without GPM (an A100, GPM off), with no activity row, or whose newest
interval is older than the freshness limit plus a shipping period is not judged. The
newest activity row has the last word: a GPU whose recent SM activity is at or above the
limit (or whose utilization is below the floor) is not flagged.

This policy never cancels: ending such jobs is `[policy.idle_gpu] signal = "sm_active"`'s
job, with its warnings and grace period.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_gpu.config import shipping_delay
from slurm_gpu.config.policy import LowEfficiencySettings
from slurm_gpu.models import Action, GpuActivity, GpuInterval, SlurmJob, Verdict
from slurm_gpu.policy.rules.context import (
    LOW_EFFICIENCY,
    Context,
    gpu_list,
    job_verdict,
    span_text,
)


@dataclass(frozen=True)
class _Stretch:
    """One GPU's newest unbroken run of busy-looking, barely computing intervals."""

    row: GpuActivity
    seconds: float
    util_seconds: float  # sum of utilization x covered seconds
    covered_seconds: float
    sm_seconds: float  # sum of SM activity x GPM seconds
    gpm_seconds: float


def _fake_busy(interval: GpuInterval, settings: LowEfficiencySettings) -> bool:
    """The interval looked busy (duty cycle) while few SMs worked, as GPM measured."""
    util = interval.util_mean_percent
    sm = interval.sm_active_mean_percent
    return (
        interval.gpm_seconds > 0
        and util is not None
        and sm is not None
        and util >= settings.min_util_percent
        and sm < settings.max_sm_active_percent
    )


def _stretch(
    ctx: Context, row: GpuActivity, rows: Sequence[GpuInterval], settings: LowEfficiencySettings
) -> _Stretch | None:
    """The GPU's newest fake-busy stretch, or None when it is not fake-busy now (or unknown)."""
    if row.sm_active_recent_percent is not None and (
        row.sm_active_recent_percent >= settings.max_sm_active_percent
    ):
        return None  # the newest GPM window says its SMs work
    if row.util_recent_percent is not None and row.util_recent_percent < settings.min_util_percent:
        return None
    ordered = sorted(rows, key=lambda r: r.period_start, reverse=True)
    if not ordered:
        return None
    shipping = shipping_delay(ctx.config)
    if ctx.now - ordered[0].period_end > ctx.fresh_seconds + shipping:
        return None  # its newest interval is too old to say what it does now
    # Intervals of one GPU follow each other end to start; a later start is a gap.
    tolerance = float(ctx.config.node.interval)
    begin = end = ordered[0].period_end
    util_s = covered = sm_s = gpm = 0.0
    for interval in ordered:
        if interval.period_end < begin - tolerance or not _fake_busy(interval, settings):
            break
        begin = interval.period_start
        util_s += (interval.util_mean_percent or 0.0) * interval.covered_seconds
        covered += interval.covered_seconds
        sm_s += (interval.sm_active_mean_percent or 0.0) * interval.gpm_seconds
        gpm += interval.gpm_seconds
    if gpm <= 0:
        return None
    # Only the time GPM measured counts (as only measured time is idle).
    return _Stretch(row, min(gpm, end - begin), util_s, covered, sm_s, gpm)


def low_efficiency(
    ctx: Context, job: SlurmJob, rows: Sequence[GpuActivity], intervals: Sequence[GpuInterval]
) -> Verdict | None:
    """The low_efficiency notice for one running job, or None.

    Args:
        ctx: this cycle's time and config.
        job: the running job.
        rows: the agent's activity rows of the job's GPUs (their Slurm indices, newest news).
        intervals: the job's stored GPU intervals, at least `notice_after` plus a
            shipping period back.
    """
    settings = ctx.config.policy.low_efficiency
    expected = {(node, index) for node, indices in job.gpus for index in indices}
    mine = [r for r in rows if not expected or (r.node, r.slurm_index) in expected]
    by_gpu: dict[tuple[str, str], list[GpuInterval]] = {}
    for interval in intervals:
        by_gpu.setdefault((interval.node, interval.gpu_uuid), []).append(interval)
    stretches = []
    unmeasured = []
    for row in mine:
        gpu_rows = by_gpu.get((row.node, row.gpu_uuid), [])
        if row.sm_active_recent_percent is None and not any(r.gpm_seconds > 0 for r in gpu_rows):
            unmeasured.append(row)  # no GPM here: never judged
            continue
        found = _stretch(ctx, row, gpu_rows, settings)
        if found is not None and found.seconds >= settings.notice_after:
            stretches.append(found)
    if not stretches:
        return None
    flagged = [s.row for s in stretches]
    covered = sum(s.covered_seconds for s in stretches)
    util = sum(s.util_seconds for s in stretches) / covered if covered else 0.0
    sm = sum(s.sm_seconds for s in stretches) / sum(s.gpm_seconds for s in stretches)
    shortest = min(s.seconds for s in stretches)
    one = len(flagged) == 1
    note = (
        f" SM activity is not measured on {gpu_list(unmeasured)}, which"
        f" {'was' if len(unmeasured) == 1 else 'were'} not judged."
        if unmeasured
        else ""
    )
    return job_verdict(
        LOW_EFFICIENCY,
        Action.NOTICE,
        job,
        f"{gpu_list(flagged)} of job {job.job_id} {'has' if one else 'have'} looked busy for "
        f"{span_text(shortest)} while barely computing: utilization (the share of time some "
        f"kernel runs) {util:.0f}%, but only {sm:.0f}% of {'its' if one else 'their'} SMs "
        "active. The job holds the GPU while using little of it: larger batches, fewer and "
        "bigger kernels, or a smaller GPU would serve it better. This is a notice: the job "
        f"will not be cancelled for it.{note}",
        details=(
            ("gpus", len(flagged)),
            ("seconds", shortest),
            ("util_mean_percent", round(util, 1)),
            ("sm_active_mean_percent", round(sm, 1)),
            ("min_util_percent", settings.min_util_percent),
            ("max_sm_active_percent", settings.max_sm_active_percent),
            ("unmeasured_gpus", len(unmeasured)),
        ),
    )
