"""sacctmgr -n -P parsers (associations, admin levels, coordinators) and argv builders."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu.errors import SlurmError
from slurm_gpu.slurm import sacctmgr
from slurm_gpu.slurm.sacctmgr import Association

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def _assocs(name: str) -> tuple[list[Association], list[str]]:
    return sacctmgr.parse_associations((DATA / name).read_text())


def test_real_associations_without_limits() -> None:
    """The test bed's 8 associations parse, none with limits."""
    assocs, problems = _assocs("sacctmgr-show-assoc.txt")
    expected = [
        ("root", ""), ("root", "root"), ("bio", ""), ("bio", "bob"), ("bio", "carol"),
        ("physics", ""), ("physics", "alice"), ("physics", "carol"),
    ]  # fmt: skip
    assert (expected, [], set()) == (
        [(a.account, a.user) for a in assocs],
        problems,
        {a.user for a in assocs if a.grp_tres or a.max_tres or a.max_jobs},
    )


def test_real_association_with_limits() -> None:
    """bob's limits (set with sacctmgr on the test bed) are read into fields."""
    assocs, _ = _assocs("sacctmgr-show-assoc-limits.txt")
    bob = next(a for a in assocs if a.user == "bob")
    expected = Association(
        cluster="testbed",
        account="bio",
        user="bob",
        shares=1,
        grp_tres={"cpu": 8, "gres/gpu": 4},
        grp_tres_mins={"gres/gpu": 6000},
        max_tres={"gres/gpu": 2},
        max_jobs=3,
        max_wall_seconds=86400.0,
        qos=("normal",),
    )
    assert expected == bob


def test_21_08_parent_shares_and_units() -> None:
    """Fairshare=parent is None; mem=256G is 262144 MB; several QOS are a tuple."""
    assocs, _ = _assocs("handmade/sacctmgr-show-assoc-21.08-like.txt")
    phys = assocs[1]
    assert (None, {"cpu": 64, "mem": 262144, "gres/gpu": 8}, ("normal", "high"), 172800.0) == (
        phys.shares,
        phys.grp_tres,
        phys.qos,
        phys.grp_wall_seconds,
    )


def test_21_08_malformed_lines_are_skipped_and_reported() -> None:
    """Non-numeric shares, a bad TRES and a short line are skipped, one problem each."""
    assocs, problems = _assocs("handmade/sacctmgr-show-assoc-21.08-like.txt")
    assert (["", "", "dave"], ["line 4", "line 5", "line 6"]) == (
        [a.user for a in assocs],
        [p.split(": ")[1] for p in problems],
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("gres/gpu=0", {"gres/gpu": 0}),
        ("cpu=8,mem=4000M,gres/gpu:a100=2", {"cpu": 8, "mem": 4000, "gres/gpu:a100": 2}),
        ("mem=1T", {"mem": 1048576}),
    ],
)
def test_parse_tres(text: str, expected: dict[str, int]) -> None:
    """TRES lists to {name: number}, memory in MB."""
    assert expected == sacctmgr.parse_tres(text)


def test_admin_levels_real() -> None:
    """The test bed's users and levels."""
    levels, _ = sacctmgr.parse_admin_levels(
        (DATA / "sacctmgr-show-user-adminlevel.txt").read_text()
    )
    expected = {"alice": "None", "bob": "None", "carol": "None", "root": "Administrator"}
    assert expected == levels


def test_admin_levels_trailing_bar_and_broken_line() -> None:
    """A trailing `|` is tolerated; a line without fields is reported."""
    levels, problems = sacctmgr.parse_admin_levels(
        (DATA / "handmade" / "sacctmgr-show-user-21.08-like.txt").read_text()
    )
    expected = {"alice": "None", "bob": "Operator", "root": "Administrator"}
    assert (expected, 1) == (levels, len(problems))


def test_coordinators_real() -> None:
    """carol coordinating bio (captured while set on the test bed); others have none."""
    accounts, _ = sacctmgr.parse_coordinators(
        (DATA / "sacctmgr-show-account-withcoord.txt").read_text()
    )
    assert {"bio": {"carol"}, "physics": set(), "root": set()} == accounts


def test_coordinators_several_and_broken() -> None:
    """Comma-separated coordinators; a line without an account is reported."""
    accounts, problems = sacctmgr.parse_coordinators(
        (DATA / "handmade" / "sacctmgr-show-account-withcoord-21.08-like.txt").read_text()
    )
    assert ({"bio": {"carol", "dave"}, "physics": set(), "root": set()}, 1) == (
        accounts,
        len(problems),
    )


def test_assoc_argv_with_filters() -> None:
    """user/account become a `where` clause before the fixed format."""
    argv = sacctmgr.assoc_argv(user="bob", account="bio")
    assert ["sacctmgr", "-n", "-P", "show", "assoc", "where", "user=bob", "account=bio"] == argv[
        :-1
    ]


def test_modify_user_association_argv() -> None:
    """A user's association in an account; Shares is spelled Fairshare."""
    argv = sacctmgr.modify_assoc_argv("bio", "bob", {"GrpTRES": "gres/gpu=0", "Shares": 5})
    expected = [
        "sacctmgr", "-i", "modify", "user", "where", "name=bob", "account=bio",
        "set", "GrpTRES=gres/gpu=0", "Fairshare=5",
    ]  # fmt: skip
    assert expected == argv


def test_modify_account_association_argv() -> None:
    """An account's own association; field names are case-insensitive."""
    argv = sacctmgr.modify_assoc_argv("physics", None, {"grptres": "gres/gpu=-1"})
    expected = [
        "sacctmgr", "-i", "modify", "account", "where", "name=physics",
        "set", "GrpTRES=gres/gpu=-1",
    ]  # fmt: skip
    assert expected == argv


@pytest.mark.parametrize(
    ("account", "fields"),
    [
        ("bio", {"Description": "x"}),
        ("bio", {"GrpTRES": "gres/gpu=0 MaxJobs=1"}),
        ("bio where name=physics", {"GrpJobs": 1}),
        ("bio", {}),
    ],
)
def test_modify_rejects_unknown_fields_and_odd_values(
    account: str, fields: dict[str, object]
) -> None:
    """Unknown fields, values or names with spaces, and no fields raise SlurmError."""
    with pytest.raises(SlurmError):
        sacctmgr.modify_assoc_argv(account, None, fields)
