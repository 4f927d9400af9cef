"""Shipping spool batches over NATS JetStream to the ingest workers (issue 26).

With `[node] ship_to = "nats"` the agent holds no store URL: each batch the shipper reads
is published to its node's subject (slurm_gpu/jetstream/bus.py), in messages of at most
`[nats] max_batch_bytes` encoded as the collector's wire format, each with its id as
`Nats-Msg-Id`. `ship_batch` returns (and the shipper deletes the rows) only once the
workers recorded the message's stream sequence as committed to the store for this node
(docs/design/jetstream.md): JetStream's publish ack alone is not durability. Anything
short of that is a `RetryLater`: the rows stay in the spool and are published again, a
duplicate that JetStream and the store's keys absorb.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Sequence

from slurm_gpu.collector.wire import WireRow, encode_batch
from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.jetstream.bus import Bus, BusError, batch_subject, committed_key
from slurm_gpu.node.shipper import RetryLater
from slurm_gpu.node.spool import OutboxRow


class NatsSink:
    """A shipper's BatchSink that publishes each batch and waits until it is committed.

    Args:
        settings: [nats].
        cluster: [cluster] name (the subject's and the committed key's).
        bus: the connection (tests pass their own; else one named after the node).
        clock: POSIX seconds, for the batch's `sent` and its id.
        sleep: waits between reads of the committed sequence (tests pass their own).
    """

    def __init__(
        self,
        settings: NatsSettings,
        cluster: str,
        node: str,
        *,
        bus: Bus | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.subject = batch_subject(settings, cluster, node)
        self.key = committed_key(cluster, node)
        self.bus = bus or Bus(settings, f"slurm-gpu-agent {node}")
        self.clock = clock
        self.sleep = sleep
        # JetStream's duplicate window spans the whole stream, and any node may set any
        # Nats-Msg-Id: were our ids guessable, another node could publish one of them
        # first, our batch would come back a "duplicate" of its message, and we would
        # delete rows that never reached the store. A random token of this process
        # makes them unguessable; a batch published again after a restart gets a new id
        # (the store's idempotent keys absorb that duplicate).
        self.instance = secrets.token_hex(16)

    def ship_batch(self, node: str, rows: Sequence[OutboxRow]) -> None:
        """Publishes the rows and returns once the store committed them. Raises RetryLater."""
        if not rows:
            return
        wire = [WireRow(r.kind, r.key, r.payload) for r in rows]
        sent = self.clock()
        # The same rows retried by this process get the same ids (the outbox ids they
        # span), so that JetStream drops the retry within its duplicate window.
        ids = [r.id for r in rows]
        batch = f"{node}:{min(ids)}-{max(ids)}"
        for part, chunk in enumerate(self._chunks(node, batch, sent, wire)):
            self._publish_and_wait(f"{node}:{self.instance}:{min(ids)}-{max(ids)}:{part}", chunk)

    def _chunks(
        self, node: str, batch: str, sent: float, rows: Sequence[WireRow]
    ) -> Iterator[bytes]:
        """The batch as messages of at most max_batch_bytes (halving until each fits)."""
        body = encode_batch(node, batch, sent, rows)
        if len(body) <= self.settings.max_batch_bytes:
            yield body
            return
        if len(rows) == 1:
            raise RetryLater(
                f"outbox row {rows[0].key} alone is {len(body)} bytes, over [nats]"
                f" max_batch_bytes {self.settings.max_batch_bytes}: raise it (and the"
                " server's max_payload)"
            )
        half = len(rows) // 2
        yield from self._chunks(node, batch, sent, rows[:half])
        yield from self._chunks(node, batch, sent, rows[half:])

    def _publish_and_wait(self, message_id: str, body: bytes) -> None:
        try:
            js = self.bus.jetstream()
            ack = self.bus.call(js.publish(self.subject, body, headers={"Nats-Msg-Id": message_id}))
        except BusError as exc:
            hint = ""
            if "no response from stream" in str(exc):  # nats-py's NoStreamResponseError
                hint = f" (no stream {self.settings.stream} yet: an ingest worker makes it)"
            raise RetryLater(f"publishing to {self.subject}: {exc}{hint}") from None
        deadline = time.monotonic() + float(self.settings.commit_wait)
        delay = 0.02
        while True:
            try:
                if self.bus.committed_seq(self.key) >= ack.seq:
                    return
            except BusError as exc:
                raise RetryLater(f"reading the committed batches: {exc}") from None
            if time.monotonic() >= deadline:
                raise RetryLater(
                    f"batch {message_id} (stream sequence {ack.seq}) not committed within"
                    f" {float(self.settings.commit_wait):.0f}s: is an ingest worker"
                    " (`slurm-gpu ingest run`) running, and the store up?"
                )
            self.sleep(delay)
            delay = min(delay * 2, 0.5)

    def close(self) -> None:
        """Closes the NATS connection."""
        self.bus.close()
