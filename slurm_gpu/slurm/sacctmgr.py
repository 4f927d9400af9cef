"""Association limits, shares, admin levels and coordinators: `sacctmgr -n -P` parsers.

`sacctmgr -n -P show assoc format=...` prints one association per line, fields split by
`|` in the order asked for (https://slurm.schedmd.com/sacctmgr.html). Association fields
hold names, numbers and TRES lists only, so `|` cannot appear inside a field; a line with
the wrong number of fields is reported and skipped. Empty means "no limit". The format
has been the same since before 21.08.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm_gpu.errors import SlurmError
from slurm_gpu.slurm.timespec import parse_elapsed

ASSOC_FIELDS = (
    "Cluster",
    "Account",
    "User",
    "Partition",
    "Share",
    "GrpTRES",
    "GrpTRESMins",
    "GrpTRESRunMins",
    "GrpJobs",
    "GrpSubmit",
    "GrpWall",
    "MaxTRES",
    "MaxTRESPerNode",
    "MaxTRESMins",
    "MaxJobs",
    "MaxSubmit",
    "MaxWall",
    "QOS",
    "DefaultQOS",
)

SETTABLE_FIELDS = {
    name.lower(): name
    for name in (
        "Fairshare",
        "GrpTRES",
        "GrpTRESMins",
        "GrpTRESRunMins",
        "GrpJobs",
        "GrpJobsAccrue",
        "GrpSubmit",
        "GrpWall",
        "MaxTRES",
        "MaxTRESPerNode",
        "MaxTRESMins",
        "MaxJobs",
        "MaxJobsAccrue",
        "MaxSubmit",
        "MaxWall",
        "Priority",
        "QOS",
        "DefaultQOS",
    )
}
"""Association fields set_association may change (lowercase -> sacctmgr's spelling)."""
SETTABLE_FIELDS["shares"] = "Fairshare"
SETTABLE_FIELDS["share"] = "Fairshare"

_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}


@dataclass(frozen=True)
class Association:
    """One association (cluster, account, user, partition) and its limits.

    TRES limits map a TRES name to its limit: {"gres/gpu": 4, "cpu": 8}; memory in MB,
    as Slurm counts it. None and {} mean "no limit". `shares` is the raw Fairshare
    number (None for "parent", which inherits the parent's shares).
    """

    cluster: str
    account: str
    user: str = ""
    partition: str = ""
    shares: int | None = None
    grp_tres: dict[str, int] = field(default_factory=dict)
    grp_tres_mins: dict[str, int] = field(default_factory=dict)
    grp_tres_run_mins: dict[str, int] = field(default_factory=dict)
    grp_jobs: int | None = None
    grp_submit: int | None = None
    grp_wall_seconds: float | None = None
    max_tres: dict[str, int] = field(default_factory=dict)
    max_tres_per_node: dict[str, int] = field(default_factory=dict)
    max_tres_mins: dict[str, int] = field(default_factory=dict)
    max_jobs: int | None = None
    max_submit: int | None = None
    max_wall_seconds: float | None = None
    qos: tuple[str, ...] = ()
    default_qos: str = ""


def assoc_argv(user: str | None = None, account: str | None = None) -> list[str]:
    """`sacctmgr -n -P show assoc [where user=.. account=..] format=ASSOC_FIELDS`."""
    argv = ["sacctmgr", "-n", "-P", "show", "assoc"]
    where = []
    if user:
        where.append(f"user={_name(user)}")
    if account:
        where.append(f"account={_name(account)}")
    if where:
        argv += ["where", *where]
    return [*argv, "format=" + ",".join(ASSOC_FIELDS)]


def modify_assoc_argv(account: str, user: str | None, fields: Mapping[str, object]) -> list[str]:
    """`sacctmgr -i modify user|account where ... set Field=value ...`.

    Raises:
        SlurmError: an unknown field or a value with spaces, quotes or newlines.
    """
    if not fields:
        raise SlurmError("sacctmgr modify: no fields to set")
    settings = []
    for key, value in fields.items():
        canonical = SETTABLE_FIELDS.get(key.lower())
        if canonical is None:
            raise SlurmError(
                f"sacctmgr modify: unknown association field {key!r} "
                f"(one of {', '.join(sorted(set(SETTABLE_FIELDS.values())))})"
            )
        text = str(value)
        if not text or re.search(r"[\s'\"]", text):
            raise SlurmError(f"sacctmgr modify: bad value {text!r} for {canonical}")
        settings.append(f"{canonical}={text}")
    if user:
        where = ["user", "where", f"name={_name(user)}", f"account={_name(account)}"]
    else:
        where = ["account", "where", f"name={_name(account)}"]
    return ["sacctmgr", "-i", "modify", *where, "set", *settings]


def _name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.@-]+", text):
        raise SlurmError(f"sacctmgr: bad user or account name {text!r}")
    return text


