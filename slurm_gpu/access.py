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

The same scope applies to every command that shows jobs: `sacct`, `report`, `job`,
`status`, `audit` (a user reads the decisions about their own jobs, and so why one was
cancelled) and `policy backtest`. Commands that act (`exempt`, `controller`, `db`,
`sync`) are for admins only (`require_admin`), decided before the store is opened, so
file modes that happen to let a user write the store never make them one.

The users' command holds the slurm-gpu group only to read the config and open the
store: `give_up_group` drops it (real, effective and saved gid) right after, so
nothing a user asks for (`report monthly --out DIR`) is written with the group's rights.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from slurm_gpu.errors import SlurmError, SlurmGpuError
from slurm_gpu.slurm.client import SlurmClient

ADMIN_LEVELS = frozenset({"operator", "administrator"})
WHO_IS_ADMIN = "root, the SlurmUser, [access] admins, Slurm AdminLevel Operator or Administrator"


class NotAnAdmin(SlurmGpuError):
    """A command for administrators was run by someone else.

    The CLI exits 2 for it, as the users' command (wrapper/slurm-gpu.c) does.
    """


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


def require_admin(scope: Scope, command: str) -> None:
    """Refuse `command` unless the caller is an admin (`scope.all`).

    Raises:
        NotAnAdmin: the caller is not an admin; the message says who is.
    """
    if not scope.all:
        raise NotAnAdmin(
            f"{command}: for administrators ({WHO_IS_ADMIN}); "
            f"{scope.caller.name} (uid {scope.caller.uid}) is none of them"
        )


class _Owned(Protocol):
    """A record about a job: an audit entry (`store.control.AuditEntry`)."""

    @property
    def job_id(self) -> int | None: ...

    @property
    def user(self) -> str: ...

    @property
    def account(self) -> str: ...


T = TypeVar("T", bound=_Owned)


def visible(
    scope: Scope,
    records: Sequence[T],
    owner: Callable[[int], tuple[str, str] | None] = lambda _job_id: None,
) -> list[T]:
    """The records `scope` may see: those of its caller's (and coordinated accounts') jobs.

    A record without a user but with a job id (written before its job was known) is
    judged by the job's owner, `owner(job_id)` -> (user, account), asked once per job.
    """
    if scope.all:
        return list(records)
    owners: dict[int, tuple[str, str] | None] = {}
    out = []
    for record in records:
        user, account = record.user, record.account
        if not user and record.job_id is not None:
            if record.job_id not in owners:
                owners[record.job_id] = owner(record.job_id)
            user, account = owners[record.job_id] or ("", account)
        if scope.sees(user, account):
            out.append(record)
    return out


def give_up_group(
    first: Callable[[], object] = lambda: None,
    *,
    getresgid: Callable[[], tuple[int, int, int]] = os.getresgid,
    setresgid: Callable[[int, int, int], None] = os.setresgid,
) -> bool:
    """Drop a setgid program's group: real, effective and saved gid all become the real gid.

    Only when the process holds a group besides its real one (the users' command):
    `first` (open the store) runs with the group, then it is given up, for good, even
    when `first` fails. Returns whether there was a group to give up.
    """
    real, effective, saved = getresgid()
    if real == effective == saved:
        return False
    try:
        first()
    finally:
        setresgid(real, real, real)
    return True
