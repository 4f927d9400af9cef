"""Slurm's GPU index -> NVML device on one node, as slurmd numbers the node's GPUs.

SLURM_JOB_GPUS and the prolog's indices count a node's GPUs in slurmd's order, which is
neither NVML's enumeration order nor always gres.conf's listing order:

- AutoDetect off (or unset): the order of gres.conf's `File=` entries.
- AutoDetect on: slurmd merges the detected GPUs with gres.conf's and sorts the result,
  in `_merge_system_gres_conf()` of src/plugins/gres/gpu/gres_gpu.c (SchedMD/slurm; the
  same code in 22.05, 24.11 and 26.05): first by device file in natural order
  (`_sort_gpu_by_file`, GPUs without a file last), then by the position of -1 in each
  GPU's Links string (`_sort_gpu_by_links_order`, GPUs without Links last, ties keeping
  the file order).
  - `AutoDetect=nvml`: `_get_system_gpu_list_nvml()` in src/plugins/gpu/nvml/gpu_nvml.c
    gives every GPU Links with its -1 at the GPU's NVML index (`_nvml_get_nvlink_info`),
    so the order is NVML's enumeration order (PCI bus id order), whatever File= says.
  - `AutoDetect=nvidia` (24.11+): `_get_system_gpu_list_nvidia()` in
    src/plugins/gpu/nvidia/gpu_nvidia.c reads /proc/driver/nvidia/gpus/*/information and
    sets File=/dev/nvidia<Device Minor> and no Links, so the order is the device files'
    natural order: ascending minor number.
  - GPUs gres.conf lists but slurmd does not detect keep their File= and have no Links:
    after the detected ones under nvml, among them by file under nvidia.
  - With a `Count=` and no File=, slurmd takes that many detected GPUs, lowest device file
    first (it matches the configured GPUs against the detected ones sorted by file).

A node the agent cannot number exactly (AutoDetect=full where NVML and minor order
differ, a non-NVIDIA detector, MIG lines, GPUs gres.conf names that cannot be found)
gets problems, and the GPUs it cannot place get no index: they are never bound to a job
by guess. `slurmd -G` prints slurmd's own list (parse_slurmd_gres), to compare.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slurm_gpu.models import GpuDevice
from slurm_gpu.slurm.gres import GresNode
from slurm_gpu.slurm.hostlist import expand

_NVIDIA_FILE = re.compile(r"nvidia(\d+)$")
_NOT_NVIDIA = ("generic", "nrt", "oneapi", "rsmi")


@dataclass(frozen=True)
class SlurmGpu:
    """One of the node's GPUs at its Slurm index.

    `uuid` is None for a GPU gres.conf names but NVML does not list (a lost GPU).
    """

    index: int
    path: str
    minor: int | None
    uuid: str | None


@dataclass(frozen=True)
class GpuOrder:
    """The node's GPUs in Slurm index order and the rule that ordered them.

    `problems` say what keeps some (or all) of them unnumbered, or what looks wrong.
    """

    rule: str
    gpus: tuple[SlurmGpu, ...] = ()
    problems: tuple[str, ...] = ()

    def index_uuid(self) -> dict[int, str]:
        """{Slurm GPU index: NVML UUID} for the GPUs NVML lists."""
        return {g.index: g.uuid for g in self.gpus if g.uuid is not None}


def slurm_gpu_order(
    gres: GresNode,
    devices: Sequence[GpuDevice] | None,
    stat: Callable[[str], os.stat_result] = os.stat,
) -> GpuOrder:
    """slurmd's numbering of `gres.node`'s GPUs (module docstring).

    Args:
        gres: the node's gres.conf lines.
        devices: the GPUs NVML lists on the node; None where NVML is not available (a
            head node): only what gres.conf alone shows is checked, and no GPU is placed.
        stat: os.stat, to read the minor numbers of gres.conf's device files.
    """
    mode = gres.autodetect or "off"
    where = f"{gres.source}: {gres.node}"
    problems: list[str] = []
    if gres.mig_lines:
        lines = ", ".join(str(n) for n in gres.mig_lines)
        problems.append(
            f"{where}: MultipleFiles= (MIG) GPU lines (line {lines}) are not mapped to GPUs"
            " yet: jobs on them are not recorded"
        )
    if mode in _NOT_NVIDIA:
        return GpuOrder(
            f"AutoDetect={mode}",
            problems=(
                *problems,
                f"{where}: AutoDetect={mode} ({gres.autodetect_where}) does not detect NVIDIA"
                " GPUs: slurm-gpu cannot number this node's GPUs as slurmd does",
            ),
        )
    if mode == "off":
        return _listed_order(gres, devices, stat, problems)
    if devices is None:
        return GpuOrder(f"AutoDetect={mode}", problems=tuple(problems))
    if mode == "full":
        # slurmd tries NVML first, then /proc/driver/nvidia: which one a site's slurmd
        # has (gpu_nvml.so is built only against NVML) decides the order.
        by_nvml = [d.uuid for d in sorted(devices, key=lambda d: d.nvml_index)]
        by_minor = [d.uuid for d in sorted(devices, key=lambda d: d.minor)]
        if by_nvml != by_minor:
            problems.append(
                f"{where}: AutoDetect=full ({gres.autodetect_where}): this node's NVML order"
                " and device minor order differ, and which one slurmd uses depends on"
                " whether its gpu_nvml plugin is installed: set AutoDetect=nvml or"
                " AutoDetect=nvidia (compare with `slurmd -G`)"
            )
            return GpuOrder("AutoDetect=full", problems=tuple(problems))
        mode = "nvidia"  # the same order either way
    return _detected_order(gres, devices, mode, stat, problems)


def _listed_order(
    gres: GresNode,
    devices: Sequence[GpuDevice] | None,
    stat: Callable[[str], os.stat_result],
    problems: list[str],
) -> GpuOrder:
    rule = "gres.conf File= order"
    where = f"{gres.source}: {gres.node}"
    if gres.counted:
        problems.append(
            f"{where}: {gres.counted} GPU(s) declared without File= and no AutoDetect:"
            " slurmd discards them, and slurm-gpu cannot tell which GPUs they are"
        )
    if devices is None:
        return GpuOrder(rule, problems=tuple(problems))
    by_minor = {d.minor: d for d in devices}
    gpus = []
    for entry in gres.files:
        minor = _minor(entry.path, stat, fallback=False)
        device = by_minor.get(minor) if minor is not None else None
        if minor is None:
            problems.append(
                f"{where}: Slurm GPU {entry.slurm_index} {entry.path}: no such device file"
            )
        elif device is None:
            problems.append(
                f"{where}: Slurm GPU {entry.slurm_index} {entry.path} (minor {minor}) is not"
                " among NVML's GPUs"
            )
        gpus.append(SlurmGpu(entry.slurm_index, entry.path, minor, device.uuid if device else None))
    return GpuOrder(rule, tuple(gpus), tuple(problems))


def _detected_order(
    gres: GresNode,
    devices: Sequence[GpuDevice],
    mode: str,
    stat: Callable[[str], os.stat_result],
    problems: list[str],
) -> GpuOrder:
    where = f"{gres.source}: {gres.node}"
    by_minor = {d.minor: d for d in devices}
    detected = sorted(devices, key=lambda d: d.minor)  # slurmd's matching order (by file)
    config_only: list[tuple[int, str]] = []  # (minor, path) listed but not detected
    if gres.files:
        taken = []
        for entry in gres.files:
            minor = _minor(entry.path, stat, fallback=True)
            if minor is None:
                problems.append(f"{where}: {entry.path}: not a device file slurm-gpu can read")
            elif minor in by_minor:
                taken.append(by_minor[minor])
            else:
                config_only.append((minor, entry.path))
                problems.append(
                    f"{where}: gres.conf lists {entry.path} (minor {minor}), which NVML does"
                    f" not list: slurmd keeps it as a GPU nobody can read"
                )
        detected = sorted(set(taken), key=lambda d: d.minor)
    elif gres.counted is not None and gres.counted != len(devices):
        outcome = (
            "slurmd takes the lowest minors first"
            if gres.counted < len(devices)
            else "slurmd cannot find them all"
        )
        problems.append(
            f"{where}: gres.conf declares {gres.counted} GPU(s) and NVML lists"
            f" {len(devices)}: {outcome}"
        )
        detected = detected[: gres.counted]
    placed: list[tuple[int, GpuDevice | None]]  # (minor, device) in Slurm index order
    missing: list[tuple[int, GpuDevice | None]] = [(m, None) for m, _ in sorted(config_only)]
    if mode == "nvml":
        rule = "AutoDetect=nvml: NVML enumeration (PCI bus) order"
        placed = [(d.minor, d) for d in sorted(detected, key=lambda d: d.nvml_index)]
        placed += missing
    else:
        rule = "AutoDetect=nvidia: device minor order"
        placed = sorted([(d.minor, d) for d in detected] + missing, key=lambda p: p[0])
    gpus = tuple(
        SlurmGpu(i, f"/dev/nvidia{minor}", minor, d.uuid if d is not None else None)
        for i, (minor, d) in enumerate(placed)
    )
    return GpuOrder(rule, gpus, tuple(problems))


def _minor(path: str, stat: Callable[[str], os.stat_result], fallback: bool) -> int | None:
    """The device minor of `path`.

    With `fallback`, /dev/nvidiaN's N where it cannot be stat'ed (slurmd matches
    AutoDetect's files by name).
    """
    try:
        return os.minor(stat(path).st_rdev)
    except OSError:
        match = _NVIDIA_FILE.search(path) if fallback else None
        return int(match.group(1)) if match else None


_SLURMD_GRES = re.compile(r"Gres Name=gpu\b(?P<rest>.*)$")


def parse_slurmd_gres(text: str) -> list[str]:
    """The GPU device files `slurmd -G` prints, in slurmd's index order.

    slurmd -G logs each GPU record of its final list (`_log_gres_slurmd_conf` in
    src/interfaces/gres.c; 22.05: `_log_gres_slurmd_conf` in src/common/gres.c): one
    `Gres Name=gpu ... File=/dev/nvidiaM ...` line per detected GPU, or one line with a
    range (`Count=4 ... File=/dev/nvidia[0-3]`) for an unsplit gres.conf record without
    AutoDetect. Its `Index=` is a file's trailing number, not the Slurm index: the Slurm
    index is the file's place in the list.

    Raises:
        SlurmError: a File= range that does not expand.
    """
    files = []
    for line in text.splitlines():
        match = _SLURMD_GRES.search(line)
        if match is None:
            continue
        for token in match.group("rest").split():
            if token.startswith("File="):
                files.extend(expand(token[len("File=") :]))
    return files
