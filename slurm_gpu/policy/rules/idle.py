"""idle_gpu: warn, then cancel, a running job whose GPUs are all idle.

A job with some idle and some busy GPUs gets a NOTICE, never a cancel; a job with a GPU
that has no fresh reading gets an Action.NONE verdict, since unknown is not idle. When
that job had been warned, the verdict says the warning is suspended, and why.

A suspended job is not judged (only RUNNING jobs are), and its suspended time is not
idle: after `scontrol resume` its idle clock starts again at the resume.

Only measured time is idle: a gap in a GPU's readings (agent down, GPU lost, a restarted
agent) resets its idle clock, which starts again at `GpuActivity.measured_since`, where
the current unbroken run of readings began. A job is never warned or cancelled for time
nobody measured; its warning and cancellation say when the count began.

A GPU is active at or above `[node] active_threshold_percent` (`slurm_gpu.activity`): the
agent's `last_active` was taken with that key, and the recent mean is judged by it too.

With `[policy.idle_gpu] signal = "sm_active"` the same rules apply to SM activity (NVML
GPM, issue #13): `last_sm_active` and `sm_active_recent_percent`, judged by `[node]
sm_active_threshold_percent`, so a job whose one tiny kernel keeps the duty cycle at 100%
is idle. A GPU whose SM activity is not measured (no GPM: an A100, GPM off) is judged by
utilization instead, and every verdict about it says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from slurm_gpu.activity import is_active
from slurm_gpu.models import Action, GpuActivity, Measurement, SlotKind, SlurmJob, Verdict
from slurm_gpu.policy.rules.context import (
    IDLE_GPU,
    Context,
    gpu_list,
    job_verdict,
    span_text,
)

MIB = 1024 * 1024


def idle_gpu(ctx: Context, job: SlurmJob, rows: Sequence[GpuActivity]) -> Verdict | None:
    """The idle_gpu verdict for one running job, or None when its GPUs are in use.

    Args:
        ctx: this cycle's time, config and the warnings already given.
        job: the running job.
        rows: the agent's activity rows of the job's GPUs.
    """
    now = ctx.now
    expected = {(node, index) for node, indices in job.gpus for index in indices}
    if expected:
        mine = [r for r in rows if (r.node, r.slurm_index) in expected]
        missing = len(expected) - len({(r.node, r.slurm_index) for r in mine})
    else:  # squeue gave a GPU count but no indices: every counted GPU needs a row
        mine = list(rows)
        missing = max(job.gpu_count - len(mine), 0)
    stale = [r for r in mine if now - r.last_reading > ctx.fresh_seconds]
    if missing or stale or not mine:
        return _unknown(ctx, job, missing, stale)
    unmeasured = [r for r in mine if _unmeasured(r)]
    if not unmeasured:
        return _judged(ctx, job, mine)
    # Judge the measured slots alone: busy ones keep the job in use, and where all of them
    # are idle the unknown ones may not be, so nothing is warned or cancelled.
    verdict = _judged(ctx, job, [r for r in mine if not _unmeasured(r)])
    if verdict is None:
        return None
    if verdict.action is Action.NOTICE:
        return dataclasses.replace(
            verdict, reason=f"{verdict.reason} Unknown, never idle: {_unmeasured_text(unmeasured)}."
        )
    return _unmeasured_verdict(ctx, job, unmeasured)


def _unmeasured(row: GpuActivity) -> bool:
    """A slot whose use is unknown although it has fresh rows: never idle.

    A MIG slice measured by memory only (no GPM: an Ampere) or a share whose per-process
    read gave nothing, while its job has processes there (or their count is unknown). A
    slot held with no process of its job is not unknown: it is idle ("held, no process").
    """
    if row.slot_kind == SlotKind.GPU:
        return False
    if row.process_count == 0:
        return False
    if row.measured_by == Measurement.MEMORY_ONLY:
        return True
    return row.util_recent_percent is None and row.last_active is None


def _held_no_process(row: GpuActivity) -> bool:
    """A MIG slice or share its job holds with no process on it (idle, and said so)."""
    return row.slot_kind != SlotKind.GPU and row.process_count == 0


def _judged(ctx: Context, job: SlurmJob, mine: Sequence[GpuActivity]) -> Verdict | None:
    """The verdict on the job's measured slots `mine` (fresh, none unknown)."""
    if not mine:
        return None
    settings = ctx.config.policy.idle_gpu
    now = ctx.now

    floor = settings.memory_floor_mib * MIB
    threshold = ctx.config.node.active_threshold_percent
    by_sm = settings.signal == "sm_active"
    job_start = job.start_time
    job_resumed = job.resumed_at()
    if job_resumed is not None and (job_start is None or job_resumed > job_start):
        # A stopped job runs no kernels: its time suspended is not idle, so the idle clock
        # starts again at its resume (earlier suspensions all lie before that).
        job_start = job_resumed
    idle_for: list[float] = []
    resumed: list[float] = []  # where a gap in the readings restarted a GPU's idle clock
    by_util: list[GpuActivity] = []  # signal sm_active, but SM activity not measured here
    for row in mine:
        active_at = row.last_active
        recent = row.util_recent_percent
        row_threshold = threshold
        if by_sm and row.sm_active_recent_percent is not None:
            active_at = row.last_sm_active
            recent = row.sm_active_recent_percent
            row_threshold = ctx.sm_threshold
        elif by_sm:
            by_util.append(row)
        if recent is not None and is_active(recent, row_threshold):
            active_at = row.last_reading if active_at is None else max(active_at, row.last_reading)
        # A process with a bare context is idle; one holding real data is memory-only.
        holds_memory = (row.mem_used_bytes or 0) > floor
        start = row.start if job_start is None else max(row.start, job_start)
        measured = row.measured_since
        if measured is not None and measured > start:
            start = measured  # the time before it had no readings: not idle, unknown
            if active_at is None or active_at < measured:
                resumed.append(measured)
        if holds_memory and not settings.memory_only_is_idle:
            idle_for.append(0.0)
        elif settings.window == "from_start":
            idle_for.append(max(now - start, 0.0) if active_at is None else 0.0)
        else:
            since = start if active_at is None else max(active_at, start)
            idle_for.append(max(now - since, 0.0))

    idle = [r for r, seconds in zip(mine, idle_for, strict=True) if seconds >= settings.warn_after]
    if not idle:
        return None
    threshold_text, note = _threshold_text(ctx, by_sm, len(by_util) == len(mine), by_util)
    empty = [r for r in idle if _held_no_process(r)]
    if empty:
        note += f" {gpu_list(empty)}: held, no process."
    if len(idle) < len(mine):
        busy = [
            r for r, seconds in zip(mine, idle_for, strict=True) if seconds < settings.warn_after
        ]
        longest = max(idle_for)
        return job_verdict(
            IDLE_GPU,
            Action.NOTICE,
            job,
            f"{gpu_list(idle)} of job {job.job_id} {'has' if len(idle) == 1 else 'have'} been "
            f"{threshold_text} for {span_text(longest)} while {gpu_list(busy)} "
            f"{'is' if len(busy) == 1 else 'are'} in use; consider asking for fewer GPUs. "
            f"The job will not be cancelled for this.{note}",
            details=(
                ("idle_gpus", len(idle)),
                ("busy_gpus", len(busy)),
                ("idle_seconds", longest),
                *_signal_details(ctx, by_sm, by_util),
            ),
        )

    job_idle = min(idle_for)
    idle_since = now - job_idle
    since_text = (
        "not been used since the job started"
        if settings.window == "from_start"
        else f"been {threshold_text}"
    )
    counted = ""
    if resumed and max(resumed) >= idle_since:
        # The count began where readings resumed after a gap: say so.
        resumed_at = ctx.time_text(max(resumed))
        if settings.window == "from_start":
            since_text = f"not been used since readings resumed at {resumed_at}"
        else:
            counted = f" (counted from {resumed_at}, when readings resumed after a gap)"
    else:
        resumed = []
    grace = settings.cancel_after - settings.warn_after
    warned_at = ctx.warned.get((job.job_id, IDLE_GPU))
    if warned_at is not None and warned_at < idle_since:
        warned_at = None  # a warning from an earlier idle stretch: the job was used since
    details: tuple[tuple[str, object], ...] = (
        ("idle_seconds", job_idle),
        ("threshold_percent", threshold),
        ("window", settings.window),
        ("gpus", len(mine)),
        *((("readings_resumed_at", max(resumed)),) if resumed else ()),
        *_signal_details(ctx, by_sm, by_util),
    )
    if job_idle >= settings.cancel_after and warned_at is not None and now - warned_at >= grace:
        return job_verdict(
            IDLE_GPU,
            Action.CANCEL,
            job,
            f"Job {job.job_id} cancelled: {gpu_list(mine)} had {since_text} for "
            f"{span_text(job_idle)}{counted}, and the warning at {ctx.time_text(warned_at)}"
            f" went unanswered.{note}",
            details=(*details, ("warned_at", warned_at)),
        )
    warning = now if warned_at is None else warned_at
    deadline = max(idle_since + settings.cancel_after, warning + grace)
    return job_verdict(
        IDLE_GPU,
        Action.WARN,
        job,
        f"{gpu_list(mine)} of job {job.job_id} {'has' if len(mine) == 1 else 'have'} "
        f"{since_text} for {span_text(job_idle)}{counted}; the job will be cancelled at "
        f"{ctx.time_text(deadline)} unless {'it is' if len(mine) == 1 else 'they are'} used."
        f"{note}",
        deadline=deadline,
        details=details,
    )


