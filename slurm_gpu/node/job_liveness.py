"""Closing the runs of jobs Slurm ended on this node without an epilog (issue 25 item 1).

The epilog ends a run. A job that ends without one (NODE_FAIL, slurmd killed, a node
rebooted or set DOWN with jobs on it, an epilog that timed out) would stay open here, and
every later reading of its GPUs would be charged to it. So at its first tick and every
`[node] job_check_interval` after, while runs are open, the agent asks Slurm of their jobs
(slurm/node_jobs.py) and closes, as the epilog would, each run whose job Slurm shows
ended here: at the end Slurm records. A job Slurm no longer holds (its record aged out,
MinJobAge) or that went back to the queue is closed at the last time Slurm was seen
holding it, else at the last reading of its GPUs: time nobody can confirm is not held.

What is read between a job's end and the check that finds it ended (at most one
interval) was already counted as the job's readings; its held time, and so its
GPU-hours and cost, end at Slurm's end all the same.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from slurm_gpu.slurm.node_jobs import NodeJob

log = logging.getLogger(__name__)

# A binding's mtime has whole-second precision on some file systems: a run that began
# within this of the question is not judged by its answer.
_MTIME_SLACK = 1.0


@dataclass(frozen=True)
class OpenRun:
    """A run open on this node: job, run (restart count), when it began here."""

    job_id: int
    restart: int
    start: float


@dataclass(frozen=True)
class EndedRun:
    """A run to close: its job, run, end, and Slurm's state of the job ("" unknown)."""

    job_id: int
    restart: int
    end: float
    state: str


@dataclass
class _Question:
    """One question to Slurm: the jobs asked about, when, and its answer once it came."""

    job_ids: list[int]
    asked_at: float
    done: threading.Event = field(default_factory=threading.Event)
    answer: Mapping[int, NodeJob] | None = None
    error: Exception | None = None


class JobLiveness:
    """Asks Slurm every `interval` seconds whether the open runs' jobs still hold here.

    The question runs in a thread of its own (`in_background`), so a slurmctld that does
    not answer (squeue waits out its timeout) never delays a tick; its answer is judged
    at the first tick after it came.

    Args:
        ask: job ids -> {job id: NodeJob} of those slurmctld holds (slurm/node_jobs.py
            `ask_node_jobs`); raises SlurmError when Slurm cannot answer.
        interval: seconds between questions; the first tick asks at once.
        in_background: False asks in the calling thread (tests).
    """

    def __init__(
        self,
        ask: Callable[[list[int]], Mapping[int, NodeJob]],
        interval: float,
        in_background: bool = True,
    ) -> None:
        self._ask = ask
        self.interval = interval
        self.in_background = in_background
        self._next: float | None = None
        self._question: _Question | None = None
        self._seen: dict[int, float] = {}  # job id -> last time Slurm said it holds here

    def ended_runs(
        self,
        runs: Iterable[OpenRun],
        asked_at: float,
        last_read: Callable[[int], float | None],
    ) -> list[EndedRun]:
        """The open runs whose job Slurm ended here, by the last answer that came.

        Asks again when the interval has passed and no question is out.

        Args:
            runs: the runs open on this node.
            asked_at: the wall clock now (runs that began after a question are not
                judged by its answer).
            last_read: job id -> the latest reading of its GPUs here (None: none).
        """
        runs = list(runs)
        ended: list[EndedRun] = []
        question = self._question
        if question is not None and question.done.is_set():
            self._question = None
            if question.answer is None:  # no answer is no news: ask again next interval
                log.warning("cannot ask Slurm which jobs still run here: %s", question.error)
            else:
                asked = set(question.job_ids)
                judged = [
                    r
                    for r in runs
                    if r.job_id in asked and r.start < question.asked_at - _MTIME_SLACK
                ]
                ended = self._judge(judged, question, asked_at, last_read)
        if self._question is None and (self._next is None or asked_at >= self._next):
            closed = {(r.job_id, r.restart) for r in ended}
            open_runs = [r for r in runs if (r.job_id, r.restart) not in closed]
            ids = sorted({r.job_id for r in open_runs if r.start < asked_at - _MTIME_SLACK})
            if ids:
                self._next = asked_at + self.interval
                self._question = _Question(ids, asked_at)
                self._start(self._question)
                if not self.in_background:  # answered already: judged at once
                    return ended + self.ended_runs(open_runs, asked_at, last_read)
            else:
                self._seen.clear()
        return ended

    def _start(self, question: _Question) -> None:
        def run() -> None:
            try:
                question.answer = self._ask(question.job_ids)
            except Exception as exc:  # SlurmError, or a bug: logged at the next tick
                question.error = exc
            finally:
                question.done.set()

        if self.in_background:
            threading.Thread(target=run, name="slurm-gpu-job-check", daemon=True).start()
        else:
            run()

    def _judge(
        self,
        runs: list[OpenRun],
        question: _Question,
        now: float,
        last_read: Callable[[int], float | None],
    ) -> list[EndedRun]:
        """The runs of `runs` the answer to `question` shows ended here."""
        assert question.answer is not None
        ended: list[EndedRun] = []
        for run in runs:
            job = question.answer.get(run.job_id)
            if job is not None and job.holding:
                self._seen[run.job_id] = question.asked_at
                continue
            if job is not None and job.end is not None:
                end, why = job.end, f"Slurm's end ({job.state})"
            else:
                end = self._seen.get(run.job_id) or last_read(run.job_id) or run.start
                why = "Slurm holds it no more" if job is None else f"Slurm shows it {job.state}"
                why += "; closed at the last time it was seen running here"
            end = min(max(end, run.start), now)
            log.warning(
                "job %d (run %d) ended without an epilog here: %s; its run closes at %.0f",
                run.job_id,
                run.restart,
                why,
                end,
            )
            ended.append(EndedRun(run.job_id, run.restart, end, job.state if job else ""))
        closed = {r.job_id for r in ended}
        self._seen = {j: t for j, t in self._seen.items() if j not in closed}
        return ended
