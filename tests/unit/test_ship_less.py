"""Ship less (issue 16): an agent's activity rows ship when they change, heartbeats between.

An agent over fake GPUs ships every tick into a real SQLite store; the controller's view
is `Store.activity()` (rows carried to the node's heartbeat) judged by the idle rule, as
the controller does it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_gpu.config import Config
from slurm_gpu.config.policy import ControllerSettings
from slurm_gpu.durations import Duration
from slurm_gpu.models import Action, GpuActivity, GpuDevice, SlurmJob, Verdict
from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.outbox import decode_heartbeat
from slurm_gpu.node.shipper import Shipper
from slurm_gpu.node.spool import Spool
from slurm_gpu.policy.rules import evaluate
from slurm_gpu.slurm.gres import GresGpuFile
from slurm_gpu.store import Store
from slurm_gpu.testing import FakeGpuSource, FixedClock

T0 = 1_800_000_000.0
STEP = 30.0  # [node] interval here
MIN = 60.0
GIB = 2**30
DEVICES = [
    GpuDevice("GPU-0", "Fake A100", 0, 0, "00:01", 80 * GIB),
    GpuDevice("GPU-1", "Fake A100", 1, 1, "00:02", 80 * GIB),
]
GRES = [GresGpuFile(0, "/dev/nvidia0", "a100"), GresGpuFile(1, "/dev/nvidia1", "a100")]


class DeviceStat:
    def __init__(self, rdev: int) -> None:
        self.st_rdev = rdev


def stat_by_minor(path: str) -> os.stat_result:
    return DeviceStat(os.makedev(195, int(path.rsplit("nvidia", 1)[1])))  # type: ignore[return-value]


def hook_file(path: Path, fields: dict[str, str], mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in fields.items()) + "end=1\n")
    os.utime(path, (mtime, mtime))


class Node:
    """Node gpu1: an agent over two fake GPUs, shipping each tick into `store`."""

    def __init__(self, tmp_path: Path, store: Store, refresh: float = 3600.0) -> None:
        self.clock = FixedClock(T0)
        self.gpus = FakeGpuSource(DEVICES, self.clock)
        self.node_dir = tmp_path / "gpu1"
        self.spool = Spool(tmp_path / "spool.db")
        self.agent = NodeAgent(
            "gpu1",
            self.node_dir,
            self.gpus,
            self.spool,
            GRES,
            interval=STEP,
            period=60,
            clock=self.clock,
            pid_job=lambda pid: pid // 1000,
            stat=stat_by_minor,
            activity_refresh=refresh,
        )
        self.store = store
        self.shipper = Shipper(self.spool, store, "gpu1")
        self.queued: list[int] = []  # activity rows queued, per tick
        self.kinds: list[list[str]] = []  # activity and heartbeat rows queued, per tick

    def start(self, job: int, index: int, at: float) -> None:
        fields = {"job_id": str(job), "uid": "1001", "user": "alice", "account": "physics"}
        fields["partition"] = "gpu"
        hook_file(
            self.node_dir / "bindings" / f"{job}.{index}", {**fields, "gpu_index": str(index)}, at
        )
        started = {**fields, "gpu_indices": str(index)}
        hook_file(self.node_dir / "events" / f"{job}.started.1", started, at)

    def tick(self) -> None:
        """One tick, then the shipper's drain."""
        self.clock.advance(STEP)
        self.queued.append(self.agent.tick().activity)
        pending = self.spool.pending(10**6)
        self.kinds.append([r.kind for r in pending if r.kind in ("activity", "heartbeat")])
        self.shipper.drain()

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.tick()


def config() -> Config:
    base = Config()
    node = dataclasses.replace(base.node, interval=Duration(STEP))
    return dataclasses.replace(base, node=node, controller=ControllerSettings(timezone="UTC"))


def job(job_id: int, index: int, start: float) -> SlurmJob:
    return SlurmJob(
        job_id=job_id,
        user="alice",
        account="physics",
        partition="gpu",
        state="RUNNING",
        name="train",
        qos="normal",
        start_time=start,
        nodes=("gpu1",),
        gpus=(("gpu1", (index,)),),
        gpu_count=1,
    )


def verdicts(store: Store, jobs: list[SlurmJob], now: float) -> list[Verdict]:
    """The controller's cycle at `now`: the store's activity of the jobs, the idle rule."""
    return evaluate(jobs, store.activity([j.job_id for j in jobs]), now, config())


def the_row(store: Store, job_id: int) -> GpuActivity:
    (row,) = store.activity([job_id])
    return row


@pytest.fixture
def node(tmp_path: Path, store: Store) -> Node:
    return Node(tmp_path, store)


