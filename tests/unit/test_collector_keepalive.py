"""Keep-alive between the agent's CollectorSink and the collector: one connection per node.

An agent ships every tick over the connection it keeps; a connection the collector closed
meanwhile (restarted, idle too long) is reopened and the batch sent again, nothing lost;
idle connections hold no request thread.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slurm_gpu.collector.credential import CredentialCheck, NodeAddresses
from slurm_gpu.collector.metrics import CollectorMetrics
from slurm_gpu.collector.server import Collector
from slurm_gpu.collector.writer import BatchWriter
from slurm_gpu.node.collector_sink import CollectorSink
from slurm_gpu.node.outbox import encode, fields_of
from slurm_gpu.node.shipper import RetryLater
from slurm_gpu.node.spool import OutboxRow

from .test_collector import NOW, FakeMunge, RecordingStore, interval

NODES = {f"gpu{n}": ["127.0.0.1"] for n in range(1, 5)}


def loopback_collector(
    munge: FakeMunge, store: RecordingStore, listen: str = "127.0.0.1:0", workers: int = 4
) -> Collector:
    metrics = CollectorMetrics()
    check = CredentialCheck(
        munge, NodeAddresses(NODES, resolve=lambda a: [a]), ttl=300.0, clock=lambda: NOW + 1
    )
    writer = BatchWriter(store, metrics, pool_size=1, queue_depth=8)
    collector = Collector(check, writer, metrics, listen, workers=workers)
    collector.start()
    return collector


def rows(node: str, *starts: float) -> list[OutboxRow]:
    return [
        OutboxRow(n, "interval", f"{node}:GPU-1:{s!r}", encode(fields_of(interval(node, s))))
        for n, s in enumerate(starts, 1)
    ]


def counted(collector: Collector, name: str) -> float:
    value = collector.metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


@pytest.fixture
def munge() -> FakeMunge:
    return FakeMunge(address="127.0.0.1")


@pytest.fixture
def store() -> RecordingStore:
    return RecordingStore()


@pytest.fixture
def sinks() -> Iterator[list[CollectorSink]]:
    made: list[CollectorSink] = []
    yield made
    for sink in made:
        sink.close()


def sink_to(collector: Collector, munge: FakeMunge, sinks: list[CollectorSink]) -> CollectorSink:
    sinks.append(CollectorSink(f"http://{collector.address}", munge.encode, timeout=10.0))
    return sinks[-1]


def test_batches_of_a_node_share_one_connection(
    munge: FakeMunge, store: RecordingStore, sinks: list[CollectorSink]
) -> None:
    """Three batches and a refused one in between: one connection, every good row written."""
    collector = loopback_collector(munge, store)
    try:
        sink = sink_to(collector, munge, sinks)
        sink.ship_batch("gpu1", rows("gpu1", 0.0))
        with pytest.raises(RetryLater, match="403 wrong_node"):
            sink.ship_batch("gpu9", rows("gpu9", 0.0))  # a node the collector does not know
        sink.ship_batch("gpu1", rows("gpu1", 60.0, 120.0))
        sink.ship_batch("gpu1", rows("gpu1", 180.0))
        accepted = counted(collector, "slurm_gpu_collector_connections_total")
        open_now = counted(collector, "slurm_gpu_collector_open_connections")
    finally:
        collector.stop()
    assert (1.0, 1.0) == (accepted, open_now)
    assert 3.0 == counted(collector, "slurm_gpu_collector_batches_total")
    assert [0.0, 60.0, 120.0, 180.0] == [r.period_start for r in store.intervals]


def test_a_connection_the_collector_closed_is_reopened_and_the_batch_sent_again(
    munge: FakeMunge, store: RecordingStore, sinks: list[CollectorSink]
) -> None:
    """Collector restarted between two ticks: the next batch goes on a new connection."""
    first = loopback_collector(munge, store)
    address = first.address
    sink = sink_to(first, munge, sinks)
    try:
        sink.ship_batch("gpu1", rows("gpu1", 0.0))
    finally:
        first.stop()  # closes the sink's kept connection
    second = loopback_collector(munge, store, listen=address)
    try:
        sink.ship_batch("gpu1", rows("gpu1", 60.0))  # no RetryLater: retried on a new one
        sink.ship_batch("gpu1", rows("gpu1", 120.0))
    finally:
        second.stop()
    assert [0.0, 60.0, 120.0] == [r.period_start for r in store.intervals]
    assert (1.0, 2.0) == (
        counted(second, "slurm_gpu_collector_connections_total"),
        counted(second, "slurm_gpu_collector_batches_total"),
    )


def test_a_collector_that_is_gone_is_unreachable_and_the_rows_stay(
    munge: FakeMunge, store: RecordingStore, sinks: list[CollectorSink]
) -> None:
    """Kept connection closed and nothing listening: one RetryLater, not a reconnect loop.

    The shipper keeps the rows (test_collector_munge: they land once it is back).
    """
    collector = loopback_collector(munge, store)
    sink = sink_to(collector, munge, sinks)
    try:
        sink.ship_batch("gpu1", rows("gpu1", 0.0))
    finally:
        collector.stop()
    with pytest.raises(RetryLater, match="unreachable"):
        sink.ship_batch("gpu1", rows("gpu1", 60.0))
    assert [0.0] == [r.period_start for r in store.intervals]


def test_idle_connections_hold_no_request_thread(
    munge: FakeMunge, store: RecordingStore, sinks: list[CollectorSink]
) -> None:
    """Four nodes keep their connections open to a collector of one request thread.

    Each of their next batches is still served: an idle connection waits in the selector.
    """
    collector = loopback_collector(munge, store, workers=1)
    nodes = [f"gpu{n}" for n in range(1, 5)]
    try:
        by_node = {node: sink_to(collector, munge, sinks) for node in nodes}
        for start in (0.0, 60.0):
            for node, sink in by_node.items():
                sink.ship_batch(node, rows(node, start))
        accepted = counted(collector, "slurm_gpu_collector_connections_total")
    finally:
        collector.stop()
    assert 4.0 == accepted
    assert sorted((n, s) for n in nodes for s in (0.0, 60.0)) == sorted(
        (r.node, r.period_start) for r in store.intervals
    )
