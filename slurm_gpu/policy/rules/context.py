"""The evaluation context the policies share, and the helpers their verdicts use.

`Context` holds one cycle's lookups (exemptions by config and by `slurm-gpu exempt`, the
cluster's time zone, the freshness limit) and decides whether a job or quota scope is
exempt from a policy. The rest builds job verdicts and words durations, GPUs and numbers
for their reasons.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_gpu.activity import slot_text
from slurm_gpu.config import Config
from slurm_gpu.config.policy import JobPolicySettings
from slurm_gpu.models import Action, Exemption, GpuActivity, SlotKind, SlurmJob, Verdict
from slurm_gpu.policy.quota_periods import cluster_timezone

IDLE_GPU = "idle_gpu"
LOW_EFFICIENCY = "low_efficiency"
MAX_RUNTIME = "max_runtime"
GPU_QUOTA = "gpu_quota"
HOT_NODE = "hot_node"
UNALLOCATED_USE = "unallocated_use"


def holds_gpus(job: SlurmJob) -> bool:
    """Whether the job asked for GPUs or was given some (squeue reports either)."""
    return job.gpu_count > 0 or any(indices for _, indices in job.gpus)


def sm_threshold(config: Config) -> float:
    """`[node] sm_active_threshold_percent`: SM activity at or above it is use (GPM).

    The agent takes `GpuActivity.last_sm_active` with it (`slurm_gpu.activity.is_active`).
    """
    return float(config.node.sm_active_threshold_percent)


class Context:
    """Per-cycle lookups built once: exemption sets, time zone, freshness limit.

    Args:
        config: The configuration whose policies are evaluated.
        now: The cycle's time (epoch seconds); no policy reads a clock.
        exemptions: Exemptions recorded by `slurm-gpu exempt`; expired ones are dropped.
        warned: When each (job id, policy) was last warned, for the grace periods.
    """

    def __init__(
        self,
        config: Config,
        now: float,
        exemptions: Sequence[Exemption],
        warned: Mapping[tuple[int, str], float],
    ) -> None:
        self.config = config
        self.now = now
        self.warned = warned
        self.tz = cluster_timezone(config.controller.timezone)
        # Activity rows travel with the batches: [node] ship_interval late at most.
        self.fresh_seconds = config.controller.freshness_intervals * float(
            config.node.interval
        ) + float(config.node.ship_interval)
        self.sm_threshold = sm_threshold(config)
        self.explicit: dict[str, list[Exemption]] = defaultdict(list)
        for exemption in exemptions:
            if exemption.expires is None or now < exemption.expires:
                self.explicit[exemption.scope].append(exemption)
        p = config.policy
        self.sets = {
            name: _ExemptSets.of(settings)
            for name, settings in (
                (IDLE_GPU, p.idle_gpu),
                (LOW_EFFICIENCY, p.low_efficiency),
                (MAX_RUNTIME, p.max_runtime),
                (GPU_QUOTA, p.gpu_quota),
            )
        }

    def explicitly_exempt(self, scopes: Iterable[str], policy: str) -> bool:
        """An unexpired Exemption for one of `scopes` covers `policy`."""
        return any(
            e.policy in ("", policy) for scope in scopes for e in self.explicit.get(scope, ())
        )

    def exempt(self, job: SlurmJob, policy: str) -> bool:
        """The job is exempt from `policy` by config or by an Exemption."""
        if self.sets[policy].matches(job):
            return True
        if not self.explicit:
            return False
        scopes = [f"job:{job.job_id}", f"user:{job.user}", f"account:{job.account}"]
        if job.array_job_id is not None:
            scopes.append(f"job:{job.array_job_id}")  # exempting an array covers its tasks
        return self.explicitly_exempt(scopes, policy)

    def scope_exempt(self, scope: str) -> bool:
        """A quota scope ("account:x", "user:y") is exempt from gpu_quota."""
        kind, _, name = scope.partition(":")
        sets = self.sets[GPU_QUOTA]
        listed = sets.accounts if kind == "account" else sets.users
        return name in listed or self.explicitly_exempt([scope], GPU_QUOTA)

    def time_text(self, when: float) -> str:
        """A time as users read it: "14:05" today, "2024-06-03 14:05" otherwise."""
        moment = dt.datetime.fromtimestamp(when, self.tz)
        today = dt.datetime.fromtimestamp(self.now, self.tz).date()
        return moment.strftime("%H:%M" if moment.date() == today else "%Y-%m-%d %H:%M")

    def day(self, when: float) -> str:
        """A date in the cluster's time zone: "2024-06-01"."""
        return dt.datetime.fromtimestamp(when, self.tz).strftime("%Y-%m-%d")


