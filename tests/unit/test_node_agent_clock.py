"""The agent's clock (issue 25 item 3): a wall clock step never stores GPU time twice.

The agent over fake GPUs with two injected clocks: the wall clock (a `FixedClock` the
fake GPUs stamp their samples with, as NVML stamps them with the system clock) and a
monotonic one, moved together a tick at a time; a test steps the wall clock alone. Every
tick ships into a real SQLite store, whose invariants `slurm-gpu db check` reads
(slurm_gpu/store/checks.py): no overlapping interval on a slot, none negative.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pytest
import sqlalchemy as sa

from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.shipper import Shipper
from slurm_gpu.node.spool import Spool
from slurm_gpu.store import Store, checks
from slurm_gpu.store.schema import gpu_intervals, job_gpu_summaries
from slurm_gpu.testing import FakeGpuSource, FixedClock
from tests.unit.test_node_agent import DEVICES, GRES, end_job, start_job, stat_by_minor

T0 = 1_800_000_000.0  # a round minute
M0 = 5_000.0  # the monotonic clock's reading at T0 (any: only its differences count)
STEP = 10.0  # [node] interval
GPU0 = "B"  # Slurm GPU 0 (minor 0)


class Node:
    """Node gpu1: an agent with a wall and a monotonic clock, shipping into `store`."""

    def __init__(self, tmp_path: Path, store: Store) -> None:
        self.wall = FixedClock(T0)
        self.mono = FixedClock(M0)
        self.gpus = FakeGpuSource(DEVICES, self.wall, util={GPU0: lambda t: 80.0})
        self.node_dir = tmp_path / "gpu1"
        self.tmp_path = tmp_path
        self.store = store
        self.spool = Spool(tmp_path / "spool.db")
        self.agent = self.new_agent()
        self.shipper = Shipper(self.spool, store, "gpu1")

    def new_agent(self) -> NodeAgent:
        return NodeAgent(
            "gpu1",
            self.node_dir,
            self.gpus,
            self.spool,
            GRES,
            interval=STEP,
            period=60,
            clock=self.wall,
            monotonic=self.mono,
            pid_job=lambda pid: pid // 1000,
            pid_owner=lambda pid: f"user{pid // 1000}",
            stat=stat_by_minor,
        )

    @property
    def held(self) -> float:
        """Seconds since T0 on the monotonic clock."""
        return self.mono.now - M0

    def tick(self, wall_step: float = 0.0) -> None:
        """STEP seconds pass (the wall clock also steps `wall_step`), a tick, a drain."""
        self.mono.advance(STEP)
        self.wall.advance(STEP + wall_step)
        self.agent.tick()
        self.shipper.drain()

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.tick()

    def rows(self, uuid: str = GPU0) -> list[tuple[float, float, int | None, float]]:
        """The store's intervals of one GPU: (start, end, job, covered seconds), in order."""
        t = gpu_intervals.c
        query = (
            sa.select(t.period_start, t.period_end, t.job_id, t.covered_seconds)
            .where(t.slot_id == uuid)
            .order_by(t.period_start)
        )
        with self.store.reading("test") as conn:
            return [(float(a), float(b), j, float(c)) for a, b, j, c in conn.execute(query)]

    def job_seconds(self, job: int) -> float:
        return sum(c for _, _, j, c in self.rows() if j == job)

    def samples(self, job: int) -> int:
        """Utilization samples in the job's intervals (the fake GPU samples every second)."""
        t = gpu_intervals.c
        query = sa.select(sa.func.sum(t.util_sample_count)).where(t.job_id == job)
        with self.store.reading("test") as conn:
            return int(conn.execute(query).scalar_one())

    def summary(self, job: int) -> tuple[float, float]:
        """The job's summary on GPU 0: (gpu_seconds, missing_seconds)."""
        s = job_gpu_summaries.c
        query = sa.select(s.gpu_seconds, s.missing_seconds).where(s.job_id == job)
        with self.store.reading("test") as conn:
            ((seconds, missing),) = conn.execute(query).all()
        return float(seconds), float(missing)


@pytest.fixture
def node(tmp_path: Path, store: Store) -> Node:
    return Node(tmp_path, store)


def assert_clean(node: Node) -> None:
    """The store holds no overlapping and no negative interval (`slurm-gpu db check`)."""
    assert checks.interval_overlaps(node.store).overlaps.total == 0
    assert checks.negative_intervals(node.store).total == 0
    for uuid in (d.uuid for d in DEVICES):
        rows = node.rows(uuid)
        assert rows, uuid
        for (_, end, *_), (start, *_) in itertools.pairwise(rows):
            assert start >= end


def steps(caplog: pytest.LogCaptureFixture, word: str) -> int:
    return sum(f"wall clock stepped {word}" in r.getMessage() for r in caplog.records)


