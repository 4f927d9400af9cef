"""Shipping the spool's outbox to the accounting store, and nothing else.

Rows leave the spool only after the store committed them; every row carries an
idempotency key, so a crash between commit and delete ships it again harmlessly.
While the store is down the shipper backs off (doubling up to a maximum) and the
sampler keeps filling the spool; it catches up when the store returns. A row that does
not decode (a damaged payload, an unknown kind) would fail every retry and block the
rows behind it: it is moved, whole, to the spool's `quarantine` table instead.

The shipper hands each batch either, decoded, to a `StoreSink` (the store itself, direct
mode: `Store.write_batches`, one transaction a batch) or, as read, to a `BatchSink` (the
collector's client, issue 16); the collector decodes it with the same `DecodedBatch` and
writes it with the same `Store.write_batches`, so both modes write through the store's one
writer (store/ingest.py). A sink that is overloaded raises `RetryLater`, whose
`retry_after` the back-off honours.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.models import (
    GpuActivity,
    GpuDevice,
    GpuInterval,
    GpuPhysicalInterval,
    JobEvent,
    JobGpuSummary,
    LostGpu,
    NodeHeartbeat,
)
from slurm_gpu.node.outbox import (
    OutboxError,
    decode_activity,
    decode_event,
    decode_heartbeat,
    decode_interval,
    decode_inventory,
    decode_physical,
    decode_summary,
)
from slurm_gpu.node.spool import OutboxRow, Spool

log = logging.getLogger(__name__)


class StoreSink(Protocol):
    """The part of the accounting store the shipper writes to (`Store.write_batches`)."""

    def write_batches(self, batches: Sequence[tuple[str, DecodedBatch]]) -> int:
        """Writes `(node, batch)` pairs in one transaction (idempotent); returns rows written."""
        ...


@runtime_checkable
class BatchSink(Protocol):
    """A sink that takes a spool batch whole, as the outbox rows it was read as."""

    def ship_batch(self, node: str, rows: Sequence[OutboxRow]) -> None:
        """Delivers the rows (committed when it returns). Raises SlurmGpuError."""
        ...


class RetryLater(SlurmGpuError):
    """The sink cannot take the batch now; the shipper keeps it and retries.

    Attributes:
        retry_after: seconds the sink asked to wait (HTTP Retry-After), None if it did not.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)


# The order store/ingest.py writes a batch in: events first (a job's row exists before
# its intervals and summaries arrive), activity before summaries (a finished job's
# activity is forgotten once it is summarized), heartbeats last (one vouches for the
# activity rows queued before it: store/heartbeats.py).
_ORDER = {
    "event": 0,
    "inventory": 1,
    "activity": 2,
    "interval": 3,
    "physical": 4,
    "summary": 5,
    "heartbeat": 6,
}


@dataclass
class DecodedBatch:
    """One batch of outbox rows, decoded; `bad` holds (id, error) of those that failed."""

    events: list[JobEvent] = field(default_factory=list)
    inventory: list[tuple[list[GpuDevice], float, list[LostGpu] | None]] = field(
        default_factory=list
    )
    activity: list[GpuActivity] = field(default_factory=list)
    intervals: list[GpuInterval] = field(default_factory=list)
    physical: list[GpuPhysicalInterval] = field(default_factory=list)
    summaries: list[JobGpuSummary] = field(default_factory=list)
    heartbeats: list[NodeHeartbeat] = field(default_factory=list)
    bad: list[tuple[int, str]] = field(default_factory=list)

    def add(self, kind: str, payload: str) -> None:
        """Decodes one row into its list. Raises OutboxError."""
        if kind == "event":
            self.events.append(decode_event(payload))
        elif kind == "inventory":
            self.inventory.append(decode_inventory(payload))
        elif kind == "activity":
            self.activity.append(decode_activity(payload))
        elif kind == "interval":
            self.intervals.append(decode_interval(payload))
        elif kind == "physical":
            self.physical.append(decode_physical(payload))
        elif kind == "summary":
            self.summaries.append(decode_summary(payload))
        elif kind == "heartbeat":
            self.heartbeats.append(decode_heartbeat(payload))
        else:
            raise OutboxError(f"outbox row of unknown kind {kind!r}")


def sort_rows(rows: list[OutboxRow]) -> None:
    """Puts a batch's rows in the order they are written (events first, summaries last)."""
    rows.sort(key=lambda r: (_ORDER.get(r.kind, 9), r.id))


