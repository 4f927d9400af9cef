"""Counters over the store's whole history, read incrementally, never going backwards.

The exporter's counters (GPU-hours per user, actions per policy) are sums over every job
and every audit entry ever stored. Reading the whole history on every scrape does not
scale, and most of it never changes: a job that ended long ago keeps its summaries, an
audit entry gets its outcome seconds after it is written. `SettledSums` therefore folds
rows older than a settling time into fixed totals once, and re-reads only the recent
window on each refresh. `Monotonic` keeps a counter from dropping when a running job's
interval totals are replaced by its (slightly different) summary, or when old intervals
are rolled up: Prometheus would read any drop as a counter reset and `increase()` would
count the whole total again.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


def _add(into: dict[K, list[float]], key: K, values: Sequence[float]) -> None:
    current = into.get(key)
    if current is None:
        into[key] = list(values)
    else:
        for i, v in enumerate(values):
            current[i] += v


class SettledSums(Generic[K]):
    """Sums per key of rows whose newest part may still change.

    Each `update` gets every row the store holds whose time is at or after `horizon`
    (everything while `horizon` is None): finished rows older than `settle_seconds` before
    `now` are folded into fixed totals and must not be passed again; the rest are kept
    as this refresh's recent part and replaced by the next update.

    Args:
        width: how many numbers each row carries.
        settle_seconds: how long after its time a row may still change (a summary that
            arrives later than this after a job ended is only counted after a restart).
    """

    def __init__(self, width: int, settle_seconds: float) -> None:
        self.width = width
        self.settle_seconds = settle_seconds
        self.horizon: float | None = None
        self._settled: dict[K, list[float]] = {}
        self._recent: dict[K, list[float]] = {}

    def update(self, rows: Iterable[tuple[K, float | None, Sequence[float]]], now: float) -> None:
        """Takes the rows read since `horizon`: (key, time or None while open, values)."""
        new_horizon = now - self.settle_seconds
        if self.horizon is not None:
            new_horizon = max(new_horizon, self.horizon)
        recent: dict[K, list[float]] = {}
        for key, time, values in rows:
            if len(values) != self.width:
                raise ValueError(f"expected {self.width} values, got {len(values)}")
            if time is not None and time < new_horizon:
                _add(self._settled, key, values)
            else:
                _add(recent, key, values)
        self._recent = recent
        self.horizon = new_horizon

    def totals(self) -> dict[K, tuple[float, ...]]:
        """Settled plus recent sums per key."""
        out = {k: list(v) for k, v in self._settled.items()}
        for key, values in self._recent.items():
            _add(out, key, values)
        return {k: tuple(v) for k, v in out.items()}


class Monotonic(Generic[K]):
    """Remembers the largest value exported per series and never exports less."""

    def __init__(self) -> None:
        self._seen: dict[K, float] = {}

    def apply(self, values: Mapping[K, float]) -> dict[K, float]:
        """`values`, each raised to the largest value seen for its key; known keys stay."""
        for key, value in values.items():
            self._seen[key] = max(self._seen.get(key, value), value)
        return dict(self._seen)
