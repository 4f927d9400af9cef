"""Reading what the prolog/epilog hooks wrote under <state_dir>/<node>/.

The hooks (POSIX sh, hooks/) write each `key=value` file in place with one write(2), its
last line `end=1`; there is no rename. A file without `end=1` is still being written (or
was left by a crash or a full disk) and is skipped until it is complete. The time of an
event or binding is its file's mtime (the hooks run no `date`). A file that still cannot
be parsed after the grace period is moved to `.quarantine/`, never deleted, so no event
is lost and a bad file does not block the ones behind it; a file removed while it is
being read (the epilog drops a job's bindings at any moment) is skipped.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_gpu.errors import brief
from slurm_gpu.models import Binding, JobEvent, JobEventKind

log = logging.getLogger(__name__)

# nvidia-smi -L's form of a GPU UUID, the one hooks/slurm-gpu-hooks.sh (gpu_uuid) keeps,
# and of a MIG device's (R470+: "MIG-" and the same digits), which slurmd always puts in
# CUDA_VISIBLE_DEVICES for a MIG slot (gpu_nvml.c _handle_mig sets GRES_CONF_UUID)
_GPU_UUID = re.compile(
    r"(?:GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
# gres/shard or gres/mps: what the hooks' `shard_kind=` may say (issue 14)
_SHARD_KINDS = ("shard", "mps")
# Slurm's SLUID: "s" and 13 characters of Crockford's base 32 (src/common/sluid.c,
# print_sluid); the hooks keep [A-Za-z0-9._@-] only, so anything else is damage.
_SLUID = re.compile(r"s[0-9A-HJKMNP-TV-Z]{13}")


class HookFileError(ValueError):
    """A hook file is incomplete or malformed."""


@dataclass(frozen=True)
class EventFile:
    """An event read from disk, with the path to remove once it is safely spooled.

    `gpu_uuids`: the GPUs' UUIDs where slurmd named them so (gres.conf Flags=env_uuid,
    CUDA_VISIBLE_DEVICES), in the order of `event.gpu_indices`, or alone when the hook
    had no SLURM_JOB_GPUS (then `event.gpu_indices` is empty); () otherwise.
    """

    path: Path
    event: JobEvent
    gpu_uuids: tuple[str, ...] = ()


# A binding the prolog named by its GPU's UUID alone (no SLURM_JOB_GPUS): the agent finds
# its Slurm index from the UUID before using it.
UNKNOWN_INDEX = -1


@dataclass(frozen=True)
class BindingFile:
    """A binding read from disk with what the models' Binding does not carry.

    `gpu_uuid`: the GPU's UUID as slurmd named it (Flags=env_uuid), else "". A binding
    with `binding.slurm_index == UNKNOWN_INDEX` has only the UUID. `sluid`: the job's
    SLUID (Slurm 25.11+), else "".
    """

    binding: Binding
    gpu_uuid: str = ""
    sluid: str = ""


def parse_fields(text: str, where: str) -> dict[str, str]:
    """`key=value` lines -> dict; the file must end with the `end=1` completeness line."""
    fields: dict[str, str] = {}
    lines = text.splitlines()
    if not lines or lines[-1].strip() != "end=1":
        raise HookFileError(f"{where}: incomplete (no end=1 line)")
    for number, line in enumerate(lines[:-1], start=1):
        key, sep, value = line.partition("=")
        if not sep or not key:
            raise HookFileError(f"{where}: line {number}: expected key=value, got {line!r}")
        fields[key.strip()] = value.strip()
    return fields


def _is_number(text: str) -> bool:
    # ASCII digits only: str.isdigit() also accepts '²', which int() then refuses.
    # At most 18 of them: no hook value (job id, uid, index, exit code) is longer,
    # and int() refuses more than 4300.
    return 0 < len(text) <= 18 and text.isascii() and text.isdigit()


def _int(fields: dict[str, str], key: str, where: str, required: bool = False) -> int | None:
    value = fields.get(key, "")
    if value == "":
        if required:
            raise HookFileError(f"{where}: {key} is missing")
        return None
    if not _is_number(value):
        raise HookFileError(f"{where}: {key} must be digits, got {brief(value)}")
    return int(value)


def _indices(text: str, where: str) -> tuple[int, ...]:
    parts = [p for p in text.split(",") if p]
    if not all(_is_number(p) for p in parts):
        raise HookFileError(f"{where}: gpu_indices must be digits, got {brief(text)}")
    return tuple(int(p) for p in parts)


def _uuid(text: str, where: str, key: str) -> str:
    """A GPU or MIG UUID as nvidia-smi -L prints it (GPU-/MIG-8-4-4-4-12 hex), else an error."""
    if not _GPU_UUID.fullmatch(text):
        raise HookFileError(
            f"{where}: {key} must be GPU or MIG UUIDs (GPU-xxxxxxxx-..., MIG-xxxxxxxx-...),"
            f" got {brief(text)}"
        )
    return text


def _shards(fields: dict[str, str], where: str) -> tuple[int, str]:
    """(shards, shard_kind): the gres/shard or gres/mps units the job holds (0, "": none).

    The hooks write `shards=N` and `shard_kind=shard|mps` (issue 14); a count without a
    kind is gres/shard, a kind other than those two is damage.
    """
    shards = _int(fields, "shards", where) or 0
    kind = fields.get("shard_kind", "")
    if kind and kind not in _SHARD_KINDS:
        raise HookFileError(f"{where}: shard_kind must be shard or mps, got {brief(kind)}")
    if not shards:
        return 0, ""
    return shards, kind or "shard"


def _uuids(text: str, where: str) -> tuple[str, ...]:
    return tuple(_uuid(p, where, "gpu_uuids") for p in text.split(",") if p)


def _sluid(fields: dict[str, str], where: str) -> str:
    value = fields.get("sluid", "")
    if value and not _SLUID.fullmatch(value):
        raise HookFileError(f"{where}: sluid must be a Slurm SLUID (s + 13), got {brief(value)}")
    return value


def parse_event(path: Path, node: str) -> JobEvent:
    """One `events/<jobid>.<started|ended>.<pid>` file -> JobEvent (time = mtime)."""
    return parse_event_file(path, node).event


def parse_event_file(path: Path, node: str) -> EventFile:
    """One event file -> its event and the GPUs' UUIDs it names (EventFile)."""
    where = str(path)
    fields = parse_fields(path.read_text(errors="replace"), where)
    kind_text = path.name.split(".")[1] if path.name.count(".") >= 2 else ""
    try:
        kind = JobEventKind(kind_text)
    except ValueError as exc:
        raise HookFileError(f"{where}: unknown event kind {kind_text!r}") from exc
    job_id = _int(fields, "job_id", where, required=True)
    assert job_id is not None
    shards, shard_kind = _shards(fields, where)
    indices = _indices(fields.get("gpu_indices", ""), where)
    uuids = _uuids(fields.get("gpu_uuids", ""), where)
    if indices and uuids and len(indices) != len(uuids):
        raise HookFileError(f"{where}: {len(uuids)} gpu_uuids for {len(indices)} gpu_indices")
    event = JobEvent(
        node=node,
        job_id=job_id,
        kind=kind,
        time=path.stat().st_mtime,
        user=fields.get("user", ""),
        uid=_int(fields, "uid", where),
        account=fields.get("account", ""),
        partition=fields.get("partition", ""),
        gpu_indices=indices,
        exit_code=_int(fields, "exit_code", where),
        restart=_int(fields, "restart", where) or 0,
        sluid=_sluid(fields, where),
        array_job_id=_int(fields, "array_job_id", where),
        array_task_id=_int(fields, "array_task_id", where),
        het_job_id=_int(fields, "het_job_id", where),
        het_job_offset=_int(fields, "het_job_offset", where),
        shards=shards,
        shard_kind=shard_kind,
    )
    return EventFile(path, event, uuids)


