"""slurm_gpu.policy.rules, gpu_quota: warnings, each action at 100%, and each undo."""

from __future__ import annotations

import dataclasses
from typing import Any

from slurm_gpu.config import Config
from slurm_gpu.config.policy import ControllerSettings, QuotaRule
from slurm_gpu.models import Action, Exemption, QuotaApplied, QuotaUsage, SlurmJob, Verdict
from slurm_gpu.policy.rules import evaluate

NOW = 1_717_236_000.0  # 2024-06-01 10:00:00 UTC
JUNE = 1_717_200_000.0  # 2024-06-01 00:00:00 UTC
JULY = 1_719_792_000.0  # 2024-07-01 00:00:00 UTC


def config(*rules: QuotaRule) -> Config:
    """Only quotas (idle_gpu and max_runtime off), in UTC."""
    base = Config()
    policy = dataclasses.replace(
        base.policy,
        idle_gpu=dataclasses.replace(base.policy.idle_gpu, enabled=False),
        max_runtime=dataclasses.replace(base.policy.max_runtime, enabled=False),
    )
    return dataclasses.replace(
        base,
        controller=ControllerSettings(timezone="UTC"),
        policy=policy,
        quota=list(rules),
    )


def physics(**fields: Any) -> QuotaRule:
    return QuotaRule(**{"account": "physics", "limit": 1000.0, **fields})


def usage(used: float, scope: str = "account:physics", **fields: Any) -> QuotaUsage:
    values: dict[str, Any] = {
        "scope": scope,
        "unit": "gpu_hours",
        "period": "month",
        "used": used,
        "period_start": JUNE,
        "period_end": JULY,
    }
    values.update(fields)
    return QuotaUsage(**values)


def pending(job_id: int, account: str = "physics", user: str = "alice", **f: Any) -> SlurmJob:
    return SlurmJob(job_id, user, account, "gpu", "PENDING", qos=f.pop("qos", "normal"), **f)


def applied(action: Action, target: str, **fields: Any) -> QuotaApplied:
    values: dict[str, Any] = {
        "scope": "account:physics",
        "unit": "gpu_hours",
        "period": "month",
        "action": action,
        "target": target,
        "job_id": int(target[4:]) if target.startswith("job:") else None,
        "period_end": JULY,
        "applied_at": NOW - 3600,
    }
    values.update(fields)
    return QuotaApplied(**values)


def brief(verdicts: list[Verdict]) -> list[tuple[Action, str]]:
    return [(v.action, v.target) for v in verdicts]


# ---------------------------------------------------------------------------- warnings


def test_below_every_fraction_gives_nothing() -> None:
    """700 of 1000 GPU-hours (warn at 0.8, 0.95): no verdict."""
    expected: list[Verdict] = []
    assert expected == evaluate([], [], NOW, config(physics()), quota_usage=[usage(700)])


def test_one_warning_per_crossed_fraction() -> None:
    """960 of 1000 crosses 0.8 and 0.95: two WARNs, one per fraction."""
    verdicts = evaluate([], [], NOW, config(physics()), quota_usage=[usage(960)])
    expected = [(Action.WARN, 0.8), (Action.WARN, 0.95)]
    assert expected == [(v.action, dict(v.details)["fraction"]) for v in verdicts]


def test_warning_reason_is_plain_language() -> None:
    """The warning says who, how much of what, since when, and what happens at 100%."""
    verdicts = evaluate([], [], NOW, config(physics()), quota_usage=[usage(850)])
    expected = [
        Verdict(
            policy="gpu_quota",
            action=Action.WARN,
            target="account:physics",
            reason=(
                "Account physics has used 850 of its 1,000 GPU-hours since 2024-06-01 (85%); "
                "at 100% pending jobs are held."
            ),
            account="physics",
            details=(
                ("used", 850),
                ("limit", 1000.0),
                ("unit", "gpu_hours"),
                ("period", "month"),
                ("period_start", JUNE),
                ("period_end", JULY),
                ("fraction", 0.8),
            ),
        )
    ]
    assert expected == verdicts


