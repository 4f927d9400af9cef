"""A job that ends without an epilog is closed at Slurm's end (issue 25 item 1).

squeue's answer parsed (slurm/node_jobs.py), then the agent over fake GPUs shipping into
a real SQLite store, with Slurm's answer injected: a job whose node failed (NODE_FAIL,
no epilog) is closed at the end Slurm records, summarized, its bindings dropped; the
readings after that are nobody's, and the next job on the GPU gets its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa

from slurm_gpu.errors import SlurmError
from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.job_liveness import JobLiveness
from slurm_gpu.node.shipper import Shipper
from slurm_gpu.node.spool import Spool
from slurm_gpu.slurm.node_jobs import NodeJob, ask_node_jobs, node_jobs_argv, parse_node_jobs
from slurm_gpu.store import Store
from slurm_gpu.store.schema import gpu_intervals, job_gpu_summaries, jobs
from slurm_gpu.testing import FakeGpuSource, FixedClock
from tests.unit.test_node_agent import DEVICES, GRES, end_job, start_job, stat_by_minor

T0 = 1_800_000_000.0
STEP = 10.0
GPU0 = "B"  # Slurm GPU 0 (minor 0)


def test_squeue_answer_says_which_jobs_hold_gpus_here() -> None:
    text = (
        "11|RUNNING|2027-01-15T08:00:00|gpu[1-2]\n"
        "12|NODE_FAIL|2027-01-15T07:50:00|gpu1\n"
        "13|RUNNING|2027-01-15T08:00:00|gpu2\n"  # requeued, runs elsewhere now
        "14|PENDING|2027-01-16T00:00:00|\n"
        "15|COMPLETED|Unknown|gpu1\n"
    )
    jobs = parse_node_jobs(text, "gpu1")
    assert jobs[11] == NodeJob("RUNNING", True, None)
    assert jobs[12].state == "NODE_FAIL" and not jobs[12].holding
    assert jobs[12].end == parse_node_jobs("1|FAILED|2027-01-15T07:50:00|gpu1", "gpu1")[1].end
    assert jobs[12].end is not None
    assert jobs[13] == NodeJob("RUNNING", False, None)
    assert jobs[14] == NodeJob("PENDING", False, None)
    assert jobs[15] == NodeJob("COMPLETED", False, None)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("12|RUNNING|2027-01-15T08:00:00", "line 2: unparsable"),
        ("x1|RUNNING|2027-01-15T08:00:00|gpu1", "line 2: unparsable"),
        ("12|run ning|2027-01-15T08:00:00|gpu1", "line 2: state"),
        ("12|FAILED|yesterday|gpu1", "line 2: unexpected time"),
    ],
)
def test_odd_squeue_output_is_an_error_naming_the_line(line: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_node_jobs("11|RUNNING|Unknown|gpu1\n" + line, "gpu1")


def test_no_job_held_any_more_is_an_answer_not_a_failure() -> None:
    asked: list[list[str]] = []

    def gone(argv: Sequence[str]) -> str:
        asked.append(list(argv))
        raise SlurmError("squeue --noheader failed (exit 1): Invalid job id specified")

    assert ask_node_jobs(gone, [7, 5], "gpu1") == {}
    assert asked == [node_jobs_argv([5, 7])]
    assert "--jobs=5,7" in asked[0] and "--states=all" in asked[0]

    def down(argv: Sequence[str]) -> str:
        raise SlurmError("squeue failed (exit 1): Unable to contact slurm controller")

    with pytest.raises(SlurmError, match="Unable to contact"):
        ask_node_jobs(down, [5], "gpu1")


class Slurm:
    """Slurm's answer, as the test sets it; `None` answers: Slurm cannot be reached."""

    def __init__(self) -> None:
        self.answer: Mapping[int, NodeJob] | None = {}
        self.asked: list[list[int]] = []

    def __call__(self, ids: list[int]) -> Mapping[int, NodeJob]:
        self.asked.append(ids)
        if self.answer is None:
            raise SlurmError("squeue timed out after 30s")
        return self.answer


