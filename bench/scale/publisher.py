"""One NATS publisher process of bench/scale --transport nats: its share of the simulated nodes.

Every simulated node ships through the product's own `NatsSink` (slurm_gpu/node/nats_sink.py):
its own subject `sgpu.batch.<cluster>.<node>`, its own committed key, its own random
message-id token, `ship_batch` publishing and then polling the committed bucket until the
ingest workers recorded the message's stream sequence. What is simulated is only the
connection: the nodes of one process share a few `Bus` connections (`--connections`),
not one each, and `ship_batch` runs on a thread pool (`--threads`) instead of one shipper
thread per node. A node ships one message at a time, as the agent's sequential shipper.

A message event is `ticks` ticks of one node: their rows go into the node's pending rows
replaced by key, as the spool's outbox does (`INSERT OR REPLACE`: a heartbeat and a GPU's
activity row queued again replace the unshipped one), and leave in one message, as with
`[node] ship_interval` = ticks x interval. Rows the sink could not get committed stay and
leave with the node's next message.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from load import INTERVAL, SimNode, tick_rows

from slurm_gpu.collector.wire import WireRow, encode_batch
from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.jetstream.bus import Bus
from slurm_gpu.node.nats_sink import NatsSink
from slurm_gpu.node.shipper import RetryLater
from slurm_gpu.node.spool import OutboxRow

SLICE = 0.005  # the scheduler wakes this often and hands out what is due
SIZE_EVERY = 16  # one committed message in this many is encoded again for its size


@dataclass
class PubStats:
    """What one publisher process saw in one step (summed over processes by the orchestrator)."""

    due: int = 0  # message events due in the step
    committed: int = 0  # ship_batch calls that returned: published and committed
    rows: int = 0  # rows of those messages
    sized: int = 0  # committed messages whose size was taken (one in SIZE_EVERY) ...
    body_bytes: int = 0  # ... and their bytes (encode_batch of the rows shipped)
    busy: int = 0  # events whose node still had a message in flight (rows wait for the next)
    failed: Counter[str] = field(default_factory=Counter)  # RetryLater and errors, by kind
    latencies: list[float] = field(default_factory=list)  # ship_batch: publish -> committed
    acks: list[float] = field(default_factory=list)  # publish -> JetStream's ack (about)
    lags: list[float] = field(default_factory=list)  # ship_batch's start - the event's due time
    polls: int = 0  # reads of the committed bucket (Bus.committed_seq)
    pending_rows: int = 0  # rows left unshipped at the end of the step
    abandoned: int = 0  # ship_batch calls still running when the step gave up on them


class CountingBus(Bus):
    """The product's Bus, counting the commit-wait's reads of the committed bucket.

    Per thread it also notes when each read started (`reads_started`): the first one
    starts right after the publish's ack.
    """

    def __init__(self, settings: NatsSettings, name: str) -> None:
        super().__init__(settings, name)
        self.reads = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def reads_started(self) -> list[float]:
        """This thread's read start times since the last call (and forgets them)."""
        times: list[float] = getattr(self._local, "times", [])
        self._local.times = []
        return times

    def committed_seq(self, key: str) -> int:
        """Bus.committed_seq, counted."""
        with self._lock:
            self.reads += 1
        if not hasattr(self._local, "times"):
            self._local.times = []
        self._local.times.append(time.time())
        return super().committed_seq(key)


def split_row(text: str) -> tuple[str, str, str]:
    """(kind, key, payload) of a row in the wire's JSON form (load.py's templates)."""
    row = json.loads(text)
    return row["kind"], row["key"], row["payload"]