def test_idle_job_ships_one_row_then_heartbeats_only(node: Node) -> None:
    """An idle job for 100 ticks: one activity row (the first), then nothing but heartbeats."""
    node.start(7, 0, T0 + 5)
    node.run(100)

    assert [["activity", "heartbeat"]] + [["heartbeat"]] * 99 == node.kinds


def test_idle_job_seen_by_the_controller_fresh_with_its_true_idle_time(node: Node) -> None:
    """Store.activity says read at the newest tick; the idle rule warns for the true idle time.

    The job started at T0+5 and never used its GPU: at T0+47.5 min its GPU has been idle
    for 47.5 min - 5 s, though its one row was read at its first tick.
    """
    node.start(7, 0, T0 + 5)
    node.run(95)  # up to T0 + 47.5 min
    now = node.clock.now + 2

    row = the_row(node.store, 7)
    (verdict,) = verdicts(node.store, [job(7, 0, T0 + 5)], now)
    assert (node.clock.now, None, 0.0) == (
        row.last_reading,
        row.last_active,
        row.util_recent_percent,
    )
    assert Action.WARN == verdict.action
    assert now - (T0 + 5) == dict(verdict.details)["idle_seconds"]


def test_busy_job_stays_active_with_few_rows(node: Node) -> None:
    """A job at 80% for 100 ticks ships one row; the controller sees it active now."""
    node.gpus.util["GPU-0"] = lambda t: 80.0
    node.start(7, 0, T0 + 5)
    node.run(100)
    now = node.clock.now + 2

    row = the_row(node.store, 7)
    assert 1 == sum(node.queued)
    assert (node.clock.now, 80.0) == (row.last_reading, row.util_recent_percent)
    assert [] == verdicts(node.store, [job(7, 0, T0 + 5)], now)


def test_job_going_idle_ships_at_once_and_is_idle_from_its_last_busy_sample(node: Node) -> None:
    """Busy until T0+10 min, then 0%: a row that tick; idle counted from the last busy second."""
    busy_until = T0 + 10 * MIN
    node.gpus.util["GPU-0"] = lambda t: 80.0 if t <= busy_until else 0.0
    node.start(7, 0, T0 + 5)
    node.run(20)  # to T0+10 min: busy
    node.tick()  # (T0+10 min, T0+10.5 min]: idle
    went_idle = node.queued[-1]
    node.run(100)  # to T0+60.5 min
    now = node.clock.now

    row = the_row(node.store, 7)
    (verdict,) = verdicts(node.store, [job(7, 0, T0 + 5)], now)
    assert (1, 2) == (went_idle, sum(node.queued))
    assert (node.clock.now, busy_until, 0.0) == (
        row.last_reading,
        row.last_active,
        row.util_recent_percent,
    )
    assert now - busy_until == dict(verdict.details)["idle_seconds"]


def test_stopped_agent_leaves_its_jobs_unknown_never_idle(node: Node) -> None:
    """No heartbeat after the agent stops: 2 min later its idle job is stale, not idle."""
    node.start(7, 0, T0 + 5)
    node.run(100)
    last_tick = node.clock.now
    now = last_tick + 2 * MIN  # beyond 3 intervals (90 s) without a heartbeat

    (verdict,) = verdicts(node.store, [job(7, 0, T0 + 5)], now)
    assert last_tick == the_row(node.store, 7).last_reading
    assert (Action.NONE, 1) == (verdict.action, dict(verdict.details)["stale_gpus"])


def test_lost_gpu_is_left_out_of_the_heartbeat_and_its_job_goes_stale(node: Node) -> None:
    """GPU 1 lost after T0+44 min: 2 min later its job is unknown, last read at T0+44 min.

    The other job, on GPU 0, is still seen idle (and warned).
    """
    node.start(7, 0, T0 + 5)
    node.start(8, 1, T0 + 5)
    node.run(88)  # to T0+44 min
    node.gpus.lost.add("GPU-1")
    node.run(4)  # to T0+46 min
    now = node.clock.now + 2

    jobs = [job(7, 0, T0 + 5), job(8, 1, T0 + 5)]
    judged = {v.job_id: v for v in verdicts(node.store, jobs, now)}
    assert T0 + 44 * MIN == the_row(node.store, 8).last_reading
    assert (Action.NONE, 1) == (judged[8].action, dict(judged[8].details)["stale_gpus"])
    assert "GPU 1 on gpu1 last read 2 min ago" in judged[8].reason
    assert Action.WARN == judged[7].action


def test_heartbeat_names_the_slots_read(node: Node) -> None:
    """The tick's heartbeat: its end, and the GPUs read (a lost one left out)."""
    node.gpus.lost.add("GPU-1")
    node.clock.advance(STEP)
    node.agent.tick()

    (payload,) = [p for _, k, _, p in node.spool.pending(10**6) if k == "heartbeat"]
    assert ("gpu1", T0 + STEP, ("GPU-0",)) == dataclasses.astuple(decode_heartbeat(payload))


