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

MIG (GPUs in MIG mode; docs/design/gpu-slots.md):

- AutoDetect off: a `MultipleFiles=` line is one Slurm GPU, numbered with the `File=`
  files in listing order (src/interfaces/gres.c `_foreach_fill_in_gres_devices` advances
  the device index once per MultipleFiles= record). Its cap files' minors are looked up
  in mig-minors (`slurm_gpu.slurm.mig_minors`) -> (GPU minor, GI, CI) -> the GpuDevice of
  that minor and its MigDevice of that GI and CI.
- slurmd groups a node's GPU lines by slurm.conf's Gres= types before numbering them
  (src/interfaces/gres.c `_merge_config` -> `_merge_gres2`, in the order of
  `gres_add_type`): listing order is slurmd's only where each type's lines are together
  and slurm.conf names the types in the same order (or untyped). Interleaved types are
  a problem.
- `AutoDetect=nvml`: `_get_system_gpu_list_nvml()` gives a GPU in MIG mode one record
  per MIG device (`_handle_mig`), with File= the parent's /dev/nvidiaN and the GI and CI
  cap files from mig-minors, and no Links; a GPU in MIG mode without MIG devices (or
  whose MIG devices all fail) stays one whole record with Links. So after
  `_sort_gpu_by_file` then `_sort_gpu_by_links_order` the MIG slots come after every
  whole GPU, in the natural order of their file strings (strnatcmp, src/common/
  strnatcmp.c; glibc's qsort, a merge sort where memory allows, keeps ties in order,
  as Python's sort does). A gres.conf MultipleFiles= line matches a detected MIG record
  only by the same file string (`_match_gres`).
- `AutoDetect=nvidia` does not detect MIG (gres.conf(5): "doesn't detect MIGs"): a GPU
  in MIG mode is then a problem, and its whole-GPU record is not bound.
- A whole GPU (File=) in MIG mode, a MIG line whose cap files are not in mig-minors or
  whose instance NVML does not list: problems, and no binding.

Shares: a `Name=shard` / `Name=mps` line with File= gives that GPU its Count= (slurmd
matches the File= string to a GPU record's, src/plugins/gres/common/gres_c_s.c
`_merge_lists`); one without File= is spread over every GPU record in index order,
Count/remaining each (`_distribute_count`).

A node the agent cannot number exactly (AutoDetect=full where NVML and minor order
differ, a non-NVIDIA detector, GPUs gres.conf names that cannot be found) gets problems,
and the GPUs it cannot place get no index: they are never bound to a job by guess.
`slurmd -G` prints slurmd's own list (parse_slurmd_gres), to compare.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slurm_gpu.models import GpuDevice, GpuSlot, MigDevice
from slurm_gpu.slurm.gres import GresGpuFile, GresMigFile, GresNode
from slurm_gpu.slurm.hostlist import expand
from slurm_gpu.slurm.mig_minors import MigMinors, capability_file_minor

_NVIDIA_FILE = re.compile(r"nvidia(\d+)$")
_NOT_NVIDIA = ("generic", "nrt", "oneapi", "rsmi")


@dataclass(frozen=True)
class SlurmGpu:
    """One of the node's GPUs (or MIG slots) at its Slurm index.

    Attributes:
        index: the Slurm GPU index. path: slurmd's file for it (a MIG slot's: its file
            list, as gres.conf or slurmd writes it).
        minor: the (parent) GPU's device minor; None where it cannot be read.
        uuid: the slot id the index binds to: the GPU UUID of a whole GPU, the MIG UUID
            of a MIG slot; None where it binds to nothing (NVML does not list it, or it
            cannot be bound without a guess: `GpuOrder.problems` says why).
        slot: what a job holding this index holds; None where `uuid` is None.
    """

    index: int
    path: str
    minor: int | None
    uuid: str | None
    slot: GpuSlot | None = None


@dataclass(frozen=True)
class ShareCapacity:
    """How many gres/shard (or gres/mps) one Slurm GPU is cut into.

    A job holding `n` of them holds `n / count` of the GPU (GpuSlot.shared).
    """

    kind: str  # "shard" or "mps"
    index: int
    uuid: str | None
    count: int

    def share(self, held: int) -> float:
        """The part of the GPU `held` shares are."""
        return held / self.count if self.count else 0.0


@dataclass(frozen=True)
class GpuOrder:
    """The node's GPUs in Slurm index order and the rule that ordered them.

    `problems` say what keeps some (or all) of them unnumbered, or what looks wrong.
    `shares` are the node's shard / mps capacities per GPU.
    """

    rule: str
    gpus: tuple[SlurmGpu, ...] = ()
    problems: tuple[str, ...] = ()
    shares: tuple[ShareCapacity, ...] = field(default=())

    def index_uuid(self) -> dict[int, str]:
        """{Slurm GPU index: slot id (GPU or MIG UUID)} for the GPUs bound to a device."""
        return {g.index: g.uuid for g in self.gpus if g.uuid is not None}

    def index_slot(self) -> dict[int, GpuSlot]:
        """{Slurm GPU index: its slot} for the GPUs bound to a device."""
        return {g.index: g.slot for g in self.gpus if g.slot is not None}


def slurm_gpu_order(
    gres: GresNode,
    devices: Sequence[GpuDevice] | None,
    stat: Callable[[str], os.stat_result] = os.stat,
    mig_minors: MigMinors | None = None,
) -> GpuOrder:
    """slurmd's numbering of `gres.node`'s GPUs (module docstring).

    Args:
        gres: the node's gres.conf lines.
        devices: the GPUs NVML lists on the node; None where NVML is not available (a
            head node): only what gres.conf alone shows is checked, and no GPU is placed.
        stat: os.stat, to read the minor numbers of gres.conf's device files.
        mig_minors: the node's /proc/driver/nvidia-caps/mig-minors ([node] mig_minors);
            None where it was not read: MIG slots are then not numbered.
    """
    order = _order(gres, devices, stat, mig_minors)
    shares, share_problems = _share_capacities(gres, order.gpus)
    return GpuOrder(order.rule, order.gpus, (*order.problems, *share_problems), shares)


def _order(
    gres: GresNode,
    devices: Sequence[GpuDevice] | None,
    stat: Callable[[str], os.stat_result],
    mig_minors: MigMinors | None,
) -> GpuOrder:
    mode = gres.autodetect or "off"
    where = f"{gres.source}: {gres.node}"
    problems: list[str] = []
    if mode in _NOT_NVIDIA:
        return GpuOrder(
            f"AutoDetect={mode}",
            problems=(
                f"{where}: AutoDetect={mode} ({gres.autodetect_where}) does not detect NVIDIA"
                " GPUs: slurm-gpu cannot number this node's GPUs as slurmd does",
            ),
        )
    if mode == "off":
        return _listed_order(gres, devices, stat, problems, mig_minors)
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
        if any(d.mig_enabled for d in devices):
            problems.append(
                f"{where}: AutoDetect=full ({gres.autodetect_where}) on GPUs in MIG mode:"
                " slurmd's gpu_nvml plugin detects their MIG devices and /proc/driver/nvidia"
                " does not, and which one slurmd uses depends on whether the plugin is"
                " installed: set AutoDetect=nvml"
            )
            return GpuOrder("AutoDetect=full", problems=tuple(problems))
        mode = "nvidia"  # the same order either way
    return _detected_order(gres, devices, mode, stat, problems, mig_minors)


def _listed_order(
    gres: GresNode,
    devices: Sequence[GpuDevice] | None,
    stat: Callable[[str], os.stat_result],
    problems: list[str],
    mig_minors: MigMinors | None,
) -> GpuOrder:
    rule = "gres.conf File= and MultipleFiles= order" if gres.mig else "gres.conf File= order"
    where = f"{gres.source}: {gres.node}"
    if gres.counted:
        problems.append(
            f"{where}: {gres.counted} GPU(s) declared without File= and no AutoDetect:"
            " slurmd discards them, and slurm-gpu cannot tell which GPUs they are"
        )
    entries = gres.entries()
    interleaved = _interleaved_type(entries)
    if interleaved is not None:
        problems.append(
            f"{where}: GPU lines of Type={interleaved} are not listed together: slurmd"
            " numbers a node's GPUs by slurm.conf's Gres= types, each type's lines in"
            " listing order, so this listing is not slurmd's order: list each type's"
            " lines together, in slurm.conf's order"
        )
        return GpuOrder(rule, problems=tuple(problems))
    if devices is None:
        return GpuOrder(rule, problems=tuple(problems))
    by_minor = {d.minor: d for d in devices}
    gpus = []
    for entry in entries:
        if isinstance(entry, GresMigFile):
            gpus.append(_mig_gpu(entry, by_minor, stat, False, mig_minors, where, problems))
            continue
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
        elif device.mig_enabled:
            problems.append(_whole_in_mig_mode(where, entry.slurm_index, entry.path, device))
            device = None
        gpus.append(_whole_gpu(entry.slurm_index, entry.path, minor, device))
    return GpuOrder(rule, tuple(gpus), tuple(problems))


@dataclass(frozen=True)
class _Record:
    """One GPU record of slurmd's merged list (gres_slurmd_conf_t, the fields that sort).

    `links` is the position of -1 in its Links (the NVML index), None for no Links.
    """

    file: str
    links: int | None
    minor: int | None
    gpu: SlurmGpu  # index 0 until placed


def _detected_order(
    gres: GresNode,
    devices: Sequence[GpuDevice],
    mode: str,
    stat: Callable[[str], os.stat_result],
    problems: list[str],
    mig_minors: MigMinors | None,
) -> GpuOrder:
    where = f"{gres.source}: {gres.node}"
    if mode == "nvml":
        rule = "AutoDetect=nvml: NVML enumeration (PCI bus) order"
        if gres.mig or any(d.mig_enabled for d in devices):
            rule += ", then MIG slots by device files"
        system = _nvml_records(devices, mig_minors, where, problems)
        if system is None:
            return GpuOrder(rule, problems=tuple(problems))
    else:
        rule = "AutoDetect=nvidia: device minor order"
        system = []
        for d in sorted(devices, key=lambda d: d.minor):
            path = f"/dev/nvidia{d.minor}"
            bound = None if d.mig_enabled else d
            system.append(_Record(path, None, d.minor, _whole_gpu(0, path, d.minor, bound)))
        in_mig = [d for d in devices if d.mig_enabled]
        if in_mig:
            names = ", ".join(f"/dev/nvidia{d.minor} ({d.uuid})" for d in in_mig)
            problems.append(
                f"{where}: AutoDetect=nvidia ({gres.autodetect_where}) does not detect MIG"
                f' devices (gres.conf(5): "doesn\'t detect MIGs"), and {names} are in MIG'
                " mode: slurmd numbers them as whole GPUs, which are not bound; set"
                " AutoDetect=nvml"
            )
    by_minor = {r.minor: r for r in system if "," not in r.file}
    by_file = {r.file: r for r in system}
    detected = sorted(system, key=functools.cmp_to_key(_by_file))  # slurmd's matching order
    if gres.files or gres.mig:
        taken: list[_Record] = []
        for entry in gres.entries():
            record = _match(entry, by_minor, by_file, devices, stat, where, problems)
            if record is not None:
                taken.append(record)
                continue
            # A config-only GPU: slurmd keeps it, with its file and no Links.
            if isinstance(entry, GresMigFile):
                by_dev = {d.minor: d for d in devices}
                gpu = _mig_gpu(entry, by_dev, stat, True, mig_minors, where, problems)
                if mode == "nvml":
                    gpu = SlurmGpu(0, gpu.path, gpu.minor, None)  # not what slurmd has
                taken.append(_Record(entry.path, None, gpu.minor, gpu))
            else:
                minor = _minor(entry.path, stat, fallback=True)
                if minor is None:
                    problems.append(f"{where}: {entry.path}: not a device file slurm-gpu can read")
                    continue
                taken.append(_Record(entry.path, None, minor, SlurmGpu(0, entry.path, minor, None)))
        placed = list(dict.fromkeys(taken))
    elif gres.counted is not None and gres.counted != len(detected):
        outcome = (
            "slurmd takes the lowest minors first"
            if gres.counted < len(detected)
            else "slurmd cannot find them all"
        )
        problems.append(
            f"{where}: gres.conf declares {gres.counted} GPU(s) and NVML lists"
            f" {len(detected)}: {outcome}"
        )
        placed = detected[: gres.counted]
    else:
        placed = detected
    # gres_gpu.c `_merge_system_gres_conf`: by file (natural order), then by Links (none
    # last); both sorts keep ties in order.
    placed = sorted(placed, key=functools.cmp_to_key(_by_file))
    placed = sorted(placed, key=lambda r: (r.links is None, r.links or 0))
    gpus = tuple(
        SlurmGpu(i, r.gpu.path, r.gpu.minor, r.gpu.uuid, r.gpu.slot) for i, r in enumerate(placed)
    )
    return GpuOrder(rule, gpus, tuple(problems))


def _nvml_records(
    devices: Sequence[GpuDevice],
    mig_minors: MigMinors | None,
    where: str,
    problems: list[str],
) -> list[_Record] | None:
    """The records `_get_system_gpu_list_nvml()` gives, in NVML order; None: not knowable."""
    records: list[_Record] = []
    for d in sorted(devices, key=lambda d: d.nvml_index):
        whole = f"/dev/nvidia{d.minor}"
        migs: list[_Record] = []
        if d.mig_enabled and d.mig_devices and mig_minors is None:
            problems.append(
                f"{where}: GPU {whole} ({d.uuid}) is in MIG mode and mig-minors was not read"
                " ([node] mig_minors): slurm-gpu cannot tell which MIG devices slurmd"
                " detects, so no GPU of this node is numbered"
            )
            return None
        for mig in sorted(d.mig_devices, key=lambda m: m.mig_index) if d.mig_enabled else ():
            assert mig_minors is not None
            caps = mig_minors.instance_minors(d.minor, mig.gpu_instance_id, mig.compute_instance_id)
            if caps is None:
                problems.append(
                    f"{where}: MIG device {mig.uuid} (GPU {whole}, GI {mig.gpu_instance_id}"
                    f" CI {mig.compute_instance_id}) is not in {mig_minors.source}: slurmd"
                    " skips it"
                )
                continue
            path = (
                f"{whole},/dev/nvidia-caps/nvidia-cap{caps[0]},/dev/nvidia-caps/nvidia-cap{caps[1]}"
            )
            migs.append(
                _Record(path, None, d.minor, SlurmGpu(0, path, d.minor, mig.uuid, mig.slot))
            )
        if d.mig_enabled and not migs:
            problems.append(
                f"{where}: GPU {whole} ({d.uuid}) is in MIG mode without MIG devices slurmd"
                " can use: slurmd numbers it as a whole GPU, which is not bound"
            )
            records.append(
                _Record(whole, d.nvml_index, d.minor, _whole_gpu(0, whole, d.minor, None))
            )
        elif migs:
            records.extend(migs)
        else:
            records.append(_Record(whole, d.nvml_index, d.minor, _whole_gpu(0, whole, d.minor, d)))
    return records


def _match(
    entry: GresGpuFile | GresMigFile,
    by_minor: dict[int | None, _Record],
    by_file: dict[str, _Record],
    devices: Sequence[GpuDevice],
    stat: Callable[[str], os.stat_result],
    where: str,
    problems: list[str],
) -> _Record | None:
    """The detected record a gres.conf entry takes (`_match_gres`), None for config-only."""
    if isinstance(entry, GresMigFile):
        record = by_file.get(entry.path)
        if record is None:
            problems.append(
                f"{where}: gres.conf line {entry.line} MultipleFiles={entry.path} is not a MIG"
                " device slurmd detects: slurmd keeps it as a GPU nobody can read"
            )
        return record
    minor = _minor(entry.path, stat, fallback=True)
    if minor is None:
        return None
    record = by_minor.get(minor)
    if record is not None:
        return record
    device = next((d for d in devices if d.minor == minor), None)
    if device is not None and device.mig_enabled:
        problems.append(_whole_in_mig_mode(where, None, entry.path, device))
    else:
        problems.append(
            f"{where}: gres.conf lists {entry.path} (minor {minor}), which NVML does"
            " not list: slurmd keeps it as a GPU nobody can read"
        )
    return None


def _mig_gpu(
    entry: GresMigFile,
    by_minor: dict[int, GpuDevice],
    stat: Callable[[str], os.stat_result],
    fallback: bool,
    mig_minors: MigMinors | None,
    where: str,
    problems: list[str],
) -> SlurmGpu:
    """A MultipleFiles= entry bound through mig-minors to its MIG device, or unbound."""
    here = f"{where}: Slurm GPU {entry.slurm_index} (line {entry.line}) MultipleFiles={entry.path}"
    parents = [f for f in entry.files if capability_file_minor(f) is None]
    parent = _minor(parents[0], stat, fallback) if len(parents) == 1 else None
    unbound = SlurmGpu(entry.slurm_index, entry.path, parent, None)
    if len(parents) != 1:
        problems.append(f"{here}: names {len(parents)} GPU device files, not one")
        return unbound
    if mig_minors is None:
        problems.append(f"{here}: mig-minors was not read ([node] mig_minors): not bound")
        return unbound
    caps = []
    for path in entry.files:
        minor = capability_file_minor(path)
        if minor is None:
            continue
        cap = mig_minors.capability(minor)
        if cap is None:
            problems.append(f"{here}: {path} is not in {mig_minors.source}: not bound")
            return unbound
        caps.append(cap)
    instances = {(c.gpu_minor, c.gpu_instance_id) for c in caps}
    gi_caps = [c for c in caps if c.compute_instance_id is None]
    ci_caps = [c for c in caps if c.compute_instance_id is not None]
    if len(instances) != 1 or len(gi_caps) != 1 or len(ci_caps) != 1:
        problems.append(
            f"{here}: its cap files do not name one GPU instance and one of its compute"
            f" instances ({mig_minors.source}): not bound"
        )
        return unbound
    cap = ci_caps[0]
    gi, ci = cap.gpu_instance_id, cap.compute_instance_id
    if parent is None:
        problems.append(f"{here}: {parents[0]}: no such device file")
        return unbound
    if parent != cap.gpu_minor:
        problems.append(
            f"{here}: its cap files are GPU minor {cap.gpu_minor}'s, but {parents[0]} is"
            f" minor {parent}: not bound"
        )
        return unbound
    device = by_minor.get(parent)
    mig: MigDevice | None = None
    if device is None:
        problems.append(f"{here}: GPU minor {parent} is not among NVML's GPUs")
    elif not device.mig_enabled:
        problems.append(f"{here}: GPU {device.uuid} (minor {parent}) is not in MIG mode")
    else:
        mig = next(
            (
                m
                for m in device.mig_devices
                if (m.gpu_instance_id, m.compute_instance_id) == (gi, ci)
            ),
            None,
        )
        if mig is None:
            problems.append(
                f"{here}: NVML lists no MIG device GI {gi} CI {ci} on GPU {device.uuid}"
                f" (minor {parent}): not bound"
            )
    if mig is None:
        return unbound
    return SlurmGpu(entry.slurm_index, entry.path, parent, mig.uuid, mig.slot)


def _whole_gpu(index: int, path: str, minor: int | None, device: GpuDevice | None) -> SlurmGpu:
    if device is None:
        return SlurmGpu(index, path, minor, None)
    return SlurmGpu(index, path, minor, device.uuid, GpuSlot.whole(device.uuid))


def _whole_in_mig_mode(where: str, index: int | None, path: str, device: GpuDevice) -> str:
    gpu = f"Slurm GPU {index} {path}" if index is not None else f"gres.conf's {path}"
    return (
        f"{where}: {gpu} is GPU {device.uuid} (minor {device.minor}), which is in MIG mode:"
        " a whole GPU in MIG mode runs no job, so it is not bound; list its MIG devices"
        " with MultipleFiles= (or AutoDetect=nvml)"
    )


def _interleaved_type(entries: Sequence[GresGpuFile | GresMigFile]) -> str | None:
    """A Type= whose entries are not listed together (case-insensitive, as slurmd)."""
    seen: list[str] = []
    for entry in entries:
        kind = entry.gpu_type.lower()
        if seen and seen[-1] == kind:
            continue
        if kind in seen:
            return entry.gpu_type or '""'
        seen.append(kind)
    return None


def _share_capacities(
    gres: GresNode, gpus: Sequence[SlurmGpu]
) -> tuple[tuple[ShareCapacity, ...], list[str]]:
    """Each shard / mps line's Count on its GPU (module docstring, Shares)."""
    shares: list[ShareCapacity] = []
    problems: list[str] = []
    where = f"{gres.source}: {gres.node}"
    for line in gres.shares:
        if line.path is None:
            remaining, count = len(gpus), line.count
            for gpu in gpus:  # `_distribute_count`: Count/remaining to each in turn
                part = count // remaining
                shares.append(ShareCapacity(line.kind, gpu.index, gpu.uuid, part))
                count -= part
                remaining -= 1
            continue
        match = next((g for g in gpus if g.path == line.path), None)
        if match is None:
            problems.append(
                f"{where}: line {line.line} Name={line.kind} File={line.path} names no GPU"
                " slurm-gpu numbered: its shares are not recorded"
            )
            continue
        shares.append(ShareCapacity(line.kind, match.index, match.uuid, line.count))
    return tuple(shares), problems


def natural_compare(a: str, b: str) -> int:
    """strnatcmp(a, b): -1, 0 or 1 (src/common/strnatcmp.c, the order of `_sort_gpu_by_file`).

    Runs of digits compare as numbers ("nvidia2" < "nvidia10"), except where either run
    starts with 0: then digit by digit, as a fraction; white space is skipped.
    """
    x, y = a.encode() + b"\0", b.encode() + b"\0"
    i = j = 0
    while True:
        while x[i : i + 1].isspace():
            i += 1
        while y[j : j + 1].isspace():
            j += 1
        ca, cb = x[i], y[j]
        if _digit(ca) and _digit(cb):
            if ca == ord("0") or cb == ord("0"):
                result = _compare_left(x, i, y, j)
            else:
                result = _compare_right(x, i, y, j)
            if result:
                return result
        if ca == 0 and cb == 0:
            return 0
        if ca != cb:
            return -1 if ca < cb else 1
        i += 1
        j += 1


def _digit(c: int) -> bool:
    return ord("0") <= c <= ord("9")


def _compare_right(x: bytes, i: int, y: bytes, j: int) -> int:
    """Two right-aligned numbers: the longer run wins, else the first differing digit."""
    bias = 0
    while True:
        ca, cb = x[i], y[j]
        if not _digit(ca) and not _digit(cb):
            return bias
        if not _digit(ca):
            return -1
        if not _digit(cb):
            return 1
        if ca != cb and not bias:
            bias = -1 if ca < cb else 1
        i += 1
        j += 1


def _compare_left(x: bytes, i: int, y: bytes, j: int) -> int:
    """Two left-aligned numbers (a leading 0): the first differing digit wins."""
    while True:
        ca, cb = x[i], y[j]
        if not _digit(ca) and not _digit(cb):
            return 0
        if not _digit(ca):
            return -1
        if not _digit(cb):
            return 1
        if ca != cb:
            return -1 if ca < cb else 1
        i += 1
        j += 1


def _by_file(a: _Record, b: _Record) -> int:
    return natural_compare(a.file, b.file)


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
