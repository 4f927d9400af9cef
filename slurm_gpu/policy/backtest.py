"""`slurm-gpu policy backtest`: what the job policies would have done over stored history.

The same `evaluate()` the controller runs, replayed every [controller] interval over the
jobs and GPU intervals in the store, with the GPU activity each step would have seen
rebuilt from the intervals (newest reading, newest busy interval; with `[policy.idle_gpu]
signal = "sm_active"` the newest interval whose mean SM activity is at or above `[node]
sm_active_threshold_percent`, utilization where GPM measured nothing). Warnings start grace
periods and cancellations end jobs, as live; notices (some of a job's GPUs idle, or
low_efficiency's GPUs that looked busy while barely computing, judged from the same
intervals as live) are listed as the live controller audits them, once per job. So a
backtest and an enforcing run over the same window list the same warnings, notices and
cancellations, an admin can try thresholds in dry-run before enforcing, and see the
GPU-hours each policy would have returned.

Quotas, hot nodes and unallocated use depend on state outside the jobs' own history and
are not replayed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from slurm_gpu.access import Scope
from slurm_gpu.activity import is_active
from slurm_gpu.config import Config
from slurm_gpu.models import Action, Exemption, GpuActivity, GpuInterval, SlurmJob
from slurm_gpu.policy.rules import evaluate
from slurm_gpu.policy.rules.context import sm_threshold
from slurm_gpu.store import Store
from slurm_gpu.store.control import HistoricJob

JOB_POLICIES = ("idle_gpu", "low_efficiency", "max_runtime")


@dataclass
class PolicyOutcome:
    """One policy's replayed decisions."""

    warned: dict[int, float] = field(default_factory=dict)
    noticed: dict[int, float] = field(default_factory=dict)
    """Jobs given a notice (some GPUs idle while others work), and when first."""
    cancelled: dict[int, float] = field(default_factory=dict)
    gpu_hours_returned: float = 0.0


@dataclass
class BacktestResult:
    """Per policy, which jobs would have been warned, noticed and cancelled, and when."""

    since: float
    until: float
    step: float
    jobs: int
    policies: dict[str, PolicyOutcome]
    signal: str = "util"
    """What idle_gpu judged idle by ([policy.idle_gpu] signal)."""


def _activity(
    job: HistoricJob, rows: list[GpuInterval], t: float, period: float, sm_threshold: float
) -> list[GpuActivity]:
    """What the agent's activity rows would have said at `t`, from sealed intervals."""
    by_gpu: dict[tuple[str, str], list[GpuInterval]] = defaultdict(list)
    for row in rows:
        if row.period_start < t:
            by_gpu[(row.node, row.gpu_uuid)].append(row)
    out = []
    for index, ((node, uuid), seen) in enumerate(sorted(by_gpu.items())):
        newest = max(r.period_end for r in seen)
        busy = [min(r.period_end, t) for r in seen if r.active_seconds > 0]
        # SM activity: an interval's mean stands for its GPM windows (the agent judged
        # each window; the store keeps the mean), None where GPM measured none of it.
        measured = [r for r in seen if r.gpm_seconds > 0 and r.sm_active_mean_percent is not None]
        sm_busy = [
            min(r.period_end, t)
            for r in measured
            if is_active(r.sm_active_mean_percent or 0.0, sm_threshold)
        ]
        newest_sm = max(measured, key=lambda r: r.period_end, default=None)
        out.append(
            GpuActivity(
                job_id=job.job_id,
                node=node,
                gpu_uuid=uuid,
                slurm_index=index,
                start=job.start,
                # Intervals arrive a shipping period after the fact: one still open at t
                # was being read live.
                last_reading=t if newest >= t - period else newest,
                last_active=max(busy) if busy else None,
                util_recent_percent=None,
                mem_used_bytes=max((r.mem_used_max_bytes or 0 for r in seen), default=None),
                process_count=None,
                sm_active_recent_percent=(
                    None if newest_sm is None else newest_sm.sm_active_mean_percent
                ),
                last_sm_active=max(sm_busy) if sm_busy else None,
            )
        )
    return out