def test_unknown_usage_gives_nothing() -> None:
    """No usage measured for the rule (store down): no verdict, never an action."""
    expected: list[Verdict] = []
    assert expected == evaluate([pending(5)], [], NOW, config(physics()), quota_usage=[])


def test_usage_of_a_past_period_is_unknown() -> None:
    """Usage measured for May does not count in June."""
    may = usage(5000, period_start=JUNE - 31 * 86400, period_end=JUNE)
    expected: list[Verdict] = []
    assert expected == evaluate([pending(5)], [], NOW, config(physics()), quota_usage=[may])


# ---------------------------------------------------------------------------- actions


def test_hold_pending_jobs_of_the_account() -> None:
    """action = "hold" at 100%: HOLD each pending physics job, not running or other jobs."""
    jobs = [
        pending(5),
        pending(6, account="chem"),
        dataclasses.replace(pending(7), state="RUNNING"),
        pending(8, user="bob"),
    ]
    rule = physics(warn_at=())
    verdicts = evaluate(jobs, [], NOW, config(rule), quota_usage=[usage(1000)])
    expected = [(Action.HOLD, "job:5"), (Action.HOLD, "job:8")]
    assert expected == brief(verdicts)


def test_hold_reason_says_until_when() -> None:
    """The hold reason names the job and the end of the period."""
    verdicts = evaluate(
        [pending(5)], [], NOW, config(physics(warn_at=())), quota_usage=[usage(1012)]
    )
    expected = (
        "Account physics has used 1,012 of its 1,000 GPU-hours since 2024-06-01, reaching the "
        "limit; job 5 is held until 2024-07-01."
    )
    assert expected == verdicts[0].reason


def test_held_job_is_not_held_again() -> None:
    """A job already in quota_applied gets no second HOLD."""
    verdicts = evaluate(
        [pending(5), pending(6)],
        [],
        NOW,
        config(physics(warn_at=())),
        quota_usage=[usage(1200)],
        quota_applied=[applied(Action.HOLD, "job:5")],
    )
    expected = [(Action.HOLD, "job:6")]
    assert expected == brief(verdicts)


def test_block_sets_grptres_zero() -> None:
    """action = "block": one BLOCK of the account with GrpTRES gres/gpu=0."""
    rule = physics(action="block", warn_at=())
    verdicts = evaluate([pending(5)], [], NOW, config(rule), quota_usage=[usage(1000)])
    expected = [(Action.BLOCK, "account:physics", "gres/gpu=0")]
    assert expected == [(v.action, v.target, dict(v.details)["tres"]) for v in verdicts]


def test_block_already_applied_is_not_repeated() -> None:
    """A BLOCK in quota_applied is not emitted again."""
    rule = physics(action="block", warn_at=())
    verdicts = evaluate(
        [],
        [],
        NOW,
        config(rule),
        quota_usage=[usage(1100)],
        quota_applied=[applied(Action.BLOCK, "account:physics")],
    )
    expected: list[Verdict] = []
    assert expected == verdicts


def test_qos_moves_pending_jobs() -> None:
    """action = "qos:low": SET_QOS low for pending jobs, remembering the previous QOS."""
    rule = physics(action="qos:low", warn_at=())
    jobs = [pending(5, qos="normal"), pending(6, qos="low")]
    verdicts = evaluate(jobs, [], NOW, config(rule), quota_usage=[usage(1000)])
    expected = [(Action.SET_QOS, "job:5", "low", "normal")]
    found = [
        (v.action, v.target, dict(v.details)["qos"], dict(v.details)["previous"]) for v in verdicts
    ]
    assert expected == found