def _threshold_text(
    ctx: Context, by_sm: bool, all_by_util: bool, by_util: Sequence[GpuActivity]
) -> tuple[str, str]:
    """What "idle" meant for these GPUs ("below 5% SM activity"), and the fallback note.

    The note (" SM activity not measured on GPU 0 on gpu1: judged by utilization.") ends
    every verdict of signal sm_active about a job with a GPU judged by utilization.
    """
    util = f"{ctx.config.node.active_threshold_percent:g}% utilization"
    if not by_sm or all_by_util:
        text = f"below {util}"
    elif by_util:
        text = f"below {ctx.sm_threshold:g}% SM activity ({util} where it is not measured)"
    else:
        text = f"below {ctx.sm_threshold:g}% SM activity"
    note = (
        f" SM activity not measured on {gpu_list(by_util)}: judged by utilization."
        if by_util
        else ""
    )
    return text, note


def _signal_details(
    ctx: Context, by_sm: bool, by_util: Sequence[GpuActivity]
) -> tuple[tuple[str, object], ...]:
    """The audit figures of signal sm_active (none for util, whose rows stay as they were)."""
    if not by_sm:
        return ()
    return (
        ("signal", "sm_active"),
        ("sm_threshold_percent", ctx.sm_threshold),
        ("judged_by_util_gpus", len(by_util)),
    )