class Shipper:
    """Moves outbox rows to the store in batches.

    Args:
        spool: the node's spool (the shipper's own connection).
        store: where rows go: the store (decoded here), or a BatchSink (the rows as read).
        node: this node's name (for inventory rows).
        batch_size: outbox rows per store transaction.
        backoff_max: longest wait between retries while the store is down, seconds.
        on_summaries: called with the job ids whose summaries the store just committed
            (writes the AdminComment); its failures are logged, never retried forever.
        clock: POSIX time, for when a row was quarantined.
        ship_interval: seconds `run` waits after each pass ([node] ship_interval), so
            that the rows of several ticks leave in one batch.

    Attributes:
        wake: set to end `run`'s wait at once (a request to ship now: jetstream/flush.py).
        before_pass: called before each pass of `run` (subscribing to such requests).
        after_pass: called with the time a pass began, once everything the spool held
            then is shipped (answering those requests).
    """

    def __init__(
        self,
        spool: Spool,
        store: StoreSink | BatchSink,
        node: str,
        batch_size: int = 5000,
        backoff_max: float = 300.0,
        on_summaries: Callable[[list[int]], None] | None = None,
        clock: Callable[[], float] = time.time,
        ship_interval: float = 0.0,
    ) -> None:
        self.spool = spool
        self.store = store
        self.node = node
        self.batch_size = batch_size
        self.backoff_max = backoff_max
        self.on_summaries = on_summaries
        self.clock = clock
        self.ship_interval = ship_interval
        self.wake = threading.Event()
        self.before_pass: Callable[[], object] | None = None
        self.after_pass: Callable[[float], object] | None = None
        self.failures = 0
        self.shipped_total = 0

    def ship_once(self) -> int:
        """Ships one batch; returns rows shipped (0: outbox empty). Raises on store errors."""
        return self._ship_batch()[1]

    def _ship_batch(self) -> tuple[int, int]:
        """(rows taken off the outbox, rows of them shipped); the rest were quarantined."""
        rows = self.spool.pending(self.batch_size)
        if not rows:
            return 0, 0
        sort_rows(rows)
        batch = DecodedBatch()
        keys = {row.id: row.key for row in rows}
        for row in rows:
            try:
                batch.add(row.kind, row.payload)
            except OutboxError as exc:
                batch.bad.append((row.id, str(exc)))
        if batch.bad:
            # Before shipping: these rows would fail every retry and block the outbox.
            self.spool.quarantine(batch.bad, self.clock())
            for row_id, error in batch.bad:
                log.error(
                    "outbox row %r moved to the quarantine table of %s: %s",
                    keys[row_id],
                    self.spool.path,
                    error,
                )
        bad = {row_id for row_id, _ in batch.bad}
        good = [r for r in rows if r.id not in bad]
        if isinstance(self.store, BatchSink):
            if good:
                self.store.ship_batch(self.node, good)
        else:
            self.store.write_batches([(self.node, batch)])
        summaries = batch.summaries
        self.spool.delete([r.id for r in good])
        shipped = len(rows) - len(bad)
        self.shipped_total += shipped
        if summaries and self.on_summaries is not None:
            try:
                self.on_summaries(sorted({s.job_id for s in summaries}))
            except SlurmGpuError as exc:
                log.warning("could not write job summaries to Slurm: %s", exc)
        return len(rows), shipped

    def drain(self) -> int:
        """Ships until the outbox is empty; returns rows shipped."""
        total = 0
        while True:
            taken, shipped = self._ship_batch()
            if taken == 0:
                return total
            total += shipped

    def run(self, stop: threading.Event, idle_wait: float = 1.0) -> None:
        """Ships until `stop` is set, backing off while the store is unreachable."""
        delay = 1.0
        while not stop.is_set():
            try:
                if self.before_pass is not None:
                    self.before_pass()
                began = self.clock()
                self.wake.clear()
                shipped = self.drain()
                if self.after_pass is not None:
                    self.after_pass(began)
                if self.failures:
                    log.info("store reachable again after %d failed attempts", self.failures)
                self.failures, delay = 0, 1.0
                self._pause(stop, max(self.ship_interval, idle_wait if shipped == 0 else 0.0))
            except SlurmGpuError as exc:
                self.failures += 1
                wait = self.retry_delay(exc, delay)
                log.warning(
                    "shipping failed (%s); %d rows wait in the spool; retry in %.0fs",
                    exc,
                    self.spool.backlog(),
                    wait,
                )
                stop.wait(wait)
                delay = min(delay * 2, self.backoff_max)

    def _pause(self, stop: threading.Event, seconds: float) -> None:
        """Waits `seconds`, or until `stop`, or until `wake` (a request to ship now)."""
        if self.before_pass is None:  # nobody can ask: one wait
            stop.wait(seconds)
            return
        deadline = time.monotonic() + seconds
        while not stop.is_set() and not self.wake.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            stop.wait(min(left, 0.1))

    def retry_delay(self, exc: SlurmGpuError, delay: float) -> float:
        """Seconds to wait after `exc`: the back-off's, or longer when the sink asked so.

        A RetryLater's `retry_after` (the collector's Retry-After) is honoured up to
        `backoff_max`: a collector that sheds load is not asked again sooner than it said.
        """
        if isinstance(exc, RetryLater) and exc.retry_after is not None:
            return max(delay, min(exc.retry_after, self.backoff_max))
        return delay
