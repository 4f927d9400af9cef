"""Heartbeat rows (issue 16): decoded field by field, written last, and the ledger's rules."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_gpu.models import (
    GpuActivity,
    JobGpuSummary,
    NodeHeartbeat,
)
from slurm_gpu.node.outbox import OutboxError, decode_heartbeat, encode, fields_of
from slurm_gpu.node.ship_less import ActivityLedger
from slurm_gpu.node.shipper import DecodedBatch, Shipper
from slurm_gpu.node.spool import Spool
from slurm_gpu.store import Store

T0 = 1_800_000_000.0


class Recorder:
    """A StoreSink that records the kinds of the batches it is given."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write_batches(self, batches: Sequence[tuple[str, DecodedBatch]]) -> int:
        for _node, batch in batches:
            self.calls += [kind for kind, rows in vars(batch).items() if rows and kind != "bad"]
        return len(batches)


def row(**fields: object) -> GpuActivity:
    values: dict[str, object] = {
        "job_id": 7,
        "node": "gpu1",
        "gpu_uuid": "GPU-0",
        "slurm_index": 0,
        "start": T0,
        "last_reading": T0 + 30,
        "last_active": None,
        "util_recent_percent": 0.0,
        "mem_used_bytes": 2**30,
        "process_count": 1,
        "measured_since": T0,
    }
    values.update(fields)
    return GpuActivity(**values)  # type: ignore[arg-type]


def summary() -> JobGpuSummary:
    return JobGpuSummary(
        job_id=7, node="gpu1", gpu_uuid="GPU-0", gpu_model="A100", start=T0, end=T0 + 60,
        gpu_seconds=60.0, util_mean_percent=0.0, util_max_percent=0.0, active_seconds=0.0,
        mem_max_bytes=None, mem_gib_seconds=0.0, energy_joules=None, reading_count=6,
        missing_seconds=0.0,
    )  # fmt: skip


def test_heartbeat_round_trips_through_the_outbox() -> None:
    """A NodeHeartbeat encoded as the agent queues it decodes to itself."""
    beat = NodeHeartbeat("gpu1", T0 + 0.5, ("GPU-0", "MIG-1", "GPU-2/shard/7"))
    assert beat == decode_heartbeat(encode(fields_of(beat)))


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ('{"node": "gpu1", "slots": []}', "outbox heartbeat row: field tick is missing"),
        (
            '{"node": "gpu1", "tick": "soon", "slots": []}',
            'outbox heartbeat row: field tick: expected a finite number, got "soon"',
        ),
        (
            '{"node": "gpu1", "tick": 1.0, "slots": "GPU-0"}',
            'outbox heartbeat row: field slots: expected a list of strings, got "GPU-0"',
        ),
        (
            '{"node": "gpu1", "tick": 1.0, "slots": [7]}',
            "outbox heartbeat row: field slots[0]: expected a string, got 7",
        ),
        (
            '{"node": 3, "tick": 1.0, "slots": []}',
            "outbox heartbeat row: field node: expected a string, got 3",
        ),
        (
            '{"node": "gpu1", "tick": 1.0, "slots": [], "jobs": []}',
            'outbox heartbeat row: unknown field "jobs"',
        ),
        ('{"node": "gpu1", "tick": 1.0', "outbox heartbeat row: payload is not JSON"),
    ],
)
def test_a_damaged_heartbeat_names_its_field(payload: str, error: str) -> None:
    """Each field is checked on the way out: the error names the row kind and the field."""
    with pytest.raises(OutboxError) as caught:
        decode_heartbeat(payload)
    assert str(caught.value).startswith(error)


def test_a_batch_stores_its_heartbeat_with_the_rows_it_vouches_for(store: Store) -> None:
    """Activity and heartbeat in one batch: the row is carried to the heartbeat at once.

    A summarized job's activity, in the same batch, is forgotten before the heartbeat
    could vouch for it.
    """
    batch = DecodedBatch()
    batch.add("heartbeat", encode(fields_of(NodeHeartbeat("gpu1", T0 + 60, ("GPU-0", "GPU-1")))))
    batch.add("activity", encode(fields_of(row())))
    batch.add("activity", encode(fields_of(row(job_id=8, gpu_uuid="GPU-1", slurm_index=1))))
    batch.add("summary", encode(fields_of(summary())))
    store.write_batches([("gpu1", batch)])

    assert [(8, T0 + 60)] == [(r.job_id, r.last_reading) for r in store.activity()]


