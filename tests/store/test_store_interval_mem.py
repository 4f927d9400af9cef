# The project writes `expected == actual` (DESIGN.md); ruff calls that a Yoda condition.
"""GPU-memory GiB-seconds one way (issue 24, revision 0014): intervals carry the summary's.

A running job's memory-hours are read from its intervals (`queries.interval_totals_for`),
a finished job's from its summaries. The agent sums both from the same pieces, so the two
reads of one job agree: its memory-hours, and its cost under `[cost] unit =
"gpu_mem_hour"`, do not jump when its summary lands. Intervals without the agent's sum
(stored before 0014, or shipped by an older agent) are read as before: peak x covered.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from slurm_gpu.models import GpuDevice, GpuInterval
from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.outbox import decode_interval
from slurm_gpu.node.shipper import DecodedBatch, Shipper
from slurm_gpu.node.spool import Spool
from slurm_gpu.slurm.gres import GresGpuFile
from slurm_gpu.store import Store, queries
from slurm_gpu.testing import FakeGpuSource, FixedClock

T0 = 1_800_000_000.0  # a round minute
GIB = 2**30


def interval(start: float, mem_gib: int, mem_gib_seconds: float | None = None) -> GpuInterval:
    """A minute of job 7 on GPU-A: `mem_gib` GiB at its peak, 50 s covered."""
    return GpuInterval(
        node="gpu1", gpu_uuid="GPU-A", period_start=start, period_end=start + 60, job_id=7,
        util_mean_percent=50.0, util_max_percent=90.0, util_min_percent=10.0,
        util_sample_count=5, active_seconds=50.0, covered_seconds=50.0,
        mem_used_max_bytes=mem_gib * GIB, mem_total_bytes=80 * GIB, power_mean_watts=100.0,
        energy_joules=5000.0, temperature_max_celsius=45.0, ecc_errors_total=0,
        mem_gib_seconds=mem_gib_seconds,
    )  # fmt: skip


def test_older_agents_interval_ingests_and_reads_as_peak_x_covered(store: Store) -> None:
    """An interval payload without `mem_gib_seconds` (an older agent's) stores NULL.

    Through the direct path and the collector's bulk path alike; it reads as its peak x
    covered (4 GiB x 50 s), beside a newer row's own sum.
    """
    older = dataclasses.asdict(interval(T0, 4))
    del older["mem_gib_seconds"], older["slot_id"], older["slot_kind"], older["share"]
    del older["mig_profile"], older["measured_by"]
    decoded = decode_interval(json.dumps(older))
    store.add_intervals([decoded])
    batch = DecodedBatch(intervals=[dataclasses.replace(decoded, period_start=T0 + 60)])
    store.write_batches([("gpu1", batch)])
    store.add_intervals([interval(T0 + 120, 4, mem_gib_seconds=120.0)])

    assert [None, None, 120.0] == [i.mem_gib_seconds for i in store.intervals()]
    (totals,) = queries.interval_totals_for(store, [7])
    assert 200.0 + 200.0 + 120.0 == totals.mem_gib_seconds


@pytest.fixture
def store_at_0013(store_url: str) -> Iterator[Store]:
    old = Store(store_url, cluster="alpha")
    old.upgrade("0013")
    yield old
    old.dispose()


def test_upgrade_from_0013_keeps_intervals_read_as_peak_x_covered(store_at_0013: Store) -> None:
    """Intervals stored at 0013 survive 0014 with NULL GiB-seconds, read as before.

    The same job's intervals shipped after the upgrade add their own sums.
    """
    store = store_at_0013
    row = {k: v for k, v in dataclasses.asdict(interval(T0, 2)).items() if k != "mem_gib_seconds"}
    row.update(unallocated_pids="", slot_id="GPU-A", slot_kind="gpu", measured_by="nvml")
    with store.writing("an interval at 0013") as conn:
        assert "mem_gib_seconds" not in {
            c["name"] for c in sa.inspect(conn).get_columns("gpu_intervals")
        }
        conn.execute(sa.insert(sa.table("gpu_intervals", *map(sa.column, row))), [row])
    (before,) = queries.interval_totals_for(store, [7])  # a store at 0013 is still read

    store.upgrade("0014")
    assert "0014" == store.current_revision()
    (kept,) = store.intervals()
    (after,) = queries.interval_totals_for(store, [7])
    assert (None, 2 * 50.0, 2 * 50.0) == (
        kept.mem_gib_seconds,
        before.mem_gib_seconds,
        after.mem_gib_seconds,
    )

    store.upgrade()  # head: the write API writes the newest revision's columns
    store.add_intervals([interval(T0 + 60, 2, mem_gib_seconds=75.0)])
    (both,) = queries.interval_totals_for(store, [7])
    assert 175.0 == both.mem_gib_seconds


# --- the agent: one job through its spool, shipped ----------------------------------


def hook_file(path: Path, fields: dict[str, str], mtime: float) -> None:
    """What the prolog/epilog leave behind: key=value lines, end=1, mtime = event time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in fields.items()) + "end=1\n")
    os.utime(path, (mtime, mtime))


class _Rdev:
    def __init__(self, minor: int) -> None:
        self.st_rdev = os.makedev(195, minor)


def test_running_jobs_memory_hours_from_intervals_equal_its_summarys(
    store: Store, tmp_path: Path
) -> None:
    """Job 7's GiB-seconds read from its intervals are the number its summary says.

    Reads every 10 s: 1 GiB until T0+30, 8 GiB from T0+40, 2 GiB from T0+80; the job holds
    the GPU from T0+5 to T0+95. Charged per piece: 5 + 10 + 10 + 4 x 80 + 20 + 20 + 10 (its
    own 2 GiB carried to its end) = 395 GiB-seconds, both ways. Peak x covered would
    read 8 x 55 + 8 x 35 = 720 while it runs.
    """
    clock = FixedClock(T0)
    gpus = FakeGpuSource([GpuDevice("A", "Fake A100", 0, 0, "00:01", 80 * GIB)], clock)
    node_dir = tmp_path / "gpu1"
    agent = NodeAgent(
        "gpu1", node_dir, gpus, Spool(tmp_path / "spool.db"),
        [GresGpuFile(0, "/dev/nvidia0", "a100")], interval=10, period=60, clock=clock,
        pid_job=lambda pid: pid // 1000, pid_owner=lambda pid: f"user{pid // 1000}",
        stat=lambda path: _Rdev(int(path.rsplit("nvidia", 1)[1])),  # type: ignore[arg-type,return-value]
    )  # fmt: skip
    job = {"job_id": "7", "uid": "1001", "user": "alice", "account": "physics"}
    gpus.mem_used_bytes = GIB
    agent.tick()
    hook_file(node_dir / "bindings" / "7.0", {**job, "gpu_index": "0"}, T0 + 5)
    hook_file(node_dir / "events" / "7.started.1", {**job, "gpu_indices": "0"}, T0 + 5)
    for until, mem in ((T0 + 30, 1), (T0 + 70, 8), (T0 + 90, 2)):
        gpus.mem_used_bytes = mem * GIB
        while clock.now < until:
            clock.now += 10
            agent.tick()
    (node_dir / "bindings" / "7.0").unlink()
    hook_file(node_dir / "events" / "7.ended.2", {"job_id": "7", "exit_code": "0"}, T0 + 95)
    clock.now += 10
    agent.tick()
    Shipper(agent.spool, store, "gpu1").drain()

    (running,) = queries.interval_totals_for(store, [7])
    (summary,) = queries.summaries_for(store, [7])
    assert (395.0, 395.0) == (running.mem_gib_seconds, summary.mem_gib_seconds)
