"""The controller's settings: [controller], [policy.*], [[quota]] and [notify].

Section classes only; `slurm_gpu.config.Config` holds one field per section and the generic
loader (`slurm_gpu.config._loader`) validates them. Checks that relate two keys of one table
(cancel_after after warn_after, exactly one of user/account in a [[quota]]) are `check=`
functions on the field that holds the table, so their errors name that table's key
(`policy.idle_gpu: ...`, `quota: [[quota]] #2: ...`).
"""

from __future__ import annotations

import json
import re
import zoneinfo
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from slurm_gpu.config._loader import doc
from slurm_gpu.config.names import check_names, check_user_name, check_user_names
from slurm_gpu.durations import Duration, format_duration

__all__ = [
    "QUOTA_ACTION_FORMS",
    "ControllerSettings",
    "GpuQuotaSettings",
    "HotNodeSettings",
    "IdleGpuSettings",
    "JobPolicySettings",
    "LowEfficiencySettings",
    "MaxRuntimeSettings",
    "NotifySettings",
    "PolicySettings",
    "QuotaRule",
    "UnallocatedUseSettings",
    "check_controller",
    "check_notify",
    "check_period",
    "check_quota_action",
    "check_quotas",
]

QUOTA_ACTION_FORMS = '"hold", "block", "fairshare" or "qos:NAME"'
_PERIOD = re.compile(r"week|month|[1-9][0-9]*d")
_QOS_NAME = re.compile(r"[A-Za-z0-9_.-]+")


# ---------------------------------------------------------------------------- checks


def _check_timezone(name: str) -> str | None:
    if name == "":
        return None
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return f'unknown time zone {json.dumps(name)}; expected an IANA name like "Europe/Berlin"'
    return None


def _check_positive_durations(limits: dict[str, float]) -> str | None:
    bad = [name for name, seconds in limits.items() if seconds <= 0]
    if bad:
        return f"{', '.join(bad)}: a runtime limit must be greater than 0"
    return None


def _check_emails(addresses: list[str]) -> str | None:
    bad = [a for a in addresses if not re.fullmatch(r"[^@\s]+@[^@\s]+", a)]
    if bad:
        return f"not an e-mail address: {', '.join(json.dumps(a) for a in bad)}"
    return None


def _check_webhook(url: str) -> str | None:
    if url == "" or re.match(r"https?://[^\s/]+", url):
        return None
    return f'expected an http(s):// URL or "" for off, got {json.dumps(url)}'