def parse_tres(text: str) -> dict[str, int]:
    """`cpu=8,gres/gpu=4,mem=4000M` -> {"cpu": 8, "gres/gpu": 4, "mem": 4000} (mem in MB).

    Raises ValueError for anything else.
    """
    limits: dict[str, int] = {}
    text = text.strip()
    if not text:
        return limits
    for item in text.split(","):
        name, sep, value = item.partition("=")
        match = re.fullmatch(r"(\d+)([KMGTP]?)", value.strip())
        if not sep or not name.strip() or match is None:
            raise ValueError(f"bad TRES {item!r}")
        number = int(match.group(1))
        if match.group(2):
            number = int(number * _MEM_UNITS[match.group(2)])
        limits[name.strip()] = number
    return limits


def _count(text: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"expected a number, got {text!r}")
    return int(text)


def _shares(text: str) -> int | None:
    text = text.strip()
    if text.lower() in ("", "parent"):
        return None
    return _count(text)


def _wall(text: str) -> float | None:
    return parse_elapsed(text) if text.strip() else None


def parse_associations(text: str) -> tuple[list[Association], list[str]]:
    """Associations from `assoc_argv()` output (fields in ASSOC_FIELDS order).

    Returns:
        (associations, problems); a malformed line is skipped and described.
    """
    associations: list[Association] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("|")
        # -P ends each line with a "|" in some versions; that extra field is empty.
        if len(fields) == len(ASSOC_FIELDS) + 1 and fields[-1] == "":
            fields.pop()
        if len(fields) != len(ASSOC_FIELDS):
            problems.append(
                f"sacctmgr show assoc: line {number}: {len(fields)} fields, "
                f"expected {len(ASSOC_FIELDS)}; skipped"
            )
            continue
        row = dict(zip(ASSOC_FIELDS, fields, strict=True))
        try:
            associations.append(_association(row))
        except ValueError as exc:
            problems.append(f"sacctmgr show assoc: line {number}: {exc}; skipped")
    return associations, problems


def _association(row: Mapping[str, str]) -> Association:
    if not row["Account"].strip():
        raise ValueError("no account")
    return Association(
        cluster=row["Cluster"].strip(),
        account=row["Account"].strip(),
        user=row["User"].strip(),
        partition=row["Partition"].strip(),
        shares=_shares(row["Share"]),
        grp_tres=parse_tres(row["GrpTRES"]),
        grp_tres_mins=parse_tres(row["GrpTRESMins"]),
        grp_tres_run_mins=parse_tres(row["GrpTRESRunMins"]),
        grp_jobs=_count(row["GrpJobs"]),
        grp_submit=_count(row["GrpSubmit"]),
        grp_wall_seconds=_wall(row["GrpWall"]),
        max_tres=parse_tres(row["MaxTRES"]),
        max_tres_per_node=parse_tres(row["MaxTRESPerNode"]),
        max_tres_mins=parse_tres(row["MaxTRESMins"]),
        max_jobs=_count(row["MaxJobs"]),
        max_submit=_count(row["MaxSubmit"]),
        max_wall_seconds=_wall(row["MaxWall"]),
        qos=tuple(q for q in row["QOS"].strip().split(",") if q),
        default_qos=row["DefaultQOS"].strip(),
    )


ADMIN_LEVEL_ARGV = ["sacctmgr", "-n", "-P", "show", "user", "format=User,AdminLevel"]
COORDINATOR_ARGV = [
    "sacctmgr",
    "-n",
    "-P",
    "show",
    "account",
    "withcoord",
    "format=Account,Coordinators",
]


def _two_fields(line: str) -> list[str]:
    fields = line.split("|")
    if len(fields) == 3 and fields[2] == "":
        fields.pop()  # a trailing "|"
    return fields


def parse_admin_levels(text: str) -> tuple[dict[str, str], list[str]]:
    """`sacctmgr -n -P show user format=User,AdminLevel` -> ({user: level}, problems).

    Levels are "None", "Operator" or "Administrator" as sacctmgr prints them.
    """
    levels: dict[str, str] = {}
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = _two_fields(line)
        if len(fields) != 2 or not fields[0].strip():
            problems.append(f"sacctmgr show user: line {number}: unparsable {line[:80]!r}")
            continue
        levels[fields[0].strip()] = fields[1].strip()
    return levels, problems


def parse_coordinators(text: str) -> tuple[dict[str, set[str]], list[str]]:
    """`sacctmgr -n -P show account withcoord format=Account,Coordinators`.

    Returns:
        ({account: {coordinator user, ...}}, problems); every listed account is a key,
        with an empty set when it has no coordinator.
    """
    accounts: dict[str, set[str]] = {}
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = _two_fields(line)
        if len(fields) != 2 or not fields[0].strip():
            problems.append(f"sacctmgr show account: line {number}: unparsable {line[:80]!r}")
            continue
        users = {user.strip() for user in fields[1].split(",") if user.strip()}
        accounts.setdefault(fields[0].strip(), set()).update(users)
    return accounts, problems
