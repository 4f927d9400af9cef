"""A GPU row's held time: active + idle + missing + suspended, one definition to the bill.

A row's span (its `gpu_seconds` as recorded) is every second a job held the GPU slot.
Suspended is the part of it Slurm had the job suspended (`scontrol suspend`, preemption
or gang scheduling in SUSPEND mode: sacct's Suspended): its own category, neither busy
nor idle nor missing, and not in Slurm's charge, so a row's held time (`gpu_seconds`
from here on, what GPU-hours and the bill count by default) is the span less it, as
sacct's Elapsed is. Missing is held time nobody measured (agent down, GPU lost): at most
the held time. Active is measured time at or above the active threshold: at most the
measured rest. Idle is what is left: measured time below the threshold. Missing data is
never idle (DESIGN.md): where a group held GPU time but measured none of it, its active
and idle time are unknown (NaN), never 0 % or 100 % idle.

Slurm records how long a job was suspended, not when on each GPU: a stopped job runs no
kernels, so its suspended seconds come out of the row's measured idle time first, then
out of its missing time (the agent was down during the suspension), and only then out
of active time (readings that disagree with Slurm's record).

The functions take numpy arrays or plain numbers (NaN: unknown, counted as 0 in a sum).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

Number = float | npt.NDArray[np.float64]


class RowTime(NamedTuple):
    """One row's held, active, missing and suspended seconds, clipped so that they add up.

    `held` excludes `suspended` (Slurm's charge); held + suspended is the row's span.
    """

    held: Number
    active: Number
    missing: Number
    suspended: Number


def row_time(held: Number, active: Number, missing: Number, suspended: Number = 0.0) -> RowTime:
    """A row's time split, clipped so that its parts add up to its span.

    Missing is at most the span, active at most the measured rest; suspended is at most
    the span and taken from idle, then missing, then active time.

    Args:
        held: the row's span (every second its job held the slot).
        active: active seconds measured over the span.
        missing: seconds of the span nobody measured.
        suspended: the job's suspended seconds (sacct's Suspended) in the span.

    Unknown (NaN) seconds count as 0.
    """
    span = np.nan_to_num(np.asarray(held, dtype=float))
    lost = np.minimum(np.nan_to_num(np.asarray(missing, dtype=float)), span)
    busy = np.minimum(np.nan_to_num(np.asarray(active, dtype=float)), span - lost)
    paused = np.clip(np.nan_to_num(np.asarray(suspended, dtype=float)), 0.0, span)
    from_idle = np.minimum(paused, span - lost - busy)
    from_missing = np.minimum(paused - from_idle, lost)
    from_active = paused - from_idle - from_missing
    return RowTime(
        _plain(span - paused),
        _plain(np.maximum(busy - from_active, 0.0)),  # never below 0 by rounding
        _plain(np.maximum(lost - from_missing, 0.0)),
        _plain(paused),
    )


def elapsed(start: Number, end: Number, suspended: Number = 0.0) -> Number:
    """A job's run time as sacct's Elapsed counts it: end - start less suspended time.

    At least 0; NaN suspended counts as 0 (never suspended, or not known yet).
    """
    span = np.maximum(np.asarray(end, dtype=float) - np.asarray(start, dtype=float), 0.0)
    paused = np.nan_to_num(np.asarray(suspended, dtype=float))
    return _plain(np.maximum(span - paused, 0.0))


# Held and missing seconds are sums of per-row differences, so a group measured not at
# all can come out with a rounding residue of measured time (1e-11 s of 1e5 s held):
# measured time below this share of the held time is that residue, not a reading.
ROUNDING_SHARE = 1e-9


def idle(held: Number, active: Number, missing: Number) -> Number:
    """Idle seconds of summed (row-clipped) held, active and missing seconds.

    held - missing - active, at least 0; NaN (unknown) where time was held but none of
    it measured.
    """
    gpu = np.asarray(held, dtype=float)
    measured = gpu - np.asarray(missing, dtype=float)
    out = np.maximum(measured - np.asarray(active, dtype=float), 0.0)
    return _plain(np.where(_unmeasured(gpu, measured), np.nan, out))


def active(held: Number, active_seconds: Number, missing: Number) -> Number:
    """Active seconds of summed sums: as summed, NaN where nothing held was measured."""
    gpu = np.asarray(held, dtype=float)
    measured = gpu - np.asarray(missing, dtype=float)
    return _plain(np.where(_unmeasured(gpu, measured), np.nan, active_seconds))


def _unmeasured(
    held: npt.NDArray[np.float64], measured: npt.NDArray[np.float64]
) -> npt.NDArray[np.bool_]:
    """Where GPU time was held but none of it (beyond rounding) was measured."""
    return (held > 0) & (measured <= ROUNDING_SHARE * held)


def _plain(value: npt.NDArray[np.float64]) -> Number:
    """A 0-d array as a float (callers passed numbers), else the array."""
    return float(value) if np.ndim(value) == 0 else value