def test_a_damaged_heartbeat_is_quarantined_and_the_rest_ship(tmp_path: Path) -> None:
    """The bad heartbeat is kept whole in quarantine; the activity row reaches the store."""
    spool = Spool(tmp_path / "spool.db")
    with spool.transaction() as db:
        Spool.queue(db, "activity", "activity:7:GPU-0", fields_of(row()))
        Spool.queue(db, "heartbeat", "heartbeat:gpu1", {"node": "gpu1", "tick": None})
    store = Recorder()
    Shipper(spool, store, "gpu1").drain()

    (kept,) = spool.quarantined()
    assert (["activity"], 0) == (store.calls, spool.backlog())
    assert ("heartbeat", "heartbeat:gpu1") == (kept.kind, kept.key)
    assert kept.error.startswith("outbox heartbeat row: field tick: expected a finite number")


def ledger(refresh: float = 300.0) -> ActivityLedger:
    return ActivityLedger("gpu1", active_threshold=5.0, sm_active_threshold=5.0, refresh=refresh)


def shipped_then(first: GpuActivity, then: GpuActivity, refresh: float = 300.0) -> bool:
    """Whether `then` ships after `first` was shipped and committed."""
    book = ledger(refresh)
    book.begin()
    assert book.offer("k", first, 80 * 2**30)
    book.commit(NodeHeartbeat("gpu1", first.last_reading, ("GPU-0",)))
    book.begin()
    return book.offer("k", then, 80 * 2**30)


@pytest.mark.parametrize(
    ("then", "ships"),
    [
        pytest.param({}, False, id="nothing moved"),
        pytest.param({"sm_active_recent_percent": 30.0}, True, id="SM measured now"),
        pytest.param({"process_count": 2}, True, id="a second process"),
        pytest.param({"measured_since": T0 + 50}, True, id="a gap in the readings"),
        pytest.param({"util_recent_percent": None}, True, id="utilization not measured now"),
        pytest.param({"mem_used_bytes": None}, True, id="memory not measured now"),
        pytest.param({"last_active": T0 + 50}, True, id="a busy sample, mean still idle"),
    ],
)
def test_ledger_ships_what_the_store_could_not_tell(then: dict[str, object], ships: bool) -> None:
    """Against a row of T0+30, the row of T0+60 ships only when it says something new."""
    assert ships == shipped_then(row(), row(**{"last_reading": T0 + 60, **then}))


def test_ledger_sm_activity_ships_on_crossing_and_on_5_points() -> None:
    """SM 30% -> 34.9% stands; -> 35% ships; -> 4.9% (idle) ships.

    The end of a window active at its reading is carried with it, so a steady SM-active
    job ships nothing.
    """
    first = row(sm_active_recent_percent=30.0, last_sm_active=T0 + 30)
    active = {"last_sm_active": T0 + 60, "last_reading": T0 + 60}
    assert [False, True, True, False] == [
        shipped_then(first, row(sm_active_recent_percent=34.9, **active)),
        shipped_then(first, row(sm_active_recent_percent=35.0, **active)),
        shipped_then(
            first,
            row(last_reading=T0 + 60, sm_active_recent_percent=4.9, last_sm_active=T0 + 30),
        ),
        shipped_then(first, row(sm_active_recent_percent=30.0, **active)),
    ]


def test_ledger_refreshes_at_exactly_activity_refresh() -> None:
    """A row unchanged for 299.9 s stands; at 300 s it ships again."""
    assert [False, True] == [
        shipped_then(row(), row(last_reading=T0 + 329.9)),
        shipped_then(row(), row(last_reading=T0 + 330)),
    ]


def test_ledger_forgets_a_rolled_back_tick() -> None:
    """A tick rolled back shipped nothing: its rows are offered again and ship."""
    book = ledger()
    book.begin()
    assert book.offer("k", row(), None)
    book.rollback()
    book.begin()
    assert book.offer("k", row(last_reading=T0 + 60), None)


def test_ledger_carries_an_unread_slot_to_its_last_heartbeat() -> None:
    """GPU-0 read at T0+60 (heartbeat) and not at T0+90: its row ships once, read T0+60."""
    book = ledger()
    book.begin()
    book.read("GPU-0")
    assert book.offer("k", row(), None)
    book.commit(NodeHeartbeat("gpu1", T0 + 30, ("GPU-0",)))
    book.begin()
    book.read("GPU-0")
    assert not book.offer("k", row(last_reading=T0 + 60), None)
    book.commit(book.heartbeat(T0 + 60))
    book.begin()  # GPU-0 not read
    carried = book.carried()
    book.commit(book.heartbeat(T0 + 90))
    book.begin()

    assert [("k", dataclasses.replace(row(), last_reading=T0 + 60))] == carried
    assert ([], ()) == (book.carried(), book.heartbeat(T0 + 120).slots)
