"""The jobs' AdminComment, written by the collector as a direct-to-store agent writes it.

An agent with `[node] ship_to = "collector"` reads no store, so it cannot merge a finished
job's summaries (every node's) into the AdminComment token (slurm/admin_comment.py). The
collector can: after it committed a batch holding summaries, it queues their jobs, and one
thread writes each job's token from the store (sacct, then sacctmgr modify job), off the
request path, so an agent's answer never waits on slurmdbd. A failure is logged; the
summaries stay committed, as in the agent's own shipper.
"""

from __future__ import annotations

import logging
import queue
import threading

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.slurm.admin_comment import write_job_summary
from slurm_gpu.slurm.runner import CommandRunner
from slurm_gpu.store import Store

log = logging.getLogger(__name__)


class AdminComments:
    """Writes the AdminComment of jobs whose summaries the collector committed.

    Args:
        runner: runs sacct and sacctmgr.
        store: where the jobs' summaries are read.
        cluster: the Slurm cluster's name ([cluster] name).
    """

    def __init__(self, runner: CommandRunner, store: Store, cluster: str) -> None:
        self.runner = runner
        self.store = store
        self.cluster = cluster
        self._queue: queue.Queue[list[int] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def __call__(self, job_ids: list[int]) -> None:
        """Queues the jobs (returns at once)."""
        self._queue.put(job_ids)

    def start(self) -> None:
        """Starts the thread that writes them."""
        self._thread = threading.Thread(target=self._work, name="admin-comments", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Writes what is queued, then ends the thread."""
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _work(self) -> None:
        while (job_ids := self._queue.get()) is not None:
            for job_id in job_ids:
                try:
                    summaries = self.store.job_summaries(job_id)
                    write_job_summary(self.runner, job_id, summaries, self.cluster)
                except SlurmGpuError as exc:
                    log.warning("could not write the AdminComment of job %d: %s", job_id, exc)
