"""Spool batches over a real nats-server into a real store (issue 26, docs/design/jetstream.md).

The agent's side is the shipper with a `NatsSink` over a spool on disk; the head's side
is an `IngestWorker` in a thread writing a SQLite store. What is checked is what an admin
would see: the rows in the store once each, the spool emptied only after the store
committed, refusals counted by reason and logged with the node.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_gpu.collector.wire import WireRow, encode_batch
from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.durations import Duration
from slurm_gpu.errors import StoreError
from slurm_gpu.jetstream.bus import Bus, batch_subject, committed_key
from slurm_gpu.jetstream.ingest import IngestWorker
from slurm_gpu.node.nats_sink import NatsSink
from slurm_gpu.node.outbox import encode, fields_of
from slurm_gpu.node.shipper import DecodedBatch, RetryLater, Shipper
from slurm_gpu.node.spool import Spool
from slurm_gpu.store import Store
from tests.jetstream.natsd import NatsServer
from tests.jetstream.rig import CLUSTER, T0, Running, interval, spool_with, stored_intervals


class FlakyStore:
    """The store, refusing its first `failures` transactions as a store that is down."""

    def __init__(self, store: Store, failures: int) -> None:
        self.store, self.failures = store, failures

    def write_batches(self, batches: Sequence[tuple[str, DecodedBatch]]) -> int:
        if self.failures > 0:
            self.failures -= 1
            raise StoreError("store down: connection refused")
        return self.store.write_batches(batches)


def ship_all(tmp_path: Path, settings: NatsSettings, node: str, count: int) -> Spool:
    spool = spool_with(tmp_path / f"{node}.spool", node, count)
    sink = NatsSink(settings, CLUSTER, node)
    try:
        Shipper(spool, sink, node, batch_size=50).drain()
    finally:
        sink.close()
    return spool


def test_batches_land_in_the_store_once_and_leave_the_spool(
    tmp_path: Path, settings: NatsSettings, store: Store, worker: Running
) -> None:
    spool = ship_all(tmp_path, settings, "gpu1", 120)  # three batches of 50, 50, 20
    assert 0 == spool.backlog()
    assert [("gpu1", T0 + 60 * i) for i in range(120)] == stored_intervals(store)
    assert 3 == worker.bus.committed_seq(committed_key(CLUSTER, "gpu1"))
    assert 120 == worker.worker.metrics.rows._value.get()


def test_a_batch_published_again_lands_once(
    tmp_path: Path, settings: NatsSettings, store: Store, worker: Running
) -> None:
    """An agent killed between its publish and its delete publishes the batch again."""
    spool = spool_with(tmp_path / "gpu1.spool", "gpu1", 10)
    rows = spool.pending(100)
    sink = NatsSink(settings, CLUSTER, "gpu1")
    try:
        sink.ship_batch("gpu1", rows)
        sink.ship_batch("gpu1", rows)  # the same batch id: JetStream's duplicate
    finally:
        sink.close()
    assert 10 == len(stored_intervals(store))
    assert 1 == worker.worker.metrics.batches._value.get()


def test_without_a_worker_the_rows_stay_until_one_commits_them(
    tmp_path: Path, settings: NatsSettings, store: Store
) -> None:
    quick = dataclasses.replace(settings, commit_wait=Duration(0.5))
    spool = spool_with(tmp_path / "gpu1.spool", "gpu1", 5)
    sink = NatsSink(quick, CLUSTER, "gpu1")
    Bus(quick, "stream maker").ensure_stream()  # a worker made the stream earlier
    shipper = Shipper(spool, sink, "gpu1")
    with pytest.raises(RetryLater, match="not committed within"):
        shipper.ship_once()
    assert (5, []) == (spool.backlog(), stored_intervals(store))
    running = Running(quick, store)
    try:
        assert 5 == shipper.ship_once()  # published again: a duplicate, committed once
    finally:
        running.stop()
        sink.close()
    assert (0, 5) == (spool.backlog(), len(stored_intervals(store)))


def test_a_store_that_is_down_loses_nothing(
    tmp_path: Path, settings: NatsSettings, store: Store
) -> None:
    """The worker naks while the store refuses; the batch lands once it is back."""
    flaky = FlakyStore(store, failures=1)
    running = Running(settings, flaky)
    try:
        spool = ship_all(tmp_path, settings, "gpu1", 3)
    finally:
        running.stop()
    assert (0, 3) == (spool.backlog(), len(stored_intervals(store)))
    assert 1 == running.worker.metrics.store_down._value.get()


def test_a_worker_killed_before_its_ack_hands_the_batch_to_another(
    tmp_path: Path, settings: NatsSettings, store: Store
) -> None:
    """A worker that pulled and died: after ack_wait JetStream redelivers to a live one."""
    Bus(settings, "stream maker").ensure_stream()
    spool = spool_with(tmp_path / "gpu1.spool", "gpu1", 4)
    dead_bus = Bus(settings, "dying worker")
    dead = IngestWorker(settings, CLUSTER, store, dead_bus)
    sink = NatsSink(dataclasses.replace(settings, commit_wait=Duration(0.3)), CLUSTER, "gpu1")
    with pytest.raises(RetryLater):
        Shipper(spool, sink, "gpu1").ship_once()
    subscription = dead.subscription()
    pulled = dead_bus.call(subscription.fetch(1, timeout=2.0))
    assert 1 == len(pulled)  # ... and the worker dies here, unacked
    dead_bus.close()
    running = Running(settings, store)
    try:
        assert 4 == Shipper(spool, NatsSink(settings, CLUSTER, "gpu1"), "gpu1").ship_once()
    finally:
        running.stop()
        sink.close()
    assert 4 == len(stored_intervals(store))


def test_a_batch_of_another_node_or_with_foreign_rows_is_refused(
    settings: NatsSettings, store: Store, worker: Running, caplog: pytest.LogCaptureFixture
) -> None:
    bus = Bus(settings, "forger")
    bus.ensure_stream()  # the worker's thread may not have made it yet
    js = bus.jetstream()
    on_gpu1 = batch_subject(settings, CLUSTER, "gpu1")

    def rows(node: str) -> list[WireRow]:
        return [WireRow("interval", f"{node}:x", encode(fields_of(interval(node, T0))))]

    caplog.set_level(logging.WARNING, logger="slurm_gpu.jetstream.ingest")
    forged = encode_batch("gpu2", "gpu2:1", T0, rows("gpu2"))  # gpu2's batch on gpu1's subject
    smuggled = encode_batch("gpu1", "gpu1:2", T0, rows("gpu2"))  # gpu1's batch, gpu2's rows
    for number, body in enumerate((forged, smuggled, b"not json")):
        bus.call(js.publish(on_gpu1, body, headers={"Nats-Msg-Id": f"bad-{number}"}))
    metrics = worker.worker.metrics
    deadline = threading.Event()
    for _ in range(100):
        refused = {r: metrics.refused.labels(reason=r)._value.get() for r in ("wrong_node",
                   "foreign_rows", "malformed")}  # fmt: skip
        if sum(refused.values()) == 3:
            break
        deadline.wait(0.1)
    bus.close()
    assert {"wrong_node": 1, "foreign_rows": 1, "malformed": 1} == refused
    assert [] == stored_intervals(store)
    assert "terminated a batch on sgpu.batch.c1.gpu1 (node gpu1): wrong_node" in caplog.text


def test_a_restarted_server_keeps_what_was_published(
    tmp_path: Path, natsd: NatsServer, settings: NatsSettings, store: Store
) -> None:
    """File storage: a batch published while no worker ran survives nats-server's restart."""
    quick = dataclasses.replace(settings, commit_wait=Duration(0.3))
    Bus(quick, "stream maker").ensure_stream()
    spool = spool_with(tmp_path / "gpu1.spool", "gpu1", 3)
    rows = spool.pending(10)
    sink = NatsSink(quick, CLUSTER, "gpu1")
    with pytest.raises(RetryLater):
        sink.ship_batch("gpu1", rows)
    sink.close()
    natsd.restart()
    running = Running(settings, store)
    try:
        for _ in range(100):
            if len(stored_intervals(store)) == 3:
                break
            threading.Event().wait(0.1)
    finally:
        running.stop()
    assert 3 == len(stored_intervals(store))


