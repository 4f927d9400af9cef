"""The Slurm release slurm-gpu talks to, and whether it is one slurm-gpu is tested on.

`slurm-gpu --version` and `slurm-gpu config check` say which Slurm they reach (through
the one command runner, as every Slurm command): `scontrol --version`, else
`sinfo --version`. A release outside `TESTED_RELEASES` gets a warning, never a refusal:
slurm-gpu reads Slurm through its commands' documented output, which rarely changes in
ways that matter, but only the tested releases are shown to work (the test bed runs each:
docker/slurm-cluster/local-cluster up --slurm RELEASE).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_gpu.errors import SlurmError
from slurm_gpu.slurm.runner import CommandRunner

TESTED_RELEASES = ("22.05", "24.11", "26.05")
"""The Slurm releases the whole test suite (22.05) or its Slurm-facing part runs on."""

# `slurm 24.11.5` (upstream), `slurm-wlm 24.11.5` (Debian), `slurm 23.11.0-0rc1`.
_VERSION = re.compile(r"^\s*slurm(?:-wlm)?\s+(\d+)\.(\d+)((?:\.\d+)?\S*)", re.IGNORECASE)
_QUERIES = (("scontrol", "--version"), ("sinfo", "--version"))


@dataclass(frozen=True)
class SlurmVersion:
    """A Slurm version as its commands print it.

    Attributes:
        major: the release's year (24 for 24.11.5).
        minor: the release's month (11 for 24.11.5).
        text: the whole version ("24.11.5").
    """

    major: int
    minor: int
    text: str

    @property
    def release(self) -> str:
        """The release, major.minor with two digits each ("24.11", "22.05")."""
        return f"{self.major:02d}.{self.minor:02d}"

    @property
    def tested(self) -> bool:
        """Whether the release is one slurm-gpu is tested on."""
        return self.release in TESTED_RELEASES


def parse_version(output: str) -> SlurmVersion:
    """The version in `scontrol --version` (or `sinfo --version`) output.

    Raises:
        SlurmError: no line reads `slurm X.Y...`.
    """
    for line in output.splitlines():
        match = _VERSION.match(line)
        if match:
            major, minor = int(match[1]), int(match[2])
            return SlurmVersion(major, minor, f"{match[1]}.{match[2]}{match[3]}")
    first = output.strip().splitlines()[0] if output.strip() else "no output"
    raise SlurmError(f"unrecognised Slurm version output: {first!r}")


def query_version(run: CommandRunner) -> SlurmVersion:
    """The Slurm version `run` reaches: `scontrol --version`, else `sinfo --version`.

    Raises:
        SlurmError: neither command ran and printed a version (the first one's error).
    """
    errors: list[SlurmError] = []
    for argv in _QUERIES:
        try:
            return parse_version(run(list(argv)))
        except SlurmError as exc:
            errors.append(exc)
    raise errors[0]


def untested_warning(version: SlurmVersion) -> str | None:
    """The warning for a release outside the tested ones, else None."""
    if version.tested:
        return None
    return (
        f"Slurm {version.release} is not a release slurm-gpu is tested on "
        f"({', '.join(TESTED_RELEASES)}); it should work, but check the agents' logs "
        "and `slurm-gpu status` after the upgrade"
    )


def describe_slurm(run: CommandRunner) -> tuple[str, str | None]:
    """The line saying which Slurm `run` reaches, and the warning to print (or None).

    `Slurm 24.11.5 (tested releases: 22.05, 24.11, 26.05)`, or `Slurm not reachable: WHY`
    (no warning then: the line says it).
    """
    try:
        version = query_version(run)
    except SlurmError as exc:
        return f"Slurm not reachable: {exc}", None
    tested = ", ".join(TESTED_RELEASES)
    return f"Slurm {version.text} (tested releases: {tested})", untested_warning(version)
