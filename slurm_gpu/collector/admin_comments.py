"""The jobs' AdminComment, written by the collector as a direct-to-store agent writes it.

An agent with `[node] ship_to = "collector"` reads no store, so it cannot merge a finished
job's summaries (every node's) into the AdminComment token (slurm/admin_comment.py). The
collector can: after it committed a batch holding summaries, it queues their jobs, and one
thread writes each job's token from the store (sacct, then sacctmgr modify job), off the
request path, so an agent's answer never waits on slurmdbd. A job Slurm refuses (slurmdbd
down, sacctmgr failing) is logged and tried again later, with a growing delay, for up to
`give_up_after`: the summaries stay committed whatever happens, and the token is written
from them once slurmdbd answers again. The queue is in memory: a collector stopped with
jobs still waiting logs them (`slurm-gpu job` and the reports read the store, not the
token).
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.slurm.admin_comment import write_job_summary
from slurm_gpu.slurm.runner import CommandRunner
from slurm_gpu.store import Store

log = logging.getLogger(__name__)

MAX_RETRY = 600.0  # the longest wait between two tries of a job


class AdminComments:
    """Writes the AdminComment of jobs whose summaries the collector committed.

    Args:
        runner: runs sacct and sacctmgr.
        store: where the jobs' summaries are read.
        cluster: the Slurm cluster's name ([cluster] name).
        first_retry: seconds from a job's first failure to its next try; doubled after
            each failure, up to MAX_RETRY.
        give_up_after: seconds after a job's first failure when it is given up (logged).
    """

    def __init__(
        self,
        runner: CommandRunner,
        store: Store,
        cluster: str,
        first_retry: float = 30.0,
        give_up_after: float = 86400.0,
    ) -> None:
        self.runner = runner
        self.store = store
        self.cluster = cluster
        self.first_retry = first_retry
        self.give_up_after = give_up_after
        self._queue: queue.Queue[list[int] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        # (when to try again, job id, when it first failed, the delay used last)
        self._retries: list[tuple[float, int, float, float]] = []

    def __call__(self, job_ids: list[int]) -> None:
        """Queues the jobs (returns at once)."""
        self._queue.put(job_ids)

    def start(self) -> None:
        """Starts the thread that writes them."""
        self._thread = threading.Thread(target=self._work, name="admin-comments", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Writes what is queued, then ends the thread (jobs waiting for a retry are logged)."""
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def pending_retries(self) -> list[int]:
        """The jobs waiting to be tried again, by job id."""
        return sorted(job_id for _, job_id, _, _ in self._retries)

    def _work(self) -> None:
        while True:
            wait = None
            if self._retries:
                wait = max(self._retries[0][0] - time.monotonic(), 0.0)
            try:
                job_ids = self._queue.get(timeout=wait)
            except queue.Empty:
                job_ids = []
            if job_ids is None:
                break
            for job_id in job_ids:
                self._write(job_id, None, 0.0)
            self._retry_due()
        if self._retries:
            log.warning(
                "stopping with the AdminComment of jobs %s not written (slurmdbd refused it)",
                ", ".join(map(str, self.pending_retries())),
            )

    def _retry_due(self) -> None:
        now = time.monotonic()
        while self._retries and self._retries[0][0] <= now:
            _, job_id, first_failed, delay = heapq.heappop(self._retries)
            self._write(job_id, first_failed, delay)

    def _write(self, job_id: int, first_failed: float | None, delay: float) -> None:
        """Writes one job's token; a failure is logged and the job tried again later."""
        try:
            summaries = self.store.job_summaries(job_id)
            write_job_summary(self.runner, job_id, summaries, self.cluster)
        except SlurmGpuError as exc:
            now = time.monotonic()
            first = now if first_failed is None else first_failed
            if now - first >= self.give_up_after:
                log.error(
                    "gave up writing the AdminComment of job %d after %.0f s: %s",
                    job_id, now - first, exc,
                )  # fmt: skip
                return
            delay = self.first_retry if first_failed is None else min(delay * 2, MAX_RETRY)
            log.warning(
                "could not write the AdminComment of job %d (trying again in %.0f s): %s",
                job_id, delay, exc,
            )  # fmt: skip
            heapq.heappush(self._retries, (now + delay, job_id, first, delay))
