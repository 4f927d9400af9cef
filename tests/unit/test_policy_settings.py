"""[controller], [policy.*], [[quota]] and [notify]: values, defaults, and errors by key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from slurm_gpu.config import Config, load_config, parse_settings
from slurm_gpu.config.policy import QuotaRule
from slurm_gpu.durations import Duration
from slurm_gpu.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "conf" / "slurm-gpu.toml"


def parse(text: str) -> Config:
    return parse_settings(Config, tomllib.loads(text), "t.toml")


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    return caught.value.problems


def test_defaults_are_the_safe_ones() -> None:
    """Out of the box the controller only reports (enforce = false), every 60 s."""
    expected = (False, 60.0, 3, 300)
    c = Config().controller
    assert expected == (c.enforce, c.interval, c.freshness_intervals, c.lease_seconds)


def test_idle_defaults_follow_the_issue() -> None:
    """5% ([node]), warn 45m, cancel 60m, sliding, memory-only idle, debug/interactive exempt."""
    i = Config().policy.idle_gpu
    expected = (5.0, 2700.0, 3600.0, "sliding", True, ["debug"], ["interactive"])
    found = (
        Config().node.active_threshold_percent,
        i.warn_after,
        i.cancel_after,
        i.window,
        i.memory_only_is_idle,
        i.exempt_partitions,
        i.exempt_job_name_prefixes,
    )
    assert expected == found


def test_issue_example_parses() -> None:
    """The configuration from the issue loads to the values it names.

    Its idle threshold is under [node], where it lives now.
    """
    config = parse(
        """
[controller]
enforce = true
interval = "60s"

[node]
active_threshold_percent = 5

[policy.idle_gpu]
warn_after = "45m"
cancel_after = "60m"
window = "from_start"
memory_only_is_idle = false
exempt_partitions = ["debug"]
exempt_job_name_prefixes = ["interactive"]

[policy.max_runtime]
default = "24h"
partitions = { debug = "30m" }
accounts = { physics = "48h" }
warn_before = "1h"
action = "cap"

[[quota]]
account = "physics"
period = "month"
unit = "gpu_hours"
limit = 1000
warn_at = [0.8, 0.95]
action = "hold"

