"""gres.conf: how one node's GPUs are declared (device files, AutoDetect, flags).

Slurm numbers a node's GPUs (the numbers in SLURM_JOB_GPUS) by the order of their `File=`
entries in gres.conf, unless AutoDetect is on: then slurmd sorts them itself
(`slurm_gpu.slurm.gpu_order`). Neither is NVML's enumeration order; the device file's
minor number is what ties a Slurm index to an NVML device
(https://slurm.schedmd.com/gres.conf.html#OPT_File).

A MIG GPU is one `MultipleFiles=` line (the parent's /dev/nvidiaN and the GPU and compute
instances' /dev/nvidia-caps files): one Slurm GPU, numbered with the `File=` ones in
listing order (src/interfaces/gres.c `_foreach_fill_in_gres_devices`, 24.11 and 26.05;
22.05: src/plugins/gres/common/gres_common.c `common_node_config_load`: each File= file
and each MultipleFiles= record advance the device index by one). `Name=shard` and `Name=mps`
lines give a GPU's share capacity (`Count=` per `File=` GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from slurm_gpu.errors import ConfigError, SlurmError
from slurm_gpu.slurm.hostlist import expand

AUTODETECT_VALUES = ("full", "generic", "nrt", "nvidia", "nvml", "off", "oneapi", "rsmi")
"""gres.conf AutoDetect= values Slurm knows (gres.conf(5), 22.05 to 26.05)."""


@dataclass(frozen=True)
class GresGpuFile:
    """One GPU device file from gres.conf, at its place among the node's GPU entries.

    `slurm_index` is the Slurm GPU index when AutoDetect is off (File= files and
    MultipleFiles= lines counted together, in listing order); with AutoDetect slurmd
    re-sorts the GPUs (`slurm_gpu.slurm.gpu_order`).
    """

    slurm_index: int
    path: str
    gpu_type: str


@dataclass(frozen=True)
class GresMigFile:
    """One `Name=gpu MultipleFiles=...` line: a MIG GPU, at its place among the GPU entries.

    Attributes:
        slurm_index: its Slurm GPU index when AutoDetect is off (File= files and
            MultipleFiles= lines counted together, in listing order).
        path: the MultipleFiles= value as written: slurmd compares (AutoDetect's
            `_match_gres`) and sorts (`_sort_gpu_by_file`) this string, not the files.
        files: the files it names, in order.
        gpu_type: Type=, the MIG profile ("1g.10gb").
        line: its line number in gres.conf.
    """

    slurm_index: int
    path: str
    files: tuple[str, ...]
    gpu_type: str
    line: int


SHARE_NAMES = ("mps", "shard")
"""GRES that share a GPU: a job holds `count` of a GPU's Count= (gres.conf(5))."""


@dataclass(frozen=True)
class GresShare:
    """One `Name=shard` or `Name=mps` line: how many shares one GPU (or all) is cut into.

    `path` is its File= value as written (slurmd matches it to a GPU record's file by
    string, src/plugins/gres/common/gres_c_s.c `_merge_lists`); None where the line has
    no File=: slurmd spreads its Count over every GPU (`_distribute_count`).
    """

    kind: str
    count: int
    path: str | None
    line: int


@dataclass(frozen=True)
class GresNode:
    """What one node's gres.conf lines say about its GPUs.

    Attributes:
        node: the node's Slurm name. source: the file, for messages.
        files: the `Name=gpu File=...` device files, in the order listed.
        autodetect: the AutoDetect value for this node (a node-specific one trumps the
            global one), lower case; None when gres.conf sets none (Slurm: off).
        autodetect_where: "line N" where that value was set ("" when unset).
        counted: GPUs declared by `Name=gpu` lines without File= (their Count=, 1 when
            unset, as Slurm reads it); None when no such line names this node.
        env_uuid: some GPU line of this node has Flags=env_uuid (26.05: UUIDs in
            CUDA_VISIBLE_DEVICES).
        mig_lines: line numbers of `MultipleFiles=` (MIG) GPU lines.
        mig: those lines as MIG GPU entries, in listing order.
        shares: the node's `Name=shard` / `Name=mps` lines, in listing order.
    """

    node: str
    source: str = "gres.conf"
    files: tuple[GresGpuFile, ...] = ()
    autodetect: str | None = None
    autodetect_where: str = ""
    counted: int | None = None
    env_uuid: bool = False
    mig_lines: tuple[int, ...] = field(default=())
    mig: tuple[GresMigFile, ...] = ()
    shares: tuple[GresShare, ...] = ()

    def entries(self) -> list[GresGpuFile | GresMigFile]:
        """Every GPU entry (File= files and MultipleFiles= lines) in listing order."""
        return sorted((*self.files, *self.mig), key=lambda e: e.slurm_index)

    @classmethod
    def listing(cls, node: str, files: list[GresGpuFile]) -> GresNode:
        """A node declared by File= lines alone (no AutoDetect)."""
        return cls(node=node, files=tuple(files))


