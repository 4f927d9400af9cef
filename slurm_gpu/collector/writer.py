"""The bounded write queue, and the writers that alone hold the store's connections.

A handler thread puts an accepted batch on the queue and waits until a writer committed
it: the agent deletes rows from its spool only after a 200, so the answer must follow the
commit. `pool_size` writers mean at most that many store connections, whatever the number
of nodes; a full queue is refused at once (503 with Retry-After) instead of piling up
requests the store cannot take.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from slurm_gpu.collector.metrics import CollectorMetrics
from slurm_gpu.collector.wire import Refusal
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.node.shipper import DecodedBatch, StoreSink, write_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Job:
    node: str
    batch: DecodedBatch
    done: Future[None]


class BatchWriter:
    """Writes accepted batches into the store from `pool_size` threads.

    Args:
        store: the accounting store (its add_* methods; idempotent keys).
        metrics: where write times are recorded.
        pool_size: writer threads, i.e. the most store connections used at once.
        queue_depth: batches that may wait for a writer; one more is refused.
        retry_after: seconds a refused agent is told to wait (Retry-After).
    """

    def __init__(
        self,
        store: StoreSink,
        metrics: CollectorMetrics,
        pool_size: int = 8,
        queue_depth: int = 64,
        retry_after: float = 5.0,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.pool_size = pool_size
        self.retry_after = retry_after
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
            Refusal: 503 queue_full (no room in the queue), 503 store_down (the store
                refused or is unreachable).
        """
        job = _Job(node, batch, Future())
        try:
            self._queue.put_nowait(job)
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
            job = self._queue.get()
            if job is None:
                return
            started = time.monotonic()
            try:
                write_batch(self.store, job.node, job.batch)
            except SlurmGpuError as exc:
                job.done.set_exception(
                    Refusal(503, "store_down", f"store: {exc}", self.retry_after)
                )
            except Exception as exc:  # a bug must not kill a writer and hang its caller
                log.exception("writing a batch of %s failed", job.node)
                job.done.set_exception(exc)
            else:
                self.metrics.write_seconds.observe(time.monotonic() - started)
                job.done.set_result(None)
