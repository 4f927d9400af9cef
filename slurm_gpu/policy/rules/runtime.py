"""max_runtime: warn a running GPU job before its runtime limit, cancel or cap it at the limit.

The limit comes from the job's account, else its partition, else the cluster default;
jobs whose own Slurm time limit ends first are left to Slurm.
"""

from __future__ import annotations

from slurm_gpu.models import Action, SlurmJob, Verdict
from slurm_gpu.policy.rules.context import MAX_RUNTIME, Context, job_verdict, span_text


def max_runtime(ctx: Context, job: SlurmJob) -> Verdict | None:
    """A warning, cancel or time cap for a job near or past its runtime limit, or None.

    The cancel (or cap) comes only after a warning at least `warn_before` old, so the user
    always has that long to save their work.
    """
    settings = ctx.config.policy.max_runtime
    if job.start_time is None:
        return None
    if job.account in settings.accounts:
        limit, source = settings.accounts[job.account], f"account {job.account}"
    elif job.partition in settings.partitions:
        limit, source = settings.partitions[job.partition], f"partition {job.partition}"
    else:
        limit, source = settings.default, "this cluster"
    if job.time_limit_seconds is not None and job.time_limit_seconds <= limit:
        return None  # Slurm ends it at its own limit first
    now = ctx.now
    elapsed = now - job.start_time
    if elapsed < limit - settings.warn_before:
        return None
    end = job.start_time + limit
    warned_at = ctx.warned.get((job.job_id, MAX_RUNTIME))
    details: tuple[tuple[str, object], ...] = (
        ("elapsed_seconds", elapsed),
        ("limit_seconds", limit),
        ("limit_source", source),
    )
    limit_text = f"the {span_text(limit)} runtime limit of {source}"
    warned_long_enough = settings.warn_before <= 0 or (
        warned_at is not None and now - warned_at >= settings.warn_before
    )
    if elapsed >= limit and warned_long_enough:
        if settings.action == "cap":
            return job_verdict(
                MAX_RUNTIME,
                Action.CAP_TIME,
                job,
                f"Job {job.job_id} has run {span_text(elapsed)}, reaching {limit_text}; its "
                f"time limit is set to {span_text(limit)}.",
                details=(*details, ("time_limit_seconds", limit)),
            )
        return job_verdict(
            MAX_RUNTIME,
            Action.CANCEL,
            job,
            f"Job {job.job_id} cancelled: it has run {span_text(elapsed)}, reaching {limit_text}.",
            details=details,
        )
    deadline = max(end, (warned_at if warned_at is not None else now) + settings.warn_before)
    verb = "stopped at its limit" if settings.action == "cap" else "cancelled"
    return job_verdict(
        MAX_RUNTIME,
        Action.WARN,
        job,
        f"Job {job.job_id} has run {span_text(elapsed)} and will be {verb} at "
        f"{ctx.time_text(deadline)} by {limit_text}; save your work.",
        deadline=deadline,
        details=details,
    )
