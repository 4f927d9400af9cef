"""The policies as one pure function: what Slurm and the agents report -> verdicts.

`evaluate` reads no files, no clock and no database: the controller gathers the inputs
(squeue, the store, its own records of warnings and applied quota actions), passes `now`,
and acts on the verdicts after writing them to the audit log. The same inputs always
give the same verdicts, which is what the unit tests and the dry run rely on.

Policies (config in `slurm_gpu.config.policy`):

- idle_gpu: a running job whose GPUs are all idle is warned at `warn_after` and cancelled
  at `cancel_after`, but only once a warning for the current idle stretch was recorded at
  least `cancel_after - warn_after` ago (the user always gets that long to react). A job
  with some idle and some busy GPUs gets a NOTICE, never a cancel.
  With `signal = "sm_active"` idle means SM activity (GPM) below `[node]
  sm_active_threshold_percent`; GPUs without it are judged by utilization, as the
  verdict says.
- low_efficiency: a running job with a GPU that looked busy (utilization at or above
  `min_util_percent`) while its SM activity stayed below `max_sm_active_percent` for
  `notice_after` gets a NOTICE, never a cancel; GPUs without GPM are never judged. It
  reads the job's stored intervals (`evaluate(intervals=...)`).
- max_runtime: a running GPU job is warned `warn_before` its limit and cancelled (or its
  Slurm time limit capped) at the limit, again only after a warning at least
  `warn_before` old. Jobs whose own Slurm time limit ends first are left to Slurm.
- gpu_quota: each [[quota]] rule's measured usage is warned at its `warn_at` fractions;
  at 100% its action (hold / block / qos:NAME / fairshare) is applied, and every applied
  action is undone once the scope is back under its limit, its period ended, the rule
  is gone or changed, or the scope became exempt.
- hot_node: a node with a GPU at or above `temperature_celsius`, new ECC errors or a lost
  GPU is drained.
- unallocated_use: GPU processes that no allocation holds are reported.

Unknown is not idle (DESIGN.md): a running GPU job with a GPU that has no activity row,
or whose newest reading is older than `freshness_intervals * [node].interval`, gets no
usage-based verdict. Instead it gets one Action.NONE verdict (policy idle_gpu, reason
"no fresh readings ...", or "Warning suspended: ..." for a job warned before) so that
the audit log shows why nothing happened; the controller never acts on NONE. Only
measured time is idle: a GPU's idle clock never starts before its
`GpuActivity.measured_since` (a gap in the readings resets it). Jobs exempt by config or
by an Exemption get no verdict.

Reasons are plain sentences for the user and the audit log. They do not name the
exemption contact: `notify.render` appends [notify].exemption_contact to every message.

Job states are squeue's (`RUNNING`, `PENDING`), compared case-insensitively.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from slurm_gpu.config import Config
from slurm_gpu.models import (
    Exemption,
    GpuActivity,
    GpuInterval,
    NodeHealth,
    QuotaApplied,
    QuotaUsage,
    SlotKind,
    SlurmJob,
    UnallocatedUse,
    Verdict,
)
from slurm_gpu.policy.rules.context import (
    GPU_QUOTA,
    HOT_NODE,
    IDLE_GPU,
    LOW_EFFICIENCY,
    MAX_RUNTIME,
    UNALLOCATED_USE,
    Context,
    holds_gpus,
)
from slurm_gpu.policy.rules.efficiency import low_efficiency
from slurm_gpu.policy.rules.idle import MIB, idle_gpu
from slurm_gpu.policy.rules.nodes import hot_node, unallocated_use
from slurm_gpu.policy.rules.quota import quotas
from slurm_gpu.policy.rules.runtime import max_runtime

__all__ = [
    "GPU_QUOTA",
    "HOT_NODE",
    "IDLE_GPU",
    "LOW_EFFICIENCY",
    "MAX_RUNTIME",
    "MIB",
    "UNALLOCATED_USE",
    "evaluate",
]


def evaluate(
    jobs: Sequence[SlurmJob],
    activity: Sequence[GpuActivity],
    now: float,
    config: Config,
    *,
    exemptions: Sequence[Exemption] = (),
    warned: Mapping[tuple[int, str], float] | None = None,
    quota_usage: Sequence[QuotaUsage] = (),
    quota_applied: Sequence[QuotaApplied] = (),
    node_health: Sequence[NodeHealth] = (),
    unallocated: Sequence[UnallocatedUse] = (),
    intervals: Sequence[GpuInterval] = (),
) -> list[Verdict]:
    """Every policy's verdicts for one controller cycle.

    Args:
        jobs: pending and running jobs (squeue).
        activity: the newest GpuActivity row of each running job's GPUs.
        now: the cycle's time, POSIX seconds.
        config: the loaded configuration.
        exemptions: admin exemptions (`slurm-gpu exempt`); expired ones are ignored.
        warned: (job_id, policy) -> when the first warning of the current episode was
            recorded. The controller records a WARN it delivered and forgets it when the
            job stops getting WARN/CANCEL from that policy.
        quota_usage: measured usage per [[quota]] rule (scope, unit, period).
        quota_applied: quota actions carried out and not yet undone.
        node_health: per-node GPU health.
        unallocated: GPU processes outside any allocation.
        intervals: the running jobs' stored GPU intervals, reaching at least
            [policy.low_efficiency] notice_after plus a shipping period back (only
            low_efficiency reads them).

    Returns:
        Verdicts in a stable order: per job (idle_gpu, low_efficiency, max_runtime), then
        quotas, hot nodes, unallocated use.
    """
    ctx = Context(config, now, exemptions, warned or {})
    by_job: dict[int, list[GpuActivity]] = defaultdict(list)
    for row in activity:
        by_job[row.job_id].append(row)
    intervals_of: dict[int, list[GpuInterval]] = defaultdict(list)
    for interval in intervals:
        if interval.job_id is not None:
            intervals_of[interval.job_id].append(interval)
    verdicts: list[Verdict] = []
    policy = config.policy
    for job in jobs:
        # squeue may show a job holding only gres/shard or gres/mps without GPUs; its
        # share rows from the agent make it a GPU job all the same (issue 14).
        shares = any(
            r.slot_kind in (SlotKind.SHARD, SlotKind.MPS) for r in by_job.get(job.job_id, ())
        )
        if job.state.upper() != "RUNNING" or not (holds_gpus(job) or shares):
            continue
        if policy.idle_gpu.enabled and not ctx.exempt(job, IDLE_GPU):
            verdict = idle_gpu(ctx, job, by_job.get(job.job_id, ()))
            if verdict is not None:
                verdicts.append(verdict)
        if policy.low_efficiency.enabled and not ctx.exempt(job, LOW_EFFICIENCY):
            verdict = low_efficiency(
                ctx, job, by_job.get(job.job_id, ()), intervals_of.get(job.job_id, ())
            )
            if verdict is not None:
                verdicts.append(verdict)
        if policy.max_runtime.enabled and not ctx.exempt(job, MAX_RUNTIME):
            verdict = max_runtime(ctx, job)
            if verdict is not None:
                verdicts.append(verdict)
    verdicts += quotas(ctx, jobs, quota_usage, quota_applied)
    if policy.hot_node.enabled:
        verdicts += [v for n in node_health if (v := hot_node(ctx, n)) is not None]
    if policy.unallocated_use.enabled:
        verdicts += [v for u in unallocated if (v := unallocated_use(ctx, u)) is not None]
    return verdicts
