"""Slurm's job id as its commands print it: `123`, `123_4`, `123_[1-5%2]`, `123+0`, `123.batch`.

sacct's JobID column and squeue's `%i` name a job in several forms
(https://slurm.schedmd.com/job_array.html, https://slurm.schedmd.com/heterogeneous_jobs.html):

- `123`: a plain job;
- `123_4`: task 4 of job array 123; `123_[1-5%2]`: the array's tasks still pending;
- `123+0`: component 0 of heterogeneous job 123 (its other components are `123+1`...);
- any of these followed by `.<step>`: a step (`123.batch`, `123.extern`, `123_4.0`).

A reader that expects a plain integer breaks on the first array or het job a cluster
runs, so every job id read as text goes through `parse_job_id`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MAX_JOB_ID = 2**32  # Slurm job ids are uint32
_JOB_ID = re.compile(
    r"(?P<job>[0-9]{1,10})"
    r"(?:_(?P<task>[0-9]{1,10})|_(?P<tasks>\[[0-9,%\-]+\])|\+(?P<het>[0-9]{1,10}))?"
    r"(?:\.(?P<step>[A-Za-z0-9_+\-]+))?"
)


@dataclass(frozen=True)
class JobId:
    """One job id in Slurm's text form, taken apart.

    Attributes:
        job_id: the leading number: the job, the array's job or the het job's leader.
        array_task_id: the task of an array job (`123_4` -> 4).
        array_tasks: an array's pending tasks as printed (`123_[1-5%2]` -> "[1-5%2]").
        het_offset: the component of a heterogeneous job (`123+1` -> 1).
        step: the step name or number (`123.batch` -> "batch", `123.0` -> "0").
    """

    job_id: int
    array_task_id: int | None = None
    array_tasks: str | None = None
    het_offset: int | None = None
    step: str | None = None

    def __str__(self) -> str:
        """The id as Slurm prints it."""
        text = str(self.job_id)
        if self.array_task_id is not None:
            text += f"_{self.array_task_id}"
        elif self.array_tasks is not None:
            text += f"_{self.array_tasks}"
        elif self.het_offset is not None:
            text += f"+{self.het_offset}"
        return f"{text}.{self.step}" if self.step is not None else text


def parse_job_id(text: str) -> JobId:
    """Slurm's job id text (`123`, `123_4`, `123_[1-3]`, `123+0`, `123.batch`) taken apart.

    Raises:
        ValueError: anything else, or a number beyond Slurm's 32-bit job ids.
    """
    match = _JOB_ID.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"bad job id {text[:40]!r}")
    job_id = int(match["job"])
    task = int(match["task"]) if match["task"] is not None else None
    het = int(match["het"]) if match["het"] is not None else None
    if max(job_id, task or 0, het or 0) >= _MAX_JOB_ID:
        raise ValueError(f"job id {text[:40]!r} beyond Slurm's 32-bit ids")
    return JobId(job_id, task, match["tasks"], het, match["step"])
