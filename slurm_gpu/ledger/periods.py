"""Proration: the part of a job inside a period, and the UTC days and months of usage.

A job's usage inside a period is its usage x the share of its [start, end] (end: now for
a running job) inside the period, as sreport counts usage inside its period. A job of no
length is whole in the period its start is in; a job with no start time is whole.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import numpy as np
import numpy.typing as npt

DAY = 86400.0


def fractions(
    start: Any, end: Any, since: float, until: float, now: float
) -> npt.NDArray[np.float64]:
    """The share of each job [start, end] inside [since, until] (arrays; NaN: unknown).

    Unknown end: the job runs, its end is `now`. Unknown start: 1 (whole).
    """
    begin = np.asarray(start, dtype=float)
    stop = np.asarray(end, dtype=float)
    stop = np.where(np.isnan(stop), now, stop)
    length = stop - begin
    inside = np.minimum(stop, until) - np.maximum(begin, since)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.minimum(np.maximum(inside / length, 0.0), 1.0)
    instant = np.where((since <= begin) & (begin <= until), 1.0, 0.0)
    out = np.where(length <= 0, instant, share)
    whole: npt.NDArray[np.float64] = np.where(np.isnan(begin), 1.0, out)
    return whole


def day_of(t: float) -> float:
    """The UTC day (POSIX seconds of its midnight) that `t` is in."""
    return math.floor(t / DAY) * DAY


def month_of(t: float) -> float:
    """The UTC month (POSIX seconds of its first midnight) that `t` is in."""
    day = dt.datetime.fromtimestamp(t, dt.UTC)
    return day.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def next_month(month: float) -> float:
    """The UTC month after `month` (a `month_of`)."""
    first = dt.datetime.fromtimestamp(month, dt.UTC)
    return (first.replace(day=28) + dt.timedelta(days=4)).replace(day=1).timestamp()


def day_fractions(start: float, end: float) -> list[tuple[float, float]]:
    """(day, part of [start, end] inside it) of every UTC day the job touches.

    `fractions` for each day: the share of the job's length inside it; a job of no
    length is whole in the day it starts in.
    """
    length = end - start
    first = day_of(start)
    if length <= 0:
        return [(first, 1.0)]
    out = []
    day = first
    while day < end:
        inside = min(end, day + DAY) - max(start, day)
        if inside > 0:
            out.append((day, min(max(inside / length, 0.0), 1.0)))
        day += DAY
    return out