def _unmeasured_text(rows: Sequence[GpuActivity]) -> str:
    """Why these slots' use is unknown, as a clause.

    "MIG 1g.10gb slice MIG-... on gpu3 is measured by memory only (...), with processes
    of the job".
    """
    memory_only = [r for r in rows if r.measured_by == Measurement.MEMORY_ONLY]
    failed = [r for r in rows if r.measured_by != Measurement.MEMORY_ONLY]
    parts = []
    if memory_only:
        parts.append(
            f"{gpu_list(memory_only)} {'is' if len(memory_only) == 1 else 'are'} measured by "
            "memory only (utilization not measured on an Ampere MIG slice)"
        )
    if failed:
        parts.append(f"{gpu_list(failed)} gave no per-process utilization")
    return f"{' and '.join(parts)}, with processes of the job"


def _unmeasured_verdict(ctx: Context, job: SlurmJob, rows: Sequence[GpuActivity]) -> Verdict:
    """The Action.NONE verdict of a job whose measured slots are idle and others unknown.

    As for missing readings (`_unknown`): a warning of the current episode is suspended.
    """
    details = (("unmeasured_slots", len(rows)),)
    text = (
        f"{_unmeasured_text(rows)}: the GPU use of job {job.job_id} is unknown, and unknown "
        "is never treated as idle."
    )
    if (job.job_id, IDLE_GPU) in ctx.warned:
        return job_verdict(
            IDLE_GPU,
            Action.NONE,
            job,
            f"Warning suspended: {text}",
            details=(*details, ("suspended", True)),
        )
    return job_verdict(IDLE_GPU, Action.NONE, job, f"Not judged idle: {text}", details=details)


def _unknown(ctx: Context, job: SlurmJob, missing: int, stale: Sequence[GpuActivity]) -> Verdict:
    """The Action.NONE verdict of a job whose GPU use is unknown (missing or stale readings).

    A job warned in its current episode hears that the warning is suspended: the
    controller ends the episode with this audit row, and the idle clock starts again when
    readings return (a later warning gives the full grace period again).
    """
    now = ctx.now
    newest = max((r.last_reading for r in stale), default=None)
    details = (("missing_gpus", missing), ("stale_gpus", len(stale)))
    if (job.job_id, IDLE_GPU) in ctx.warned:
        gaps = []
        if newest is not None:
            gaps.append(f"no readings from {gpu_list(stale)} since {ctx.time_text(newest)}")
        if missing:
            gaps.append(f"no readings from {missing} of its GPU(s)")
        return job_verdict(
            IDLE_GPU,
            Action.NONE,
            job,
            f"Warning suspended: {'; '.join(gaps)}. The GPU use of job {job.job_id} is unknown,"
            " and unknown is never treated as idle: the idle clock starts again when readings"
            " return.",
            details=(*details, ("suspended", True)),
        )
    what = []
    if missing:
        what.append(f"{missing} GPU(s) without readings")
    if newest is not None:
        what.append(f"{gpu_list(stale)} last read {span_text(now - newest)} ago")
    return job_verdict(
        IDLE_GPU,
        Action.NONE,
        job,
        f"No fresh readings for job {job.job_id} ({'; '.join(what)}): its GPU use is "
        "unknown, and unknown is never treated as idle.",
        details=details,
    )
