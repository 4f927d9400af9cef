"""Splitting one GPU's read window into pieces, each belonging to one job (or none).

A window (w0, w1] between two reads can hold the end of one job and the start of the
next, and can straddle the boundary of a shipping period. NVML's utilization samples are
timestamped, so each piece gets exactly the samples taken inside it: a job's mean is not
diluted by the idle seconds before it started. A point-in-time reading (memory in use,
power draw) was taken at w1, so it belongs to the piece that ends at w1 only: a job whose
span ended earlier in the window never gets the memory of the job that followed it on the
GPU (issue #11). Its GPU-memory-seconds carry the job's own newest reading forward instead.
The energy the GPU's counter grew by over the window is shared by what each piece drew, not
by its length alone: a GPU's power is close to affine in its utilization (idle power plus a
part per percent), so the window's energy and the power read at w1 give both terms, and a
busy job next to idle time gets its own share (`energy_shares`).
GPM metrics (issue #13) are means over their own window, (previous GPM sample, this one]:
each piece gets the part of that window it overlaps (`gpm_seconds`) and the window's means
(`gpm_span`, `Piece.gpm_seconds`).
Pure functions; no I/O.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

from slurm_gpu.activity import is_active
from slurm_gpu.gpu import GpmMetrics, GpuSnapshot
from slurm_gpu.units import GIB


@dataclass(frozen=True)
class JobSpan:
    """A job's hold on one GPU: from its prolog to its epilog (end None while running)."""

    job_id: int
    slurm_index: int
    start: float
    end: float | None = None
    user: str = ""
    account: str = ""
    partition: str = ""
    restart: int = 0  # Slurm's SLURM_RESTART_COUNT: which run of a requeued job
    # gres/shard or gres/mps units the run holds on this GPU (issue 14); 0: the whole slot
    shards: int = 0
    shard_kind: str = ""  # "shard" or "mps" where shards > 0

    @property
    def run(self) -> tuple[int, int]:
        """(job_id, restart): one run of a job (a requeued job runs again under its id)."""
        return self.job_id, self.restart

    def covers(self, a: float, b: float) -> bool:
        """True when the piece (a, b] lies inside this span."""
        return self.start <= a and (self.end is None or b <= self.end)


class Piece(NamedTuple):
    """Part of a read window attributed to one job (job_id None: GPU not allocated).

    A NamedTuple, not a dataclass: every GPU makes one or more a tick, and a frozen
    dataclass costs a Python call per field to build (bench/agent).

    Attributes:
        mem_used_bytes: memory in use at the read, for the piece that holds the read
            (ends at w1); None for the pieces before it.
        mem_estimate_bytes: the memory this piece is charged for (GPU-memory-seconds): the
            read's for the piece that holds it, else the previous read's when the same job
            held the GPU then, else None.
        power_watts: power draw at the read, like `mem_used_bytes`.
        gpm_seconds: how much of the piece a GPM window covers (0: not measured by GPM,
            e.g. a GPU without GPM or its first sample); the four GPM figures below are
            that window's means, None where not measured (never 0 for unknown).
    """

    start: float
    end: float
    period_start: float
    job_id: int | None
    util_sum: float
    util_count: int
    util_max: float | None
    util_min: float | None
    active_count: int
    mem_used_bytes: int | None
    power_watts: float | None
    energy_joules: float | None
    restart: int = 0
    mem_estimate_bytes: int | None = None
    gpm_seconds: float = 0.0
    sm_active_percent: float | None = None
    sm_occupancy_percent: float | None = None
    tensor_active_percent: float | None = None
    dram_bw_percent: float | None = None

    @property
    def seconds(self) -> float:
        """Length of the piece."""
        return self.end - self.start

    @property
    def mem_gib_seconds(self) -> float:
        """GPU-memory GiB-seconds the piece is charged: its memory estimate x its length.

        The one definition of a piece's GPU-memory-seconds: the spool adds it both to the
        piece's shipping period (the interval's `mem_gib_seconds`) and to its run's totals
        (the summary's), so a job's memory-hours read from its intervals while it runs are
        those its summary says once it lands (issue 24). An unknown estimate counts 0.
        """
        return (self.mem_estimate_bytes or 0) / GIB * (self.end - self.start)