def parse_gres_node(text: str, node: str, source: str = "gres.conf") -> GresNode:
    """What gres.conf `text` says about `node`'s GPUs.

    Lines without NodeName apply to every node. GPU lines are `Name=gpu` lines; other GRES
    are ignored. A line holding only AutoDetect= (no NodeName) is the global default.

    Raises:
        ConfigError: a line is malformed, or an AutoDetect value is unknown or set twice
            differently for this node, or a GPU line has both File= and MultipleFiles=
            or a MultipleFiles= of one file (slurmd refuses both), or a share line has no
            Count= (names the file and line number).
    """
    files: list[GresGpuFile] = []
    global_autodetect: tuple[str, int] | None = None
    node_autodetect: tuple[str, int] | None = None
    counted: int | None = None
    env_uuid = False
    mig_lines: list[int] = []
    mig: list[GresMigFile] = []
    shares: list[GresShare] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}: line {number}"
        fields = _fields(line, where)
        try:
            names_node = "nodename" not in fields or node in expand(fields["nodename"])
        except SlurmError as exc:
            raise ConfigError([f"{where}: {exc}"]) from exc
        if "autodetect" in fields:
            value = fields["autodetect"].lower()
            if value not in AUTODETECT_VALUES:
                known = ", ".join(AUTODETECT_VALUES)
                given = fields["autodetect"]
                raise ConfigError([f"{where}: AutoDetect={given}: not one of {known}"])
            if "nodename" not in fields:
                global_autodetect = (value, number)
            elif names_node:
                if node_autodetect is not None and node_autodetect[0] != value:
                    raise ConfigError(
                        [
                            f"{where}: AutoDetect={value} for {node}, but line"
                            f" {node_autodetect[1]} set AutoDetect={node_autodetect[0]}"
                            " (Slurm requires one value per node)"
                        ]
                    )
                node_autodetect = (value, number)
        name = fields.get("name", "").lower()
        if names_node and name in SHARE_NAMES:
            if "count" not in fields:
                raise ConfigError([f"{where}: Name={fields['name']} without Count="])
            count = _count(fields["count"], where)
            shares.append(GresShare(name, count, fields.get("file"), number))
        if not names_node or name != "gpu":
            continue
        env_uuid = env_uuid or "env_uuid" in fields.get("flags", "").lower().split(",")
        index = len(files) + len(mig)  # File= files and MultipleFiles= lines together
        if "multiplefiles" in fields:
            # src/interfaces/gres.c `_parse_gres_config`: both is fatal, so is one file.
            if "file" in fields or "files" in fields:
                raise ConfigError([f"{where}: File= and MultipleFiles= on one line"])
            parts = tuple(_expand(fields["multiplefiles"], where))
            if len(parts) < 2:
                raise ConfigError([f"{where}: MultipleFiles= names one file: use File="])
            mig_lines.append(number)
            mig.append(
                GresMigFile(index, fields["multiplefiles"], parts, fields.get("type", ""), number)
            )
        elif "file" in fields:
            for offset, path in enumerate(_expand(fields["file"], where)):
                files.append(GresGpuFile(index + offset, path, fields.get("type", "")))
        else:
            counted = (counted or 0) + _count(fields.get("count", "1"), where)
    chosen = node_autodetect or global_autodetect
    return GresNode(
        node=node,
        source=source,
        files=tuple(files),
        autodetect=chosen[0] if chosen else None,
        autodetect_where=f"line {chosen[1]}" if chosen else "",
        counted=counted,
        env_uuid=env_uuid,
        mig_lines=tuple(mig_lines),
        mig=tuple(mig),
        shares=tuple(shares),
    )


def parse_gres_conf(text: str, node: str, source: str = "gres.conf") -> list[GresGpuFile]:
    """The GPU device files of `node`, in the order gres.conf lists them."""
    return list(parse_gres_node(text, node, source).files)


def load_gres_node(path: Path, node: str) -> GresNode:
    """parse_gres_node() on a file; a missing or unreadable file is a ConfigError."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([f"{path}: {exc.strerror or exc}"]) from exc
    return parse_gres_node(text, node, str(path))


def load_gres_conf(path: Path, node: str) -> list[GresGpuFile]:
    """The GPU device files of `node` in the file at `path` (see load_gres_node)."""
    return list(load_gres_node(path, node).files)


def _expand(text: str, where: str) -> list[str]:
    try:
        return expand(text)
    except SlurmError as exc:
        raise ConfigError([f"{where}: {exc}"]) from exc


def _fields(line: str, where: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if not sep:
            raise ConfigError([f"{where}: expected KEY=VALUE, got {token!r}"])
        fields[key.lower()] = value
    return fields


_SUFFIXES = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


def _count(text: str, where: str) -> int:
    """Count= as Slurm reads it: a number with an optional K/M/G/T/P (x1024) suffix."""
    number, multiplier = text, 1
    if text[-1:].lower() in _SUFFIXES:
        number, multiplier = text[:-1], _SUFFIXES[text[-1].lower()]
    if not number.isascii() or not number.isdigit():
        raise ConfigError([f"{where}: Count={text}: not a number"])
    return int(number) * multiplier
