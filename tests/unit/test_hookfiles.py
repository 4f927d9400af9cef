"""Reading the hooks' files (node/hookfiles.py): bad files are quarantined, never lost."""

from __future__ import annotations

import errno
import os
from collections.abc import Generator
from pathlib import Path, PosixPath
from typing import Self

import pytest

from slurm_gpu.node.hookfiles import (
    HookFileError,
    parse_binding,
    read_binding_files,
    read_bindings,
    read_events,
)


def _write(path: Path, text: str, age: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    then = path.stat().st_mtime - age
    os.utime(path, (then, then))
    return path


@pytest.mark.parametrize("field", ["job_id=²", "gpu_index=²", "job_id=" + "1" * 5000])
def test_non_ascii_or_absurd_numbers_are_hook_file_errors(tmp_path: Path, field: str) -> None:
    """'²' passes str.isdigit(); it and a 5000-digit id are HookFileErrors naming the key."""
    text = "job_id=7\ngpu_index=0\n" + field + "\nend=1\n"
    path = _write(tmp_path / "bindings" / "7.0", text, age=0)
    with pytest.raises(HookFileError, match=field.partition("=")[0] + " must be digits"):
        parse_binding(path)


def test_bad_event_file_is_quarantined_after_the_grace_period(tmp_path: Path) -> None:
    """An old event file with job_id=² moves to .quarantine/; a young one waits."""
    old = _write(tmp_path / "events" / "7.started.1", "job_id=²\nend=1\n", age=120)
    young = _write(tmp_path / "events" / "8.started.1", "job_id=²\nend=1\n", age=0)
    assert [] == read_events(tmp_path, "gpu1", grace_seconds=60)
    quarantined = tmp_path / "events" / ".quarantine" / old.name
    assert (False, True, True) == (old.exists(), quarantined.exists(), young.exists())


def test_bad_binding_file_is_quarantined_after_the_grace_period(tmp_path: Path) -> None:
    """A binding with gpu_index=² is quarantined once old, and the good one still read."""
    _write(tmp_path / "bindings" / "7.0", "job_id=7\ngpu_index=²\nend=1\n", age=120)
    _write(tmp_path / "bindings" / "8.0", "job_id=8\ngpu_index=0\nend=1\n", age=120)
    assert [8] == [b.job_id for b in read_bindings(tmp_path, grace_seconds=60)]
    assert (tmp_path / "bindings" / ".quarantine" / "7.0").exists()


class RacyDir(PosixPath):
    """A node dir whose listings also name `GONE`, a hook file removed meanwhile.

    It was there when the directory was read, then the epilog removed it before the agent
    stat'ed it.
    """

    GONE = "7.0"

    def iterdir(self) -> Generator[Self, None, None]:
        yield from super().iterdir()
        yield self / self.GONE

    def is_file(self) -> bool:
        return self.name == self.GONE or super().is_file()  # what the listing saw

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        if self.name == self.GONE:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self))
        return super().stat(follow_symlinks=follow_symlinks)


@pytest.mark.parametrize("subdir", ["bindings", "events"])
def test_file_removed_between_listing_and_reading_is_skipped(tmp_path: Path, subdir: str) -> None:
    """A hook file removed while the agent lists its directory is skipped.

    The epilog removes a job's bindings at any moment; the other files are still read and
    nothing raises out of the agent's tick.
    """
    _write(tmp_path / "bindings" / "8.0", "job_id=8\ngpu_index=0\nend=1\n", age=0)
    _write(tmp_path / "events" / "8.started.1", "job_id=8\ngpu_indices=0\nend=1\n", age=0)
    node_dir = RacyDir(tmp_path)

    if subdir == "bindings":
        found = [b.job_id for b in read_bindings(node_dir)]
    else:
        found = [e.event.job_id for e in read_events(node_dir, "gpu1")]

    assert [8] == found


def test_restart_count_is_read_from_events_and_bindings(tmp_path: Path) -> None:
    """`restart=2` (SLURM_RESTART_COUNT) is the run; a file without it is run 0."""
    _write(tmp_path / "events" / "7.started.1", "job_id=7\nrestart=2\nend=1\n", age=0)
    _write(tmp_path / "events" / "8.started.1", "job_id=8\nend=1\n", age=0)
    _write(tmp_path / "bindings" / "7.0", "job_id=7\ngpu_index=0\nrestart=2\nend=1\n", age=0)
    events = {e.event.job_id: e.event for e in read_events(tmp_path, "gpu1")}
    (binding,) = read_bindings(tmp_path)
    assert (2, 0, 2) == (events[7].restart, events[8].restart, binding.restart)
    assert ("gpu1:7:started:2", "gpu1:8:started") == (events[7].key, events[8].key)


def test_mig_uuids_are_read_as_slurmd_names_mig_slots(tmp_path: Path) -> None:
    """slurmd always names a MIG slot by its MIG UUID in CUDA_VISIBLE_DEVICES (issue 14)."""
    mig = "MIG-5c1f0e8a-1b2c-4d3e-8f90-0123456789ab"
    _write(
        tmp_path / "events" / "7.started.1", f"job_id=7\ngpu_indices=4\ngpu_uuids={mig}\nend=1\n", 0
    )
    _write(tmp_path / "bindings" / "7.4", f"job_id=7\ngpu_index=4\ngpu_uuid={mig}\nend=1\n", 0)
    (event,) = read_events(tmp_path, "gpu1")
    (binding,) = read_binding_files(tmp_path)
    assert (event.gpu_uuids, binding.gpu_uuid, binding.binding.slurm_index) == ((mig,), mig, 4)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("shards=4\nshard_kind=shard\n", (4, "shard")),
        ("shards=25\nshard_kind=mps\n", (25, "mps")),
        ("shards=2\n", (2, "shard")),  # a count without a kind is gres/shard
        ("shards=0\nshard_kind=mps\n", (0, "")),
        ("", (0, "")),  # hooks before shares
    ],
)
def test_shares_are_read_from_bindings(
    tmp_path: Path, lines: str, expected: tuple[int, str]
) -> None:
    path = _write(tmp_path / "bindings" / "7.0", f"job_id=7\ngpu_index=0\n{lines}end=1\n", 0)
    binding = parse_binding(path)
    assert (binding.shards, binding.shard_kind) == expected


@pytest.mark.parametrize("line", ["shard_kind=gpu", "shards=x"])
def test_bad_share_lines_are_hook_file_errors(tmp_path: Path, line: str) -> None:
    path = _write(
        tmp_path / "bindings" / "7.0", f"job_id=7\ngpu_index=0\nshards=2\n{line}\nend=1\n", 0
    )
    with pytest.raises(HookFileError, match=line.partition("=")[0]):
        parse_binding(path)
