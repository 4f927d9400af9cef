"""Who may see which jobs: Slurm's PrivateData=usage, applied to every report.

- A user sees their own jobs and usage only.
- An account coordinator (sacctmgr's Coordinators) also sees the jobs of the accounts
  they coordinate.
- An admin sees everything: root, the SlurmUser, the names in `[access] admins`, and
  users whose Slurm AdminLevel is Operator or Administrator
  (`sacctmgr -n -P show user format=User,AdminLevel`).

The caller is the process's REAL uid (os.getuid()), never a command-line flag, so the
users' setgid command (wrapper/slurm-gpu.c), which grants the slurm-gpu group's read
access to the store's credentials without changing the uid, cannot widen what a user
sees. The identity source is an argument so tests can be anyone. slurm_gpu/credentials.py
says how the credentials themselves are kept to root and that group.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from slurm_gpu.errors import SlurmError
from slurm_gpu.slurm.client import SlurmClient

ADMIN_LEVELS = frozenset({"operator", "administrator"})


@dataclass(frozen=True)
class Caller:
    """The user running the command."""

    uid: int
    name: str


def current_caller(getuid: Callable[[], int] = os.getuid) -> Caller:
    """The real uid of this process and its user name (the uid as text when unnamed)."""
    uid = getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return Caller(uid, name)


@dataclass(frozen=True)
class Scope:
    """What a caller may see.

    Attributes:
        caller: who asked.
        all: True for admins (everything).
        accounts: accounts whose jobs are visible besides the caller's own (coordinator).
        reason: why this scope, in words ("admin: AdminLevel=Administrator").
    """

    caller: Caller
    all: bool
    accounts: frozenset[str] = frozenset()
    reason: str = ""

    def sees(self, user: str | None, account: str | None) -> bool:
        """True when a job of `user` in `account` is visible."""
        if self.all:
            return True
        if user and user == self.caller.name:
            return True
        return bool(account) and account in self.accounts

    def describe(self) -> str:
        """One line for report headers."""
        if self.all:
            return f"all users ({self.reason})"
        if self.accounts:
            return f"user {self.caller.name} and accounts {','.join(sorted(self.accounts))}"
        return f"user {self.caller.name} only"


def resolve_scope(
    caller: Caller,
    slurm: SlurmClient | None,
    *,
    admins: Iterable[str] = (),
    slurm_user: str | None = None,
    use_slurm: bool = True,
) -> Scope:
    """Decide what `caller` may see.

    Args:
        caller: the real user (see `current_caller`).
        slurm: asks Slurm for the SlurmUser, AdminLevels and coordinators; None skips
            Slurm entirely.
        admins: user names configured in `[access] admins`.
        slurm_user: the SlurmUser if known; else asked from `scontrol show config`.
        use_slurm: ask sacctmgr for AdminLevel and coordinators.

    Slurm being unreachable never widens the scope: the caller then sees their own jobs
    (plus everything when root or a configured admin).
    """
    if caller.uid == 0:
        return Scope(caller, True, reason="root")
    if caller.name in set(admins):
        return Scope(caller, True, reason="[access] admins")
    if slurm is None or not use_slurm:
        return Scope(caller, False)
    if slurm_user is None:
        try:
            slurm_user = slurm.slurm_user()
        except SlurmError:
            slurm_user = ""
    if slurm_user and caller.name == slurm_user:
        return Scope(caller, True, reason="SlurmUser")
    # The client leaves an unparsable line out (never widening what anyone sees).
    try:
        levels = slurm.admin_levels()
    except SlurmError:
        levels = {}
    level = levels.get(caller.name, "")
    if level.lower() in ADMIN_LEVELS:
        return Scope(caller, True, reason=f"AdminLevel={level}")
    try:
        coordinators = slurm.coordinators()
    except SlurmError:
        coordinators = {}
    # {account: coordinators} -> the accounts this caller coordinates.
    accounts = frozenset(a for a, users in coordinators.items() if caller.name in users)
    return Scope(caller, False, accounts, reason="coordinator" if accounts else "")