def parse_binding(path: Path) -> Binding:
    """One `bindings/<jobid>.<index>` file -> Binding (start = mtime)."""
    return parse_binding_file(path).binding


def parse_binding_file(path: Path) -> BindingFile:
    """One `bindings/<jobid>.<index|uuid>` file -> BindingFile (start = mtime).

    A file has gpu_index, gpu_uuid or both (gres.conf Flags=env_uuid); one with neither
    is malformed.
    """
    where = str(path)
    fields = parse_fields(path.read_text(errors="replace"), where)
    job_id = _int(fields, "job_id", where, required=True)
    uuid = _uuid(fields["gpu_uuid"], where, "gpu_uuid") if fields.get("gpu_uuid") else ""
    index = _int(fields, "gpu_index", where, required=not uuid)
    assert job_id is not None
    shards, shard_kind = _shards(fields, where)
    binding = Binding(
        job_id=job_id,
        slurm_index=UNKNOWN_INDEX if index is None else index,
        start=path.stat().st_mtime,
        user=fields.get("user", ""),
        uid=_int(fields, "uid", where),
        account=fields.get("account", ""),
        partition=fields.get("partition", ""),
        restart=_int(fields, "restart", where) or 0,
        het_job_id=_int(fields, "het_job_id", where),
        het_job_offset=_int(fields, "het_job_offset", where),
        shards=shards,
        shard_kind=shard_kind,
    )
    return BindingFile(binding, uuid, _sluid(fields, where))


