"""What Slurm says of some jobs on one node: holding their GPUs there, or ended, and when.

The node agent asks it to close the runs of jobs that ended without an epilog (NODE_FAIL,
slurmd killed, a node rebooted or set DOWN; issue 25): `squeue --jobs=<ids> --states=all`
answers for the jobs slurmctld still holds, the ended ones too until MinJobAge passes,
with their state, EndTime (`%e`: the expected end while a job runs, the end once it
ended) and nodes. A job of the list that slurmctld no longer holds is absent. A job
back in the queue (requeued after its node failed) gets the end of its run here from
`sacct -D`, which keeps each run.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from slurm_gpu.errors import SlurmError, brief
from slurm_gpu.slurm.hostlist import expand as expand_hostlist
from slurm_gpu.slurm.runner import CommandRunner
from slurm_gpu.slurm.squeue import parse_slurm_time

# A job in these states still holds its allocation on its nodes: its epilog (or Slurm's
# next answer) ends it.
HOLDING_STATES = frozenset(
    {
        "RUNNING",
        "SUSPENDED",
        "COMPLETING",
        "CONFIGURING",
        "STOPPED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
    }
)
# Back in the queue (requeued): its run on the node ended, but `%e` is an expected end.
_QUEUED_STATES = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD"}
)
_FORMAT = "%A|%T|%e|%N"
# squeue's answer when none of the jobs asked for is held any more (not a failure).
_NONE_HELD = "Invalid job id specified"


def node_jobs_argv(job_ids: Sequence[int]) -> list[str]:
    """squeue of these jobs in every state: job id, state, end time, nodes."""
    ids = ",".join(str(i) for i in sorted(set(job_ids)))
    return ["squeue", "--noheader", "--states=all", f"--jobs={ids}", f"--format={_FORMAT}"]


@dataclass(frozen=True)
class NodeJob:
    """What slurmctld holds of a job, as the node sees it.

    holding: it holds GPUs on the node. end: when its run there ended, where Slurm says
    (None while holding; a requeued job's from sacct, where it answers).
    """

    state: str
    holding: bool
    end: float | None


def ask_node_jobs(
    run: CommandRunner, job_ids: Sequence[int], node: str, tz: dt.tzinfo | None = None
) -> dict[int, NodeJob]:
    """Asks squeue (`run`: a CommandRunner) of these jobs on `node`; absent: not held.

    Raises:
        SlurmError: squeue failed (slurmctld down...), or its answer is unreadable.
    """
    if not job_ids:
        return {}
    try:
        text = run(node_jobs_argv(job_ids))
    except SlurmError as exc:
        if _NONE_HELD in str(exc):
            return {}
        raise
    try:
        jobs = parse_node_jobs(text, node, tz)
    except ValueError as exc:
        raise SlurmError(str(exc)) from None
    queued = [i for i, j in jobs.items() if j.state in _QUEUED_STATES]
    if queued:
        ends = _requeued_ends(run, queued, node, tz)
        jobs.update({i: replace(jobs[i], end=end) for i, end in ends.items()})
    return jobs


def _requeued_ends(
    run: CommandRunner, job_ids: Sequence[int], node: str, tz: dt.tzinfo | None
) -> dict[int, float]:
    """When the last run on `node` of these requeued jobs ended: `sacct -D`'s record.

    squeue shows a requeued job pending, with no end of the run that ended; sacct keeps
    each run (-D). A job sacct cannot tell of (slurmdbd away, a record not yet written) is
    left out: its run closes where it was last seen running.
    """
    ids = ",".join(str(i) for i in sorted(set(job_ids)))
    argv = ["sacct", "-D", "-X", "-n", "-P", f"--jobs={ids}", "--format=JobIDRaw,End,NodeList"]
    try:
        text = run(argv)
    except SlurmError:
        return {}
    ends: dict[int, float] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not re.fullmatch(r"[0-9]{1,10}", parts[0]):
            continue
        try:
            end = parse_slurm_time(parts[1], tz)
            here = node in expand_hostlist(parts[2]) if parts[2].strip() else False
        except (ValueError, SlurmError):
            continue
        if end is not None and here:
            job = int(parts[0])
            ends[job] = max(ends.get(job, end), end)
    return ends


def parse_node_jobs(text: str, node: str, tz: dt.tzinfo | None = None) -> dict[int, NodeJob]:
    """`node_jobs_argv` output -> {job id: NodeJob} as `node` sees each job.

    A job Slurm shows holding its allocation on other nodes only (a requeued job that
    runs elsewhere now) is not holding here, its end here unknown.

    Raises:
        ValueError: a line that is not `<job id>|<STATE>|<time>|<nodes>`, naming the line.
    """
    jobs: dict[int, NodeJob] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"squeue --format={_FORMAT}: line {number}"
        parts = line.strip().split("|")
        if len(parts) != 4 or not re.fullmatch(r"[0-9]{1,10}", parts[0]):
            raise ValueError(f"{where}: unparsable {brief(line)}")
        state = parts[1].strip().upper()
        if not re.fullmatch(r"[A-Z_]+", state):
            raise ValueError(f"{where}: state {brief(parts[1])}")
        nodes = parts[3].strip()
        try:
            here = nodes in ("", "(null)", "None assigned") or node in expand_hostlist(nodes)
            holding = state in HOLDING_STATES and here
            ended = not holding and state not in _QUEUED_STATES and here
            end = parse_slurm_time(parts[2], tz) if ended else None
        except (ValueError, SlurmError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        jobs[int(parts[0])] = NodeJob(state, holding, end)
    return jobs