def _check_domain(domain: str) -> str | None:
    if domain == "" or re.fullmatch(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*", domain):
        return None
    return f'expected a mail domain like "example.org" (no "@"), got {json.dumps(domain)}'


def check_period(period: str) -> str | None:
    """A quota period: "week", "month" or "<N>d" (a rolling window of N days)."""
    if _PERIOD.fullmatch(period):
        return None
    return f'expected "week", "month" or a rolling "<N>d" such as "30d", got {json.dumps(period)}'


def check_quota_action(action: str) -> str | None:
    """A quota action: hold, block, fairshare or qos:NAME."""
    if action in ("hold", "block", "fairshare"):
        return None
    if action.startswith("qos:") and _QOS_NAME.fullmatch(action[4:]):
        return None
    return f"expected {QUOTA_ACTION_FORMS}, got {json.dumps(action)}"


def _check_fractions(fractions: tuple[float, ...]) -> str | None:
    bad = [f for f in fractions if not 0 < f <= 1]
    if bad:
        return f"fractions of the limit must be above 0 and at most 1, got {bad}"
    return None


# ---------------------------------------------------------------------------- [controller]


@dataclass(frozen=True)
class ControllerSettings:
    """[controller]: the head-node loop that turns policies into Slurm actions."""

    enforce: bool = field(
        default=False,
        metadata=doc("Act through Slurm; false is a dry run that only writes the audit log."),
    )
    interval: Duration = field(
        default=Duration(60.0), metadata=doc("How often the policies are evaluated.", above=0)
    )
    flush_over_nats: bool = field(
        default=False,
        metadata=doc(
            "Before cancelling a job for what its GPUs did (idle_gpu, low_efficiency), ask"
            ' its nodes over [nats] to ship what they hold (agents with ship_to = "nats"'
            " and a [node] ship_interval) and judge it again on that; a node that does not"
            " answer within [nats] commit_wait is judged on what the store has."
        ),
    )
    lease_seconds: int = field(
        default=300,
        metadata=doc(
            "Lease in the store that lets only one controller act; renewed every cycle.",
            above=0,
        ),
    )
    freshness_intervals: int = field(
        default=3,
        metadata=doc(
            "GPU readings older than this many [node].interval are unknown, never idle.",
            minimum=1,
        ),
    )
    timezone: str = field(
        default="",
        metadata=doc(
            'IANA time zone for quota weeks/months and times in messages; "" = host local.',
            check=_check_timezone,
        ),
    )
    audit_spool: Path = field(
        default=Path("/var/lib/slurm-gpu/controller/audit-spool.jsonl"),
        metadata=doc(
            "Local file holding decisions made while the store is down, until it is back."
        ),
    )


def check_controller(settings: ControllerSettings) -> str | None:
    """[controller] as a whole: the lease outlives the interval between cycles."""
    if settings.lease_seconds <= settings.interval:
        return (
            f"lease_seconds ({settings.lease_seconds}) must be longer than interval "
            f"({format_duration(settings.interval)}), or the lease lapses between cycles"
        )
    return None


# ---------------------------------------------------------------------------- [policy.*]


@dataclass(frozen=True)
class JobPolicySettings:
    """Keys every job policy has: the switch and the exemptions."""

    enabled: bool = field(default=True, metadata=doc("Evaluate this policy."))
    exempt_users: list[str] = field(
        default_factory=list,
        metadata=doc("Users whose jobs this policy skips.", check=check_user_names),
    )
    exempt_accounts: list[str] = field(
        default_factory=list,
        metadata=doc("Slurm accounts whose jobs this policy skips.", check=check_names),
    )
    exempt_partitions: list[str] = field(
        default_factory=list,
        metadata=doc("Partitions whose jobs this policy skips.", check=check_names),
    )
    exempt_qos: list[str] = field(
        default_factory=list, metadata=doc("QOS whose jobs this policy skips.", check=check_names)
    )
    exempt_job_name_prefixes: list[str] = field(
        default_factory=list,
        metadata=doc("Jobs whose name starts with one of these are skipped.", check=check_names),
    )


@dataclass(frozen=True)
class IdleGpuSettings(JobPolicySettings):
    """[policy.idle_gpu]: warn, then cancel, jobs whose GPUs all sit idle.

    Which GPU is idle is `[node] active_threshold_percent`'s call: the agent records the
    active samples with it, and this policy reads the same key (see `slurm_gpu.activity`).
    With `signal = "sm_active"` it is `[node] sm_active_threshold_percent`'s, applied to
    the GPU's SM activity (NVML GPM, Hopper and newer); a GPU whose SM activity is not
    measured is judged by utilization, and the verdict says so.
    """

    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "threshold_percent": (
            "the idle threshold is [node] active_threshold_percent, which the node agent"
            " records activity with and this policy reads; set the value there"
        )
    }

    exempt_partitions: list[str] = field(
        default_factory=lambda: ["debug"],
        metadata=doc("Partitions whose jobs this policy skips.", check=check_names),
    )
    exempt_job_name_prefixes: list[str] = field(
        default_factory=lambda: ["interactive"],
        metadata=doc("Jobs whose name starts with one of these are skipped.", check=check_names),
    )
    warn_after: Duration = field(
        default=Duration(45 * 60.0),
        metadata=doc("Warn the user when all of a job's GPUs were idle this long.", above=0),
    )
    cancel_after: Duration = field(
        default=Duration(60 * 60.0),
        metadata=doc("Cancel when idle this long and warned at least the difference ago.", above=0),
    )
    window: Literal["sliding", "from_start"] = field(
        default="sliding",
        metadata=doc('"sliding": idle since the last use; "from_start": never used since start.'),
    )
    signal: Literal["util", "sm_active"] = field(
        default="util",
        metadata=doc(
            '"util": idle by utilization (duty cycle); "sm_active": by SM activity (GPM),'
            " utilization where it is not measured."
        ),
    )
    memory_only_is_idle: bool = field(
        default=True,
        metadata=doc("A GPU holding memory but doing no compute counts as idle."),
    )
    memory_floor_mib: int = field(
        default=1024,
        metadata=doc(
            "Memory in use up to this many MiB counts as none: a bare CUDA context"
            " (300-600 MiB) is not data held.",
            minimum=0,
        ),
    )


def _check_idle_gpu(settings: IdleGpuSettings) -> str | None:
    if settings.cancel_after <= settings.warn_after:
        return (
            f"cancel_after ({format_duration(settings.cancel_after)}) must be longer than "
            f"warn_after ({format_duration(settings.warn_after)}), so users are warned first"
        )
    return None


def _check_low_efficiency_action(action: str) -> str | None:
    if action == "notify":
        return None
    hint = ""
    if action == "cancel":
        hint = (
            "; this policy never cancels: to end jobs whose SMs stay idle, set [policy.idle_gpu]"
            ' signal = "sm_active" (warned first, with its grace period)'
        )
    return f'expected "notify", got {json.dumps(action)}{hint}'