[[quota]]
user = "alice"
period = "30d"
unit = "job_hours"
limit = 50
action = "qos:low"
"""
    )
    expected = (
        True,
        "from_start",
        {"debug": Duration(1800.0)},
        {"physics": Duration(172800.0)},
        "cap",
        [
            QuotaRule(account="physics", limit=1000.0),
            QuotaRule(user="alice", period="30d", unit="job_hours", limit=50.0, action="qos:low"),
        ],
    )
    found = (
        config.controller.enforce,
        config.policy.idle_gpu.window,
        config.policy.max_runtime.partitions,
        config.policy.max_runtime.accounts,
        config.policy.max_runtime.action,
        config.quota,
    )
    assert expected == found


def test_quota_scope_property() -> None:
    """QuotaRule.scope is "account:NAME" or "user:NAME"."""
    expected = ["account:physics", "user:alice"]
    rules = [QuotaRule(account="physics", limit=1.0), QuotaRule(user="alice", limit=1.0)]
    assert expected == [r.scope for r in rules]


def test_commented_quota_example_is_valid() -> None:
    """The commented-out [[quota]] in conf/slurm-gpu.toml, uncommented, is a valid quota."""
    lines, inside = [], False
    for line in EXAMPLE.read_text().splitlines():
        inside = line.startswith("# [[") or (inside and line.startswith("# "))
        if inside:
            lines.append(line[2:])
    expected = [QuotaRule(account="physics", limit=1000.0)]
    assert expected == parse("\n".join(lines)).quota


def test_errors_name_the_file(tmp_path: Path) -> None:
    """A broken value in a file is reported as <file>: <dotted key>: <problem>."""
    path = tmp_path / "slurm-gpu.toml"
    path.write_text('[policy.idle_gpu]\nwindow = "Sliding"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    expected = [
        f'{path}: policy.idle_gpu.window: expected one of "sliding", "from_start", '
        'got "Sliding" (string); did you mean "sliding"?'
    ]
    assert expected == caught.value.problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[policy.idle_gpu]\nwarn_after = "1h"\ncancel_after = "30m"\n',
            "t.toml: policy.idle_gpu: cancel_after (30m) must be longer than warn_after (1h), "
            "so users are warned first",
        ),
        (
            '[policy.max_runtime]\naction = "kill"\n',
            't.toml: policy.max_runtime.action: expected one of "cancel", "cap", '
            'got "kill" (string)',
        ),
        (
            "[policy.max_runtime]\npartitions = { debug = 0 }\n",
            "t.toml: policy.max_runtime.partitions: debug: a runtime limit must be greater than 0",
        ),
        (
            '[policy.max_runtime]\naccounts = { physics = "two days" }\n',
            "t.toml: policy.max_runtime.accounts.physics: not a duration: 'two days'; expected "
            '"90s", "45m", "2h", "7d", "1h30m" or a number of seconds',
        ),
        (
            '[policy.hot_node]\ntemperature_celsius = "hot"\n',
            't.toml: policy.hot_node.temperature_celsius: expected a number, got "hot" (string)',
        ),
        (
            "[policy.unallocated_use]\nenabled = 1\n",
            "t.toml: policy.unallocated_use.enabled: expected a boolean (true or false), "
            "got 1 (integer)",
        ),
        (
            '[policy.gpu_quota]\nexempt_users = [""]\n',
            't.toml: policy.gpu_quota.exempt_users: not a user name: "" (a user name is '
            'letters, digits, ".", "_", "-" and "@", not starting with "-")',
        ),
        (
            '[policy.idle_gpu]\nexempt_accounts = [" "]\n',
            't.toml: policy.idle_gpu.exempt_accounts: names must not be empty ("")',
        ),
        (
            '[controller]\ntimezone = "Mars/Olympus"\n',
            't.toml: controller.timezone: unknown time zone "Mars/Olympus"; expected an IANA '
            'name like "Europe/Berlin"',
        ),
        (
            "[controller]\nlease_seconds = 30\n",
            "t.toml: controller: lease_seconds (30) must be longer than interval (1m), or the "
            "lease lapses between cycles",
        ),
        (
            "[controller]\nfreshness_intervals = 0\n",
            "t.toml: controller.freshness_intervals: must be at least 1, got 0 (integer)",
        ),
        (
            '[notify]\nwebhook_url = "hooks.slack.com/x"\n',
            't.toml: notify.webhook_url: expected an http(s):// URL or "" for off, got '
            '"hooks.slack.com/x"',
        ),
        (
            '[notify]\nadmin_emails = ["root"]\n',
            't.toml: notify.admin_emails: not an e-mail address: "root"',
        ),
        (
            '[notify]\nuser_email_domain = "@example.org"\n',
            't.toml: notify.user_email_domain: expected a mail domain like "example.org" '
            '(no "@"), got "@example.org"',
        ),
        (
            "[notify]\nsmtp_port = 70000\n",
            "t.toml: notify.smtp_port: must be between 1 and 65535, got 70000 (integer)",
        ),
        (
            '[notify]\nsmtp_password_file = "/etc/slurm-gpu/smtp"\n',
            "t.toml: notify: smtp_password_file is set but smtp_user is not",
        ),
    ],
)
def test_broken_section_values_name_the_key(text: str, expected: str) -> None:
    """Each broken [controller]/[policy.*]/[notify] value is reported under its key."""
    assert [expected] == problems(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[[quota]]\naccount = "a"\nuser = "b"\nlimit = 1\n',
            "t.toml: quota: [[quota]] #1: set exactly one of account or user",
        ),
        (
            "[[quota]]\nlimit = 1\n",
            "t.toml: quota: [[quota]] #1: set exactly one of account or user",
        ),
        (
            '[[quota]]\naccount = "a"\n',
            "t.toml: quota[1].limit: missing required key (number)",
        ),
        (
            '[[quota]]\naccount = "a"\nlimit = 1\n[[quota]]\naccount = "b"\nlimit = 1\n'
            'period = "fortnight"\n',
            't.toml: quota[2].period: expected "week", "month" or a rolling "<N>d" such as '
            '"30d", got "fortnight"',
        ),
        (
            '[[quota]]\naccount = "a"\nlimit = 1\nperiod = "0d"\n',
            't.toml: quota[1].period: expected "week", "month" or a rolling "<N>d" such as '
            '"30d", got "0d"',
        ),
        (
            '[[quota]]\naccount = "a"\nlimit = 1\naction = "qos:"\n',
            't.toml: quota[1].action: expected "hold", "block", "fairshare" or "qos:NAME", '
            'got "qos:"',
        ),
        (
            '[[quota]]\naccount = "a"\nlimit = 1\nunit = "gpu_minutes"\n',
            't.toml: quota[1].unit: expected one of "gpu_hours", "gpu_mem_hours", "job_hours", '
            'got "gpu_minutes" (string)',
        ),
        (
            '[[quota]]\naccount = "a"\nlimit = 1\nwarn_at = [0.5, 1.5]\n',
            "t.toml: quota[1].warn_at: fractions of the limit must be above 0 and at most 1, "
            "got [1.5]",
        ),
        (
            '[[quota]]\naccount = "a"\nlimit = -5\n',
            "t.toml: quota[1].limit: must be at least 0, got -5 (integer)",
        ),
        (
            '[[quota]]\naccount = "a"\nlimit = 1\n[[quota]]\naccount = "a"\nlimit = 2\n',
            "t.toml: quota: [[quota]] #2: same account:a, unit and period as #1",
        ),
    ],
)
def test_broken_quota_names_the_key(text: str, expected: str) -> None:
    """Each broken [[quota]] is reported by its number and key."""
    assert [expected] == problems(text)


def test_removed_idle_threshold_key_says_where_it_went(tmp_path: Path) -> None:
    """An old file's [policy.idle_gpu] threshold_percent is an error naming file:key.

    The error names [node] active_threshold_percent; the value is never silently ignored.
    """
    path = tmp_path / "slurm-gpu.toml"
    path.write_text("[policy.idle_gpu]\nthreshold_percent = 10\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    expected = [
        f"{path}: policy.idle_gpu.threshold_percent: no longer supported; the idle threshold"
        " is [node] active_threshold_percent, which the node agent records activity with and"
        " this policy reads; set the value there"
    ]
    assert expected == caught.value.problems


def test_idle_threshold_is_the_node_key() -> None:
    """[node] active_threshold_percent is the one threshold key; the idle policy has none."""
    config = parse("[node]\nactive_threshold_percent = 10\n")
    expected = (10.0, False)
    found = (
        config.node.active_threshold_percent,
        hasattr(config.policy.idle_gpu, "threshold_percent"),
    )
    assert expected == found


def test_quota_user_follows_the_user_name_rule() -> None:
    """A [[quota]] user is checked by the same rule as every other user-name key."""
    expected = [
        't.toml: quota[1].user: not a user name: "al ice" (a user name is letters, digits, '
        '".", "_", "-" and "@", not starting with "-")'
    ]
    assert expected == problems('[[quota]]\nuser = "al ice"\nlimit = 1\n')
