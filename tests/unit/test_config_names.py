"""slurm_gpu.config.names: one user-name rule for every key that holds a user name.

The rule: POSIX portable user names plus "@".
"""

from __future__ import annotations

import tomllib

import pytest

from slurm_gpu.config import Config, parse_settings
from slurm_gpu.config.names import check_names, check_user_names, is_user_name
from slurm_gpu.errors import ConfigError


@pytest.mark.parametrize(
    "name", ["alice", "Bob", "svc_ml.1", "a-b", "_apt", "0day", "alice@example.org"]
)
def test_portable_names_and_qualified_names_are_user_names(name: str) -> None:
    """Letters, digits, ".", "_", "-" and "@" (SSSD/AD "user@domain") make a user name."""
    assert True is is_user_name(name)


@pytest.mark.parametrize("name", ["", " bob", "bob ", "a b", "-x", "al,ice", "bob:x", "é"])
def test_blank_spaced_hyphen_first_and_other_characters_are_not(name: str) -> None:
    """Empty, spaces, a leading "-" (read as an option), ",", ":" and non-ASCII are refused."""
    assert False is is_user_name(name)


def test_check_names_every_bad_entry_and_the_rule() -> None:
    """The error lists each offending entry and states the rule."""
    expected = (
        'not a user name: "a b", "-x" (a user name is letters, digits, ".", "_", "-" and "@",'
        ' not starting with "-")'
    )
    assert expected == check_user_names(["alice", "a b", "-x"])


def test_other_names_only_refuse_blanks() -> None:
    """Accounts, partitions, QOS, nodes and prefixes are left to Slurm, but not blank."""
    expected = (None, 'names must not be empty ("")')
    assert expected == (check_names(["gpu[1-4]", "my account"]), check_names([" "]))


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[access]\nadmins = ["a b"]\n', "access.admins"),
        ('[policy.idle_gpu]\nexempt_users = ["a b"]\n', "policy.idle_gpu.exempt_users"),
        (
            '[policy.unallocated_use]\nexempt_users = ["a b"]\n',
            "policy.unallocated_use.exempt_users",
        ),
        ('[[quota]]\nuser = "a b"\nlimit = 1\n', "quota[1].user"),
    ],
)
def test_every_user_name_key_uses_the_one_rule(text: str, key: str) -> None:
    """[access] admins, the policies' exempt_users and [[quota]] user reject alike."""
    with pytest.raises(ConfigError) as caught:
        parse_settings(Config, tomllib.loads(text), "t.toml")
    expected = [f"t.toml: {key}: {check_user_names(['a b'])}"]
    assert expected == caught.value.problems


def test_qualified_admin_and_exempt_user_are_accepted() -> None:
    """A qualified name is accepted both as an admin and as an exempt user.

    The two keys used to disagree: one allowed "@" and refused spaces, the other allowed
    anything that was not blank.
    """
    text = '[access]\nadmins = ["alice@example.org"]\n'
    text += '[policy.idle_gpu]\nexempt_users = ["alice@example.org"]\n'
    config = parse_settings(Config, tomllib.loads(text), "t.toml")
    expected = (["alice@example.org"], ["alice@example.org"])
    assert expected == (config.access.admins, config.policy.idle_gpu.exempt_users)