def gpm_span(w0: float, w1: float, snapshot: GpuSnapshot) -> tuple[float, float] | None:
    """The snapshot's GPM window on the agent's clock, or None when it has none.

    The source stamps the window with its own clock (the snapshot's time), the agent cuts
    windows at its tick's time, read a few milliseconds earlier: the window is moved by
    that difference, and a start within 5% of the window of the previous read is that
    read, so consecutive windows tile time without slivers. A start well before w0 (a
    GPM sample failed, a read was missed) stays there: the part before w0 was another
    window's and is not counted again.
    """
    gpm = snapshot.gpm
    if gpm is None or gpm.end <= gpm.start:
        return None
    shift = w1 - snapshot.time
    start, end = gpm.start + shift, gpm.end + shift
    if abs(start - w0) <= 0.05 * (w1 - w0):
        start = w0
    return start, end


_UNMEASURED = GpmMetrics(0.0, 0.0)  # every figure None


def _gpm_part(a: float, b: float, span: tuple[float, float] | None) -> float:
    """Seconds of the piece (a, b] inside the GPM window `span`."""
    if span is None:
        return 0.0
    return max(0.0, min(b, span[1]) - max(a, span[0]))


def period_start(t: float, period: float) -> float:
    """Start of the shipping period that contains the instant just before t."""
    return math.floor(t / period) * period if period > 0 else 0.0


def cut_points(w0: float, w1: float, spans: list[JobSpan], period: float) -> list[float]:
    """Window edges, job edges and period boundaries inside (w0, w1], sorted."""
    inside = [
        edge
        for span in spans
        for edge in (span.start, span.end)
        if edge is not None and w0 < edge < w1
    ]
    if period > 0:
        boundary = period_start(w0, period) + period
        while boundary < w1:
            inside.append(boundary)
            boundary += period
    if not inside:  # the usual window: one job (or none) throughout, inside one period
        return [w0, w1]
    return sorted({w0, w1, *inside})


