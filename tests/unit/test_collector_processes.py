"""`slurm-gpu collector run` with [collector] processes = 2: real processes, munged, SQLite.

The command as systemd runs it (a subprocess), agents' batches signed by this machine's
munged and shipped by the agent's own Shipper and CollectorSink.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu.collector.processes import SummaryNotices, pool_shares, read_notices
from slurm_gpu.models import GpuInterval
from slurm_gpu.munge import Libmunge
from slurm_gpu.node.collector_sink import CollectorSink
from slurm_gpu.node.outbox import fields_of
from slurm_gpu.node.shipper import Shipper
from slurm_gpu.node.spool import Spool
from slurm_gpu.store import Store

NODES = ("gpu1", "gpu2", "gpu3", "gpu4")
RUN = ("collector", "run")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp_path: Path, store: Store, port: int, processes: int, pool: int) -> Path:
    listed = ", ".join(f'{n} = ["127.0.0.1", "{socket.gethostname()}"]' for n in NODES)
    path = tmp_path / "collector.toml"
    path.write_text(
        f'[cluster]\nname = "c"\n[store]\nurl = "{store.engine.url}"\n'
        "[node]\nwrite_admin_comment = false\n"
        f'[collector]\nlisten = "127.0.0.1:{port}"\nprocesses = {processes}\n'
        f"pool_size = {pool}\nnodes = {{ {listed} }}\n"
    )
    return path


class Running:
    """A `slurm-gpu collector run` subprocess, its log kept in a file."""

    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slurm_gpu.cli.main", "--config", str(config), *RUN],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return str(answer.read().decode())

    def value(self, name: str) -> float:
        found = re.search(rf"^{name} (\S+)$", self.metrics(), re.M)
        assert found, name
        return float(found.group(1))

    def wait_serving(self, processes: int) -> list[int]:
        """The workers' pids, once /metrics counts them all."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if self.value("slurm_gpu_collector_processes") == processes:
                    found = re.search(r"from \d+ processes \(pids ([\d, ]+);", self.log.read_text())
                    assert found, self.log.read_text()
                    return [int(p) for p in found.group(1).split(", ")]
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"collector not serving: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def running(tmp_path: Path, store: Store) -> Iterator[Running]:
    port = free_port()
    collector = Running(write_config(tmp_path, store, port, 2, 3), port, tmp_path / "log")
    yield collector
    collector.stop()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pids: list[int], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def ship(tmp_path: Path, port: int, lib: Libmunge, node: str, periods: int) -> int:
    """`periods` intervals of one GPU of `node`, shipped one batch each; the rows shipped."""
    spool = Spool(tmp_path / f"spool-{node}.db")
    with spool.transaction() as db:
        for n in range(periods):
            start = 60.0 * n
            row = GpuInterval(
                node, f"GPU-{node}", start, start + 60, 7, 50.0, 60.0, 40.0, 60, 60.0, 60.0,
                None, None, None, None, None, None,
            )  # fmt: skip
            Spool.queue(db, "interval", f"{node}:GPU:{start!r}", fields_of(row))
    try:
        sink = CollectorSink(f"http://127.0.0.1:{port}", lib.encode)
        return Shipper(spool, sink, node, batch_size=1).drain()
    finally:
        spool.close()


@pytest.mark.slurm  # munged (the `munge` fixture)
def test_two_processes_serve_one_port_and_count_together(
    tmp_path: Path,
    store: Store,
    running: Running,
    munge: Libmunge,
) -> None:
    """Four agents at once through two processes: every row lands once, /metrics sums both.

    Each scrape, whichever process answers it, counts every batch; SIGTERM stops both
    workers and the command exits 0.
    """
    workers = running.wait_serving(2)
    assert 2 == len(workers) and all(alive(p) for p in workers)
    shipped: dict[str, int] = {}
    threads = [
        threading.Thread(
            target=lambda n=n: shipped.__setitem__(n, ship(tmp_path, running.port, munge, n, 5))
        )
        for n in NODES
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert dict.fromkeys(NODES, 5) == shipped
    for node in NODES:
        assert [60.0 * n for n in range(5)] == [r.period_start for r in store.intervals(node=node)]
    scraped = {running.value("slurm_gpu_collector_batches_total") for _ in range(8)}
    assert {20.0} == scraped
    running.proc.send_signal(signal.SIGTERM)
    assert 0 == running.proc.wait(timeout=60)
    assert wait_gone(workers, 5)


def test_a_killed_collector_takes_its_workers_and_frees_the_port(running: Running) -> None:
    """SIGKILL of the command (systemd's last resort): its workers stop (PR_SET_PDEATHSIG).

    The port is free again for the collector that starts next.
    """
    workers = running.wait_serving(2)
    running.proc.kill()
    running.proc.wait()
    assert wait_gone(workers), "a worker outlived its collector"
    socket.create_server(("127.0.0.1", running.port)).close()  # as the next collector binds


def test_a_worker_that_dies_stops_the_collector(running: Running) -> None:
    """A worker killed: the others stop, the command exits 1 (systemd restarts it)."""
    workers = running.wait_serving(2)
    os.kill(workers[0], signal.SIGKILL)
    assert 1 == running.proc.wait(timeout=60)
    assert wait_gone(workers, 5)
    assert f"collector worker {workers[0]} exited (status -9)" in running.log.read_text()


def test_processes_beyond_the_pool_are_refused_with_the_reason(
    tmp_path: Path, store: Store
) -> None:
    """processes = 4 with pool_size = 3: `collector run` says why and serves nothing."""
    port = free_port()
    collector = Running(write_config(tmp_path, store, port, 4, 3), port, tmp_path / "log")
    assert 2 == collector.proc.wait(timeout=60)
    assert (
        "[collector] processes = 4 needs pool_size >= 4 (a store connection per process);"
        " pool_size is 3"
    ) in collector.log.read_text()


def test_pool_shares_split_the_pool_and_keep_one_for_the_admin_comment() -> None:
    """pool_size 8 over 3 processes: 3+3+2; with AdminComment's connection: 3+2+2."""
    assert [3, 3, 2] == pool_shares(8, 3, 0)
    assert [3, 2, 2] == pool_shares(8, 3, 1)
    with pytest.raises(ValueError, match="and one for AdminComment"):
        pool_shares(3, 3, 1)


def test_summary_notices_from_many_threads_arrive_whole() -> None:
    """Job ids sent at once from 8 threads (lines past PIPE_BUF split) arrive each once."""
    read_fd, write_fd = os.pipe()
    got: list[int] = []
    reader = threading.Thread(target=read_notices, args=(read_fd, got.extend))
    reader.start()
    notices = SummaryNotices(write_fd)
    sent = [list(range(t * 10_000, t * 10_000 + 2_000)) for t in range(8)]
    threads = [threading.Thread(target=notices, args=(ids,)) for ids in sent]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.close(write_fd)
    reader.join(timeout=10)
    assert sorted(i for ids in sent for i in ids) == sorted(got)
