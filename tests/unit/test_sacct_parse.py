"""Parsing `sacct -P -X --noconvert --delimiter=0x1F` (slurm/sacct.py) on captured output."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from slurm_gpu.errors import SlurmError
from slurm_gpu.slurm.sacct import (
    DELIMITER,
    FIELDS,
    parse_sacct,
    sacct_argv,
    split_records,
    state_name,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"
UTC = dt.UTC


def captured() -> dict[int, object]:
    text = (DATA / "sacct-22.05-x1f.txt").read_text(encoding="utf-8")
    return {job.job_id: job for job in parse_sacct(text, tz=UTC)}


def test_odd_job_name_survives_whole() -> None:
    """A name with HTML, unicode and '|' is read back byte for byte (JobName is last)."""
    jobs = parse_sacct((DATA / "sacct-22.05-x1f.txt").read_text(encoding="utf-8"), tz=UTC)
    names = {j.job_id: j.name for j in jobs}
    assert "<script>alert(1)</script> ü|x" == names[281]


def test_newline_in_job_name_continues_the_record() -> None:
    """A job name holding a newline spans two lines; it stays one record."""
    jobs = parse_sacct((DATA / "sacct-22.05-x1f.txt").read_text(encoding="utf-8"), tz=UTC)
    assert "two\nlines" == next(j.name for j in jobs if j.job_id == 282)
    assert 12 == len(jobs)


def test_times_gpus_and_state() -> None:
    """Submit/Start/End, Elapsed, Timelimit, GPUs by type, first word of the state."""
    jobs = {j.job_id: j for j in parse_sacct((DATA / "sacct-22.05-x1f.txt").read_text(), tz=UTC)}
    job = jobs[282]
    expected_start = dt.datetime(2026, 11, 29, 19, 40, 37, tzinfo=UTC).timestamp()
    assert expected_start == job.start_time
    assert 86.0 == job.queue_wait_seconds
    assert 600.0 == job.time_limit_seconds
    assert 3.0 == job.elapsed_seconds
    assert ("gpu1",) == job.nodes
    assert "CANCELLED" == jobs[276].state
    assert 0 == jobs[276].alloc_gpus
    assert (("a100", 1), ("h100", 1)) == jobs[275].gpu_types
    assert ("gpu1", "gpu2") == jobs[275].nodes
    assert 2 == jobs[275].alloc_gpus
    assert jobs[270].time_limit_seconds is None  # UNLIMITED


def test_array_and_het_ids() -> None:
    """job_id is JobIDRaw (what the prolog sees); JobID keeps sacct's text."""
    jobs = {j.job_id: j for j in parse_sacct((DATA / "sacct-22.05-x1f.txt").read_text(), tz=UTC)}
    assert "272_3" == jobs[272].job_id_text
    assert "273+1" == jobs[274].job_id_text


def test_pending_job() -> None:
    """Unknown start/end and 'None assigned' nodes are None and ()."""
    header = DELIMITER.join(FIELDS)
    line = DELIMITER.join(
        [
            "9",
            "9",
            "bob",
            "bio",
            "gpu",
            "normal",
            "PENDING",
            "2026-11-29T19:39:11",
            "Unknown",
            "Unknown",
            "00:00:00",
            "Partition_Limit",
            "None assigned",
            "",
            "0:0",
            "00:00:00",
            "x",
        ]
    )
    (job,) = parse_sacct(f"{header}\n{line}\n", tz=UTC)
    assert (None, None, (), None) == (
        job.start_time,
        job.end_time,
        job.nodes,
        job.queue_wait_seconds,
    )


def test_garbage_is_an_error() -> None:
    """A line that belongs to no record is a SlurmError, not a silent skip."""
    with pytest.raises(SlurmError, match="not a job record"):
        split_records("sacct: error: something\n")


def test_bad_time_names_the_job() -> None:
    """A time sacct printed in another format (SLURM_TIME_FORMAT) names job and cause."""
    line = DELIMITER.join(
        [
            "9",
            "9",
            "bob",
            "bio",
            "gpu",
            "normal",
            "RUNNING",
            "Sun 19:39",
            "Unknown",
            "Unknown",
            "00:00:00",
            "UNLIMITED",
            "gpu1",
            "",
            "0:0",
            "00:00:00",
            "x",
        ]
    )
    with pytest.raises(SlurmError, match="job 9: unexpected time 'Sun 19:39'"):
        parse_sacct(line + "\n")


def test_argv() -> None:
    """Filters become sacct's own flags; times are local ISO, JobName comes last."""
    argv = sacct_argv(
        start=dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp(),
        end=dt.datetime(2026, 12, 1, tzinfo=UTC).timestamp(),
        users=("alice",),
        jobs=("12", "13_1"),
        states=("COMPLETED",),
        tz=UTC,
    )
    assert argv[:5] == ["sacct", "-P", "-X", "--noconvert", f"--delimiter={DELIMITER}"]
    assert argv[6].endswith(",JobName")
    assert "-a" not in argv
    assert ["-S", "2026-11-01T00:00:00", "-E", "2026-12-01T00:00:00"] == argv[7:11]
    assert ["-u", "alice", "-j", "12,13_1", "-s", "COMPLETED"] == argv[11:]


@pytest.mark.parametrize(
    ("given", "expected"),
    [("cd", "COMPLETED"), ("OOM", "OUT_OF_MEMORY"), ("to", "TIMEOUT"), ("running", "RUNNING")],
)
def test_state_name_takes_sacct_short_codes(given: str, expected: str) -> None:
    """`-s cd` means COMPLETED, as for sacct; a full name is only upper-cased."""
    assert expected == state_name(given)


def test_state_text_keeps_who_cancelled() -> None:
    """`CANCELLED by 0`: `state` is the name (filters), `state_text` Slurm's words (views).

    The store keeps Slurm's words too, so a report from the store alone says the same.
    """
    jobs = {j.job_id: j for j in parse_sacct((DATA / "sacct-22.05-x1f.txt").read_text(), tz=UTC)}
    cancelled, completed = jobs[276], jobs[270]
    assert ("CANCELLED", "CANCELLED by 0") == (cancelled.state, cancelled.state_text)
    assert ("COMPLETED", "COMPLETED") == (completed.state, completed.state_text)
    assert "CANCELLED by 0" == cancelled.store_row()["state"]