class Node:
    """Node gpu1's agent asking `slurm` every tick, shipping into `store` each tick."""

    def __init__(self, tmp_path: Path, store: Store) -> None:
        self.clock = FixedClock(T0)
        self.gpus = FakeGpuSource(DEVICES, self.clock, util={GPU0: lambda t: 80.0})
        self.node_dir = tmp_path / "gpu1"
        self.slurm = Slurm()
        spool = Spool(tmp_path / "spool.db")
        self.agent = NodeAgent(
            "gpu1",
            self.node_dir,
            self.gpus,
            spool,
            GRES,
            interval=STEP,
            period=60,
            clock=self.clock,
            pid_job=lambda pid: pid // 1000,
            pid_owner=lambda pid: f"user{pid // 1000}",
            stat=stat_by_minor,
            liveness=JobLiveness(self.slurm, STEP, in_background=False),
        )
        self.store = store
        self.shipper = Shipper(spool, store, "gpu1")

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.clock.advance(STEP)
            self.agent.tick()
            self.shipper.drain()

    def summary(self, job: int) -> float:
        """The GPU-seconds of the job's one summary (on GPU 0)."""
        s = job_gpu_summaries.c
        query = sa.select(s.gpu_seconds).where(s.job_id == job)
        with self.store.reading("test") as conn:
            rows = conn.execute(query).all()
        assert len(rows) == 1, rows
        return float(rows[0][0])

    def job(self, job: int) -> tuple[str, float | None]:
        """The store's (state, end time) of the job."""
        j = jobs.c
        with self.store.reading("test") as conn:
            state, end = conn.execute(sa.select(j.state, j.end_time).where(j.job_id == job)).one()
        return str(state), None if end is None else float(end)

    def seconds_after(self, job: int, when: float) -> float:
        """Covered seconds of the job's GPU-0 intervals that begin at or after `when`."""
        t = gpu_intervals.c
        query = sa.select(sa.func.sum(t.covered_seconds)).where(
            t.job_id == job, t.slot_id == GPU0, t.period_start >= when
        )
        with self.store.reading("test") as conn:
            return float(conn.execute(query).scalar_one() or 0.0)


@pytest.fixture
def node(tmp_path: Path, store: Store) -> Node:
    return Node(tmp_path, store)


def test_a_job_whose_node_failed_is_closed_at_slurms_end(node: Node) -> None:
    start_job(node.node_dir, 7, [0], T0)
    node.slurm.answer = {7: NodeJob("RUNNING", True, None)}
    node.run(6)
    assert node.job(7) == ("RUNNING", None)
    # slurmd died at T0 + 50; Slurm ended the job NODE_FAIL at T0 + 65; no epilog ran.
    node.slurm.answer = {7: NodeJob("NODE_FAIL", False, T0 + 65)}
    node.run(3)
    assert node.summary(7) == 65.0
    assert node.job(7) == ("NODE_FAIL", T0 + 65)
    assert not list((node.node_dir / "bindings").glob("7.*"))
    # The node runs on: its readings are nobody's, not the dead job's.
    node.slurm.answer = {}
    node.run(12)
    assert node.seconds_after(7, T0 + 120) == 0.0
    assert node.summary(7) == 65.0
    # The next job on the same GPU is recorded with readings of its own.
    start_job(node.node_dir, 8, [0], node.clock.now)
    node.slurm.answer = {8: NodeJob("RUNNING", True, None)}
    node.run(6)
    end_job(node.node_dir, 8, node.clock.now)
    node.run(1)
    s = job_gpu_summaries.c
    with node.store.reading("test") as conn:
        seconds, missing, util = conn.execute(
            sa.select(s.gpu_seconds, s.missing_seconds, s.util_mean_percent).where(s.job_id == 8)
        ).one()
    assert seconds == pytest.approx(60.0)
    assert missing == 0.0
    assert util == pytest.approx(80.0)