class Publisher:
    """The simulated nodes of one process, their pending rows and their sinks."""

    def __init__(
        self,
        settings: NatsSettings,
        cluster: str,
        nodes: list[SimNode],
        heartbeat: bool,
        change: float,
        connections: int,
        threads: int,
    ) -> None:
        self.nodes = nodes
        self.heartbeat, self.change = heartbeat, change
        self.buses = [
            CountingBus(settings, f"bench-scale-publisher {i}") for i in range(connections)
        ]
        self.sinks = [
            NatsSink(settings, cluster, node.name, bus=self.buses[i % connections])
            for i, node in enumerate(nodes)
        ]
        # Per node: its unshipped rows by key (insertion order = the outbox's id order).
        self.pending: list[dict[str, OutboxRow]] = [{} for _ in nodes]
        self.next_id = [1] * len(nodes)
        self.in_flight = [False] * len(nodes)
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ship")
        self.cursor = 0  # the next node to ship: continues over steps

    def queue(self, i: int, ticks: int) -> None:
        """`ticks` ticks of node i into its pending rows, replaced by key as the outbox does."""
        node, pending = self.nodes[i], self.pending[i]
        for _ in range(ticks):
            for text in tick_rows(node, self.heartbeat, self.change):
                kind, key, payload = split_row(text)
                pending.pop(key, None)  # REPLACE: the newest takes the newest place
                pending[key] = OutboxRow(self.next_id[i], kind, key, payload)
                self.next_id[i] += 1

    def step(self, multiple: float, ticks: int, start_at: float, seconds: float) -> PubStats:
        """Ships a message every INTERVAL * ticks / multiple per node for `seconds`."""
        stats = PubStats()
        reads0 = sum(b.reads for b in self.buses)
        n = len(self.nodes)
        gap = INTERVAL * ticks / multiple / n
        end = start_at + seconds
        total = math.ceil(seconds / gap)
        futures: list[Future[None]] = []
        k = 0
        time.sleep(max(0.0, start_at - time.time()))
        while k < total and time.time() < end:
            now = time.time()
            while k < total and start_at + k * gap <= now:
                due = start_at + k * gap
                i = self.cursor
                self.cursor = (self.cursor + 1) % n
                k += 1
                stats.due += 1
                with self.lock:
                    self.queue(i, ticks)
                    if self.in_flight[i]:
                        stats.busy += 1
                        continue
                    self.in_flight[i] = True
                    rows = list(self.pending[i].values())
                futures.append(self.pool.submit(self._ship, i, rows, due, stats))
            time.sleep(SLICE)
        # Every ship_batch ends within [nats] commit_wait (RetryLater past it), plus a publish.
        drain = float(self.sinks[0].settings.commit_wait) + 15.0 if self.sinks else 0.0
        _, left = wait_futures(futures, timeout=drain)
        stats.abandoned = len(left)
        stats.polls = sum(b.reads for b in self.buses) - reads0
        with self.lock:
            stats.pending_rows = sum(len(p) for p in self.pending)
        return stats

    def _ship(self, i: int, rows: list[OutboxRow], due: float, stats: PubStats) -> None:
        node, sink = self.nodes[i], self.sinks[i]
        bus = self.buses[i % len(self.buses)]
        bus.reads_started()
        started = time.time()
        stats.lags.append(started - due)
        try:
            sink.ship_batch(node.name, rows)
        except RetryLater as exc:
            with self.lock:
                stats.failed[str(exc).split(":", 1)[0][:40]] += 1
                self.in_flight[i] = False
            return
        except Exception as exc:  # a bench bug or a product error: counted, the run goes on
            with self.lock:
                stats.failed[type(exc).__name__] += 1
                self.in_flight[i] = False
            return
        done = time.time()
        reads = bus.reads_started()
        size = 0
        if i % SIZE_EVERY == 0:  # the batch id is about as long as this placeholder
            wire = [WireRow(r.kind, r.key, r.payload) for r in rows]
            size = len(encode_batch(node.name, "x" * 60, started, wire))
        with self.lock:
            pending = self.pending[i]
            for r in rows:  # rows queued again meanwhile (a newer id) stay for the next one
                mine = pending.get(r.key)
                if mine is not None and mine.id == r.id:
                    del pending[r.key]
            self.in_flight[i] = False
            stats.committed += 1
            stats.rows += len(rows)
            if size:
                stats.sized += 1
                stats.body_bytes += size
            stats.latencies.append(done - started)
            if reads:  # one message a batch here (none is over max_batch_bytes)
                stats.acks.append(reads[0] - started)

    def close(self) -> None:
        """Stops the pool and closes the connections."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        for bus in self.buses:
            bus.close()


def serve(
    conn: Connection,
    url: str,
    cluster: str,
    numbers: list[int],
    origin: float,
    heartbeat: bool,
    change: float,
    connections: int,
    threads: int,
) -> None:
    """A publisher process: ("step", multiple, ticks, start_at, seconds) until ("stop",)."""
    # The orchestrator's handlers (SIGTERM raises KeyboardInterrupt) are not this process's:
    # it is ended by ("stop",), or by its pid.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    settings = NatsSettings(url=url)  # the product's defaults: commit_wait 30 s ...
    # Past their first tick (their job's event, inventory, every GPU's first activity).
    nodes = [SimNode(number=n, origin=origin, ticks=1, primed=True) for n in numbers]
    publisher = Publisher(settings, cluster, nodes, heartbeat, change, connections, threads)
    try:
        while True:
            message: tuple[Any, ...] = conn.recv()
            if message[0] == "stop":
                return
            _, multiple, ticks, start_at, seconds = message
            conn.send(publisher.step(multiple, ticks, start_at, seconds))
    finally:
        publisher.close()