@dataclass(frozen=True)
class LowEfficiencySettings(JobPolicySettings):
    """[policy.low_efficiency]: tell the user about GPUs that look busy but barely compute.

    NVML's utilization is a duty cycle: one tiny kernel on one SM reads 100%. Where GPM
    measures SM activity (Hopper and newer), a GPU whose utilization stayed at or above
    `min_util_percent` while its SM activity stayed below `max_sm_active_percent` for
    `notice_after` earns its job a notice. GPUs without GPM are never judged (unknown is
    never inefficient). It only ever notifies: ending such jobs is `[policy.idle_gpu]
    signal = "sm_active"`'s job, with its warnings and grace period.
    """

    min_util_percent: float = field(
        default=80.0,
        metadata=doc(
            "Utilization (duty cycle) at or above this counts as looking busy.",
            minimum=0,
            maximum=100,
        ),
    )
    max_sm_active_percent: float = field(
        default=10.0,
        metadata=doc(
            "SM activity below this, while looking busy, counts as barely computing.",
            above=0,
            maximum=100,
        ),
    )
    notice_after: Duration = field(
        default=Duration(30 * 60.0),
        metadata=doc("Notify when a GPU looked busy but barely computed this long.", above=0),
    )
    action: str = field(
        default="notify",
        metadata=doc(
            '"notify" (the only action: this policy never cancels).',
            check=_check_low_efficiency_action,
        ),
    )


@dataclass(frozen=True)
class MaxRuntimeSettings(JobPolicySettings):
    """[policy.max_runtime]: end or cap jobs that run longer than allowed."""

    default: Duration = field(
        default=Duration(24 * 3600.0),
        metadata=doc("Longest a job may run when no partition or account limit applies.", above=0),
    )
    partitions: dict[str, Duration] = field(
        default_factory=dict,
        metadata=doc(
            'Per-partition limits, e.g. { debug = "30m" }.', check=_check_positive_durations
        ),
    )
    accounts: dict[str, Duration] = field(
        default_factory=dict,
        metadata=doc(
            "Per-account limits; they beat partition limits.", check=_check_positive_durations
        ),
    )
    warn_before: Duration = field(
        default=Duration(3600.0), metadata=doc("Warn the user this long before the limit.")
    )
    action: Literal["cancel", "cap"] = field(
        default="cancel",
        metadata=doc('At the limit: "cancel" the job, or "cap" its Slurm time limit to it.'),
    )


@dataclass(frozen=True)
class GpuQuotaSettings(JobPolicySettings):
    """[policy.gpu_quota]: the switch and exemptions for the [[quota]] rules."""


@dataclass(frozen=True)
class HotNodeSettings:
    """[policy.hot_node]: drain nodes whose GPUs overheat, report ECC errors or are lost."""

    enabled: bool = field(default=True, metadata=doc("Evaluate this policy."))
    temperature_celsius: float = field(
        default=85.0, metadata=doc("Drain a node whose GPU reaches this temperature.", above=0)
    )
    drain_on_ecc: bool = field(
        default=True, metadata=doc("Drain a node whose GPUs report new ECC errors.")
    )
    drain_on_lost_gpu: bool = field(
        default=True, metadata=doc("Drain a node on which a GPU fell off the bus (lost).")
    )
    exempt_nodes: list[str] = field(
        default_factory=list, metadata=doc("Nodes never drained.", check=check_names)
    )


@dataclass(frozen=True)
class UnallocatedUseSettings:
    """[policy.unallocated_use]: report GPU processes that no Slurm allocation allows."""

    enabled: bool = field(default=True, metadata=doc("Evaluate this policy."))
    exempt_users: list[str] = field(
        default_factory=list,
        metadata=doc(
            "Process owners whose GPU use is allowed (monitoring).", check=check_user_names
        ),
    )
    exempt_nodes: list[str] = field(
        default_factory=list, metadata=doc("Nodes not checked.", check=check_names)
    )


@dataclass(frozen=True)
class PolicySettings:
    """[policy]: one sub-table per policy."""

    idle_gpu: IdleGpuSettings = field(
        default_factory=IdleGpuSettings,
        metadata=doc("Idle-GPU reclamation.", check=_check_idle_gpu),
    )
    low_efficiency: LowEfficiencySettings = field(
        default_factory=LowEfficiencySettings,
        metadata=doc("Notices about GPUs that look busy but barely compute (GPM)."),
    )
    max_runtime: MaxRuntimeSettings = field(
        default_factory=MaxRuntimeSettings, metadata=doc("Maximum job runtime.")
    )
    gpu_quota: GpuQuotaSettings = field(
        default_factory=GpuQuotaSettings, metadata=doc("Switch and exemptions for [[quota]].")
    )
    hot_node: HotNodeSettings = field(
        default_factory=HotNodeSettings, metadata=doc("Hot or failing GPU nodes.")
    )
    unallocated_use: UnallocatedUseSettings = field(
        default_factory=UnallocatedUseSettings, metadata=doc("GPU use outside allocations.")
    )


