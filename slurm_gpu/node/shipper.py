"""Shipping the spool's outbox to the accounting store, and nothing else.

Rows leave the spool only after the store committed them; every row carries an
idempotency key, so a crash between commit and delete ships it again harmlessly.
While the store is down the shipper backs off (doubling up to a maximum) and the
sampler keeps filling the spool; it catches up when the store returns.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.models import GpuActivity, GpuDevice, GpuInterval, JobEvent, JobGpuSummary
from slurm_gpu.node.spool import Spool, decode_event, decode_interval, decode_summary

log = logging.getLogger(__name__)


class StoreSink(Protocol):
    """The part of the accounting store the shipper writes to."""

    def add_events(self, events: Sequence[JobEvent]) -> int: ...
    def add_intervals(self, rows: Sequence[GpuInterval]) -> int: ...
    def add_summaries(self, rows: Sequence[JobGpuSummary]) -> int: ...
    def upsert_inventory(self, node: str, devices: Sequence[GpuDevice], seen_at: float) -> None: ...
    def add_activity(self, rows: Sequence[GpuActivity]) -> int: ...
    def forget_activity(self, job_ids: Sequence[int]) -> None: ...


# Events first: a job's row exists before its intervals and summaries arrive.
# Activity before summaries: a finished job's activity is forgotten once it is summarized.
_ORDER = {"event": 0, "inventory": 1, "activity": 2, "interval": 3, "summary": 4}


class Shipper:
    """Moves outbox rows to the store in batches.

    Args:
        spool: the node's spool (the shipper's own connection).
        store: where rows go.
        node: this node's name (for inventory rows).
        batch_size: outbox rows per store transaction.
        backoff_max: longest wait between retries while the store is down, seconds.
        on_summaries: called with the job ids whose summaries the store just committed
            (writes the AdminComment); its failures are logged, never retried forever.
    """

    def __init__(
        self,
        spool: Spool,
        store: StoreSink,
        node: str,
        batch_size: int = 5000,
        backoff_max: float = 300.0,
        on_summaries: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.spool = spool
        self.store = store
        self.node = node
        self.batch_size = batch_size
        self.backoff_max = backoff_max
        self.on_summaries = on_summaries
        self.failures = 0
        self.shipped_total = 0

    def ship_once(self) -> int:
        """Ships one batch; returns rows shipped (0: outbox empty). Raises on store errors."""
        rows = self.spool.pending(self.batch_size)
        if not rows:
            return 0
        rows.sort(key=lambda r: (_ORDER.get(r[1], 9), r[0]))
        events = [decode_event(p) for _, kind, _, p in rows if kind == "event"]
        intervals = [decode_interval(p) for _, kind, _, p in rows if kind == "interval"]
        summaries = [decode_summary(p) for _, kind, _, p in rows if kind == "summary"]
        inventory = [p for _, kind, _, p in rows if kind == "inventory"]
        activity = [GpuActivity(**json.loads(p)) for _, kind, _, p in rows if kind == "activity"]
        if events:
            self.store.add_events(events)
        for payload in inventory:
            data = json.loads(payload)
            devices = [GpuDevice(**d) for d in data["devices"]]
            self.store.upsert_inventory(self.node, devices, data["seen_at"])
        if activity:
            self.store.add_activity(activity)
        if intervals:
            self.store.add_intervals(intervals)
        if summaries:
            self.store.add_summaries(summaries)
            self.store.forget_activity(sorted({s.job_id for s in summaries}))
        self.spool.delete([r[0] for r in rows])
        self.shipped_total += len(rows)
        if summaries and self.on_summaries is not None:
            try:
                self.on_summaries(sorted({s.job_id for s in summaries}))
            except SlurmGpuError as exc:
                log.warning("could not write job summaries to Slurm: %s", exc)
        return len(rows)

    def drain(self) -> int:
        """Ships until the outbox is empty; returns rows shipped."""
        total = 0
        while (n := self.ship_once()) > 0:
            total += n
        return total

    def run(self, stop: threading.Event, idle_wait: float = 1.0) -> None:
        """Ships until `stop` is set, backing off while the store is unreachable."""
        delay = 1.0
        while not stop.is_set():
            try:
                shipped = self.drain()
                if self.failures:
                    log.info("store reachable again after %d failed attempts", self.failures)
                self.failures, delay = 0, 1.0
                stop.wait(idle_wait if shipped == 0 else 0)
            except SlurmGpuError as exc:
                self.failures += 1
                log.warning(
                    "shipping failed (%s); %d rows wait in the spool; retry in %.0fs",
                    exc,
                    self.spool.backlog(),
                    delay,
                )
                stop.wait(delay)
                delay = min(delay * 2, self.backoff_max)
