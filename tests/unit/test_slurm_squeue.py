"""squeue parsers on real Slurm 22.05 output (tests/data/slurm) and handmade variants.

The 22.05 captures were taken at one moment with: a job array (--array=0-3, two tasks
running, 2-3 pending), a heterogeneous job (273+0, 273+1), a two-node job, a job without
GPUs, a job pending on --begin, jobs with odd names (HTML, unicode, `|`, a newline).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from slurm_gpu.models import SlurmJob
from slurm_gpu.slurm import squeue

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
UTC = dt.UTC


def _json(name: str = "squeue-22.05.json", **kwargs: object) -> squeue.SqueueResult:
    return squeue.parse_squeue_json((DATA / name).read_text(), **kwargs)  # type: ignore[arg-type]


def _format(name: str = "squeue-22.05-format.txt", **kwargs: object) -> squeue.SqueueResult:
    text = (DATA / name).read_text()
    return squeue.parse_squeue_format(text, tz=UTC, **kwargs)  # type: ignore[arg-type]


def _by_id(result: squeue.SqueueResult) -> dict[int, SlurmJob]:
    return {job.job_id: job for job in result.jobs}


def test_json_running_array_task() -> None:
    """An array task has its own job id, the array's id and its task index."""
    expected = SlurmJob(
        job_id=279,
        user="alice",
        account="physics",
        partition="gpu",
        state="RUNNING",
        name="arr",
        qos="normal",
        submit_time=1795981116.0,
        start_time=1795981132.0,
        time_limit_seconds=300.0,
        nodes=("gpu1",),
        gpu_count=1,
        array_job_id=272,
        array_task_id=0,
    )
    assert expected == _by_id(_json())[279]


def test_json_pending_array_tasks_are_one_record() -> None:
    """The pending tasks 2-3 are one record, with no task id and no start time."""
    job = _by_id(_json())[272]
    assert ("PENDING", 272, None, None, 1) == (
        job.state,
        job.array_job_id,
        job.array_task_id,
        job.start_time,
        job.gpu_count,
    )


def test_json_array_targets_name_the_task() -> None:
    """scancel targets: a task as 272_0, pending tasks as 272_[2-3], others by id."""
    targets = _json().targets
    assert ("272_0", "272_1", "272_[2-3]", "275") == (
        targets[279],
        targets[280],
        targets[272],
        targets[275],
    )


def test_json_heterogeneous_components() -> None:
    """Each component of a heterogeneous job is a job with the leader's id and an offset."""
    jobs = _by_id(_json())
    expected = [(273, 0, ("gpu1",), 1), (273, 1, ("gpu2",), 2)]
    actual = [
        (j.het_job_id, j.het_job_offset, j.nodes, j.gpu_count) for j in (jobs[273], jobs[274])
    ]
    assert expected == actual


def test_json_multi_node_job() -> None:
    """A two-node job lists both nodes and counts the GPUs of both."""
    job = _by_id(_json())[275]
    assert (("gpu1", "gpu2"), 2) == (job.nodes, job.gpu_count)


def test_json_job_without_gpus() -> None:
    """A job that asked for no GPU has gpu_count 0."""
    assert 0 == _by_id(_json())[276].gpu_count


def test_json_pending_job_counts_requested_gpus() -> None:
    """A pending job's gpu_count is what it asked for (tres_req_str)."""
    job = _by_id(_json())[277]
    assert ("PENDING", (), 2, None) == (job.state, job.nodes, job.gpu_count, job.start_time)


def test_json_odd_names_are_kept_verbatim() -> None:
    """Names with HTML, unicode, `|` and a newline come through unchanged."""
    jobs = _by_id(_json())
    assert ["<script>alert(1)</script> ünï|x", "two\nlines"] == [jobs[278].name, jobs[282].name]


def test_json_comment_is_read() -> None:
    """The user's Comment is read; an empty AdminComment is ""."""
    job = _by_id(_json())[278]
    assert ("user comment with spaces", "") == (job.comment, job.admin_comment)


def test_json_unlimited_time_limit_is_none() -> None:
    """A job without a time limit (INFINITE in --json) has time_limit_seconds None."""
    assert None is _by_id(_json())[281].time_limit_seconds


def test_json_filters_states() -> None:
    """Only jobs in the requested states are returned (22.05 ignores squeue -t)."""
    assert {273, 274, 275, 278, 279, 280} == set(_by_id(_json(states=["RUNNING"])))


def test_json_real_capture_has_no_problems() -> None:
    """Every record of the real capture parses."""
    assert [] == _json().problems


def test_format_output_equals_json_output() -> None:
    """The -O fallback and --json, captured at the same moment, give the same jobs."""

    def by_id(job: SlurmJob) -> int:
        return job.job_id

    assert sorted(_json().jobs, key=by_id) == sorted(_format().jobs, key=by_id)