def split_window(
    w0: float,
    w1: float,
    snapshot: GpuSnapshot,
    spans: list[JobSpan],
    period: float,
    active_threshold: float,
    energy_delta: float | None,
    previous_mem_bytes: int | None = None,
) -> list[Piece]:
    """Pieces of (w0, w1] with their samples, point readings and a share of the energy.

    Args:
        w0: end of the previous read (exclusive).
        w1: this read (inclusive).
        snapshot: this read; its samples may reach before w0 (they are filtered).
        spans: the jobs that held this GPU at any time in the window.
        period: shipping period in seconds (pieces never straddle its boundaries).
        active_threshold: a sample at or above this percent is active (`is_active`).
        energy_delta: joules the GPU used over the window, shared by `energy_shares`.
        previous_mem_bytes: memory in use at the previous read (at w0), if known.
    """
    if w1 <= w0:
        return []
    points = cut_points(w0, w1, spans, period)
    # One piece draws all of the window's energy (the usual case: no job edge, no boundary).
    energies = (
        [energy_delta]
        if len(points) == 2
        else energy_shares(w0, w1, points, snapshot, energy_delta)
    )
    pieces: list[Piece] = []
    # Who held the GPU at w0, for the pieces before the read (none in a one-piece window).
    w0_owner = (
        None
        if len(points) == 2
        else next((s for s in spans if s.start <= w0 and (s.end is None or s.end > w0)), None)
    )
    span = gpm_span(w0, w1, snapshot)
    # One GPM window is the finest truth NVML gives: its means are all that is known of
    # any part of it, so a job that starts or ends inside a window (and the idle time or
    # other job beside it) shares the window's means, each for its own seconds.
    gpm = snapshot.gpm if span is not None else None
    if (
        gpm is not None
        and gpm.sm_active_percent is None
        and gpm.sm_occupancy_percent is None
        and gpm.tensor_active_percent is None
        and gpm.dram_bw_percent is None
    ):
        span = gpm = None  # a window whose four figures all failed measured nothing here
    for (a, b), energy in zip(itertools.pairwise(points), energies, strict=True):
        owner = next((s for s in spans if s.covers(a, b)), None)
        values = [s.util_percent for s in snapshot.samples if a < s.time <= b]
        holds_read = b == w1
        gpm_seconds = _gpm_part(a, b, span)
        window = gpm if gpm is not None and gpm_seconds > 0 else _UNMEASURED
        if holds_read:
            estimate = snapshot.mem_used_bytes
        elif owner is not None and w0_owner is not None and owner.run == w0_owner.run:
            estimate = previous_mem_bytes  # the job's own newest reading, carried forward
        else:
            estimate = None
        pieces.append(
            Piece(
                start=a,
                end=b,
                period_start=period_start(a, period) if period > 0 else a,
                job_id=owner.job_id if owner else None,
                restart=owner.restart if owner else 0,
                util_sum=sum(values),
                util_count=len(values),
                util_max=max(values) if values else None,
                util_min=min(values) if values else None,
                active_count=sum(1 for v in values if is_active(v, active_threshold)),
                mem_used_bytes=snapshot.mem_used_bytes if holds_read else None,
                power_watts=snapshot.power_watts if holds_read else None,
                energy_joules=energy,
                mem_estimate_bytes=estimate,
                gpm_seconds=gpm_seconds,
                sm_active_percent=window.sm_active_percent,
                sm_occupancy_percent=window.sm_occupancy_percent,
                tensor_active_percent=window.tensor_active_percent,
                dram_bw_percent=window.dram_bw_percent,
            )
        )
    return pieces


def energy_shares(
    w0: float,
    w1: float,
    points: list[float],
    snapshot: GpuSnapshot,
    energy_delta: float | None,
) -> list[float | None]:
    """The window's energy split over the pieces between `points`, as each drew it.

    With power P = P_idle + k * util (close to what GPUs draw; exact for the test bed's
    simulated GPUs), the window's energy E = P_idle * T + k * U (U: the integral of the
    utilization samples) and the power read at w1, P1 = P_idle + k * u1 (u1: the newest
    sample), give P_idle and k; a piece then drew P_idle * length + k * its own U. When
    they cannot be told apart (uniform load, no power or samples, a fit below zero), the
    energy is shared by length. The shares always add up to E.
    """
    bounds = list(itertools.pairwise(points))
    if energy_delta is None:
        return [None] * len(bounds)
    length = w1 - w0
    by_length: list[float | None] = [energy_delta * (b - a) / length for a, b in bounds]
    samples = [s for s in snapshot.samples if w0 < s.time <= w1]
    if snapshot.power_watts is None or not samples:
        return by_length
    mean = sum(s.util_percent for s in samples) / len(samples)
    integrals = []
    for a, b in bounds:
        mine = [s.util_percent for s in samples if a < s.time <= b]
        integrals.append((b - a) * (sum(mine) / len(mine) if mine else mean))
    total = sum(integrals)
    newest = max(samples, key=lambda s: s.time).util_percent
    spread = total - newest * length  # 0 when the load was uniform: nothing to tell apart
    if abs(spread) < 1e-6 * length:
        return by_length
    per_percent = (energy_delta - snapshot.power_watts * length) / spread
    idle = snapshot.power_watts - per_percent * newest
    if per_percent < 0 or idle < 0:
        return by_length
    shares: list[float | None] = [
        idle * (b - a) + per_percent * u for (a, b), u in zip(bounds, integrals, strict=True)
    ]
    return shares