def backtest(
    store: Store,
    config: Config,
    since: float,
    until: float,
    step: float | None = None,
    *,
    scope: Scope | None = None,
) -> BacktestResult:
    """Replays the job policies over [since, until) every `step` seconds.

    scope: only the jobs this caller may see (None: every job); the job policies judge
    each job on its own, so leaving others out changes no decision about these.
    """
    step = step or float(config.controller.interval)
    period = max(float(config.store.ship_aggregate), float(config.node.interval))
    threshold = sm_threshold(config)
    control = store.control
    history = [
        j
        for j in control.jobs_between(since, until)
        if scope is None or scope.sees(j.user, j.account)
    ]
    intervals = {job.job_id: store.intervals(job_id=job.job_id) for job in history}
    exemptions = [
        Exemption(f"{e.kind}:{e.target}", e.policy, e.until, e.reason, e.created_by)
        for e in control.exemptions()
    ]
    outcomes = {name: PolicyOutcome() for name in JOB_POLICIES}
    warned: dict[tuple[int, str], float] = {}
    ended: dict[int, float] = {}
    # Decisions happen on a grid of `step` and at each job's last moment: the live
    # controller's cycles fall anywhere inside a step, so its last look at a job may come
    # after the grid's.
    grid = [since + n * step for n in range(int((until - since) // step) + 1)]
    ends = [j.end for j in history if j.end is not None and since <= j.end < until]
    for t in sorted(set(grid) | set(ends)):
        running = [
            j
            for j in history
            if j.start <= t <= (j.end if j.end is not None else until) and j.job_id not in ended
        ]
        jobs = [
            SlurmJob(
                job_id=j.job_id,
                user=j.user,
                account=j.account,
                partition=j.partition,
                state="RUNNING",
                name=j.name,
                start_time=j.start,
                gpu_count=j.gpus,
                nodes=j.nodes,
            )
            for j in running
        ]
        activity = [
            a for j in running for a in _activity(j, intervals[j.job_id], t, period, threshold)
        ]
        # What the store held at t, for low_efficiency (as `_activity` sees it).
        seen = [r for j in running for r in intervals[j.job_id] if r.period_start < t]
        # A warning counts as given up to one step earlier: where inside the step the
        # live cycle fell is unknown.
        earlier = {key: at - step for key, at in warned.items()}
        verdicts = [
            v
            for v in evaluate(
                jobs, activity, t, config, exemptions=exemptions, warned=earlier, intervals=seen
            )
            if v.policy in JOB_POLICIES and v.job_id is not None
        ]
        flagged = set()
        for v in verdicts:
            assert v.job_id is not None
            outcome = outcomes[v.policy]
            if v.action is Action.WARN:
                warned.setdefault((v.job_id, v.policy), t)
                outcome.warned.setdefault(v.job_id, t)
                flagged.add((v.job_id, v.policy))
            elif v.action is Action.NOTICE:
                outcome.noticed.setdefault(v.job_id, t)
            elif v.action in (Action.CANCEL, Action.CAP_TIME):
                outcome.cancelled.setdefault(v.job_id, t)
                ended[v.job_id] = t
                flagged.add((v.job_id, v.policy))
        for key in [k for k in warned if k not in flagged]:
            del warned[key]  # the episode ended (as the live controller withdraws it)
    by_id = {j.job_id: j for j in history}
    for outcome in outcomes.values():
        for job_id, at in outcome.cancelled.items():
            job = by_id[job_id]
            real_end = job.end if job.end is not None else until
            outcome.gpu_hours_returned += max(0.0, real_end - at) * job.gpus / 3600
    return BacktestResult(
        since, until, step, len(history), outcomes, signal=config.policy.idle_gpu.signal
    )
