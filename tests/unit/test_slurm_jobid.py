"""Slurm's job-id forms (slurm/jobid.py): plain, array task, pending tasks, het, steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu.slurm.jobid import JobId, parse_job_id
from slurm_gpu.slurm.sacct import split_records

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"


def test_every_job_id_of_a_captured_sacct_with_a_het_job() -> None:
    """sacct's JobID column with array tasks and het components (273+0) all parse.

    `int()` of the JobID text (what the credentials test read) fails on `273+0`.
    """
    rows = split_records((DATA / "sacct-22.05-x1f.txt").read_text(encoding="utf-8"))
    ids = {parse_job_id(row["JobID"]) for row in rows}
    assert {JobId(273, het_offset=0), JobId(273, het_offset=1), JobId(272, 3)} <= ids


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123", JobId(123)),
        ("123_4", JobId(123, array_task_id=4)),
        ("123_[1-5%2]", JobId(123, array_tasks="[1-5%2]")),
        ("8+0", JobId(8, het_offset=0)),
        ("123.batch", JobId(123, step="batch")),
        ("123_4.0", JobId(123, array_task_id=4, step="0")),
        ("8+1.extern", JobId(8, het_offset=1, step="extern")),
    ],
)
def test_job_id_forms(text: str, expected: JobId) -> None:
    """Each form Slurm prints is taken apart, and prints back as it came."""
    assert (expected, text) == (parse_job_id(text), str(parse_job_id(text)))


@pytest.mark.parametrize("text", ["", "abc", "12+", "12_", "²", "1" * 11, "4294967296", "1 2"])
def test_other_text_is_no_job_id(text: str) -> None:
    """Garbage, unicode digits and ids beyond Slurm's 32 bits raise ValueError."""
    with pytest.raises(ValueError, match="job id"):
        parse_job_id(text)
