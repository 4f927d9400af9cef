"""gpu_quota: warn, act on and undo each [[quota]] rule by its measured usage.

Usage is warned at the rule's `warn_at` fractions; at 100% its action (hold / block /
qos:NAME / fairshare) is applied, and every applied action is undone once the scope is
back under its limit, its period ended, the rule is gone or changed, or it became exempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurm_gpu.config.policy import QuotaRule
from slurm_gpu.models import Action, QuotaApplied, QuotaUsage, SlurmJob, Verdict
from slurm_gpu.policy.quota_periods import is_rolling, rolling_days
from slurm_gpu.policy.rules.context import GPU_QUOTA, Context, number_text

_UNIT_NAMES = {"gpu_hours": "GPU-hours", "gpu_mem_hours": "GPU-memory GiB-hours"}
_UNIT_NAMES["job_hours"] = "job-hours"
_QUOTA_ACTIONS = {"hold": Action.HOLD, "block": Action.BLOCK, "fairshare": Action.SET_FAIRSHARE}


def _quota_action(rule: QuotaRule) -> Action:
    return Action.SET_QOS if rule.action.startswith("qos:") else _QUOTA_ACTIONS[rule.action]


def _scope_fields(scope: str) -> tuple[str, str]:
    """(user, account) of a quota scope, for the Verdict fields."""
    kind, _, name = scope.partition(":")
    return (name, "") if kind == "user" else ("", name)


def _in_scope(job: SlurmJob, scope: str) -> bool:
    kind, _, name = scope.partition(":")
    return (job.user if kind == "user" else job.account) == name


def quotas(
    ctx: Context,
    jobs: Sequence[SlurmJob],
    usage: Sequence[QuotaUsage],
    applied: Sequence[QuotaApplied],
) -> list[Verdict]:
    """The gpu_quota verdicts of one cycle: warnings, actions, and undoing of old actions.

    Args:
        ctx: The cycle's context.
        jobs: The cluster's jobs; pending ones in scope are held or moved to another QOS.
        usage: Measured usage per (scope, unit, period); a rule without it triggers nothing.
        applied: The quota actions in force, each undone when its reason no longer holds.

    Returns:
        The verdicts, the undoings last.
    """
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


def _usage_text(ctx: Context, rule: QuotaRule, used: QuotaUsage) -> str:
    kind, _, name = rule.scope.partition(":")
    days = rolling_days(rule.period)
    when = f"in the last {days} days" if days else f"since {ctx.day(used.period_start)}"
    unit = _UNIT_NAMES[rule.unit]
    return (
        f"{kind.capitalize()} {name} has used {number_text(used.used)} of its "
        f"{number_text(rule.limit)} {unit} {when}"
    )


def _quota_rule(
    ctx: Context,
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
    ctx: Context,
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
        why = (
            f"usage ({number_text(used.used)}) is below the limit ({number_text(rule.limit)}) again"
        )
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
