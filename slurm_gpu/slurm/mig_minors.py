"""/proc/driver/nvidia-caps/mig-minors: which capability device grants which MIG instance.

The NVIDIA driver lists one `NAME MINOR` line per capability: `config 1`, `monitor 2`,
then `gpu{g}/gi{gi}/access {minor}` (GPU instance gi of the GPU with device minor g) and
`gpu{g}/gi{gi}/ci{ci}/access {minor}` (its compute instance ci). The device
`/dev/nvidia-caps/nvidia-cap{minor}` is that capability. slurmd reads this file to build a
MIG device's files (src/plugins/gpu/nvml/gpu_nvml.c `_nvml_get_mig_minor_numbers`, called
by `_handle_mig`: the parent's /dev/nvidiaN, then the GPU instance's and the compute
instance's cap files), and gres.conf's `MultipleFiles=` lines name the same files, so this
file ties a Slurm MIG GPU to NVML's (GPU minor, GPU instance, compute instance).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from slurm_gpu.errors import ConfigError

DEFAULT_PATH = Path("/proc/driver/nvidia-caps/mig-minors")

_CAP_NAME = re.compile(r"gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access")
_CAP_FILE = re.compile(r"nvidia-cap(\d+)$")


@dataclass(frozen=True)
class MigCapability:
    """What one capability minor grants: a GPU instance, or one of its compute instances.

    `compute_instance_id` is None for the GPU instance's own `access` capability.
    """

    gpu_minor: int
    gpu_instance_id: int
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class MigMinors:
    """The parsed mig-minors file, both ways.

    Attributes:
        source: the file, for messages.
        capabilities: {capability minor: what it grants}, the MIG lines only.
        config, monitor: the minors of the `config` and `monitor` capabilities (None
            where the file has no such line).
    """

    source: str = str(DEFAULT_PATH)
    capabilities: Mapping[int, MigCapability] = field(default_factory=dict)
    config: int | None = None
    monitor: int | None = None

    def capability(self, minor: int) -> MigCapability | None:
        """What capability `minor` grants; None where the file has no MIG line for it."""
        return self.capabilities.get(minor)

    def instance_minors(
        self, gpu_minor: int, gpu_instance_id: int, compute_instance_id: int
    ) -> tuple[int, int] | None:
        """(GPU instance minor, compute instance minor) of a MIG device, as slurmd finds them.

        None where either line is missing (slurmd then skips the MIG device).
        """
        gi = ci = None
        for minor, cap in self.capabilities.items():
            if (cap.gpu_minor, cap.gpu_instance_id) != (gpu_minor, gpu_instance_id):
                continue
            if cap.compute_instance_id is None:
                gi = minor
            elif cap.compute_instance_id == compute_instance_id:
                ci = minor
        return (gi, ci) if gi is not None and ci is not None else None


def parse_mig_minors(text: str, source: str = str(DEFAULT_PATH)) -> MigMinors:
    """The capabilities the mig-minors `text` lists (module docstring).

    Lines other than `config`, `monitor` and `gpu.../access` are ignored, as slurmd ignores
    every name it does not look for.

    Raises:
        ConfigError: a line is not `NAME MINOR`, a minor is not a number, a `gpu...` name
            is not `gpuG/giI/access` or `gpuG/giI/ciC/access`, or a minor is listed twice
            (names the file and line).
    """
    capabilities: dict[int, MigCapability] = {}
    first_line: dict[int, int] = {}
    config = monitor = None
    for number, raw in enumerate(text.splitlines(), start=1):
        parts = raw.split()
        if not parts:
            continue
        where = f"{source}: line {number}"
        if len(parts) != 2:
            raise ConfigError([f"{where}: expected NAME MINOR, got {raw.strip()!r}"])
        name, value = parts
        if not (value.isascii() and value.isdigit()):
            raise ConfigError([f"{where}: {name}: minor {value!r} is not a number"])
        minor = int(value)
        if minor in first_line:
            raise ConfigError(
                [f"{where}: {name}: minor {minor} is already line {first_line[minor]}'s"]
            )
        first_line[minor] = number
        if name == "config":
            config = minor
        elif name == "monitor":
            monitor = minor
        elif name.startswith("gpu"):
            match = _CAP_NAME.fullmatch(name)
            if match is None:
                raise ConfigError(
                    [f"{where}: {name!r} is not gpuG/giI/access or gpuG/giI/ciC/access"]
                )
            g, gi, ci = match.groups()
            capabilities[minor] = MigCapability(int(g), int(gi), int(ci) if ci else None)
    return MigMinors(source, capabilities, config, monitor)


def load_mig_minors(path: Path) -> MigMinors:
    """parse_mig_minors() on a file; a missing or unreadable file is a ConfigError."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([f"{path}: {exc.strerror or exc}"]) from exc
    return parse_mig_minors(text, str(path))


def capability_file_minor(path: str) -> int | None:
    """N of a `/dev/nvidia-caps/nvidia-capN` file name; None for any other file.

    slurmd names the cap files by their mig-minors minor (`_handle_mig` writes
    `/dev/nvidia-caps/nvidia-cap%u`), so the name is what ties them, as in Slurm.
    """
    match = _CAP_FILE.search(path)
    return int(match.group(1)) if match and "/nvidia-caps/" in path else None
