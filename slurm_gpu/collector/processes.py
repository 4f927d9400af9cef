"""One port, several collector processes ([collector] processes > 1).

Python runs one thread at a time in a process, so one collector uses about one core,
whatever its threads: at production cadence (one batch per node every 10 s) that is a few
thousand nodes (bench/scale). With `processes` = N, `slurm-gpu collector run` binds the
port once and starts N copies of itself (`collector worker`), each serving that one
listening socket (the kernel hands each new connection to one of them; an agent's kept
connection stays with its process) with its own request threads, write queue and share of
`pool_size`: the store still sees at most `pool_size` connections from the collector.

The parent only watches:

- **AdminComment:** the workers send the job ids of the summaries they committed over a
  pipe; the parent's one `AdminComments` thread writes them, in order, as one collector
  does (two writers of one job's token could each miss the other's summaries). It holds
  one store connection of `pool_size`.
- **Metrics:** each worker counts into files of a folder made for this run
  ($PROMETHEUS_MULTIPROC_DIR, set before the worker's first import of prometheus_client),
  and /metrics from any of them sums every process (collector/metrics.py).
- **Faults:** a worker that exits stops the others and the parent exits 1 (systemd
  restarts the whole, Restart=always); SIGTERM stops every worker, each after the
  batches under way. A worker whose parent dies gets SIGTERM (PR_SET_PDEATHSIG), so no
  orphan keeps the port.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from slurm_gpu.collector.metrics import MULTIPROC_DIR

log = logging.getLogger(__name__)

# A line of job ids on the pipe is written at once (POSIX: writes of at most PIPE_BUF,
# 4096 bytes on Linux, are not interleaved with other writers').
LINE_BYTES = 4000
STOP_SECONDS = 50.0  # within the unit's TimeoutStopSec (60)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def pool_shares(pool_size: int, processes: int, reserved: int) -> list[int]:
    """Each worker's store connections: `pool_size` less `reserved`, split evenly.

    Raises:
        ValueError: fewer than one connection for some worker.
    """
    left = pool_size - reserved
    if left < processes:
        raise ValueError(
            f"[collector] processes = {processes} needs pool_size >= {processes + reserved}"
            f" (a store connection per process{', and one for AdminComment' if reserved else ''});"
            f" pool_size is {pool_size}"
        )
    return [left // processes + (1 if n < left % processes else 0) for n in range(processes)]


def bind(listen: str) -> socket.socket:
    """A listening socket on "host:port" (inherited by the workers)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, int(port)), family=family, backlog=1024)
    sock.set_inheritable(True)
    return sock


class SummaryNotices:
    """A worker's `Collector.on_summaries`: the job ids, a line at a time, to the parent."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __call__(self, job_ids: list[int]) -> None:
        """Sends these job ids, in lines of at most LINE_BYTES."""
        line = ""
        for job_id in job_ids:
            word = f"{job_id} "
            if len(line) + len(word) >= LINE_BYTES:
                self._send(line)
                line = ""
            line += word
        if line:
            self._send(line)

    def _send(self, line: str) -> None:
        # Under PIPE_BUF (LINE_BYTES): one write, never interleaved with another thread's
        # or worker's, so no lock.
        os.write(self.fd, line.encode() + b"\n")


def read_notices(fd: int, deliver: Callable[[list[int]], None]) -> None:
    """Hands each line of job ids on `fd` to `deliver`, until every writer closed it."""
    with os.fdopen(fd, "rb") as pipe:
        for line in pipe:
            try:
                ids = [int(word) for word in line.split()]
            except ValueError:
                log.error("collector worker sent a line that is not job ids: %r", line[:80])
                continue
            if ids:
                deliver(ids)


def die_with_parent(parent: int) -> None:
    """In a worker: SIGTERM when the parent dies; exits now if it died already."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent:
        log.error("collector worker: its parent %d is gone; exiting", parent)
        sys.exit(1)


def worker_command(
    config_path: Path | None, listening: int, pool_size: int, notices: int | None
) -> list[str]:
    """The command line of one worker (`slurm-gpu collector worker`), this interpreter's."""
    command = [sys.executable, "-m", "slurm_gpu.cli.main"]
    if config_path is not None:
        command += ["--config", str(config_path)]
    command += [
        "collector",
        "worker",
        "--listening-fd",
        str(listening),
        "--pool-size",
        str(pool_size),
        "--parent",
        str(os.getpid()),
    ]
    if notices is not None:
        command += ["--summaries-fd", str(notices)]
    return command


def run_workers(
    listen: str,
    shares: Sequence[int],
    config_path: Path | None,
    stop: threading.Event,
    on_summaries: Callable[[list[int]], None] | None,
) -> int:
    """Serves `listen` from one worker per share of the pool until `stop` or a fault.

    Returns the exit status: 0 when stopped, 1 when a worker exited by itself.
    """
    sock = bind(listen)
    metrics_dir = tempfile.mkdtemp(prefix="slurm-gpu-collector-metrics-")
    env = {**os.environ, MULTIPROC_DIR: metrics_dir}
    read_fd, write_fd = os.pipe() if on_summaries is not None else (None, None)
    workers: list[subprocess.Popen[bytes]] = []
    reader = None
    try:
        fds = (sock.fileno(), *((write_fd,) if write_fd is not None else ()))
        for share in shares:
            command = worker_command(config_path, sock.fileno(), share, write_fd)
            workers.append(subprocess.Popen(command, pass_fds=fds, env=env))
        sock.close()  # the workers hold it
        if write_fd is not None and read_fd is not None and on_summaries is not None:
            os.close(write_fd)  # EOF once every worker closed its end
            reader = threading.Thread(
                target=read_notices, args=(read_fd, on_summaries), name="collector-summaries"
            )
            reader.start()
        log.info(
            "collector serving on %s from %d processes (pids %s; store connections %s)",
            listen,
            len(workers),
            ", ".join(str(w.pid) for w in workers),
            "+".join(str(s) for s in shares),
        )
        failed = _watch(workers, stop)
    finally:
        _stop(workers)
        if reader is not None:
            reader.join(timeout=STOP_SECONDS)
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 1 if failed else 0


def _watch(workers: Sequence[subprocess.Popen[bytes]], stop: threading.Event) -> bool:
    """Waits for `stop` (False) or a worker's exit (True, logged)."""
    while not stop.wait(0.5):
        for worker in workers:
            code = worker.poll()
            if code is not None:
                log.error(
                    "collector worker %d exited (status %s): stopping the others", worker.pid, code
                )
                return True
    return False


def _stop(workers: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every worker still running, then waits (SIGKILL after STOP_SECONDS)."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.error(
                "collector worker %d did not stop in %.0f s: killed", worker.pid, STOP_SECONDS
            )
            worker.kill()
            worker.wait()
