"""Who sees what (access.py): root, SlurmUser, [access] admins, AdminLevel, coordinators."""

from __future__ import annotations

from slurm_gpu.access import Caller, current_caller, resolve_scope
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
