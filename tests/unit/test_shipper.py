"""The shipper: rows leave the spool only after the store committed them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_gpu.errors import StoreError
from slurm_gpu.models import GpuActivity, GpuDevice, GpuInterval, JobEvent, JobGpuSummary
from slurm_gpu.node.shipper import Shipper
from slurm_gpu.node.spool import Spool


class FakeStore:
    """Records what it was given; fails while `down` is True."""

    def __init__(self) -> None:
        self.down = False
        self.intervals: list[GpuInterval] = []
        self.calls: list[str] = []

    def _check(self, what: str) -> None:
        if self.down:
            raise StoreError("store down")
        self.calls.append(what)

    def add_events(self, events: Sequence[JobEvent]) -> int:
        self._check("events")
        return len(events)

    def add_intervals(self, rows: Sequence[GpuInterval]) -> int:
        self._check("intervals")
        self.intervals += rows
        return len(rows)

    def add_summaries(self, rows: Sequence[JobGpuSummary]) -> int:
        self._check("summaries")
        return len(rows)

    def upsert_inventory(self, node: str, devices: Sequence[GpuDevice], seen_at: float) -> None:
        self._check("inventory")

    def add_activity(self, rows: Sequence[GpuActivity]) -> int:
        self._check("activity")
        return len(rows)

    def forget_activity(self, job_ids: Sequence[int]) -> None:
        self._check("forget")


def interval(start: float) -> GpuInterval:
    return GpuInterval(
        "gpu1",
        "U",
        start,
        start + 60,
        7,
        50.0,
        60.0,
        40.0,
        60,
        60.0,
        60.0,
        None,
        None,
        None,
        None,
        None,
        None,
    )


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    spool = Spool(tmp_path / "spool.db")
    with spool.transaction() as db:
        for start in (0.0, 60.0, 120.0):
            Spool.queue(db, "interval", f"i{start}", interval(start).__dict__)
    return spool


def test_store_down_keeps_every_row_in_the_spool(spool: Spool) -> None:
    """A failed batch raises and leaves the outbox as it was."""
    store = FakeStore()
    store.down = True
    with pytest.raises(StoreError):
        Shipper(spool, store, "gpu1").ship_once()
    assert 3 == spool.backlog()


def test_rows_are_deleted_after_the_store_committed(spool: Spool) -> None:
    """When the store returns, the backlog drains and each row is shipped once."""
    store = FakeStore()
    shipper = Shipper(spool, store, "gpu1", batch_size=2)
    assert 3 == shipper.drain()
    assert (0, [0.0, 60.0, 120.0]) == (spool.backlog(), [r.period_start for r in store.intervals])
