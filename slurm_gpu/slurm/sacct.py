"""Job facts from Slurm's accounting: `sacct -P -X --noconvert`, parsed defensively.

One row per job allocation (-X), read with an unlikely delimiter (the ASCII unit
separator, 0x1F) and with JobName as the LAST field: a job name may hold `|`, unicode,
HTML or even a newline (sacct prints it raw), so a line that lacks the delimiters is the
continuation of the previous record's name. `--noconvert` keeps sacct from scaling
memory units. Times come back in local time as `YYYY-MM-DDTHH:MM:SS` (SLURM_TIME_FORMAT
unset) or "Unknown"/"None".
See https://slurm.schedmd.com/sacct.html (-P, --delimiter, -o, -X).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_gpu.errors import SlurmError
from slurm_gpu.slurm.hostlist import expand as expand_hostlist
from slurm_gpu.slurm.runner import CommandRunner
from slurm_gpu.slurm.timespec import parse_elapsed

DELIMITER = "\x1f"
FIELDS = (
    "JobID",
    "JobIDRaw",
    "User",
    "Account",
    "Partition",
    "QOS",
    "State",
    "Submit",
    "Start",
    "End",
    "Elapsed",
    "Timelimit",
    "NodeList",
    "AllocTRES",
    "ExitCode",
    "Suspended",
    "JobName",  # last: it may contain anything, including the delimiter and newlines
)
# sacct -s takes short codes too (https://slurm.schedmd.com/sacct.html#SECTION_JOB-STATE-CODES).
STATE_CODES = {
    "BF": "BOOT_FAIL",
    "CA": "CANCELLED",
    "CD": "COMPLETED",
    "DL": "DEADLINE",
    "F": "FAILED",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "PD": "PENDING",
    "PR": "PREEMPTED",
    "R": "RUNNING",
    "RQ": "REQUEUED",
    "RS": "RESIZING",
    "RV": "REVOKED",
    "S": "SUSPENDED",
    "TO": "TIMEOUT",
}
_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(\d+)")
_GPU_MODEL_TRES = re.compile(r"(?:^|,)gres/gpu:([^=,]+)=(\d+)")


@dataclass(frozen=True)
class SacctJob:
    """One job allocation as `sacct -X` reports it.

    Times are POSIX seconds (None when sacct says Unknown/None). `job_id` is JobIDRaw
    (the number the prolog sees, also for array tasks); `job_id_text` is JobID as sacct
    shows it ("150_3", "273+1"). `elapsed_seconds` is sacct's Elapsed, which leaves out
    `suspended_seconds` (Suspended: the time Slurm had the job suspended). `state` is the
    state's name ("CANCELLED"), what filters and logic compare; `state_text` is sacct's
    State as printed ("CANCELLED by 1002": who cancelled, by uid, 0 being root or the
    controller), what every view shows.
    """

    job_id: int
    job_id_text: str
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str
    state_text: str
    submit_time: float | None
    start_time: float | None
    end_time: float | None
    elapsed_seconds: float | None
    time_limit_seconds: float | None
    nodes: tuple[str, ...]
    alloc_gpus: int
    gpu_types: tuple[tuple[str, int], ...]
    exit_code: int | None
    suspended_seconds: float | None = None

    @property
    def queue_wait_seconds(self) -> float | None:
        """Start - Submit (None while pending)."""
        if self.start_time is None or self.submit_time is None:
            return None
        return max(self.start_time - self.submit_time, 0.0)

    def store_row(self) -> dict[str, Any]:
        """The `jobs` columns this job fills (for `Store.upsert_jobs`)."""
        return {
            "job_id": self.job_id,
            "user": self.user,
            "account": self.account,
            "partition": self.partition,
            "job_name": self.name[:255],
            "state": self.state_text[:32],
            "exit_code": self.exit_code,
            "submit_time": self.submit_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "nodes": ",".join(sorted(self.nodes)) or None,
            "suspended_seconds": self.suspended_seconds,
        }


def state_name(text: str) -> str:
    """A job state as `sacct -s` takes it, by its full name: "cd" -> "COMPLETED"."""
    return STATE_CODES.get(text.upper(), text.upper())


def state_word(text: str) -> str:
    """The state's name in sacct's State text: "CANCELLED by 1002" -> "CANCELLED"."""
    return text.strip().split(" ")[0]


def sacct_argv(
    *,
    start: float | None = None,
    end: float | None = None,
    users: Sequence[str] = (),
    accounts: Sequence[str] = (),
    partitions: Sequence[str] = (),
    jobs: Sequence[str] = (),
    nodes: Sequence[str] = (),
    states: Sequence[str] = (),
    all_users: bool = True,
    tz: dt.tzinfo | None = None,
) -> list[str]:
    """The sacct command line that lists these jobs (`sacct -P -X --noconvert -o ...`).

    Times are passed to sacct as local `YYYY-MM-DDTHH:MM:SS`, the form every Slurm since
    2.x parses, so slurm-gpu and sacct agree on the window to the second.
    """
    argv = ["sacct", "-P", "-X", "--noconvert", f"--delimiter={DELIMITER}", "-o", ",".join(FIELDS)]
    if all_users and not users:
        argv.append("-a")
    if start is not None:
        argv += ["-S", _local(start, tz)]
    if end is not None:
        argv += ["-E", _local(end, tz)]
    for flag, values in (
        ("-u", users),
        ("-A", accounts),
        ("-r", partitions),
        ("-j", jobs),
        ("-N", nodes),
        ("-s", states),
    ):
        if values:
            argv += [flag, ",".join(values)]
    return argv


def _local(seconds: float, tz: dt.tzinfo | None) -> str:
    return dt.datetime.fromtimestamp(int(seconds), tz=tz).strftime("%Y-%m-%dT%H:%M:%S")


def run_sacct(runner: CommandRunner, tz: dt.tzinfo | None = None, **filters: Any) -> list[SacctJob]:
    """Run sacct through `runner` (SlurmCommands) and parse its rows. See `sacct_argv`."""
    return parse_sacct(runner(sacct_argv(tz=tz, **filters)), tz=tz)


def split_records(text: str, fields: Sequence[str] = FIELDS) -> list[dict[str, str]]:
    """Split `sacct -P --delimiter=0x1F -o <fields>` output (last field free text) into rows.

    The header line (if present) names the fields sacct printed, a subset of `fields` in
    any order with the last one last (a sacct from before a field was asked for: its
    records lack that field); a line with fewer delimiters than a record has continues
    the previous record's last field (a newline inside a job name).

    Raises:
        SlurmError: the output has lines that belong to no record.
    """
    lines = text.split("\n")
    first = lines[0].split(DELIMITER)
    if first[-1] == fields[-1] and set(first) <= set(fields):
        fields = tuple(first)  # the header line itself is skipped below
    count = len(fields) - 1
    rows: list[list[str]] = []
    header = DELIMITER.join(fields)
    for number, line in enumerate(lines, 1):
        if line == header:
            continue
        if line.count(DELIMITER) >= count:
            rows.append(line.split(DELIMITER, count))
        elif rows:
            rows[-1][-1] += "\n" + line
        elif line.strip():
            raise SlurmError(f"sacct output line {number} is not a job record: {line[:80]!r}")
    # The output's final newline appended an empty continuation to the last record.
    if rows and rows[-1][-1].endswith("\n"):
        rows[-1][-1] = rows[-1][-1][:-1]
    return [dict(zip(fields, row, strict=True)) for row in rows]


def parse_sacct(text: str, tz: dt.tzinfo | None = None) -> list[SacctJob]:
    """Parse the output of `sacct_argv` into SacctJobs, in sacct's order.

    Raises:
        SlurmError: a record is malformed (the message names the job and the field).
    """
    jobs: list[SacctJob] = []
    for row in split_records(text):
        try:
            jobs.append(_job(row, tz))
        except ValueError as exc:
            raise SlurmError(f"sacct: job {row.get('JobID', '?')}: {exc}") from None
    return jobs


def _job(row: Mapping[str, str], tz: dt.tzinfo | None) -> SacctJob:
    raw = row["JobIDRaw"].strip()
    if not raw.isdigit():
        raise ValueError(f"JobIDRaw {raw!r} is not a number")
    tres = row["AllocTRES"].strip()
    gpus = _GPU_TRES.search(tres)
    types = tuple((m.group(1), int(m.group(2))) for m in _GPU_MODEL_TRES.finditer(tres))
    node_list = row["NodeList"].strip()
    nodes = () if not node_list or node_list == "None assigned" else expand_hostlist(node_list)
    state_text = " ".join(row["State"].split())  # "CANCELLED by 1001", as sacct prints it
    return SacctJob(
        job_id=int(raw),
        job_id_text=row["JobID"].strip(),
        name=row["JobName"],
        user=row["User"].strip(),
        account=row["Account"].strip(),
        partition=row["Partition"].strip(),
        qos=row["QOS"].strip(),
        state=state_word(state_text),
        state_text=state_text,
        submit_time=parse_sacct_time(row["Submit"], tz),
        start_time=parse_sacct_time(row["Start"], tz),
        end_time=parse_sacct_time(row["End"], tz),
        elapsed_seconds=parse_elapsed(row["Elapsed"]),
        time_limit_seconds=parse_elapsed(row["Timelimit"]),
        nodes=tuple(nodes),
        alloc_gpus=int(gpus.group(1)) if gpus else sum(n for _, n in types),
        gpu_types=types,
        exit_code=_exit_code(row["ExitCode"]),
        suspended_seconds=parse_elapsed(row.get("Suspended", "")),
    )


def parse_sacct_time(text: str, tz: dt.tzinfo | None = None) -> float | None:
    """sacct's `YYYY-MM-DDTHH:MM:SS` (local time) to POSIX seconds; Unknown/None -> None.

    Raises:
        ValueError: any other text.
    """
    text = text.strip()
    if text in ("", "Unknown", "None"):
        return None
    try:
        local = dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        raise ValueError(f"unexpected time {text!r} (is SLURM_TIME_FORMAT set?)") from None
    if tz is not None:
        return local.replace(tzinfo=tz).timestamp()
    return local.timestamp()  # naive: the process's local time zone, like sacct's


def _exit_code(text: str) -> int | None:
    code, _, _signal = text.strip().partition(":")
    return int(code) if code.isdigit() else None
