"""Which strings the configuration accepts as user names and as other Slurm names.

One rule for a user name, used by every key that holds one (`exempt_users` of the
policies, `[access] admins`, `[[quota]] user`), so a name accepted in one table is
accepted in all of them.
"""

from __future__ import annotations

import json
import re

__all__ = ["USER_NAME_RULE", "check_names", "check_user_name", "check_user_names", "is_user_name"]

USER_NAME_RULE = 'letters, digits, ".", "_", "-" and "@", not starting with "-"'
"""The user-name rule in words, as error messages state it."""

# POSIX's portable user name (POSIX.1-2017 Base Definitions 3.437: the portable filename
# character set, no leading hyphen;
# https://pubs.opengroup.org/onlinepubs/9699919799/basedefs/V1_chap03.html)
# plus "@": Slurm takes user names from getpwnam(), and SSSD/AD sites resolve fully
# qualified names such as "alice@example.org".
_USER_NAME = re.compile(r"[A-Za-z0-9._@][A-Za-z0-9._@-]*")


def is_user_name(name: str) -> bool:
    """Whether `name` is a user name slurm-gpu accepts in its configuration.

    The rule: one or more of the POSIX portable filename characters (ASCII letters,
    digits, ".", "_", "-") or "@" (fully qualified names such as "alice@example.org",
    which Slurm accepts wherever getpwnam() resolves them), not starting with "-" (POSIX
    advises against it, and a command line would read it as an option). So "", " bob",
    "a b" and "-x" are not user names; "alice", "svc_ml.1", "alice@example.org" are.

    Args:
        name: the text of one TOML string.
    """
    return _USER_NAME.fullmatch(name) is not None


def check_user_names(names: list[str]) -> str | None:
    """A `check=` for a list of user names: names every entry that breaks the rule."""
    bad = [name for name in names if not is_user_name(name)]
    if bad:
        shown = ", ".join(json.dumps(name, ensure_ascii=False) for name in bad)
        return f"not a user name: {shown} (a user name is {USER_NAME_RULE})"
    return None


def check_user_name(name: str) -> str | None:
    """A `check=` for one optional user name: "" (not set) or a user name."""
    return None if name == "" else check_user_names([name])


def check_names(names: list[str]) -> str | None:
    """A `check=` for accounts, partitions, QOS, nodes, prefixes: none may be blank.

    A blank entry would match nothing, so it is a mistake; other text is left to Slurm.
    """
    if any(not name.strip() for name in names):
        return 'names must not be empty ("")'
    return None
