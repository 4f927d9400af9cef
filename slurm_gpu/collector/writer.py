"""The bounded write queue, and the writers that alone hold the store's connections.

A handler thread puts an accepted batch on the queue and waits until a writer committed
it: the agent deletes rows from its spool only after a 200, so the answer must follow the
commit. `pool_size` writers mean at most that many store connections, whatever the number
of nodes; a full queue is refused at once (503 with Retry-After) instead of piling up
requests the store cannot take.

Group commit: a writer takes the batch it got plus what arrives within `group_wait`, up
to `group_max_batches`, and writes them in one transaction (`Store.write_batches`), so the
store's per-transaction cost is paid once per group, not per node. One writer gathers at
a time while the others write: idle writers would otherwise split the arrivals into
groups of one, whose transactions cost the store (and the collector's CPU) several times
as much per batch (`bench/scale/stages.py --group 1`, then `--group 32`: 1,460 us, then
170 us of the collector's CPU per batch). When a group fails and the store still answers,
one batch's data was at fault: each batch of the group is then written alone, so one bad
batch cannot refuse the others.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from slurm_gpu.collector.metrics import CollectorMetrics
from slurm_gpu.collector.wire import Refusal
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.node.shipper import DecodedBatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Job:
    node: str
    batch: DecodedBatch
    done: Future[None]


class GroupSink(Protocol):
    """The part of the accounting store the collector writes through."""

    def write_batches(self, batches: Sequence[tuple[str, DecodedBatch]]) -> int:
        """Writes (node, batch) pairs in one transaction; returns the rows written."""
        ...

    def ping(self) -> None:
        """Raises StoreError unless the store answers."""
        ...


class BatchWriter:
    """Writes accepted batches into the store from `pool_size` threads, in groups.

    Args:
        store: the accounting store (`write_batches`; idempotent keys).
        metrics: where write times, group sizes and rows written are recorded.
        pool_size: writer threads, i.e. the most store connections used at once.
        group_max_batches: the most batches one transaction writes.
        group_wait: seconds a group smaller than group_max_batches waits for more
            batches before it is written (each agent's answer comes that much later).
        queue_depth: batches that may wait for a writer; one more is refused.
        retry_after: seconds a refused agent is told to wait (Retry-After).
        queue_wait: seconds a batch waits for room in a full queue before it is refused:
            kept connections let a burst of agents in at once (collector/server.py), which
            the writers drain in a group commit or two.
    """

    def __init__(
        self,
        store: GroupSink,
        metrics: CollectorMetrics,
        pool_size: int = 8,
        queue_depth: int = 64,
        retry_after: float = 5.0,
        group_max_batches: int = 32,
        queue_wait: float = 1.0,
        group_wait: float = 0.02,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.pool_size = pool_size
        self.group_max_batches = group_max_batches
        self.retry_after = retry_after
        self.queue_wait = queue_wait
        self.group_wait = group_wait
        self._gathering = threading.Lock()  # one writer gathers a group at a time
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_depth)
        self._threads: list[threading.Thread] = []
        metrics.track_queue(self._queue.qsize)

    def depth(self) -> int:
        """Batches waiting for a writer now."""
        return self._queue.qsize()

    def start(self) -> None:
        """Starts the writer threads."""
        for number in range(self.pool_size):
            thread = threading.Thread(
                target=self._work, name=f"collector-writer-{number}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 30.0) -> None:
        """Lets the writers finish the queued batches, then ends them."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=timeout)
        self._threads.clear()

    def write(self, node: str, batch: DecodedBatch) -> None:
        """Queues `node`'s batch and returns once the store committed it.

        Raises:
            Refusal: 503 queue_full (no room in the queue within queue_wait), 503
                store_down (the store refused or is unreachable).
        """
        job = _Job(node, batch, Future())
        try:
            self._queue.put(job, timeout=self.queue_wait)
        except queue.Full:
            raise Refusal(
                503,
                "queue_full",
                f"write queue full ({self._queue.maxsize} batches wait for the store)",
                self.retry_after,
            ) from None
        job.done.result()

    def _work(self) -> None:
        while True:
            with self._gathering:
                group, stopping = self._gather()
            if group:
                self._write(group)
            if stopping:
                return

    def _gather(self) -> tuple[list[_Job], bool]:
        """The next group: the first batch to come, and those within group_wait of it.

        Returns the group and whether stop() was asked (this writer ends after it).
        """
        job = self._queue.get()
        if job is None:
            return [], True
        group = [job]
        deadline = time.monotonic() + self.group_wait
        while len(group) < self.group_max_batches:
            try:  # timeout 0: only what is queued already
                more = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if more is None:
                return group, True
            group.append(more)
        return group, False

    def _write(self, group: list[_Job]) -> None:
        """Writes `group` in one transaction and answers each of its callers."""
        started = time.monotonic()
        try:
            rows = self.store.write_batches([(job.node, job.batch) for job in group])
        except SlurmGpuError as exc:
            answers = self._store_answers()
            if answers and len(group) > 1:
                log.warning(
                    "a group of %d batches was not written (%s); writing each alone",
                    len(group),
                    exc,
                )
                for job in group:
                    self._write([job])
                return
            if answers:  # the store is up, so this batch's rows are at fault
                log.error("the store refused the batch of %s: %s", group[0].node, exc)
            refusal = Refusal(503, "store_down", f"store: {exc}", self.retry_after)
            for job in group:
                job.done.set_exception(refusal)
        except Exception as exc:  # a bug must not kill a writer and hang its callers
            log.exception("writing %d batches (%s) failed", len(group), _nodes(group))
            for job in group:
                job.done.set_exception(exc)
        else:
            self.metrics.write_seconds.observe(time.monotonic() - started)
            self.metrics.group_batches.observe(len(group))
            self.metrics.rows_written.inc(rows)
            for job in group:
                job.done.set_result(None)

    def _store_answers(self) -> bool:
        try:
            self.store.ping()
        except SlurmGpuError:
            return False
        return True


def _nodes(group: Sequence[_Job]) -> str:
    return ", ".join(sorted({job.node for job in group}))