# ---------------------------------------------------------------------------- [[quota]]


QuotaUnit = Literal["gpu_hours", "gpu_mem_hours", "job_hours"]


@dataclass(frozen=True)
class QuotaRule:
    """[[quota]]: a GPU budget for one account or one user per period."""

    account: str = field(default="", metadata=doc("Slurm account (set this or user)."))
    user: str = field(
        default="", metadata=doc("User (set this or account).", check=check_user_name)
    )
    period: str = field(
        default="month",
        metadata=doc(
            '"week", "month" (local calendar) or "<N>d" (rolling N days).', check=check_period
        ),
    )
    unit: QuotaUnit = field(
        default="gpu_hours",
        metadata=doc("What is counted: gpu_hours, gpu_mem_hours (GiB-hours) or job_hours."),
    )
    limit: float = field(kw_only=True, metadata=doc("Budget per period, in `unit`.", minimum=0))
    warn_at: tuple[float, ...] = field(
        default=(0.8, 0.95),
        metadata=doc(
            "Warn when usage crosses these fractions of the limit.", check=_check_fractions
        ),
    )
    action: str = field(
        default="hold",
        metadata=doc(
            'At the limit: "hold" pending jobs, "block", "qos:NAME" or "fairshare".',
            check=check_quota_action,
        ),
    )
    fairshare_shares: int = field(
        default=1, metadata=doc('Fairshare set by action = "fairshare".', minimum=0)
    )

    @property
    def scope(self) -> str:
        """What the budget is for: "account:NAME" or "user:NAME"."""
        return f"account:{self.account}" if self.account else f"user:{self.user}"


def check_quotas(rules: list[QuotaRule]) -> str | None:
    """Rules that relate keys of one [[quota]] or several: named by their 1-based number."""
    problems = []
    seen: dict[tuple[str, str, str], int] = {}
    for number, rule in enumerate(rules, 1):
        if bool(rule.account) == bool(rule.user):
            problems.append(f"[[quota]] #{number}: set exactly one of account or user")
            continue
        key = (rule.scope, rule.unit, rule.period)
        if key in seen:
            problems.append(
                f"[[quota]] #{number}: same {rule.scope}, unit and period as #{seen[key]}"
            )
        seen.setdefault(key, number)
    return "; ".join(problems) or None


# ---------------------------------------------------------------------------- [notify]


@dataclass(frozen=True)
class NotifySettings:
    """[notify]: e-mail and chat messages about warnings and actions."""

    smtp_host: str = field(default="", metadata=doc('SMTP server for e-mail; "" sends no e-mail.'))
    smtp_port: int = field(default=25, metadata=doc("SMTP port.", minimum=1, maximum=65535))
    smtp_from: str = field(
        default="slurm-gpu@localhost",
        metadata=doc("Sender address of the messages.", check=lambda a: _check_emails([a])),
    )
    smtp_starttls: bool = field(
        default=False, metadata=doc("Upgrade the SMTP session with STARTTLS.")
    )
    smtp_user: str = field(default="", metadata=doc('SMTP login; "" sends without logging in.'))
    smtp_password_file: str = field(
        default="", metadata=doc("File holding the SMTP password (never the password itself).")
    )
    user_email_domain: str = field(
        default="",
        metadata=doc('Users are mailed at user@<domain>; "" mails no users.', check=_check_domain),
    )
    admin_emails: list[str] = field(
        default_factory=list,
        metadata=doc("Addresses told about every action.", check=_check_emails),
    )
    webhook_url: str = field(
        default="",
        metadata=doc('Slack-compatible webhook ({"text": ...}); "" is off.', check=_check_webhook),
    )
    user_rate_limit: Duration = field(
        default=Duration(600.0),
        metadata=doc("Least time between two notices or reports to one user (not warnings)."),
    )
    exemption_contact: str = field(
        default="",
        metadata=doc("Who to ask for an exemption (address or URL), shown in every message."),
    )


def check_notify(settings: NotifySettings) -> str | None:
    """[notify] as a whole: a password file needs a login to go with it."""
    if settings.smtp_password_file and not settings.smtp_user:
        return "smtp_password_file is set but smtp_user is not"
    return None