def test_format_targets_equal_json_targets() -> None:
    """The -O fallback names array tasks for scancel the same way as --json."""
    assert _json().targets == _format().targets


def test_format_argv_uses_separators_and_no_truncation() -> None:
    """Every field is :0 (no truncation), 0x1F-separated, the name last and 0x1E-ended."""
    argv = squeue.format_argv(["RUNNING"])
    spec = argv[-1]
    assert (["squeue", "-h", "-t", "RUNNING", "-O"], True, True) == (
        argv[:5],
        spec.endswith("Name:0\x1e"),
        spec.count(":0\x1f") == len(squeue.FORMAT_FIELDS) - 1,
    )


def test_json_23_11_wrapped_numbers_and_state_lists() -> None:
    """v0.0.40 output ({"set","number"} numbers, job_state lists) parses like 22.05's."""
    newer = _by_id(_json("handmade/squeue-23.11-like.json"))
    older = _by_id(_json())
    expected = [older[274], older[275], older[276]]
    assert expected == [newer[274], newer[275], newer[276]]


def test_json_23_11_infinite_time_limit() -> None:
    """{"infinite": true} time limit is None."""
    assert None is _by_id(_json("handmade/squeue-23.11-like.json"))[272].time_limit_seconds


def test_json_malformed_records_are_skipped() -> None:
    """Records without id, state or user, or with a bad node list or time, are skipped."""
    assert [279, 903] == [job.job_id for job in _json("handmade/squeue-malformed.json").jobs]


def test_json_malformed_records_are_reported() -> None:
    """Each skipped record and the unknown state yield one problem line naming the job."""
    problems = _json("handmade/squeue-malformed.json").problems
    expected = ["record #1", "record #2", *(f"job {n}" for n in range(901, 906))]
    assert expected == [next((t for t in expected if t in p), p) for p in problems]


def test_json_unknown_state_is_kept_as_printed() -> None:
    """A state this code does not know is kept verbatim, not mapped to another."""
    assert "SOMETHING_NEW" == _by_id(_json("handmade/squeue-malformed.json"))[903].state


def test_json_garbage_raises() -> None:
    """Output that is not JSON at all raises SlurmError naming squeue --json."""
    from slurm_gpu.errors import SlurmError

    with pytest.raises(SlurmError, match="squeue --json"):
        squeue.parse_squeue_json("slurm_load_jobs error: Unable to contact slurm controller")


def test_format_21_08_tres_per_node_without_prefix() -> None:
    """21.08's tres-per-node "gpu:1" is read like 22.05's "gres:gpu:1"."""
    jobs = _by_id(_format("handmade/squeue-21.08-like-format.txt"))
    assert (2, 1, 1) == (jobs[275].gpu_count, jobs[273].gpu_count, jobs[272].gpu_count)


def test_format_malformed_records_are_skipped_and_reported() -> None:
    """A bad JobID and a short record are skipped; each gets a problem line."""
    result = _format("handmade/squeue-21.08-like-format.txt")
    expected = ([275, 273, 272, 277, 278], 3)
    assert expected == ([j.job_id for j in result.jobs], len(result.problems))


def test_format_record_separator_inside_a_name() -> None:
    """A name holding the record separator is rebuilt, not cut."""
    jobs = _by_id(_format("handmade/squeue-21.08-like-format.txt"))
    assert "evil\x1ename" == jobs[278].name


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-29T19:12:05", 1795979525.0),
        ("Unknown", None),
        ("None", None),
        ("N/A", None),
        ("", None),
        (1795979525, 1795979525.0),
        ("1795979525", 1795979525.0),
        (0, None),
        ({"set": True, "infinite": False, "number": 1795979525}, 1795979525.0),
        ({"set": False, "infinite": False, "number": 0}, None),
    ],
)
def test_parse_slurm_time(value: object, expected: float | None) -> None:
    """Slurm's time forms (ISO local text, Unknown/None, epochs, wrapped) to POSIX seconds."""
    assert expected == squeue.parse_slurm_time(value, UTC)


def test_parse_slurm_time_rejects_other_text() -> None:
    """A time in another format (SLURM_TIME_FORMAT set) raises ValueError, not a guess."""
    with pytest.raises(ValueError, match="SLURM_TIME_FORMAT"):
        squeue.parse_slurm_time("Nov 29 19:12")


