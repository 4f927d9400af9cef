"""The shipper: rows leave the spool only after the store committed them."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_gpu.errors import StoreError
from slurm_gpu.models import (
    GpuDevice,
    GpuInterval,
    GpuPhysicalInterval,
    Measurement,
    MigDevice,
    SlotKind,
)
from slurm_gpu.node.outbox import device_fields, fields_of
from slurm_gpu.node.shipper import DecodedBatch, Shipper
from slurm_gpu.node.spool import Spool


class FakeStore:
    """Records what it was given; fails while `down` is True."""

    def __init__(self) -> None:
        self.down = False
        self.intervals: list[GpuInterval] = []
        self.physical: list[GpuPhysicalInterval] = []
        self.devices: list[GpuDevice] = []
        self.calls: list[str] = []

    def write_batches(self, batches: Sequence[tuple[str, DecodedBatch]]) -> int:
        if self.down:
            raise StoreError("store down")
        for _node, batch in batches:
            self.calls += [
                kind
                for kind, rows in (
                    ("events", batch.events),
                    ("inventory", batch.inventory),
                    ("activity", batch.activity),
                    ("intervals", batch.intervals),
                    ("physical", batch.physical),
                    ("summaries", batch.summaries),
                    ("heartbeats", batch.heartbeats),
                )
                if rows
            ]
            self.intervals += batch.intervals
            self.physical += batch.physical
            self.devices += [d for devices, _seen, _lost in batch.inventory for d in devices]
        return len(batches)


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


class CountedStop(threading.Event):
    """A stop event that records each wait and is set after `passes` of them."""

    def __init__(self, passes: int) -> None:
        super().__init__()
        self.passes = passes
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(float(timeout or 0.0))
        if len(self.waits) >= self.passes:
            self.set()
        return self.is_set()


def test_ship_interval_gathers_the_ticks_of_its_interval_in_one_batch(spool: Spool) -> None:
    """[node] ship_interval 60 s: after each pass the shipper waits 60 s, rows or not."""
    store = FakeStore()
    stop = CountedStop(passes=2)
    Shipper(spool, store, "gpu1", ship_interval=60.0).run(stop)
    assert ([60.0, 60.0], 1) == (stop.waits, store.calls.count("intervals"))
    default = CountedStop(passes=1)
    Shipper(spool, FakeStore(), "gpu1").run(default)
    assert [1.0] == default.waits  # nothing left: the idle wait, as before


def test_corrupt_row_is_quarantined_and_the_rest_reach_the_store(spool: Spool) -> None:
    """A row that does not decode moves, whole and with its reason, to quarantine.

    The good rows around it still reach the store.
    """
    with spool.transaction() as db:
        db.execute(
            "INSERT INTO outbox (kind, key, payload) VALUES ('interval', 'bad', '{\"node\": 1')"
        )
        Spool.queue(db, "interval", "i180.0", interval(180.0).__dict__)
    store = FakeStore()
    shipper = Shipper(spool, store, "gpu1", clock=lambda: 1000.0)
    assert 4 == shipper.drain()
    ((kind, key, payload, error),) = spool.quarantined()
    assert ("interval", "bad", '{"node": 1') == (kind, key, payload)
    assert error.startswith("outbox interval row: payload is not JSON")
    assert (0, [0.0, 60.0, 120.0, 180.0]) == (
        spool.backlog(),
        [r.period_start for r in store.intervals],
    )


def test_rows_of_unknown_kind_and_wrong_field_types_are_quarantined(tmp_path: Path) -> None:
    """A row of an unknown kind, or with a field of the wrong type, is quarantined.

    It is kept there rather than shipped, dropped, or retried forever.
    """
    spool = Spool(tmp_path / "spool.db")
    bad_interval = dict(interval(0.0).__dict__, job_id="seven")
    with spool.transaction() as db:
        Spool.queue(db, "bogus", "b", {"x": 1})
        Spool.queue(db, "interval", "i0", bad_interval)
        Spool.queue(db, "inventory", "inventory:gpu1", {"devices": [{}], "seen_at": 1.0})
    assert 0 == Shipper(spool, FakeStore(), "gpu1").drain()
    errors = {key: error for _kind, key, _payload, error in spool.quarantined()}
    assert {
        "b": "outbox row of unknown kind 'bogus'",
        "i0": 'outbox interval row: field job_id: expected an integer or null, got "seven"',
        "inventory:gpu1": "outbox inventory row: field uuid is missing",
    } == errors
    assert 0 == spool.backlog()


def test_quarantine_survives_a_store_outage(spool: Spool) -> None:
    """The corrupt row is set aside even when the store is down; the good rows wait."""
    with spool.transaction() as db:
        Spool.queue(db, "summary", "s", [1, 2])
    store = FakeStore()
    store.down = True
    with pytest.raises(StoreError):
        Shipper(spool, store, "gpu1").ship_once()
    assert (3, ["s"]) == (spool.backlog(), [key for _k, key, _p, _e in spool.quarantined()])


PHYSICAL = GpuPhysicalInterval(
    "gpu1", "GPU-P", 60.0, 120.0, 60.0, 250.0, 15000.0, 61.0, 0, 2**30, 2**36
)


def test_slot_intervals_and_physical_totals_reach_the_store(tmp_path: Path) -> None:
    """Physical rows and slot intervals reach the store in one batch; slots decode whole."""
    spool = Spool(tmp_path / "spool.db")
    mig = GpuInterval(**{**vars(interval(60.0)), "gpu_uuid": "GPU-P", "slot_id": "MIG-1",
                         "slot_kind": SlotKind.MIG, "share": 1 / 7, "mig_profile": "1g.10gb",
                         "measured_by": Measurement.MEMORY_ONLY})  # fmt: skip
    with spool.transaction() as db:
        Spool.queue(db, "physical", "physical:gpu1:GPU-P:60.0", fields_of(PHYSICAL))
        Spool.queue(db, "interval", "gpu1:MIG-1:60.0", fields_of(mig))
    store = FakeStore()
    assert 2 == Shipper(spool, store, "gpu1").drain()
    assert (store.calls, store.intervals, store.physical) == (
        ["intervals", "physical"],
        [mig],
        [PHYSICAL],
    )


def test_inventory_of_a_gpu_in_mig_mode_carries_its_mig_devices(tmp_path: Path) -> None:
    migs = (MigDevice("MIG-1", "GPU-P", 0, 9, 0, "1g.10gb", 1, 7, 10 * 2**30),)
    devices = [
        GpuDevice("GPU-P", "NVIDIA H100", 0, 0, "00:17", 2**36, True, True, migs),
        GpuDevice("GPU-W", "NVIDIA H100", 1, 1, "00:18", 2**36, True),
    ]
    spool = Spool(tmp_path / "spool.db")
    payload = {"devices": [device_fields(d) for d in devices], "seen_at": 5.0}
    with spool.transaction() as db:
        Spool.queue(db, "inventory", "inventory:gpu1", payload)
    whole = spool.pending(1)[0].payload
    store = FakeStore()
    Shipper(spool, store, "gpu1").drain()
    assert store.devices == devices
    assert "mig" not in whole.split('"GPU-W"')[1]  # a whole GPU's fields are those of before
