"""`slurm-gpu ingest run`: a stateless worker from the JetStream stream to the store.

Any number of workers, on any hosts, share one durable pull consumer per cluster
(`slurm-gpu-ingest-<cluster>`, filtered on that cluster's subjects), so JetStream hands
each message to one of them. A worker pulls up to `[nats] fetch_batches` messages,
checks each as the collector checked a request (the subject names a node of the
cluster; the body is a wire batch of that node holding that node's rows only), writes
the good ones in one store transaction through the store's one writer, records per node
the highest stream sequence committed (the agents delete their rows on it), and acks.
A message that fails a check is terminated (never redelivered), logged with its node,
subject and reason, and counted; while the store is down the messages are nak'ed with a
delay and come back (docs/design/jetstream.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from prometheus_client import CollectorRegistry, Counter, Histogram

from slurm_gpu.collector.credential import decode_rows
from slurm_gpu.collector.wire import Refusal, WireError, decode_batch
from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.errors import SlurmGpuError, StoreError
from slurm_gpu.jetstream.bus import Bus, BusError, committed_key, node_of_subject, token
from slurm_gpu.node.shipper import DecodedBatch, StoreSink

log = logging.getLogger(__name__)

REASONS = ("malformed", "wrong_node", "foreign_rows", "oversized")
# Seconds a message waits before it is handed out again after the store refused it.
RETRY_DELAY = 5.0


class IngestMetrics:
    """The worker's counters, in a registry of their own (`registry` for /metrics)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.batches = Counter(
            "slurm_gpu_ingest_batches", "Batches committed to the store", registry=self.registry
        )
        self.rows = Counter(
            "slurm_gpu_ingest_rows", "Outbox rows in the committed batches", registry=self.registry
        )
        self.refused = Counter(
            "slurm_gpu_ingest_refused",
            "Batches terminated unwritten, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.store_down = Counter(
            "slurm_gpu_ingest_store_failures",
            "Store transactions that failed (their batches come back later)",
            registry=self.registry,
        )
        self.write_seconds = Histogram(
            "slurm_gpu_ingest_write_seconds",
            "Seconds to write one pull's batches (one transaction)",
            registry=self.registry,
        )
        for reason in REASONS:
            self.refused.labels(reason=reason)


@dataclass
class _Checked:
    msg: Msg
    node: str
    batch: DecodedBatch
    rows: int
    seq: int


