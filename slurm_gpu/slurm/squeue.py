"""Pending and running jobs from `squeue`: pure parsers for `--json` and a fixed `-O` format.

`squeue --json` is the first choice (Slurm 21.08+ with the openapi plugins). Its schema
moves between releases, so every field is read defensively:

- numbers are plain (`"time_limit": 5`, v0.0.37/38) or wrapped
  (`{"set": true, "infinite": false, "number": 5}`, v0.0.40+);
- `job_state` is a string ("RUNNING") or a list (["RUNNING"], v0.0.40+);
- `tres_per_node` is "gpu:2" (21.08), "gres:gpu:2" (22.05) or "gres/gpu:2" (23.02+);
- 22.05 ignores filters (-t, -j) under --json and lists recently finished jobs too,
  so callers filter here.

The fallback is `squeue -h -O <FIELDS>` (every field `:0` = no truncation, see
https://slurm.schedmd.com/squeue.html#OPT_Format), fields separated by the ASCII unit
separator 0x1F and each record ended by the record separator 0x1E, with the job name
last: a user's job name may hold `|`, spaces, HTML, unicode, even a newline.

A malformed record is skipped and described in `problems`; it is never guessed at.
Times are POSIX seconds; squeue prints local time (`2026-11-29T19:12:05`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from slurm_gpu.errors import SlurmError, brief
from slurm_gpu.models import SlurmJob
from slurm_gpu.slurm.hostlist import expand as expand_hostlist
from slurm_gpu.slurm.timespec import parse_elapsed

FIELD_SEP = "\x1f"
RECORD_END = "\x1e"

# Slurm's NO_VAL / INFINITE sentinels (slurm.h) as they leak into --json numbers.
_NO_VAL = 0xFFFFFFFE
_NO_VAL64 = 0xFFFFFFFFFFFFFFFE

FORMAT_FIELDS = (
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "HetJobID",
    "HetJobOffset",
    "UserName",
    "Account",
    "Partition",
    "State",
    "QOS",
    "SubmitTime",
    "StartTime",
    "TimeLimit",
    "NodeList",
    "NumNodes",
    "tres-alloc",
    "tres-per-node",
    "tres-per-job",
    "Comment",
    "admin_comment",
    "Name",  # last: free text, may contain anything
)

KNOWN_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETING",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "CONFIGURING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "RESV_DEL_HOLD",
        "REVOKED",
        "SIGNALING",
        "SPECIAL_EXIT",
        "STAGE_OUT",
        "STOPPED",
        "POWER_UP_NODE",
        "UPDATE_DB",
    }
)
"""Job states Slurm 21.08-25.x print (squeue(1) JOB STATE CODES); others are reported."""

ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING"})
"""States in which a job can still be updated, held or cancelled."""


@dataclass(frozen=True)
class SqueueResult:
    """What a squeue parser made of one output.

    Attributes:
        jobs: the well-formed job records, in squeue's order.
        problems: one line per skipped or doubtful record (job id and what was wrong).
        targets: {job_id: the id to give scontrol/scancel}: "272_3" for an array task,
            "272_[2-3]" for an array's pending tasks, "123" otherwise. `scancel 272`
            would cancel a whole array, so array members are always named by task.
        gres_detail: {job_id: --json `gres_detail`, one "gpu:a100:1(IDX:0)" per node}.
    """

    jobs: list[SlurmJob] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    targets: dict[int, str] = field(default_factory=dict)
    gres_detail: dict[int, tuple[str, ...]] = field(default_factory=dict)


def format_argv(states: Sequence[str] = ()) -> list[str]:
    """`squeue -h -O ...` for FORMAT_FIELDS (all states when `states` is empty)."""
    spec = ",".join(f"{name}:0{FIELD_SEP}" for name in FORMAT_FIELDS[:-1])
    spec += f",{FORMAT_FIELDS[-1]}:0{RECORD_END}"
    return ["squeue", "-h", "-t", ",".join(states) if states else "all", "-O", spec]


# --- scalar helpers -----------------------------------------------------------------


def json_number(value: Any) -> float | None:
    """A --json number: plain, numeric text, or `{"set", "infinite", "number"}`.

    None for unset, infinite, NO_VAL sentinels and null. Raises ValueError otherwise
    (also for a bare non-finite or out-of-range number: `Infinity`, `1e999`).
    """
    if value is None:
        return None
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        return json_number(value.get("number"))
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond a float's range
            raise ValueError(f"number out of range: {brief(value)}") from None
    elif isinstance(value, str) and re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", value.strip()):
        number = float(value.strip())
    else:
        raise ValueError(f"expected a number, got {value!r}")
    if math.isinf(number):
        # JSON has no infinity; Python's json reads `Infinity` and `1e999` as one.
        # Slurm writes an unlimited value as {"infinite": true}, handled above.
        raise ValueError(f"expected a finite number, got {brief(value)}")
    if math.isnan(number) or number in (_NO_VAL, _NO_VAL + 1, _NO_VAL64, _NO_VAL64 + 1):
        return None
    return number


def _json_int(value: Any) -> int | None:
    number = json_number(value)
    return None if number is None else int(number)


def parse_slurm_time(value: Any, tz: dt.tzinfo | None = None) -> float | None:
    """A time as Slurm prints it, to POSIX seconds (None when unknown or unset).

    Accepts local ISO text (`2026-11-29T19:12:05`, in `tz`, default the process's zone),
    "Unknown", "None", "N/A", "", epoch numbers (plain, numeric text or --json's
    `{"set": true, "number": ...}`); 0 means unset. Raises ValueError otherwise.
    """
    if isinstance(value, str):
        text = value.strip()
        if text in ("", "Unknown", "None", "N/A", "(null)", "0"):
            return None
        if not re.fullmatch(r"\d+", text):
            try:
                local = dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")
            except ValueError:
                raise ValueError(f"unexpected time {text!r} (is SLURM_TIME_FORMAT set?)") from None
            return local.replace(tzinfo=tz).timestamp() if tz else local.timestamp()
    number = json_number(value)
    return None if number is None or number <= 0 else number


def parse_time_limit(value: Any, *, minutes: bool = False) -> float | None:
    """A time limit in seconds; None for UNLIMITED, NOT_SET and the like.

    Text is squeue's `[D-]HH:MM:SS`, `MM:SS`, `D-HH`; numbers (--json) are minutes when
    `minutes`, else seconds. Raises ValueError for anything else.
    """
    if isinstance(value, str):
        text = value.strip()
        if text.upper() in ("", "UNLIMITED", "INFINITE", "NOT_SET", "N/A", "PARTITION_LIMIT"):
            return None
        if ":" in text or "-" in text:
            return parse_elapsed(text)
    number = json_number(value)
    if number is None:
        return None
    return number * 60 if minutes else number


_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(\d+)(?=,|$)")
_GPU_TYPED_TRES = re.compile(r"(?:^|,)gres/gpu:[^=,]+=(\d+)(?=,|$)")


def gpus_from_tres(text: str) -> int | None:
    """GPUs in a TRES string (`cpu=1,gres/gpu=2,gres/gpu:a100=2` -> 2); None when absent."""
    text = text.strip()
    total = _GPU_TRES.search(text)
    if total is not None:
        return int(total.group(1))
    typed = [int(m.group(1)) for m in _GPU_TYPED_TRES.finditer(text)]
    return sum(typed) if typed else None


def gpus_from_tres_per(text: str) -> int | None:
    """GPUs in a tres-per-node/-job string, as any Slurm since 21.08 prints it.

    "gpu:2", "gres:gpu:a100:2", "gres/gpu:2", "gres/gpu=2" -> 2; "gres:gpu" -> 1;
    None when there is no GPU item ("N/A", "", "gres:mps:100").
    """
    total = 0
    found = False
    for item in text.split(","):
        item = item.strip()
        for prefix in ("gres:", "gres/"):
            if item.startswith(prefix):
                item = item[len(prefix) :]
        name, _, rest = item.replace("=", ":").partition(":")
        if name != "gpu":
            continue
        found = True
        count = rest.rsplit(":", 1)[-1] if rest else ""
        count = re.sub(r"\(.*\)$", "", count)  # "2(S:0-1)" in some versions
        total += int(count) if count.isdigit() else 1
    return total if found else None


def _gpu_count(
    state: str, alloc: str, req: str, per_job: str, per_node: str, node_count: int
) -> int:
    if state != "PENDING":
        allocated = gpus_from_tres(alloc)
        if allocated is not None:
            return allocated
    requested = gpus_from_tres(req)
    if requested is not None:
        return requested
    job_wide = gpus_from_tres_per(per_job)
    if job_wide is not None:
        return job_wide
    per = gpus_from_tres_per(per_node)
    return per * max(node_count, 1) if per is not None else 0


def _text(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {value!r}")
    return "" if value == "(null)" else value


def _nodes(hostlist: str) -> tuple[str, ...]:
    hostlist = hostlist.strip()
    if hostlist in ("", "(null)", "None assigned", "N/A"):
        return ()
    try:
        return tuple(expand_hostlist(hostlist))
    except SlurmError as exc:
        raise ValueError(f"bad node list {hostlist!r}: {exc}") from None


def _target(job_id: int, array_job: int | None, task: int | None, task_set: str) -> str:
    if array_job is not None and task is not None:
        return f"{array_job}_{task}"
    task_set = task_set.split("%", 1)[0].strip()  # "2-3%1": the throttle is not a task
    if array_job is not None and task_set and task_set != "N/A":
        return f"{array_job}_[{task_set}]"
    return str(job_id)


def _state_problem(job_id: int, state: str) -> str | None:
    if state in KNOWN_STATES:
        return None
    return f"job {job_id}: unknown state {state!r} (kept as printed)"


# --- squeue --json --------------------------------------------------------------------


def parse_squeue_json(
    text: str, states: Iterable[str] = (), tz: dt.tzinfo | None = None
) -> SqueueResult:
    """Parse `squeue --json` (openapi v0.0.37 to v0.0.4x) into SlurmJobs.

    Args:
        text: squeue's stdout.
        states: keep only jobs in these states (all when empty).
        tz: time zone of text times (only old versions print text; default local).

    Raises:
        SlurmError: the output is not JSON or has no `jobs` list (nothing to salvage).
    """
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"squeue --json: output is not JSON ({exc})") from None
    jobs = document.get("jobs") if isinstance(document, dict) else None
    if not isinstance(jobs, list):
        raise SlurmError("squeue --json: output has no 'jobs' list")
    wanted = frozenset(states)
    result = SqueueResult()
    for number, record in enumerate(jobs):
        if not isinstance(record, dict):
            result.problems.append(f"squeue --json: record #{number} is not an object; skipped")
            continue
        try:
            job, target = _job_from_json(record, tz)
        except (ValueError, TypeError) as exc:
            label = f"job {brief(record['job_id'])}" if "job_id" in record else f"record #{number}"
            result.problems.append(f"squeue --json: {label}: {exc}; skipped")
            continue
        if wanted and job.state not in wanted:
            continue
        problem = _state_problem(job.job_id, job.state)
        if problem:
            result.problems.append(problem)
        result.jobs.append(job)
        result.targets[job.job_id] = target
        detail = record.get("gres_detail")
        if isinstance(detail, list) and all(isinstance(d, str) for d in detail):
            result.gres_detail[job.job_id] = tuple(detail)
    return result


def _json_state(value: Any) -> str:
    if isinstance(value, list):
        value = value[0] if value else ""
    state = _text(value).strip().upper()
    if not state:
        raise ValueError("no job_state")
    return state


def _job_from_json(record: Mapping[str, Any], tz: dt.tzinfo | None) -> tuple[SlurmJob, str]:
    job_id = _json_int(record.get("job_id"))
    if job_id is None or job_id <= 0:
        raise ValueError(f"no valid job_id ({brief(record.get('job_id'))})")
    state = _json_state(record.get("job_state"))
    array_job = _json_int(record.get("array_job_id")) or None
    task = _json_int(record.get("array_task_id")) if array_job else None
    het_job = _json_int(record.get("het_job_id")) or None
    het_offset = _json_int(record.get("het_job_offset")) if het_job else None
    nodes = _nodes(_text(record.get("nodes")))
    node_count = _json_int(record.get("node_count")) or len(nodes)
    start = parse_slurm_time(record.get("start_time"), tz)
    job = SlurmJob(
        job_id=job_id,
        user=_text(record.get("user_name")),
        account=_text(record.get("account")),
        partition=_text(record.get("partition")),
        state=state,
        name=_text(record.get("name")),
        qos=_text(record.get("qos")),
        submit_time=parse_slurm_time(record.get("submit_time"), tz),
        start_time=None if state == "PENDING" else start,
        time_limit_seconds=parse_time_limit(record.get("time_limit"), minutes=True),
        nodes=nodes,
        gpu_count=_gpu_count(
            state,
            _text(record.get("tres_alloc_str")),
            _text(record.get("tres_req_str")),
            _text(record.get("tres_per_job")),
            _text(record.get("tres_per_node")),
            node_count,
        ),
        array_job_id=array_job,
        array_task_id=task,
        het_job_id=het_job,
        het_job_offset=het_offset,
        admin_comment=_text(record.get("admin_comment")),
        comment=_text(record.get("comment")),
        # Slurm's suspend_time is 0 for a job never suspended (job_info.c).
        suspend_time=parse_slurm_time(record.get("suspend_time"), tz) or None,
        pre_suspend_seconds=json_number(record.get("pre_sus_time")) or 0.0,
    )
    if not job.user:
        raise ValueError("no user_name")
    task_set = _text(record.get("array_task_string"))
    return job, _target(job_id, array_job, task, task_set)


# --- squeue -h -O -------------------------------------------------------------------


def split_format_records(text: str, field_count: int = len(FORMAT_FIELDS)) -> list[list[str]]:
    """Records of `format_argv` output, each a list of `field_count` raw fields.

    A piece without any field separator continues the previous record's last field
    (a job name that contained the record separator). Other fragments are returned with
    their wrong number of fields, for the caller to report.
    """
    records: list[list[str]] = []
    pieces = text.split(RECORD_END)
    for index, piece in enumerate(pieces):
        if index > 0 and piece.startswith("\n"):
            piece = piece[1:]
        if index == len(pieces) - 1 and not piece.strip():
            break  # what follows the last record: its newline
        if FIELD_SEP not in piece and records and len(records[-1]) == field_count:
            records[-1][-1] += RECORD_END + piece
        else:
            records.append(piece.split(FIELD_SEP, field_count - 1))
    return records


def parse_squeue_format(
    text: str, states: Iterable[str] = (), tz: dt.tzinfo | None = None
) -> SqueueResult:
    """Parse `format_argv()` output (squeue -h -O with 0x1F/0x1E separators)."""
    wanted = frozenset(states)
    result = SqueueResult()
    for raw in split_format_records(text):
        if len(raw) != len(FORMAT_FIELDS):
            record = FIELD_SEP.join(raw)[:80]
            result.problems.append(f"squeue: record with {len(raw)} fields skipped: {record!r}")
            continue
        row = dict(zip(FORMAT_FIELDS, raw, strict=True))
        try:
            job, target = _job_from_row(row, tz)
        except (ValueError, KeyError) as exc:
            result.problems.append(f"squeue: job {row['JobID'].strip()!r}: {exc}; skipped")
            continue
        if wanted and job.state not in wanted:
            continue
        problem = _state_problem(job.job_id, job.state)
        if problem:
            result.problems.append(problem)
        result.jobs.append(job)
        result.targets[job.job_id] = target
    return result


def _optional_int(text: str) -> int | None:
    text = text.strip()
    if text in ("", "N/A", "(null)", "4294967294"):
        return None
    if not text.isdigit():
        raise ValueError(f"expected a number or N/A, got {text!r}")
    return int(text)


def _job_from_row(row: Mapping[str, str], tz: dt.tzinfo | None) -> tuple[SlurmJob, str]:
    job_text = row["JobID"].strip()
    if not job_text.isdigit():
        raise ValueError(f"bad JobID {job_text!r}")
    job_id = int(job_text)
    state = row["State"].strip().upper()
    if not state or not re.fullmatch(r"[A-Z_]+", state):
        raise ValueError(f"bad State {row['State']!r}")
    task_text = row["ArrayTaskID"].strip()
    task = int(task_text) if task_text.isdigit() else None
    is_array = task is not None or task_text not in ("", "N/A")
    array_job = _optional_int(row["ArrayJobID"]) if is_array else None
    het_job = _optional_int(row["HetJobID"]) or None
    het_offset = _optional_int(row["HetJobOffset"]) if het_job else None
    nodes = _nodes(row["NodeList"])
    node_count = _optional_int(row["NumNodes"]) or len(nodes)
    user = row["UserName"].strip()
    if not user:
        raise ValueError("no UserName")
    start = parse_slurm_time(row["StartTime"], tz)
    job = SlurmJob(
        job_id=job_id,
        user=user,
        account=row["Account"].strip(),
        partition=row["Partition"].strip(),
        state=state,
        name=_text(row["Name"]),
        qos=row["QOS"].strip(),
        submit_time=parse_slurm_time(row["SubmitTime"], tz),
        start_time=None if state == "PENDING" else start,
        time_limit_seconds=parse_time_limit(row["TimeLimit"]),
        nodes=nodes,
        gpu_count=_gpu_count(
            state,
            _na(row["tres-alloc"]),
            "",
            _na(row["tres-per-job"]),
            _na(row["tres-per-node"]),
            node_count,
        ),
        array_job_id=array_job,
        array_task_id=task,
        het_job_id=het_job,
        het_job_offset=het_offset,
        admin_comment=_text(row["admin_comment"]),
        comment=_text(row["Comment"]),
    )
    return job, _target(job_id, array_job, task, task_text)


def _na(text: str) -> str:
    text = text.strip()
    return "" if text in ("N/A", "(null)") else text


def with_gpus(job: SlurmJob, gpus: Sequence[tuple[str, Sequence[int]]]) -> SlurmJob:
    """A copy of `job` with its GPU indices per node, in the job's node order."""
    order = {node: i for i, node in enumerate(job.nodes)}
    ordered = sorted(gpus, key=lambda pair: order.get(pair[0], len(order)))
    return replace(job, gpus=tuple((node, tuple(idx)) for node, idx in ordered))


# --- who runs what --------------------------------------------------------------------

OWNERS_ARGV = ["squeue", "-h", "-t", "R,CG", "-o", "%A|%u|%a"]
"""Running and completing jobs: numeric job id (`%A`: also for array tasks and het
components), user, account. Names and accounts hold no `|`."""


@dataclass(frozen=True)
class JobOwner:
    """Whose a job is: the user who runs it and the account it is charged to."""

    user: str
    account: str


def parse_running_owners(text: str) -> tuple[dict[int, JobOwner], list[str]]:
    """`OWNERS_ARGV` output -> ({job_id: JobOwner}, problems); a malformed line is skipped."""
    owners: dict[int, JobOwner] = {}
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 3 or not re.fullmatch(r"[0-9]{1,10}", parts[0]):
            problems.append(f"squeue -o %A|%u|%a: line {number}: unparsable {brief(line)}")
            continue
        owners[int(parts[0])] = JobOwner(parts[1], parts[2])
    return owners, problems