@pytest.mark.parametrize(
    ("value", "minutes", "expected"),
    [
        ("UNLIMITED", False, None),
        ("NOT_SET", False, None),
        ("1-02:03:04", False, 93784.0),
        ("30:00", False, 1800.0),
        ("02:00:00", False, 7200.0),
        (30, True, 1800.0),
        (4294967295, True, None),
        ({"set": True, "infinite": False, "number": 30}, True, 1800.0),
        ({"set": True, "infinite": True, "number": 0}, True, None),
    ],
)
def test_parse_time_limit(value: object, minutes: bool, expected: float | None) -> None:
    """Time limits as squeue prints them and as --json gives them (minutes) to seconds."""
    assert expected == squeue.parse_time_limit(value, minutes=minutes)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:2", 2),
        ("gres:gpu:a100:2", 2),
        ("gres/gpu:2", 2),
        ("gres/gpu=3", 3),
        ("gres:gpu", 1),
        ("gres:mps:100", None),
        ("N/A", None),
        ("", None),
        ("gres:gpu:a100:1,gres:gpu:v100:2", 3),
    ],
)
def test_gpus_from_tres_per(text: str, expected: int | None) -> None:
    """tres-per-node/-job in the forms of 21.08, 22.05 and 23.02+."""
    assert expected == squeue.gpus_from_tres_per(text)


def test_gpus_from_tres_prefers_the_total() -> None:
    """`gres/gpu=N` is the total; typed entries only count when it is missing."""
    assert (2, 3, None) == (
        squeue.gpus_from_tres("cpu=2,gres/gpu=2,gres/gpu:a100=1,gres/gpu:h100=1"),
        squeue.gpus_from_tres("cpu=2,gres/gpu:a100=1,gres/gpu:h100=2"),
        squeue.gpus_from_tres("cpu=1,mem=4000M,node=1,billing=1"),
    )


@pytest.mark.parametrize(
    "record",
    [
        '{"job_id": Infinity, "job_state": "RUNNING", "user_name": "alice"}',
        '{"job_id": 5, "array_job_id": 1e999, "job_state": "RUNNING", "user_name": "alice"}',
        '{"job_id": 1' + "0" * 400 + ', "job_state": "RUNNING", "user_name": "alice"}',
    ],
)
def test_json_non_finite_numbers_are_malformed_records(record: str) -> None:
    """Infinity, 1e999 and integers beyond a float: the record is skipped and reported."""
    result = squeue.parse_squeue_json('{"jobs": [' + record + "]}")
    assert ([], 1) == (result.jobs, len(result.problems))
    assert result.problems[0].endswith("; skipped")


def test_running_owners_from_the_capture() -> None:
    """`squeue -h -t R,CG -o %A|%u|%a` on the test bed: job 1 is alice's in physics."""
    text = (DATA / "squeue-owners-22.05.txt").read_text()
    assert ({1: squeue.JobOwner("alice", "physics")}, []) == squeue.parse_running_owners(text)


def test_running_owners_reports_lines_it_cannot_read() -> None:
    """A line without three fields or with a non-numeric id is skipped and described."""
    owners, problems = squeue.parse_running_owners("7|alice|physics\n²|bob|bio\nnoise\n\n")
    assert ({7: squeue.JobOwner("alice", "physics")}, 2) == (owners, len(problems))
    assert problems[0].startswith("squeue -o %A|%u|%a: line 2: unparsable")


@pytest.mark.parametrize("wrapped", [False, True])
def test_json_suspension_times_give_the_suspended_seconds(wrapped: bool) -> None:
    """suspend_time (last suspend or resume) and pre_sus_time, as 22.05 and v0.0.40 print.

    Started at 1000, ran 50 s, suspended at 1050: at 1170 it has been suspended 120 s; once
    resumed at 1170 it keeps those 120 s and its idle clock starts again at 1170.
    """

    def number(n: int) -> object:
        return {"set": True, "infinite": False, "number": n} if wrapped else n

    record = json.loads((DATA / "squeue-22.05.json").read_text())["jobs"][0]
    record.update(job_state="SUSPENDED", start_time=number(1000), suspend_time=number(1050))
    record.update(pre_sus_time=number(50))
    [suspended] = squeue.parse_squeue_json(json.dumps({"jobs": [record]})).jobs
    assert (1050.0, 50.0, None) == (
        suspended.suspend_time,
        suspended.pre_suspend_seconds,
        suspended.resumed_at(),
    )
    assert 120.0 == suspended.suspended_seconds(1170.0)
    record.update(job_state="RUNNING", suspend_time=number(1170))
    [resumed] = squeue.parse_squeue_json(json.dumps({"jobs": [record]})).jobs
    assert (1170.0, 120.0) == (resumed.resumed_at(), resumed.suspended_seconds(5000.0))
    record.update(suspend_time=number(0))  # never suspended
    [plain] = squeue.parse_squeue_json(json.dumps({"jobs": [record]})).jobs
    assert (None, 0.0) == (plain.resumed_at(), plain.suspended_seconds(5000.0))