@dataclass(frozen=True)
class _ExemptSets:
    users: frozenset[str]
    accounts: frozenset[str]
    partitions: frozenset[str]
    qos: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def of(cls, settings: JobPolicySettings) -> _ExemptSets:
        return cls(
            users=frozenset(settings.exempt_users),
            accounts=frozenset(settings.exempt_accounts),
            partitions=frozenset(settings.exempt_partitions),
            qos=frozenset(settings.exempt_qos),
            prefixes=tuple(settings.exempt_job_name_prefixes),
        )

    def matches(self, job: SlurmJob) -> bool:
        # A pending job may list several partitions ("gpu,debug"): exempt only if all are.
        partitions = job.partition.split(",") if job.partition else []
        return (
            job.user in self.users
            or job.account in self.accounts
            or (bool(partitions) and all(p in self.partitions for p in partitions))
            or (bool(job.qos) and job.qos in self.qos)
            or (bool(self.prefixes) and job.name.startswith(self.prefixes))
        )


def job_verdict(
    policy: str,
    action: Action,
    job: SlurmJob,
    reason: str,
    *,
    deadline: float | None = None,
    details: tuple[tuple[str, object], ...] = (),
) -> Verdict:
    """A verdict on one job, its user and account filled in from the job.

    Args:
        policy: The policy's name (`IDLE_GPU`, `MAX_RUNTIME`, ...).
        action: What the controller is to do.
        job: The job the verdict is about.
        reason: The sentence the user and the audit log read.
        deadline: When a warned action takes effect, if it has one.
        details: Figures for the audit log, as (name, value) pairs.

    Returns:
        The verdict, targeting "job:ID".
    """
    return Verdict(
        policy=policy,
        action=action,
        target=f"job:{job.job_id}",
        reason=reason,
        job_id=job.job_id,
        user=job.user,
        account=job.account,
        deadline=deadline,
        details=details,
    )


def span_text(seconds: float) -> str:
    """A duration for people: "40 s", "47 min", "2 h 5 min", "24 h", "3 d 4 h"."""
    if seconds < 60:
        return f"{int(max(seconds, 0.0))} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def gpu_list(rows: Iterable[GpuActivity]) -> str:
    """GPUs by node for people: "GPUs 0,1 on gpu1 and GPU 3 on gpu2".

    The indices are Slurm's, as the user's job sees them. A slot that is not a whole GPU
    (issue 14) is named by itself, after the whole GPUs: "MIG 1g.10gb slice MIG-... on
    gpu3", "shard 1/4 of GPU-... on gpu3".
    """
    per_node: dict[str, list[int]] = defaultdict(list)
    slots: list[str] = []
    for row in rows:
        if row.slot_kind == SlotKind.GPU:
            per_node[row.node].append(row.slurm_index)
        else:
            slots.append(f"{slot_name(row)} on {row.node}")
    parts = []
    for node in sorted(per_node):
        indices = sorted(per_node[node])
        noun = "GPU" if len(indices) == 1 else "GPUs"
        parts.append(f"{noun} {','.join(map(str, indices))} on {node}")
    return " and ".join([*parts, *sorted(slots)])


def slot_name(row: GpuActivity) -> str:
    """A slot as a policy reason names it: "MIG 1g.10gb slice MIG-...", "GPU 0".

    A MIG slice by its profile and MIG UUID, a share by its part of its GPU
    (`slurm_gpu.activity.slot_text`), a whole GPU by its Slurm index.
    """
    if row.slot_kind == SlotKind.MIG:
        return f"MIG {row.mig_profile or '?'} slice {row.effective_slot_id}"
    if row.slot_kind == SlotKind.GPU:
        return f"GPU {row.slurm_index}"
    return slot_text(row.slot_kind, row.effective_slot_id, row.gpu_uuid, row.share)


def number_text(value: float) -> str:
    """A figure for people: "1,234", "12.5", "0.0417" (about three significant digits)."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.1f}" if abs(value) >= 1 else f"{value:.3g}"
