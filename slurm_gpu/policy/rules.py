"""The policies as one pure function: what Slurm and the agents report -> verdicts.

`evaluate` reads no files, no clock and no database: the controller gathers the inputs
(squeue, the store, its own records of warnings and applied quota actions), passes `now`,
and acts on the verdicts after writing them to the audit log. The same inputs always
give the same verdicts, which is what the unit tests and the dry run rely on.

Policies (config in `slurm_gpu.policy.settings`):

- idle_gpu: a running job whose GPUs are all idle is warned at `warn_after` and cancelled
  at `cancel_after`, but only once a warning for the current idle stretch was recorded at
  least `cancel_after - warn_after` ago (the user always gets that long to react). A job
  with some idle and some busy GPUs gets a NOTICE, never a cancel.
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
"no fresh readings ...") so that the audit log shows why nothing happened; the
controller never acts on NONE. Jobs exempt by config or by an Exemption get no verdict.

Reasons are plain sentences for the user and the audit log. They do not name the
exemption contact: `notify.render` appends [notify].exemption_contact to every message.

Job states are squeue's (`RUNNING`, `PENDING`), compared case-insensitively.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_gpu.config import Config
from slurm_gpu.models import (
    Action,
    Exemption,
    GpuActivity,
    NodeHealth,
    QuotaApplied,
    QuotaUsage,
    SlurmJob,
    UnallocatedUse,
    Verdict,
)
from slurm_gpu.policy.quota_periods import cluster_timezone, is_rolling, rolling_days
from slurm_gpu.policy.settings import JobPolicySettings, QuotaRule

__all__ = [
    "GPU_QUOTA",
    "HOT_NODE",
    "IDLE_GPU",
    "MAX_RUNTIME",
    "MIB",
    "UNALLOCATED_USE",
    "evaluate",
]

IDLE_GPU = "idle_gpu"
MAX_RUNTIME = "max_runtime"
GPU_QUOTA = "gpu_quota"
HOT_NODE = "hot_node"
UNALLOCATED_USE = "unallocated_use"
MIB = 1024 * 1024
_UNIT_NAMES = {"gpu_hours": "GPU-hours", "gpu_mem_hours": "GPU-memory GiB-hours"}
_UNIT_NAMES["job_hours"] = "job-hours"
_QUOTA_ACTIONS = {"hold": Action.HOLD, "block": Action.BLOCK, "fairshare": Action.SET_FAIRSHARE}


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

    Returns:
        Verdicts in a stable order: per job (idle_gpu, max_runtime), then quotas, hot
        nodes, unallocated use.
    """
    ctx = _Context(config, now, exemptions, warned or {})
    by_job: dict[int, list[GpuActivity]] = defaultdict(list)
    for row in activity:
        by_job[row.job_id].append(row)
    verdicts: list[Verdict] = []
    policy = config.policy
    for job in jobs:
        if job.state.upper() != "RUNNING" or not _holds_gpus(job):
            continue
        if policy.idle_gpu.enabled and not ctx.exempt(job, IDLE_GPU):
            verdict = _idle_gpu(ctx, job, by_job.get(job.job_id, ()))
            if verdict is not None:
                verdicts.append(verdict)
        if policy.max_runtime.enabled and not ctx.exempt(job, MAX_RUNTIME):
            verdict = _max_runtime(ctx, job)
            if verdict is not None:
                verdicts.append(verdict)
    verdicts += _quotas(ctx, jobs, quota_usage, quota_applied)
    if policy.hot_node.enabled:
        verdicts += [v for n in node_health if (v := _hot_node(ctx, n)) is not None]
    if policy.unallocated_use.enabled:
        verdicts += [v for u in unallocated if (v := _unallocated(ctx, u)) is not None]
    return verdicts


def _holds_gpus(job: SlurmJob) -> bool:
    return job.gpu_count > 0 or any(indices for _, indices in job.gpus)


# ---------------------------------------------------------------------------- context


