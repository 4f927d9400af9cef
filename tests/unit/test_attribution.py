"""Splitting a read window among its pieces (node/attribution.py): energy (issue #11), GPM.

The test bed's GPUs draw idle + (max - idle) x util; a real GPU draws close to that.
A GPM window's means cover (previous GPM sample, this one]; each piece gets its seconds of
that window at the window's means (issue #13).
"""

from __future__ import annotations

from slurm_gpu.gpu import GpmMetrics, GpuSnapshot, UtilSample
from slurm_gpu.node.attribution import JobSpan, Piece, energy_shares, gpm_span, split_window

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


# --- GPM windows (issue #13) -------------------------------------------------------------


def gpm_read(
    start: float, end: float, sm: float | None = 30.0, tensor: float | None = 60.0
) -> GpuSnapshot:
    """A read at `end` whose GPM window is (start, end] with SM 30%, tensor 60%."""
    gpm = GpmMetrics(start, end, sm_active_percent=sm, tensor_active_percent=tensor)
    return GpuSnapshot("A", end, gpm=gpm)


def gpm_of(pieces: list[Piece]) -> list[tuple[int | None, float, float | None, float | None]]:
    return [(p.job_id, p.gpm_seconds, p.sm_active_percent, p.tensor_active_percent) for p in pieces]


def test_job_starting_inside_a_gpm_window_gets_its_seconds_at_the_window_mean() -> None:
    """Job 7 starts at 4 in (0, 10]: 4 s unallocated and 6 s of job, both at the window's 30%."""
    pieces = split_window(0.0, 10.0, gpm_read(0.0, 10.0), [JobSpan(7, 0, 4.0)], 60, 5.0, None)

    assert [(None, 4.0, 30.0, 60.0), (7, 6.0, 30.0, 60.0)] == gpm_of(pieces)


def test_gpm_window_split_by_a_job_end_and_a_period_boundary() -> None:
    """(50, 70] with job 7 ending at 55 and the period boundary at 60: 5 + 5 + 10 seconds."""
    pieces = split_window(
        50.0, 70.0, gpm_read(50.0, 70.0, sm=80.0), [JobSpan(7, 0, 0.0, 55.0)], 60, 5.0, None
    )

    expected = [(7, 5.0, 80.0, 60.0), (None, 5.0, 80.0, 60.0), (None, 10.0, 80.0, 60.0)]
    assert expected == gpm_of(pieces)


def test_read_without_gpm_is_unmeasured_never_zero() -> None:
    """A GPU without GPM (or its first sample): gpm_seconds 0 and every figure None."""
    pieces = split_window(0.0, 10.0, GpuSnapshot("A", 10.0), [JobSpan(7, 0, 4.0)], 60, 5.0, None)

    assert [(None, 0.0, None, None), (7, 0.0, None, None)] == gpm_of(pieces)


def test_gpm_window_reaching_before_the_read_window_counts_only_its_part_inside() -> None:
    """A GPM sample failed last tick: the window (-10, 10] counts only (0, 10] here."""
    pieces = split_window(0.0, 10.0, gpm_read(-10.0, 10.0), [JobSpan(7, 0, 0.0)], 60, 5.0, None)

    assert [(7, 10.0, 30.0, 60.0)] == gpm_of(pieces)


def test_gpm_window_read_a_little_after_the_tick_is_aligned_to_the_tick() -> None:
    """The source read 3 ms after the agent's tick times: the window is (w0, w1], no sliver."""
    snap = GpuSnapshot(
        "A", 10.003, gpm=GpmMetrics(0.002, 10.003, sm_active_percent=30.0)
    )  # previous sample 2 ms after the previous tick, this one 3 ms after this tick

    assert (0.0, 10.0) == gpm_span(0.0, 10.0, snap)


def test_gpm_metric_not_measured_stays_none_beside_those_measured() -> None:
    """A window whose tensor metric failed: SM activity counts, tensor is None (not 0)."""
    pieces = split_window(0.0, 10.0, gpm_read(0.0, 10.0, tensor=None), [], 60, 5.0, None)

    assert [(None, 10.0, 30.0, None)] == gpm_of(pieces)
