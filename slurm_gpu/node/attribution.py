"""Splitting one GPU's read window into pieces, each belonging to one job (or none).

A window (w0, w1] between two reads can hold the end of one job and the start of the
next, and can straddle the boundary of a shipping period. NVML's utilization samples are
timestamped, so each piece gets exactly the samples taken inside it: a job's mean is not
diluted by the idle seconds before it started. A point-in-time reading (memory in use,
power draw) was taken at w1, so it belongs to the piece that ends at w1 only: a job whose
span ended earlier in the window never gets the memory of the job that followed it on the
GPU (issue #11). Its GPU-memory-seconds carry the job's own newest reading forward instead.
Pure functions; no I/O.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from slurm_gpu.activity import is_active
from slurm_gpu.gpu import GpuSnapshot


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

    @property
    def run(self) -> tuple[int, int]:
        """(job_id, restart): one run of a job (a requeued job runs again under its id)."""
        return self.job_id, self.restart

    def covers(self, a: float, b: float) -> bool:
        """True when the piece (a, b] lies inside this span."""
        return self.start <= a and (self.end is None or b <= self.end)


@dataclass(frozen=True)
class Piece:
    """Part of a read window attributed to one job (job_id None: GPU not allocated).

    Attributes:
        mem_used_bytes: memory in use at the read, for the piece that holds the read
            (ends at w1); None for the pieces before it.
        mem_estimate_bytes: the memory this piece is charged for (GPU-memory-seconds): the
            read's for the piece that holds it, else the previous read's when the same job
            held the GPU then, else None.
        power_watts: power draw at the read, like `mem_used_bytes`.
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

    @property
    def seconds(self) -> float:
        """Length of the piece."""
        return self.end - self.start


def period_start(t: float, period: float) -> float:
    """Start of the shipping period that contains the instant just before t."""
    return math.floor(t / period) * period if period > 0 else 0.0


def cut_points(w0: float, w1: float, spans: list[JobSpan], period: float) -> list[float]:
    """Window edges, job edges and period boundaries inside (w0, w1], sorted."""
    points = {w0, w1}
    for span in spans:
        for edge in (span.start, span.end):
            if edge is not None and w0 < edge < w1:
                points.add(edge)
    if period > 0:
        boundary = period_start(w0, period) + period
        while boundary < w1:
            points.add(boundary)
            boundary += period
    return sorted(points)


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
        energy_delta: joules the GPU used over the window, shared by piece length.
        previous_mem_bytes: memory in use at the previous read (at w0), if known.
    """
    if w1 <= w0:
        return []
    points = cut_points(w0, w1, spans, period)
    pieces: list[Piece] = []
    w0_owner = next((s for s in spans if s.start <= w0 and (s.end is None or s.end > w0)), None)
    for a, b in itertools.pairwise(points):
        owner = next((s for s in spans if s.covers(a, b)), None)
        values = [s.util_percent for s in snapshot.samples if a < s.time <= b]
        holds_read = b == w1
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
                energy_joules=None if energy_delta is None else energy_delta * (b - a) / (w1 - w0),
                mem_estimate_bytes=estimate,
            )
        )
    return pieces
