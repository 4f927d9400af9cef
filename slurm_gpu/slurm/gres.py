"""gres.conf: which device files are a node's GPUs, in Slurm's index order.

Slurm numbers a node's GPUs by the order of their `File=` entries in gres.conf, and
SLURM_JOB_GPUS carries those numbers. They are NOT NVML's enumeration order; the device
file's minor number is what ties a Slurm index to an NVML device
(https://slurm.schedmd.com/gres.conf.html#OPT_File).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slurm_gpu.errors import ConfigError, SlurmError
from slurm_gpu.slurm.hostlist import expand


@dataclass(frozen=True)
class GresGpuFile:
    """One GPU device file from gres.conf, at its Slurm index on the node."""

    slurm_index: int
    path: str
    gpu_type: str


def parse_gres_conf(text: str, node: str, source: str = "gres.conf") -> list[GresGpuFile]:
    """The GPU device files of `node`, in Slurm index order.

    Lines without NodeName apply to every node. Only `Name=gpu` lines with `File=` count;
    AutoDetect lines and other GRES are ignored.

    Raises:
        ConfigError: a line is malformed (names the file and line number).
    """
    files: list[GresGpuFile] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if not sep:
                raise ConfigError([f"{source}: line {number}: expected KEY=VALUE, got {token!r}"])
            fields[key.lower()] = value
        if fields.get("name") != "gpu" or "file" not in fields:
            continue
        try:
            if "nodename" in fields and node not in expand(fields["nodename"]):
                continue
            paths = expand(fields["file"])
        except SlurmError as exc:
            raise ConfigError([f"{source}: line {number}: {exc}"]) from exc
        for path in paths:
            files.append(GresGpuFile(len(files), path, fields.get("type", "")))
    return files


def load_gres_conf(path: Path, node: str) -> list[GresGpuFile]:
    """parse_gres_conf() on a file; a missing or unreadable file is a ConfigError."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([f"{path}: {exc.strerror or exc}"]) from exc
    return parse_gres_conf(text, node, str(path))


def index_to_minor(
    files: list[GresGpuFile], stat: Callable[[str], os.stat_result] = os.stat
) -> dict[int, int]:
    """{Slurm GPU index: device minor number}; files that cannot be stat'ed are left out."""
    minors: dict[int, int] = {}
    for entry in files:
        try:
            minors[entry.slurm_index] = os.minor(stat(entry.path).st_rdev)
        except OSError:
            continue
    return minors