def test_unchanged_row_ships_again_after_activity_refresh(tmp_path: Path, store: Store) -> None:
    """[node] activity_refresh 5 min, 30 s ticks: an idle job's row every 10th tick."""
    node = Node(tmp_path, store, refresh=5 * MIN)
    node.start(7, 0, T0 + 5)
    node.run(30)

    assert ([1] + [0] * 9) * 3 == node.queued


def util(percent: float) -> Callable[[Node], None]:
    return lambda n: n.gpus.util.__setitem__("GPU-0", lambda t: percent)


def memory(used: int) -> Callable[[Node], None]:
    return lambda n: setattr(n.gpus, "mem_used_bytes", used)


@pytest.mark.parametrize(
    ("change", "rows"),
    [
        pytest.param(util(4.0), 0, id="util 0 -> 4: under 5 points, idle either way"),
        pytest.param(util(5.0), 1, id="util 0 -> 5: active now"),
        pytest.param(memory(GIB + 4 * GIB - 1), 0, id="memory: under 5% of 80 GiB more"),
        pytest.param(memory(GIB + 4 * GIB), 1, id="memory: 5% of 80 GiB more"),
    ],
)
def test_what_ships_a_row_at_once(node: Node, change: Callable[[Node], None], rows: int) -> None:
    """An idle job's GPU changes: a row ships that tick exactly when the change matters."""
    node.start(7, 0, T0 + 5)
    node.run(3)
    change(node)
    node.tick()

    assert rows == node.queued[-1]


def test_a_sporadic_busy_sample_ships_its_time(node: Node) -> None:
    """A busy second each window whose mean stays below 5%: each tick ships its last_active.

    The store could not know of it otherwise, and would count the job idle.
    """
    node.gpus.util["GPU-0"] = lambda t: 100.0 if int(t) % 30 == 15 else 0.0  # mean 3.3%
    node.start(7, 0, T0 + 5)
    node.run(20)
    now = node.clock.now + 2

    row = the_row(node.store, 7)
    assert (node.clock.now, node.clock.now - 15) == (row.last_reading, row.last_active)
    assert [1] * 20 == node.queued
    assert [] == verdicts(node.store, [job(7, 0, T0 + 5)], now)


def test_heartbeat_ships_behind_the_activity_rows_of_its_tick(node: Node) -> None:
    """A replaced row moves behind the rows queued before it: a tick's heartbeat is last.

    Job 8's first row is queued after the first heartbeat; when job 8 turns busy, its new
    row must still reach the store before the heartbeat of that tick, or the store would
    carry its idle row to that tick. Shipped one row a batch, it never does.
    """
    node.start(7, 0, T0 + 5)
    node.clock.advance(STEP)
    node.agent.tick()  # job 7's first row, the heartbeat
    node.start(8, 1, T0 + 35)
    node.clock.advance(STEP)
    node.agent.tick()  # job 8's first row (idle), the heartbeat again
    node.gpus.util["GPU-1"] = lambda t: 50.0
    node.clock.advance(STEP)
    node.agent.tick()  # job 8's row again (busy now), the heartbeat again
    busy_at = node.clock.now

    pending = node.spool.pending(10**6)
    kinds = [(r.kind, r.key) for r in pending if r.kind in ("activity", "heartbeat")]
    assert [
        ("activity", "activity:7:GPU-0"),
        ("activity", "activity:8:GPU-1"),
        ("heartbeat", "heartbeat:gpu1"),
    ] == kinds
    one_by_one = Shipper(node.spool, node.store, "gpu1", batch_size=1)
    views = []
    while one_by_one.ship_once():
        views.append(
            {r.job_id: (r.last_reading, r.util_recent_percent) for r in node.store.activity()}
        )
    # Job 7 seen read at the third tick (its heartbeat) only beside job 8's busy row of it.
    vouched = [v for v in views if v.get(7, (None,))[0] == busy_at]
    assert vouched and all((busy_at, 50.0) == v[8] for v in vouched)


def test_a_replaced_outbox_row_moves_behind_the_rows_queued_before_it(tmp_path: Path) -> None:
    """Spool.queue replaces a row by key and gives it the newest place in the outbox."""
    spool = Spool(tmp_path / "spool.db")
    with spool.transaction() as db:
        for key in ("heartbeat:gpu1", "activity:7:GPU-0", "activity:8:GPU-1"):
            Spool.queue(db, "x", key, {})
    with spool.transaction() as db:
        Spool.queue(db, "x", "heartbeat:gpu1", {"again": 1})

    order = [(r.key, r.payload) for r in spool.pending(10)]
    assert [
        ("activity:7:GPU-0", "{}"),
        ("activity:8:GPU-1", "{}"),
        ("heartbeat:gpu1", '{"again": 1}'),
    ] == order
