"""Who sees what (access.py): root, SlurmUser, [access] admins, AdminLevel, coordinators."""

from __future__ import annotations

from collections.abc import Sequence

from slurm_gpu.access import Caller, current_caller, resolve_scope
from slurm_gpu.errors import SlurmError

LEVELS = "alice|None\nbob|None\ncarol|None\nop|Operator\nroot|Administrator\n"
COORDS = "bio|\nphysics|carol\nroot|\n"
CONFIG = "ClusterName             = testbed\nSlurmUser               = slurm(64030)\n"


class FakeSlurm:
    """Answers sacctmgr/scontrol like the test bed; records what was asked."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        if self.fail:
            raise SlurmError("sacctmgr: cannot reach slurmdbd")
        if argv[0] == "scontrol":
            return CONFIG
        if "AdminLevel" in argv[-1]:
            return LEVELS
        return COORDS


def test_user_sees_own_jobs_only() -> None:
    """A plain user's scope is their own name."""
    scope = resolve_scope(Caller(1001, "alice"), FakeSlurm())
    assert (False, frozenset()) == (scope.all, scope.accounts)
    assert scope.sees("alice", "physics")
    assert not scope.sees("bob", "bio")
    assert not scope.sees("carol", "physics")


def test_coordinator_sees_account() -> None:
    """A coordinator of physics sees physics jobs, not bio ones."""
    scope = resolve_scope(Caller(1003, "carol"), FakeSlurm())
    assert scope.sees("alice", "physics")
    assert not scope.sees("bob", "bio")


def test_admins() -> None:
    """root, SlurmUser, Operator/Administrator and [access] admins see all."""
    assert resolve_scope(Caller(0, "root"), None).all
    assert resolve_scope(Caller(64030, "slurm"), FakeSlurm()).all
    assert "AdminLevel=Operator" == resolve_scope(Caller(2000, "op"), FakeSlurm()).reason
    assert resolve_scope(Caller(1002, "bob"), None, admins=["bob"]).all


def test_slurm_down_never_widens() -> None:
    """sacctmgr failing leaves a user with their own jobs."""
    scope = resolve_scope(Caller(1003, "carol"), FakeSlurm(fail=True))
    assert (False, frozenset()) == (scope.all, scope.accounts)


def test_slurm_roles_off_asks_nothing() -> None:
    """[access] slurm_roles = false: no sacctmgr calls, own jobs only."""
    slurm = FakeSlurm()
    scope = resolve_scope(Caller(1003, "carol"), slurm, use_slurm=False)
    assert ([], False) == (slurm.calls, scope.all)


def test_caller_is_the_real_uid() -> None:
    """The identity comes from the injected getuid (os.getuid in production)."""
    assert Caller(0, "root") == current_caller(lambda: 0)
    assert "4242424" == current_caller(lambda: 4242424).name