class _Context:
    """Per-cycle lookups built once: exemption sets, time zone, freshness limit."""

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
        self.fresh_seconds = config.controller.freshness_intervals * config.node.interval
        self.explicit: dict[str, list[Exemption]] = defaultdict(list)
        for exemption in exemptions:
            if exemption.expires is None or now < exemption.expires:
                self.explicit[exemption.scope].append(exemption)
        p = config.policy
        self.sets = {
            name: _ExemptSets.of(settings)
            for name, settings in (
                (IDLE_GPU, p.idle_gpu),
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

    def clock(self, when: float) -> str:
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


def _job_verdict(
    policy: str,
    action: Action,
    job: SlurmJob,
    reason: str,
    *,
    deadline: float | None = None,
    details: tuple[tuple[str, object], ...] = (),
) -> Verdict:
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


def _span(seconds: float) -> str:
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


def _gpu_list(rows: Iterable[GpuActivity]) -> str:
    """ "GPUs 0,1 on gpu1 and GPU 3 on gpu2" (Slurm indices, as the user's job sees them)."""
    per_node: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        per_node[row.node].append(row.slurm_index)
    parts = []
    for node in sorted(per_node):
        indices = sorted(per_node[node])
        noun = "GPU" if len(indices) == 1 else "GPUs"
        parts.append(f"{noun} {','.join(map(str, indices))} on {node}")
    return " and ".join(parts)


def _number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.1f}" if abs(value) >= 1 else f"{value:.3g}"


# ---------------------------------------------------------------------------- idle_gpu


def _idle_gpu(ctx: _Context, job: SlurmJob, rows: Sequence[GpuActivity]) -> Verdict | None:
    settings = ctx.config.policy.idle_gpu
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
        what = []
        if missing:
            what.append(f"{missing} GPU(s) without readings")
        if stale:
            newest = max(r.last_reading for r in stale)
            what.append(f"{_gpu_list(stale)} last read {_span(now - newest)} ago")
        return _job_verdict(
            IDLE_GPU,
            Action.NONE,
            job,
            f"No fresh readings for job {job.job_id} ({'; '.join(what)}): its GPU use is "
            "unknown, and unknown is never treated as idle.",
            details=(("missing_gpus", missing), ("stale_gpus", len(stale))),
        )

    floor = settings.memory_floor_mib * MIB
    threshold = settings.threshold_percent
    job_start = job.start_time
    idle_for: list[float] = []
    for row in mine:
        active_at = row.last_active
        if row.util_recent_percent is not None and row.util_recent_percent >= threshold:
            active_at = row.last_reading if active_at is None else max(active_at, row.last_reading)
        # A process with a bare context is idle; one holding real data is memory-only.
        holds_memory = (row.mem_used_bytes or 0) > floor
        start = row.start if job_start is None else max(row.start, job_start)
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
    threshold_text = f"below {threshold:g}% utilization"
    if len(idle) < len(mine):
        busy = [
            r for r, seconds in zip(mine, idle_for, strict=True) if seconds < settings.warn_after
        ]
        longest = max(idle_for)
        return _job_verdict(
            IDLE_GPU,
            Action.NOTICE,
            job,
            f"{_gpu_list(idle)} of job {job.job_id} {'has' if len(idle) == 1 else 'have'} been "
            f"{threshold_text} for {_span(longest)} while {_gpu_list(busy)} "
            f"{'is' if len(busy) == 1 else 'are'} in use; consider asking for fewer GPUs. "
            "The job will not be cancelled for this.",
            details=(
                ("idle_gpus", len(idle)),
                ("busy_gpus", len(busy)),
                ("idle_seconds", longest),
            ),
        )

    job_idle = min(idle_for)
    idle_since = now - job_idle
    since_text = (
        "not been used since the job started"
        if settings.window == "from_start"
        else f"been {threshold_text}"
    )
    grace = settings.cancel_after - settings.warn_after
    warned_at = ctx.warned.get((job.job_id, IDLE_GPU))
    if warned_at is not None and warned_at < idle_since:
        warned_at = None  # a warning from an earlier idle stretch: the job was used since
    details: tuple[tuple[str, object], ...] = (
        ("idle_seconds", job_idle),
        ("threshold_percent", threshold),
        ("window", settings.window),
        ("gpus", len(mine)),
    )
    if job_idle >= settings.cancel_after and warned_at is not None and now - warned_at >= grace:
        return _job_verdict(
            IDLE_GPU,
            Action.CANCEL,
            job,
            f"Job {job.job_id} cancelled: {_gpu_list(mine)} had {since_text} for "
            f"{_span(job_idle)}, and the warning at {ctx.clock(warned_at)} went unanswered.",
            details=(*details, ("warned_at", warned_at)),
        )
    warning = now if warned_at is None else warned_at
    deadline = max(idle_since + settings.cancel_after, warning + grace)
    return _job_verdict(
        IDLE_GPU,
        Action.WARN,
        job,
        f"{_gpu_list(mine)} of job {job.job_id} {'has' if len(mine) == 1 else 'have'} "
        f"{since_text} for {_span(job_idle)}; the job will be cancelled at "
        f"{ctx.clock(deadline)} unless {'it is' if len(mine) == 1 else 'they are'} used.",
        deadline=deadline,
        details=details,
    )


# ---------------------------------------------------------------------------- max_runtime


def _max_runtime(ctx: _Context, job: SlurmJob) -> Verdict | None:
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
    limit_text = f"the {_span(limit)} runtime limit of {source}"
    warned_long_enough = settings.warn_before <= 0 or (
        warned_at is not None and now - warned_at >= settings.warn_before
    )
    if elapsed >= limit and warned_long_enough:
        if settings.action == "cap":
            return _job_verdict(
                MAX_RUNTIME,
                Action.CAP_TIME,
                job,
                f"Job {job.job_id} has run {_span(elapsed)}, reaching {limit_text}; its "
                f"time limit is set to {_span(limit)}.",
                details=(*details, ("time_limit_seconds", limit)),
            )
        return _job_verdict(
            MAX_RUNTIME,
            Action.CANCEL,
            job,
            f"Job {job.job_id} cancelled: it has run {_span(elapsed)}, reaching {limit_text}.",
            details=details,
        )
    deadline = max(end, (warned_at if warned_at is not None else now) + settings.warn_before)
    verb = "stopped at its limit" if settings.action == "cap" else "cancelled"
    return _job_verdict(
        MAX_RUNTIME,
        Action.WARN,
        job,
        f"Job {job.job_id} has run {_span(elapsed)} and will be {verb} at "
        f"{ctx.clock(deadline)} by {limit_text}; save your work.",
        deadline=deadline,
        details=details,
    )


# ---------------------------------------------------------------------------- gpu_quota


def _quota_action(rule: QuotaRule) -> Action:
    return Action.SET_QOS if rule.action.startswith("qos:") else _QUOTA_ACTIONS[rule.action]


def _scope_fields(scope: str) -> tuple[str, str]:
    """(user, account) of a quota scope, for the Verdict fields."""
    kind, _, name = scope.partition(":")
    return (name, "") if kind == "user" else ("", name)


def _in_scope(job: SlurmJob, scope: str) -> bool:
    kind, _, name = scope.partition(":")
    return (job.user if kind == "user" else job.account) == name


def _quotas(
    ctx: _Context,
    jobs: Sequence[SlurmJob],
    usage: Sequence[QuotaUsage],
    applied: Sequence[QuotaApplied],
) -> list[Verdict]:
    enabled = ctx.config.policy.gpu_quota.enabled
    rules: dict[tuple[str, str, str], QuotaRule] = {}
    if enabled:
        rules = {(r.scope, r.unit, r.period): r for r in ctx.config.quota}
    now = ctx.now
    current = {
        (u.scope, u.unit, u.period): u
        for u in usage
        if u.period_start <= now and (now < u.period_end or is_rolling(u.period))
    }
    verdicts: list[Verdict] = []
    done = {(a.scope, a.unit, a.period, a.target) for a in applied}
    pending = [j for j in jobs if j.state.upper() == "PENDING"]
    for key, rule in rules.items():
        measured = current.get(key)
        if measured is None or ctx.scope_exempt(rule.scope):
            continue  # unknown usage never triggers an action
        verdicts += _quota_rule(ctx, rule, measured, pending, done)
    for entry in applied:
        verdict = _undo(ctx, entry, rules.get((entry.scope, entry.unit, entry.period)), current)
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts


def _usage_text(ctx: _Context, rule: QuotaRule, used: QuotaUsage) -> str:
    kind, _, name = rule.scope.partition(":")
    days = rolling_days(rule.period)
    when = f"in the last {days} days" if days else f"since {ctx.day(used.period_start)}"
    unit = _UNIT_NAMES[rule.unit]
    return (
        f"{kind.capitalize()} {name} has used {_number(used.used)} of its "
        f"{_number(rule.limit)} {unit} {when}"
    )


def _quota_rule(
    ctx: _Context,
    rule: QuotaRule,
    used: QuotaUsage,
    pending: Sequence[SlurmJob],
    done: set[tuple[str, str, str, str]],
) -> list[Verdict]:
    fraction = used.used / rule.limit if rule.limit > 0 else float("inf")
    user, account = _scope_fields(rule.scope)
    text = _usage_text(ctx, rule, used)
    figures: tuple[tuple[str, object], ...] = (
        ("used", used.used),
        ("limit", rule.limit),
        ("unit", rule.unit),
        ("period", rule.period),
        ("period_start", used.period_start),
        ("period_end", used.period_end),
    )

    def verdict(action: Action, target: str, reason: str, *extra: tuple[str, object]) -> Verdict:
        job_id = int(target[4:]) if target.startswith("job:") else None
        return Verdict(
            policy=GPU_QUOTA,
            action=action,
            target=target,
            reason=reason,
            job_id=job_id,
            user=user,
            account=account,
            details=(*figures, *extra),
        )

    out = [
        verdict(
            Action.WARN,
            rule.scope,
            f"{text} ({fraction:.0%}); at 100% {_consequence(rule)}.",
            ("fraction", f),
        )
        for f in sorted(rule.warn_at)
        if fraction >= f
    ]
    if used.used < rule.limit:
        return out
    reset = "" if is_rolling(rule.period) else f" until {ctx.day(used.period_end)}"
    over = f"{text}, reaching the limit"
    action = _quota_action(rule)
    key = (rule.scope, rule.unit, rule.period)
    if action in (Action.BLOCK, Action.SET_FAIRSHARE):
        if (*key, rule.scope) in done:
            return out
        if action is Action.BLOCK:
            reason = f"{over}; no new GPU jobs start{reset}."
            return [*out, verdict(action, rule.scope, reason, ("tres", "gres/gpu=0"))]
        reason = f"{over}; its fairshare is lowered to {rule.fairshare_shares}{reset}."
        return [
            *out,
            verdict(action, rule.scope, reason, ("shares", rule.fairshare_shares)),
        ]
    qos = rule.action[4:]
    for job in pending:
        target = f"job:{job.job_id}"
        if not _in_scope(job, rule.scope) or (*key, target) in done:
            continue
        if ctx.exempt(job, GPU_QUOTA):
            continue
        if action is Action.HOLD:
            reason = f"{over}; job {job.job_id} is held{reset}."
            out.append(verdict(Action.HOLD, target, reason))
        elif job.qos != qos:
            reason = f"{over}; job {job.job_id} moves to QOS {qos}{reset}."
            out.append(verdict(Action.SET_QOS, target, reason, ("qos", qos), ("previous", job.qos)))
    return out


def _consequence(rule: QuotaRule) -> str:
    if rule.action == "hold":
        return "pending jobs are held"
    if rule.action == "block":
        return "no new GPU jobs start"
    if rule.action == "fairshare":
        return f"fairshare drops to {rule.fairshare_shares}"
    return f"pending jobs move to QOS {rule.action[4:]}"


def _undo(
    ctx: _Context,
    entry: QuotaApplied,
    rule: QuotaRule | None,
    current: Mapping[tuple[str, str, str], QuotaUsage],
) -> Verdict | None:
    used = current.get((entry.scope, entry.unit, entry.period))
    if rule is None:
        why = "its quota rule was removed or the quota policy is off"
    elif _quota_action(rule) is not entry.action:
        why = f"the quota's action is now {rule.action}"
    elif (
        entry.period_end is not None
        and not is_rolling(entry.period)  # a rolling window never ends
        and ctx.now >= entry.period_end
    ):
        why = "a new quota period began"
    elif used is not None and used.used < rule.limit:
        why = f"usage ({_number(used.used)}) is below the limit ({_number(rule.limit)}) again"
    elif ctx.scope_exempt(entry.scope):
        why = f"{entry.scope} is exempt from quotas"
    elif ctx.explicitly_exempt([entry.target], GPU_QUOTA):
        why = f"{entry.target} is exempt from quotas"
    else:
        return None
    user, account = _scope_fields(entry.scope)
    undo: dict[Action, tuple[Action, str, tuple[tuple[str, object], ...]]] = {
        Action.HOLD: (Action.RELEASE, "released", ()),
        Action.BLOCK: (Action.UNBLOCK, "unblocked", (("tres", "gres/gpu=-1"),)),
        Action.SET_QOS: (Action.SET_QOS, "back to its QOS", (("qos", entry.previous or "normal"),)),
        Action.SET_FAIRSHARE: (
            Action.SET_FAIRSHARE,
            "back to its fairshare",
            (("shares", int(entry.previous) if entry.previous.isdigit() else 1),),
        ),
    }
    if entry.action not in undo:
        return None
    action, done, extra = undo[entry.action]
    kind, _, name = entry.target.partition(":")
    return Verdict(
        policy=GPU_QUOTA,
        action=action,
        target=entry.target,
        reason=f"{kind.capitalize()} {name} is {done}: {why}.",
        job_id=entry.job_id,
        user=user,
        account=account,
        details=(*extra, ("restore", True), ("undoes", entry.action.value)),
    )


# ---------------------------------------------------------------------------- nodes


def _hot_node(ctx: _Context, health: NodeHealth) -> Verdict | None:
    settings = ctx.config.policy.hot_node
    if health.drained or health.node in settings.exempt_nodes:
        return None
    problems = []
    temperature = health.max_temperature_celsius
    if temperature is not None and temperature >= settings.temperature_celsius:
        problems.append(f"GPU at {temperature:g}C (limit {settings.temperature_celsius:g}C)")
    if settings.drain_on_ecc and health.new_ecc_errors > 0:
        problems.append(f"{health.new_ecc_errors} new GPU ECC error(s)")
    if settings.drain_on_lost_gpu and health.lost_gpus:
        problems.append(f"lost GPU {', '.join(health.lost_gpus)}")
    if not problems:
        return None
    return Verdict(
        policy=HOT_NODE,
        action=Action.DRAIN,
        target=f"node:{health.node}",
        reason="; ".join(problems),  # the drain prefixes "slurm-gpu: "
        node=health.node,
        details=(
            ("max_temperature_celsius", temperature),
            ("new_ecc_errors", health.new_ecc_errors),
            ("lost_gpus", health.lost_gpus),
        ),
    )


def _unallocated(ctx: _Context, use: UnallocatedUse) -> Verdict | None:
    settings = ctx.config.policy.unallocated_use
    if use.node in settings.exempt_nodes:
        return None
    if use.users and all(u in settings.exempt_users for u in use.users):
        return None
    gpu = f"GPU {use.slurm_index} ({use.gpu_uuid})" if use.slurm_index is not None else use.gpu_uuid
    owners = f" of {', '.join(sorted(set(use.users)))}" if use.users else ""
    noun = "Process" if len(use.pids) == 1 else "Processes"
    return Verdict(
        policy=UNALLOCATED_USE,
        action=Action.REPORT,
        target=f"node:{use.node}",
        reason=(
            f"{noun} {', '.join(map(str, use.pids))}{owners} use {gpu} on {use.node} "
            "without a Slurm allocation."
        ),
        user=",".join(sorted(set(use.users))),
        node=use.node,
        details=(
            ("gpu_uuid", use.gpu_uuid),
            ("slurm_index", use.slurm_index),
            ("pids", use.pids),
        ),
    )