def test_a_job_slurm_no_longer_holds_closes_when_last_seen_running(node: Node) -> None:
    start_job(node.node_dir, 7, [0], T0)
    node.slurm.answer = {7: NodeJob("RUNNING", True, None)}
    node.run(4)  # Slurm last said it runs at T0 + 40
    node.slurm.answer = {}  # its record aged out (MinJobAge) while slurmd was away
    node.run(2)
    assert node.summary(7) == 40.0
    assert node.job(7)[0] == "COMPLETED"  # no word from Slurm: the hooks' state


def test_no_answer_from_slurm_closes_nothing(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    start_job(node.node_dir, 7, [0], T0)
    node.slurm.answer = None
    with caplog.at_level(logging.WARNING):
        node.run(5)
    assert node.job(7) == ("RUNNING", None)
    assert list((node.node_dir / "bindings").glob("7.*"))
    assert "cannot ask Slurm which jobs still run here: squeue timed out" in caplog.text
    # A job that ends by its epilog needs no question at all.
    end_job(node.node_dir, 7, node.clock.now)
    node.run(1)
    assert node.summary(7) == pytest.approx(50.0)
    asked = len(node.slurm.asked)
    node.run(3)
    assert len(node.slurm.asked) == asked


def test_a_job_bound_after_the_question_is_not_judged_by_its_answer(node: Node) -> None:
    node.slurm.answer = {}
    start_job(node.node_dir, 9, [0], T0 + STEP)  # its prolog ran as Slurm was asked
    node.run(1)
    assert node.job(9) == ("RUNNING", None)
    assert list((node.node_dir / "bindings").glob("9.*"))


def test_a_slow_slurm_never_delays_a_tick(node: Node) -> None:
    """Asked in a thread of its own: the answer is judged at the first tick after it came."""
    import threading

    release = threading.Event()
    answered: list[int] = []

    def slow(ids: list[int]) -> Mapping[int, NodeJob]:
        release.wait(10)
        answered.append(len(ids))
        return {7: NodeJob("NODE_FAIL", False, T0 + 25)}

    start_job(node.node_dir, 7, [0], T0)
    node.agent.liveness = JobLiveness(slow, STEP)
    node.run(3)  # the question is out, unanswered: the ticks go on
    assert node.job(7) == ("RUNNING", None)
    release.set()
    deadline = time.monotonic() + 10
    while node.job(7)[0] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.01)
        node.run(1)
    node.run(1)  # the tick after the close summarizes the run
    assert answered == [1]
    assert node.summary(7) == 25.0


def test_a_job_requeued_after_its_node_failed_ends_here_where_sacct_says() -> None:
    """squeue shows it pending (no end); sacct -D keeps the run that ended on this node."""
    asked: list[list[str]] = []

    def slurm(argv: Sequence[str]) -> str:
        asked.append(list(argv))
        if argv[0] == "squeue":
            return "123|PENDING|2027-01-16T00:00:00|\n124|RUNNING|2027-01-16T00:00:00|gpu1\n"
        return (
            "123|2027-01-15T07:50:00|gpu1\n"  # the run that ended here, NODE_FAIL
            "123|2027-01-15T07:20:00|gpu2\n"  # an earlier run elsewhere
            "123|Unknown|\n"  # the next run, pending
        )

    jobs = ask_node_jobs(slurm, [123, 124], "gpu1")
    assert jobs[123] == NodeJob(
        "PENDING", False, parse_node_jobs("1|FAILED|2027-01-15T07:50:00|gpu1", "gpu1")[1].end
    )
    assert jobs[124] == NodeJob("RUNNING", True, None)
    assert asked[1][:3] == ["sacct", "-D", "-X"] and "--jobs=123" in asked[1]

    def no_sacct(argv: Sequence[str]) -> str:
        if argv[0] == "squeue":
            return "123|PENDING|2027-01-16T00:00:00|\n"
        raise SlurmError("sacct failed (exit 1): slurmdbd not responding")

    assert ask_node_jobs(no_sacct, [123], "gpu1") == {123: NodeJob("PENDING", False, None)}
