"""Splitting a read window's energy among its pieces (node/attribution.py), issue #11.

The test bed's GPUs draw idle + (max - idle) x util; a real GPU draws close to that.
"""

from __future__ import annotations

from slurm_gpu.gpu import GpuSnapshot, UtilSample
from slurm_gpu.node.attribution import JobSpan, energy_shares, split_window

IDLE_W, MAX_W = 50.0, 250.0


def power(util: float) -> float:
    return IDLE_W + (MAX_W - IDLE_W) * util / 100


def snapshot(utils: list[float]) -> GpuSnapshot:
    """A read at t=len(utils) with one sample a second (t=1..n) and the power at the read."""
    samples = tuple(UtilSample(float(t), u) for t, u in enumerate(utils, start=1))
    return GpuSnapshot("A", float(len(utils)), samples=samples, power_watts=power(utils[-1]))


def test_job_starting_mid_window_gets_the_energy_it_drew() -> None:
    """Idle 5 s, then a job at 100% for 5 s: the job drew 1250 J of the 1500, not half."""
    utils = [0.0] * 5 + [100.0] * 5
    energy = sum(power(u) for u in utils)  # 1 s per sample
    pieces = split_window(0.0, 10.0, snapshot(utils), [JobSpan(7, 0, 5.0)], 60, 5.0, energy)
    assert [(None, 250.0), (7, 1250.0)] == [(p.job_id, p.energy_joules) for p in pieces]


def test_job_ending_mid_window_keeps_its_energy_from_the_idle_after_it() -> None:
    """A job at 80% for 4 s, then 6 s idle: it drew 4 x 210 J; the shares add up."""
    utils = [80.0] * 4 + [0.0] * 6
    energy = sum(power(u) for u in utils)
    shares = energy_shares(0.0, 10.0, [0.0, 4.0, 10.0], snapshot(utils), energy)
    assert [840.0, 300.0] == [round(s or 0.0, 6) for s in shares]


def test_uniform_load_or_no_power_is_shared_by_length() -> None:
    """Nothing to tell apart (one utilization throughout, or no power read): by length."""
    flat = snapshot([40.0] * 10)
    unread = GpuSnapshot("A", 10.0, samples=snapshot([0.0] * 5 + [90.0] * 5).samples)
    by_length = [400.0, 600.0]
    assert by_length == energy_shares(0.0, 10.0, [0.0, 4.0, 10.0], flat, 1000.0)
    assert by_length == energy_shares(0.0, 10.0, [0.0, 4.0, 10.0], unread, 1000.0)