def _visible(directory: Path) -> list[Path]:
    """The hook files in `directory`, oldest first (mtime, then name).

    A file removed between the listing and its stat (the epilog drops a job's bindings at
    any moment) is skipped, as prometheus client_python's multiprocess reader skips the
    files that vanish under it: the agent must not lose its tick to that race.
    """
    try:
        listed = list(directory.iterdir())
    except FileNotFoundError:
        return []
    found: list[tuple[float, str, Path]] = []
    for path in listed:
        if path.name.startswith("."):
            continue
        try:
            info = path.stat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode):
            found.append((info.st_mtime, path.name, path))
    return [path for _mtime, _name, path in sorted(found)]


def quarantine(path: Path, reason: str) -> None:
    """Moves a bad hook file aside (kept for the admin) and logs why."""
    target_dir = path.parent / ".quarantine"
    target_dir.mkdir(exist_ok=True)
    os.replace(path, target_dir / path.name)
    log.error("hook file quarantined in %s: %s", target_dir, reason)


def read_events(node_dir: Path, node: str, grace_seconds: float = 60.0) -> list[EventFile]:
    """New hook events, oldest first. Bad files older than `grace_seconds` are quarantined."""
    found: list[EventFile] = []
    for path in _visible(node_dir / "events"):
        try:
            found.append(parse_event_file(path, node))
        except (HookFileError, OSError) as exc:
            _handle_bad(path, exc, grace_seconds)
    return found


def read_bindings(node_dir: Path, grace_seconds: float = 60.0) -> list[Binding]:
    """The GPUs currently bound to jobs on this node, as the prolog left them."""
    return [b.binding for b in read_binding_files(node_dir, grace_seconds)]


def read_binding_files(node_dir: Path, grace_seconds: float = 60.0) -> list[BindingFile]:
    """The bindings with their GPU UUIDs and SLUIDs (BindingFile), oldest first."""
    found: list[BindingFile] = []
    for path in _visible(node_dir / "bindings"):
        try:
            found.append(parse_binding_file(path))
        except (HookFileError, OSError) as exc:
            _handle_bad(path, exc, grace_seconds)
    return found


def drop_bindings(node_dir: Path, job_id: int) -> None:
    """Removes `bindings/<job_id>.*`, as the epilog does (a job that ended without one)."""
    for path in (node_dir / "bindings").glob(f"{int(job_id)}.*"):
        path.unlink(missing_ok=True)


def _handle_bad(path: Path, exc: Exception, grace_seconds: float) -> None:
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return  # removed meanwhile (the epilog ran): nothing to keep
    if age >= grace_seconds:
        quarantine(path, str(exc))
