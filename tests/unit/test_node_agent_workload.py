"""One scripted workload through the agent: every shipped row, as the agent shipped it.

Several jobs on a GPU with GPM ("B", Slurm index 0) and one without ("A", index 1), job
edges inside read windows (reads at T0+3+10k, so period boundaries fall inside windows),
two jobs' edges inside one window, a job on both GPUs, a stray process, a lost read and
an agent gap. The summaries are checked against figures computed here from the workload's
own functions; every outbox row (intervals, summaries, activity, events) is checked
against the rows the agent shipped before its tick was made cheaper
(data/agent_workload_outbox.json): the performance work must not change one bit.
Regenerate that file only for a change meant to alter results:
`python -m tests.unit.test_node_agent_workload > tests/unit/data/agent_workload_outbox.json`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_gpu.models import GpuInterval, GpuProcess, JobGpuSummary
from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.outbox import decode_interval, decode_physical, decode_summary
from tests.unit.test_node_agent import T0, end_job, make_agent, start_job

GOLDEN = Path(__file__).parent / "data" / "agent_workload_outbox.json"
FIRST_READ = T0 + 3  # reads at T0+3, T0+13, ...: every minute's boundary inside a window


def util_b(t: float) -> float:
    return float((int(t) * 7) % 101)


def util_a(t: float) -> float:
    return 90.0 if int(t) % 3 else 20.0


def sm_b(t: float) -> float:
    return 20.0 + int(t) % 37


def tensor_b(t: float) -> float:
    return 60.0 if int(t) % 60 < 30 else 5.0


def gpm_b(t: float) -> dict[str, float]:
    # occupancy is not measured (None); DRAM constant
    return {
        "sm_active_percent": sm_b(t),
        "tensor_active_percent": tensor_b(t),
        "dram_bw_percent": 12.5,
    }


# job: (Slurm indices, start, end) relative to T0
JOBS = {
    7: ([0], 15.0, 105.0),
    8: ([1], 25.5, 175.0),
    9: ([0], 107.0, 235.0),  # starts in the window where job 7 ended
    10: ([0, 1], 290.0, 410.0),  # spans the agent's gap
}


def run_workload(tmp_path: Path) -> NodeAgent:
    agent, clock, gpus, node_dir = make_agent(tmp_path)
    clock.now = FIRST_READ
    gpus.util.update({"B": util_b, "A": util_a})
    gpus.gpm["B"] = gpm_b
    gpus.processes["A"] = (GpuProcess(8001, 2**30), GpuProcess(5005, 2**20))  # 5005: job 5, a stray
    agent.source = gpus
    agent.devices = gpus.devices()
    edges = sorted(
        [(T0 + s, "start", j) for j, (_, s, _) in JOBS.items()]
        + [(T0 + e, "end", j) for j, (_, _, e) in JOBS.items()]
    )
    agent.tick()
    while clock.now < T0 + 440:
        nxt = clock.now + 10
        for at, what, job in edges:
            if clock.now < at <= nxt:
                if what == "start":
                    start_job(node_dir, job, JOBS[job][0], at)
                else:
                    end_job(node_dir, job, at)
        clock.now = nxt
        if clock.now == T0 + 143:
            gpus.lost.add("A")  # one read of A fails
        elif clock.now == T0 + 153:
            gpus.lost.discard("A")
        if T0 + 343 < clock.now < T0 + 393:
            continue  # the agent is down: 50 s between reads (beyond 3 intervals)
        if clock.now == T0 + 183:
            gpus.processes["A"] = ()
        agent.tick()
    return agent


def shipped(agent: NodeAgent) -> list[list[str]]:
    """Every outbox row of the kinds shipped before GPU slots (not `physical`, issue 14)."""
    rows = agent.spool.pending(10**6)
    return [[kind, key, payload] for _, kind, key, payload in rows if kind != "physical"]


def test_every_shipped_row_is_the_one_shipped_before(tmp_path: Path) -> None:
    rows = shipped(run_workload(tmp_path))

    expected = json.loads(GOLDEN.read_text())
    assert len(expected) == len(rows)
    for want, got in zip(expected, rows, strict=True):
        assert want == got


def test_each_gpu_period_has_its_physical_totals_from_its_intervals(tmp_path: Path) -> None:
    """Whole GPUs: one physical row per GPU and period, the totals of its interval rows."""
    agent = run_workload(tmp_path)
    rows = agent.spool.pending(10**6)
    physical = [decode_physical(p) for _, k, _, p in rows if k == "physical"]
    intervals = [decode_interval(p) for _, k, _, p in rows if k == "interval"]
    by_period: dict[tuple[str, float], list[GpuInterval]] = {}
    for interval in intervals:
        by_period.setdefault((interval.gpu_uuid, interval.period_start // 60), []).append(interval)
    periods = [(row.gpu_uuid, row.period_start // 60) for row in physical]

    assert sorted(by_period) == sorted(periods)  # one each, no more
    for row in physical:
        mine = by_period[(row.gpu_uuid, row.period_start // 60)]
        energies = [i.energy_joules for i in mine if i.energy_joules is not None]
        assert (min(i.period_start for i in mine), max(i.period_end for i in mine)) == (
            row.period_start,
            row.period_end,
        )
        assert abs(row.covered_seconds - sum(i.covered_seconds for i in mine)) < 1e-9
        assert row.energy_joules == (pytest.approx(sum(energies)) if energies else None)
        assert row.temperature_max_celsius == max(
            (i.temperature_max_celsius for i in mine if i.temperature_max_celsius is not None),
            default=None,
        )
        assert row.mem_used_max_bytes == max(
            (i.mem_used_max_bytes for i in mine if i.mem_used_max_bytes is not None), default=None
        )
        read = any(i.power_mean_watts is not None for i in mine)  # a read inside the period
        assert row.power_mean_watts == (pytest.approx(100.0) if read else None)  # the fake's


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def gpm_truth(level: Callable[[float], float], start: float, end: float) -> float:
    """Each read window's mean (its whole seconds) for the job's seconds inside it."""
    total = 0.0
    w0 = FIRST_READ
    while w0 < end:
        w1 = w0 + 10
        overlap = min(w1, end) - max(w0, start)
        if overlap > 0:
            total += overlap * mean([level(float(t)) for t in range(int(w0) + 1, int(w1) + 1)])
        w0 = w1
    return total / (end - start)


def test_summaries_are_the_truth_of_the_workload(tmp_path: Path) -> None:
    """Jobs 7 and 9 (read throughout, on B): covered, util and GPM means from the functions."""
    agent = run_workload(tmp_path)
    summaries = {
        (s.job_id, s.gpu_uuid): s
        for s in (decode_summary(p) for k, _, p in shipped(agent) if k == "summary")
    }

    for job in (7, 9):
        _, start, end = JOBS[job]
        s: JobGpuSummary = summaries[(job, "B")]
        seconds = [float(t) for t in range(int(T0 + start) + 1, int(T0 + end) + 1)]
        assert (end - start, 0.0) == (s.gpu_seconds, s.missing_seconds)
        assert s.util_mean_percent is not None and s.sm_active_mean_percent is not None
        assert abs(s.util_mean_percent - mean([util_b(t) for t in seconds])) < 1e-9
        assert abs(s.sm_active_mean_percent - gpm_truth(sm_b, T0 + start, T0 + end)) < 1e-9
        assert (end - start, None, 12.5) == (
            s.gpm_seconds,
            s.sm_occupancy_mean_percent,
            s.dram_bw_mean_percent,
        )
    eight = summaries[(8, "A")]  # no GPM; one read lost (T0+133 .. T0+143 missing)
    assert (0.0, None, None, 10.0) == (
        eight.gpm_seconds,
        eight.sm_active_mean_percent,
        eight.dram_bw_mean_percent,
        eight.missing_seconds,
    )
    # The agent's gap: no read after T0+343 until T0+393, which claims only its own 10 s:
    # 40 s missing, not idle.
    ten = summaries[(10, "B")]
    assert (120.0, 40.0) == (ten.gpu_seconds, ten.missing_seconds)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        json.dump(shipped(run_workload(Path(tmp))), sys.stdout, indent=0)
        print()