def test_a_batch_over_max_batch_bytes_goes_in_several_messages(
    tmp_path: Path, settings: NatsSettings, store: Store, worker: Running
) -> None:
    small = dataclasses.replace(settings, max_batch_bytes=4096)
    spool = ship_all(tmp_path, small, "gpu1", 40)
    assert (0, 40) == (spool.backlog(), len(stored_intervals(store)))
    assert worker.worker.metrics.batches._value.get() > 1


def test_another_node_cannot_claim_a_batch_id_first(
    tmp_path: Path, settings: NatsSettings, store: Store, worker: Running
) -> None:
    """gpu2's batches land though gpu1 published the ids they would have had first.

    gpu1, a rogue, publishes on its own subject the ids of gpu2's batches made of the
    rows alone (the first design; found by helper-17). JetStream's duplicate window is
    the stream's: had gpu2's second batch come back a duplicate of gpu1's message, gpu2
    would have deleted rows that never reached the store.
    """
    rogue = NatsSink(settings, CLUSTER, "gpu1")
    spool = spool_with(tmp_path / "gpu2.spool", "gpu2", 6)
    rows = spool.pending(10)
    first, second = rows[:3], rows[3:]
    js = rogue.bus.jetstream()
    mine = encode_batch("gpu1", "gpu1:x", T0, [WireRow("interval", "gpu1:x",
                        encode(fields_of(interval("gpu1", T0))))])  # fmt: skip
    for guess in (f"gpu2:{second[0].id}-{second[-1].id}:0", f"gpu2:{second[0].id}-{second[-1].id}"):
        rogue.bus.call(js.publish(rogue.subject, mine, headers={"Nats-Msg-Id": guess}))
    victim = NatsSink(settings, CLUSTER, "gpu2")
    try:
        victim.ship_batch("gpu2", first)
        victim.ship_batch("gpu2", second)
    finally:
        victim.close()
        rogue.close()
    stored = [s for n, s in stored_intervals(store) if n == "gpu2"]
    assert [T0 + 60 * i for i in range(6)] == stored