def test_fairshare_lowers_the_shares() -> None:
    """action = "fairshare": SET_FAIRSHARE of the association to fairshare_shares."""
    rule = physics(action="fairshare", fairshare_shares=2, warn_at=())
    verdicts = evaluate([], [], NOW, config(rule), quota_usage=[usage(1000)])
    expected = [(Action.SET_FAIRSHARE, "account:physics", 2)]
    assert expected == [(v.action, v.target, dict(v.details)["shares"]) for v in verdicts]


def test_user_quota_holds_only_that_users_jobs() -> None:
    """A user = "alice" quota holds alice's pending jobs in any account."""
    rule = QuotaRule(user="alice", limit=10.0, warn_at=())
    jobs = [pending(5, account="chem"), pending(6, user="bob")]
    verdicts = evaluate(jobs, [], NOW, config(rule), quota_usage=[usage(11, scope="user:alice")])
    expected = [(Action.HOLD, "job:5")]
    assert expected == brief(verdicts)


def test_zero_limit_blocks_from_the_start() -> None:
    """limit = 0 (no GPU time at all): holds even with nothing used."""
    rule = physics(limit=0.0, warn_at=())
    verdicts = evaluate([pending(5)], [], NOW, config(rule), quota_usage=[usage(0)])
    expected = [(Action.HOLD, "job:5")]
    assert expected == brief(verdicts)


def test_exempt_account_is_not_limited() -> None:
    """[policy.gpu_quota] exempt_accounts = ["physics"]: no warnings, no holds."""
    settings = config(physics())
    settings = dataclasses.replace(
        settings,
        policy=dataclasses.replace(
            settings.policy,
            gpu_quota=dataclasses.replace(settings.policy.gpu_quota, exempt_accounts=["physics"]),
        ),
    )
    expected: list[Verdict] = []
    assert expected == evaluate([pending(5)], [], NOW, settings, quota_usage=[usage(2000)])


def test_exempt_job_is_not_held() -> None:
    """An explicit exemption for job 5 keeps it from being held; job 6 is held."""
    exemptions = [Exemption("job:5", policy="gpu_quota")]
    verdicts = evaluate(
        [pending(5), pending(6)],
        [],
        NOW,
        config(physics(warn_at=())),
        exemptions=exemptions,
        quota_usage=[usage(1000)],
    )
    expected = [(Action.HOLD, "job:6")]
    assert expected == brief(verdicts)


def test_rolling_period_reason() -> None:
    """A "30d" rule says "in the last 30 days" and holds without an end date."""
    rule = physics(period="30d", warn_at=())
    rolling = usage(1000, period="30d", period_start=NOW - 30 * 86400, period_end=NOW)
    verdicts = evaluate([pending(5)], [], NOW, config(rule), quota_usage=[rolling])
    expected = [
        "Account physics has used 1,000 of its 1,000 GPU-hours in the last 30 days, reaching "
        "the limit; job 5 is held."
    ]
    assert expected == [v.reason for v in verdicts]


# ---------------------------------------------------------------------------- undo


def test_release_when_budget_grew() -> None:
    """A held job is RELEASEd once the limit was raised above the usage."""
    rule = physics(limit=2000.0, warn_at=())
    verdicts = evaluate(
        [pending(5)],
        [],
        NOW,
        config(rule),
        quota_usage=[usage(1200)],
        quota_applied=[applied(Action.HOLD, "job:5")],
    )
    expected = [
        (
            Action.RELEASE,
            "job:5",
            "Job 5 is released: usage (1,200) is below the limit (2,000) again.",
        )
    ]
    assert expected == [(v.action, v.target, v.reason) for v in verdicts]


def test_hold_stays_while_over_the_limit() -> None:
    """Still over the limit: the applied hold is neither repeated nor undone."""
    verdicts = evaluate(
        [pending(5)],
        [],
        NOW,
        config(physics(warn_at=())),
        quota_usage=[usage(1200)],
        quota_applied=[applied(Action.HOLD, "job:5")],
    )
    expected: list[Verdict] = []
    assert expected == verdicts


