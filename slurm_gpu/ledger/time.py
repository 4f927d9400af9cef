"""A GPU row's held time: active + idle + missing, one definition from reading to bill.

Held (a row's `gpu_seconds`) is every second a job held the GPU slot. Missing is held
time nobody measured (agent down, GPU lost): at most the held time. Active is measured
time at or above the active threshold: at most the measured rest. Idle is what is left:
measured time below the threshold. Missing data is never idle (DESIGN.md): where a group
held GPU time but measured none of it, its active and idle time are unknown (NaN), never
0 % or 100 % idle.

The functions take numpy arrays or plain numbers (NaN: unknown, counted as 0 in a sum).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

Number = float | npt.NDArray[np.float64]


class RowTime(NamedTuple):
    """One row's held, active and missing seconds, clipped so that they add up."""

    held: Number
    active: Number
    missing: Number


def row_time(held: Number, active: Number, missing: Number) -> RowTime:
    """A row's held time with missing at most held and active at most the measured rest.

    Unknown (NaN) held, active or missing seconds count as 0.
    """
    gpu = np.nan_to_num(np.asarray(held, dtype=float))
    lost = np.minimum(np.nan_to_num(np.asarray(missing, dtype=float)), gpu)
    busy = np.minimum(np.nan_to_num(np.asarray(active, dtype=float)), gpu - lost)
    return RowTime(_plain(gpu), _plain(busy), _plain(lost))


def idle(held: Number, active: Number, missing: Number) -> Number:
    """Idle seconds of summed (row-clipped) held, active and missing seconds.

    held - missing - active, at least 0; NaN (unknown) where time was held but none of
    it measured.
    """
    gpu = np.asarray(held, dtype=float)
    measured = gpu - np.asarray(missing, dtype=float)
    out = np.maximum(measured - np.asarray(active, dtype=float), 0.0)
    return _plain(np.where((gpu > 0) & (measured <= 0), np.nan, out))


def active(held: Number, active_seconds: Number, missing: Number) -> Number:
    """Active seconds of summed sums: as summed, NaN where nothing held was measured."""
    gpu = np.asarray(held, dtype=float)
    measured = gpu - np.asarray(missing, dtype=float)
    return _plain(np.where((gpu > 0) & (measured <= 0), np.nan, active_seconds))


def _plain(value: npt.NDArray[np.float64]) -> Number:
    """A 0-d array as a float (callers passed numbers), else the array."""
    return float(value) if np.ndim(value) == 0 else value
