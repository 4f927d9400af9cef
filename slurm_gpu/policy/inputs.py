"""The policies' inputs: what each controller cycle reads from the store for evaluate().

Slurm gives the jobs and nodes (squeue, scontrol); the store gives the GPU activity of the
running jobs, their recent GPU intervals, the exemptions in force, the warnings of the
current episodes, node health (readings, lost GPUs, heartbeats), quota usage and what the
quota policy set, and the stray processes on GPUs that no allocation allows. Missing data
stays missing here: a job without fresh readings is unknown to the policies, never idle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from slurm_gpu.config import Config, shipping_delay
from slurm_gpu.models import (
    Action,
    Exemption,
    GpuActivity,
    GpuInterval,
    QuotaApplied,
    QuotaUsage,
    SlurmJob,
    UnallocatedUse,
)
from slurm_gpu.policy.audit_history import first_warnings
from slurm_gpu.policy.node_health import NodeReadings, node_health
from slurm_gpu.policy.quota_periods import cluster_timezone, period_bounds
from slurm_gpu.store import Store
from slurm_gpu.store.control import ExemptionRecord

QuotaMeter = Callable[[str, str, float, float, float], float]
"""(scope, unit, since, until, now) -> what the scope used in [since, until], in unit."""


@dataclass(frozen=True)
class CycleInputs:
    """What one cycle read from the store for the policies.

    Attributes:
        activity: the running jobs' newest GPU activity.
        recent: the intervals of the last few shipping periods (node health, strays).
        intervals: the running jobs' intervals in that read (low_efficiency).
        exemption_records: the `slurm-gpu exempt` exemptions in force.
        exemptions: the same, as the policies take them.
        warned: {(job, policy): first warning of the current episode}.
        node_health: each node's health (`node_health.node_health`).
    """

    activity: list[GpuActivity]
    recent: list[GpuInterval]
    intervals: list[GpuInterval]
    exemption_records: list[ExemptionRecord]
    exemptions: list[Exemption]
    warned: dict[tuple[int, str], float]
    node_health: NodeReadings


class PolicyInputs:
    """Reads the policies' inputs from the store, remembering what spans cycles.

    Args:
        config: the loaded configuration.
        store: the accounting store.
        quota_meter: what a quota counts (the bill's); needed only with [[quota]] rules.
    """

    def __init__(self, config: Config, store: Store, quota_meter: QuotaMeter | None) -> None:
        self.config = config
        self.store = store
        self.control = store.control
        self.quota_meter = quota_meter
        self._ecc_seen: dict[str, int] = {}
        # (node, GPU) -> stray pids already reported.
        self._unallocated_reported: dict[tuple[str, str], set[int]] = {}

    def read(
        self,
        jobs: list[SlurmJob],
        drained: list[str],
        now: float,
        dry_run: bool,
        resumed: Mapping[str, float],
    ) -> CycleInputs:
        """This cycle's activity, intervals, exemptions, warnings and node health.

        resumed: {node: when an admin resumed it after slurm-gpu drained it}.
        """
        running = [j.job_id for j in jobs if j.state.upper() == "RUNNING"]
        activity = self.store.activity(running)
        # One read serves node health and stray processes (the last few shipping periods)
        # and low_efficiency (its notice_after, and a shipping period more, of the
        # running jobs' intervals).
        recent_since = self._recent_intervals_window(now)
        since = recent_since
        if self.config.policy.low_efficiency.enabled and running:
            since = min(since, self._efficiency_window(now))
        read = self.store.intervals(since=since)
        recent = [r for r in read if r.period_end > recent_since]
        running_ids = set(running)
        intervals = [r for r in read if r.job_id in running_ids]
        records = self.control.exemptions(now)
        exemptions = [
            Exemption(e.scope, e.policy, e.until, e.reason, e.created_by) for e in records
        ]
        warned = first_warnings(self.control, running, dry_run)
        readings = node_health(
            recent,
            self.store.inventory(),
            drained,
            resumed,
            self.control.heartbeat_ticks(sorted(resumed)),
            self._ecc_seen,
        )
        return CycleInputs(activity, recent, intervals, records, exemptions, warned, readings)

    def quota_usage(self, now: float) -> list[QuotaUsage]:
        """What each [[quota]] scope used in its current period, as the bill counts it."""
        tz = cluster_timezone(self.config.controller.timezone)
        usage = []
        for rule in self.config.quota:
            start, end = period_bounds(now, rule.period, tz)
            assert self.quota_meter is not None  # the Controller refuses quota rules without one
            used = self.quota_meter(rule.scope, rule.unit, start, min(end, now), now)
            usage.append(QuotaUsage(rule.scope, rule.unit, rule.period, used, start, end))
        return usage

    def quota_applied(self, live_jobs: set[int]) -> list[QuotaApplied]:
        """What the quota policy set and has not undone; entries of vanished jobs are dropped."""
        applied = []
        for entry in self.control.quota_actions():
            d = entry.details
            job_id = d.get("job_id")
            if job_id is not None and job_id not in live_jobs:
                # Held or re-QOSed job that has since ended or was cancelled: nothing to undo.
                self.control.forget_quota_action(entry.scope, entry.action, entry.target)
                continue
            applied.append(
                QuotaApplied(
                    scope=entry.scope,
                    unit=str(d.get("unit", "")),
                    period=str(d.get("period", "")),
                    action=Action(entry.action),
                    target=entry.target,
                    job_id=d.get("job_id"),
                    previous=str(d.get("previous", "")),
                    period_end=d.get("period_end"),
                    applied_at=entry.applied_at,
                )
            )
        return applied

    def unallocated(self, recent: list[GpuInterval]) -> list[UnallocatedUse]:
        """Stray processes in the recent intervals, once per new process.

        The window looks back several shipping periods, since intervals reach the store
        a little after they end; a GPU is reported again only when a process it had not
        reported appears (with all its current processes).
        """
        found: dict[tuple[str, str], set[int]] = {}
        for row in recent:
            if row.unallocated_pids:
                found.setdefault((row.node, row.gpu_uuid), set()).update(row.unallocated_pids)
        uses = [
            UnallocatedUse(node, gpu, tuple(sorted(pids)))
            for (node, gpu), pids in sorted(found.items())
            if not pids <= self._unallocated_reported.get((node, gpu), set())
        ]
        # Forget GPUs gone quiet, so the dict stays the size of what is happening now.
        self._unallocated_reported = {
            key: pids | self._unallocated_reported.get(key, set()) for key, pids in found.items()
        }
        return uses

    def store_period(self) -> float:
        """How far back "recent" readings reach: how late a reading may reach the store."""
        return shipping_delay(self.config)

    def _recent_intervals_window(self, now: float) -> float:
        return now - 3 * float(self.store_period())

    def _efficiency_window(self, now: float) -> float:
        """How far back low_efficiency reads: its notice_after and two shipping periods."""
        notice_after = float(self.config.policy.low_efficiency.notice_after)
        return now - notice_after - 2 * float(self.store_period())