def test_a_step_back_and_forward_mid_job_store_the_time_held_once(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """Back 30 s, then forward 30 s, while job 7 runs: its seconds are the time it held.

    Before the fix the step back made the agent read (now - interval, now] again: rows
    over wall time already written, and job 7 (started after the new wall time) read as
    unallocated.
    """
    caplog.set_level(logging.INFO, "slurm_gpu.node.agent")
    node.run(1)
    start_job(node.node_dir, 7, [0], T0 + 15)
    started = node.held + 5  # T0 + 15 on both clocks
    node.run(5)  # to T0 + 60
    node.tick(wall_step=-30.0)  # NTP: the wall clock ran 30 s ahead
    node.run(6)
    node.tick(wall_step=30.0)  # and back again
    node.run(3)
    ended = node.held + 5
    end_job(node.node_dir, 7, node.wall.now + 5)
    node.run(20)  # the job's periods are sealed and shipped
    assert steps(caplog, "back") == 1
    assert steps(caplog, "forward") == 1
    assert_clean(node)
    assert node.job_seconds(7) == pytest.approx(ended - started, abs=STEP)
    # each second's sample counted once, those stamped by the stepped wall clock too
    assert node.samples(7) == pytest.approx(node.job_seconds(7), abs=1)
    gpu = node.rows()
    # every second of the GPU since the first read is covered once: no gap, no double
    assert sum(c for *_, c in gpu) == pytest.approx(gpu[-1][1] - gpu[0][0])


def test_a_step_forward_mid_job_is_missing_time_not_measured(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """The 30 s the wall clock jumps were never read: no interval spans them."""
    node.run(1)
    start_job(node.node_dir, 7, [0], T0 + 15)
    started = node.held + 5
    node.run(5)
    node.tick(wall_step=30.0)
    node.run(6)
    ended = node.held + 5
    end_job(node.node_dir, 7, node.wall.now + 5)
    node.run(20)
    assert steps(caplog, "forward") == 1
    assert steps(caplog, "back") == 0
    assert_clean(node)
    assert node.job_seconds(7) == pytest.approx(ended - started, abs=STEP)
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(node.rows())]
    assert max(gaps) == pytest.approx(30.0)  # the jump: uncovered, i.e. missing
    # The hooks' wall times span the jump: the summary says the 30 s are missing.
    seconds, missing = node.summary(7)
    assert seconds == pytest.approx(ended - started + 30.0)
    assert missing == pytest.approx(30.0, abs=STEP)


def test_a_step_back_holds_the_monotonic_clock_until_no_job_holds_a_gpu(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """Job 7 ends while the wall clock is 30 s behind; then the agent rejoins the wall.

    The job is charged the time it held; the wall time the clock repeats on the idle node
    is not read again (missing); the intervals after it start where the last one ended.
    """
    caplog.set_level(logging.INFO, "slurm_gpu.node.agent")
    node.run(1)
    start_job(node.node_dir, 7, [0], T0 + 15)
    started = node.held + 5
    node.run(5)
    node.tick(wall_step=-30.0)
    node.run(4)
    ended = node.held + 5
    end_job(node.node_dir, 7, node.wall.now + 5)
    node.run(2)
    assert any("back on the wall clock" in r.getMessage() for r in caplog.records)
    assert node.agent.tick().time == node.wall.now  # on the wall clock again
    node.shipper.drain()
    node.run(20)
    assert steps(caplog, "back") == 1
    assert steps(caplog, "forward") == 0
    assert_clean(node)
    assert node.job_seconds(7) == pytest.approx(ended - started, abs=STEP)


def test_an_agent_started_after_a_step_back_starts_after_its_spool(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """The spool's last reads are ahead of a new agent's wall clock: nothing written twice."""
    node.run(6)
    node.wall.advance(-30.0)  # stepped back while no agent ran
    node.agent = node.new_agent()
    node.run(20)
    assert steps(caplog, "back") == 0  # nothing to compare with: the spool is the guard
    assert_clean(node)


def test_a_wall_clock_wobble_under_the_threshold_is_no_step(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """A 1 s step back: no warning, intervals on the monotonic clock, none overlapping."""
    node.run(3)
    node.tick(wall_step=-1.0)
    node.run(12)
    assert steps(caplog, "back") == 0
    assert_clean(node)


def test_the_default_monotonic_clock_of_a_test_clock_is_the_clock_itself(tmp_path: Path) -> None:
    """An agent given only a test clock runs on it (its tests step no wall clock)."""
    clock = FixedClock(T0)
    agent = NodeAgent(
        "gpu1",
        tmp_path / "gpu1",
        FakeGpuSource(DEVICES, clock),
        Spool(tmp_path / "spool.db"),
        GRES,
        clock=clock,
        stat=stat_by_minor,
    )
    assert agent.monotonic is clock
