"""Reading the hooks' files (node/hookfiles.py): bad files are quarantined, never lost."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu.node.hookfiles import HookFileError, parse_binding, read_bindings, read_events


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