def test_unblock_when_period_ended() -> None:
    """A BLOCK applied in May (period ended) is UNBLOCKed even before June usage is known."""
    entry = applied(Action.BLOCK, "account:physics", period_end=JUNE)
    verdicts = evaluate([], [], NOW, config(physics(action="block")), quota_applied=[entry])
    expected = [(Action.UNBLOCK, "account:physics", "gres/gpu=-1")]
    assert expected == [(v.action, v.target, dict(v.details)["tres"]) for v in verdicts]


def test_restore_previous_qos() -> None:
    """Undoing SET_QOS sets the job's previous QOS back."""
    entry = applied(Action.SET_QOS, "job:5", previous="normal")
    verdicts = evaluate(
        [pending(5, qos="low")],
        [],
        NOW,
        config(physics(action="qos:low")),
        quota_usage=[usage(10)],
        quota_applied=[entry],
    )
    expected = [(Action.SET_QOS, "job:5", "normal")]
    assert expected == [(v.action, v.target, dict(v.details)["qos"]) for v in verdicts]


def test_restore_previous_fairshare() -> None:
    """Undoing SET_FAIRSHARE sets the association's previous shares back."""
    entry = applied(Action.SET_FAIRSHARE, "account:physics", previous="100")
    verdicts = evaluate(
        [],
        [],
        NOW,
        config(physics(action="fairshare")),
        quota_usage=[usage(10)],
        quota_applied=[entry],
    )
    expected = [(Action.SET_FAIRSHARE, "account:physics", 100)]
    assert expected == [(v.action, v.target, dict(v.details)["shares"]) for v in verdicts]


def test_undo_when_rule_removed() -> None:
    """A hold whose [[quota]] rule is gone from the config is released."""
    verdicts = evaluate(
        [pending(5)], [], NOW, config(), quota_applied=[applied(Action.HOLD, "job:5")]
    )
    expected = [(Action.RELEASE, "job:5")]
    assert expected == brief(verdicts)


def test_undo_when_action_changed() -> None:
    """The rule's action changed from hold to block: old holds are released, then BLOCK."""
    verdicts = evaluate(
        [pending(5)],
        [],
        NOW,
        config(physics(action="block", warn_at=())),
        quota_usage=[usage(1200)],
        quota_applied=[applied(Action.HOLD, "job:5")],
    )
    expected = [(Action.BLOCK, "account:physics"), (Action.RELEASE, "job:5")]
    assert expected == brief(verdicts)


def test_rolling_hold_is_kept_while_over() -> None:
    """A rolling-window hold is not undone by time (its period_end passes), only by usage."""
    rule = physics(period="30d", warn_at=())
    entry = applied(Action.HOLD, "job:5", period="30d", period_end=NOW - 60)
    rolling = usage(1100, period="30d", period_start=NOW - 30 * 86400, period_end=NOW)
    verdicts = evaluate(
        [pending(5)], [], NOW, config(rule), quota_usage=[rolling], quota_applied=[entry]
    )
    expected: list[Verdict] = []
    assert expected == verdicts


def test_unknown_usage_keeps_the_hold() -> None:
    """No usage measured in the period and the period not over: the hold stays."""
    verdicts = evaluate(
        [pending(5)], [], NOW, config(physics()), quota_applied=[applied(Action.HOLD, "job:5")]
    )
    expected: list[Verdict] = []
    assert expected == verdicts


def test_undo_when_job_exempted() -> None:
    """An admin exempts a held job: it is released although the account is still over."""
    verdicts = evaluate(
        [pending(5)],
        [],
        NOW,
        config(physics(warn_at=())),
        exemptions=[Exemption("job:5", policy="gpu_quota")],
        quota_usage=[usage(1200)],
        quota_applied=[applied(Action.HOLD, "job:5")],
    )
    expected = [(Action.RELEASE, "job:5", "Job 5 is released: job:5 is exempt from quotas.")]
    assert expected == [(v.action, v.target, v.reason) for v in verdicts]
