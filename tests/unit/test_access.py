"""Who sees what (access.py): root, SlurmUser, [access] admins, AdminLevel, coordinators."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from slurm_gpu.access import (
    Caller,
    NotAnAdmin,
    Scope,
    current_caller,
    give_up_group,
    require_admin,
    resolve_scope,
    visible,
)
from slurm_gpu.errors import SlurmError
from slurm_gpu.slurm.client import CliSlurmClient
from slurm_gpu.slurm.sacctmgr import ADMIN_LEVEL_ARGV, COORDINATOR_ARGV
from slurm_gpu.testing import FakeRunner

LEVELS = "alice|None\nbob|None\ncarol|None\nop|Operator\nroot|Administrator\n"
COORDS = "bio|\nphysics|carol\nroot|\n"
CONFIG = "ClusterName             = testbed\nSlurmUser               = slurm(64030)\n"


def fake_runner(fail: bool = False) -> FakeRunner:
    """Answers sacctmgr/scontrol like the test bed; `fail`: slurmdbd cannot be reached."""
    runner = FakeRunner(
        {
            ("scontrol",): CONFIG,
            tuple(ADMIN_LEVEL_ARGV): LEVELS,
            tuple(COORDINATOR_ARGV): COORDS,
        }
    )
    if fail:
        runner.outage = SlurmError("sacctmgr: cannot reach slurmdbd")
    return runner


def slurm(runner: FakeRunner | None = None) -> CliSlurmClient:
    """The real client over the fake runner: access.py reads Slurm only through it."""
    return CliSlurmClient(runner if runner is not None else fake_runner())


def test_user_sees_own_jobs_only() -> None:
    """A plain user's scope is their own name."""
    scope = resolve_scope(Caller(1001, "alice"), slurm())
    assert (False, frozenset()) == (scope.all, scope.accounts)
    assert scope.sees("alice", "physics")
    assert not scope.sees("bob", "bio")
    assert not scope.sees("carol", "physics")


def test_coordinator_sees_account() -> None:
    """A coordinator of physics sees physics jobs, not bio ones."""
    scope = resolve_scope(Caller(1003, "carol"), slurm())
    assert scope.sees("alice", "physics")
    assert not scope.sees("bob", "bio")


def test_admins() -> None:
    """root, SlurmUser, Operator/Administrator and [access] admins see all."""
    assert resolve_scope(Caller(0, "root"), None).all
    assert resolve_scope(Caller(64030, "slurm"), slurm()).all
    assert "AdminLevel=Operator" == resolve_scope(Caller(2000, "op"), slurm()).reason
    assert resolve_scope(Caller(1002, "bob"), None, admins=["bob"]).all


def test_slurm_down_never_widens() -> None:
    """sacctmgr failing leaves a user with their own jobs."""
    scope = resolve_scope(Caller(1003, "carol"), slurm(fake_runner(fail=True)))
    assert (False, frozenset()) == (scope.all, scope.accounts)


def test_slurm_roles_off_asks_nothing() -> None:
    """[access] slurm_roles = false: no sacctmgr calls, own jobs only."""
    runner = fake_runner()
    scope = resolve_scope(Caller(1003, "carol"), slurm(runner), use_slurm=False)
    assert ([], False) == (runner.calls, scope.all)


def test_caller_is_the_real_uid() -> None:
    """The identity comes from the injected getuid (os.getuid in production)."""
    assert Caller(0, "root") == current_caller(lambda: 0)
    assert "4242424" == current_caller(lambda: 4242424).name


def test_slurm_user_is_asked_once_from_scontrol() -> None:
    """Without a known SlurmUser, `scontrol show config` says who it is (slurm: admin)."""
    runner = fake_runner()
    scope = resolve_scope(Caller(64030, "slurm"), slurm(runner))
    assert ("SlurmUser", [["scontrol", "show", "config"]]) == (scope.reason, runner.calls)


@dataclass(frozen=True)
class Row:
    """A record about a job, as an audit entry is."""

    job_id: int | None
    user: str
    account: str


def test_visible_keeps_the_callers_and_coordinated_rows() -> None:
    """carol (coordinator of physics) sees her row and physics', not bio's nor a node's."""
    scope = resolve_scope(Caller(1003, "carol"), slurm())
    rows = [Row(1, "carol", "bio"), Row(2, "alice", "physics"), Row(3, "bob", "bio")]
    assert rows[:2] == visible(scope, [*rows, Row(None, "", "")])


def test_visible_asks_the_owner_of_a_row_without_user_once_per_job() -> None:
    """A row with a job id but no user is judged by the job's owner."""
    asked: list[int] = []

    def owner(job_id: int) -> tuple[str, str] | None:
        asked.append(job_id)
        return {7: ("alice", "physics")}.get(job_id)

    rows = [Row(7, "", ""), Row(7, "", ""), Row(8, "", "")]
    assert (rows[:2], [7, 8]) == (visible(Scope(Caller(1001, "alice"), False), rows, owner), asked)


def test_an_admin_sees_every_row() -> None:
    """Scope.all: every row, no owner asked."""
    rows = [Row(None, "", ""), Row(3, "bob", "bio")]
    assert rows == visible(Scope(Caller(0, "root"), True), rows, lambda _: None)


def test_require_admin_refuses_a_user_and_says_who_is_one() -> None:
    """A user's scope is refused with the command and the rule; an admin's passes."""
    with pytest.raises(NotAnAdmin, match=r"^exempt: for administrators \(root, the SlurmUser"):
        require_admin(Scope(Caller(1001, "alice"), False), "exempt")
    require_admin(Scope(Caller(0, "root"), True), "exempt")


def test_give_up_group_sets_real_effective_and_saved_gid_after_opening() -> None:
    """setgid (egid 990): `first` runs with the group, then all three become the real gid."""
    calls: list[object] = []
    dropped = give_up_group(
        lambda: calls.append("open"),
        getresgid=lambda: (1001, 990, 990),
        setresgid=lambda *gids: calls.append(gids),
    )
    assert (True, ["open", (1001, 1001, 1001)]) == (dropped, calls)


def test_give_up_group_even_when_opening_fails() -> None:
    """A store that fails to open still leaves the process without the group."""
    calls: list[object] = []

    def fail() -> None:
        raise OSError("no store")

    with pytest.raises(OSError, match="no store"):
        give_up_group(
            fail, getresgid=lambda: (1001, 990, 990), setresgid=lambda *g: calls.append(g)
        )
    assert [(1001, 1001, 1001)] == calls


def test_give_up_group_without_a_group_changes_nothing() -> None:
    """Not setgid (the console script, the controller): `first` is not even needed."""
    calls: list[object] = []
    dropped = give_up_group(
        lambda: calls.append("open"),
        getresgid=lambda: (0, 0, 0),
        setresgid=lambda *gids: calls.append(gids),
    )
    assert (False, []) == (dropped, calls)