class IngestWorker:
    """Pulls batches of one cluster, writes them, records them committed, acks them.

    Args:
        settings: [nats].
        cluster: [cluster] name: the subjects and consumer this worker serves.
        store: where batches go (`Store.write_batches`, one transaction a pull).
        bus: the NATS connection (a worker key's: it makes the stream and bucket).
        on_summaries: called with the job ids whose summaries were just committed
            (writes the AdminComment); its failures are logged.
        metrics: the counters (tests read them).
        retry_delay: seconds before batches the store refused are handed out again.
    """

    def __init__(
        self,
        settings: NatsSettings,
        cluster: str,
        store: StoreSink,
        bus: Bus,
        *,
        on_summaries: Callable[[list[int]], None] | None = None,
        metrics: IngestMetrics | None = None,
        retry_delay: float = RETRY_DELAY,
    ) -> None:
        self.settings = settings
        self.cluster = token("cluster", cluster)
        self.store = store
        self.bus = bus
        self.on_summaries = on_summaries
        self.metrics = metrics or IngestMetrics()
        self.retry_delay = retry_delay
        self.durable = f"slurm-gpu-ingest-{self.cluster}"
        self._subscription: JetStreamContext.PullSubscription | None = None

    def subscription(self) -> JetStreamContext.PullSubscription:
        """The shared durable pull consumer (made, with the stream, on first use)."""
        if self._subscription is None:
            self.bus.ensure_stream()
            js = self.bus.jetstream()
            s = self.settings
            config = ConsumerConfig(
                durable_name=self.durable,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=float(s.ack_wait),
                max_ack_pending=max(1000, 4 * s.fetch_batches),
                filter_subject=f"{s.subject_prefix}.{self.cluster}.*",
            )
            self._subscription = self.bus.call(
                js.pull_subscribe(
                    config.filter_subject or "", durable=self.durable, stream=s.stream,
                    config=config,
                )
            )  # fmt: skip
        return self._subscription

    def pull_once(self, wait: float = 1.0) -> int:
        """One pull: up to fetch_batches messages within `wait` seconds.

        Returns the batches committed (0: none came). Raises BusError when NATS is
        unreachable.
        """
        subscription = self.subscription()

        async def fetch() -> list[Msg]:
            try:
                return await subscription.fetch(self.settings.fetch_batches, timeout=wait)
            except NatsTimeout:
                return []

        messages = self.bus.call(fetch(), timeout=wait + self.bus.timeout)
        if not messages:
            return 0
        checked = [c for c in (self._check(m) for m in messages) if c is not None]
        if not checked:
            return 0
        return self._commit(checked)

    def _check(self, msg: Msg) -> _Checked | None:
        """The message's batch, or None after terminating it with its reason logged."""
        node = node_of_subject(self.settings, self.cluster, msg.subject)
        try:
            if len(msg.data) > self.settings.max_batch_bytes:
                raise Refusal(413, "oversized", f"{len(msg.data)} bytes, over max_batch_bytes")
            try:
                wire = decode_batch(msg.data)
            except WireError as exc:
                raise Refusal(400, "malformed", str(exc)) from None
            if node is None or wire.node != node:
                raise Refusal(
                    403, "wrong_node", f"a batch of node {wire.node!r} on subject {msg.subject}"
                )
            batch = decode_rows(wire)
        except Refusal as refusal:
            self.metrics.refused.labels(reason=refusal.reason).inc()
            log.warning(
                "terminated a batch on %s (node %s): %s: %s",
                msg.subject,
                node or "?",
                refusal.reason,
                refusal,
            )
            self.bus.call(msg.term())
            return None
        return _Checked(msg, node, batch, len(wire.rows), msg.metadata.sequence.stream)

    def _commit(self, checked: Sequence[_Checked]) -> int:
        """Writes the batches in one transaction; records them committed; acks them."""
        began = time.perf_counter()
        try:
            self.store.write_batches([(c.node, c.batch) for c in checked])
        except StoreError as exc:
            self.metrics.store_down.inc()
            log.warning(
                "store write of %d batches failed (%s); they come back in %.0fs",
                len(checked),
                exc,
                self.retry_delay,
            )
            for c in checked:
                self.bus.call(c.msg.nak(delay=self.retry_delay))
            return 0
        self.metrics.write_seconds.observe(time.perf_counter() - began)
        highest: dict[str, int] = {}
        for c in checked:
            highest[c.node] = max(highest.get(c.node, 0), c.seq)
        for node, seq in highest.items():
            self.bus.record_committed(committed_key(self.cluster, node), seq)
        for c in checked:
            self.bus.call(c.msg.ack())
        self.metrics.batches.inc(len(checked))
        self.metrics.rows.inc(sum(c.rows for c in checked))
        jobs = sorted({s.job_id for c in checked for s in c.batch.summaries})
        if jobs and self.on_summaries is not None:
            try:
                self.on_summaries(jobs)
            except SlurmGpuError as exc:
                log.warning("could not write job summaries to Slurm: %s", exc)
        return len(checked)

    def run(self, stop: threading.Event, backoff_max: float = 30.0) -> None:
        """Pulls until `stop` is set, backing off while NATS is unreachable."""
        delay = 1.0
        while not stop.is_set():
            try:
                self.pull_once()
                delay = 1.0
            except BusError as exc:
                log.warning("NATS: %s; retry in %.0fs", exc, delay)
                stop.wait(delay)
                delay = min(delay * 2, backoff_max)
