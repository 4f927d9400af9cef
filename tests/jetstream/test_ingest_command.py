"""`slurm-gpu ingest run` as an admin runs it, and an agent configured with ship_to = "nats".

The command runs as its own process against a real nats-server and a SQLite store; the
agent's side is the sink `run_node` builds from the same kind of config file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from slurm_gpu.config import read_config
from slurm_gpu.node.daemon import batch_sink
from slurm_gpu.node.nats_sink import NatsSink
from slurm_gpu.node.shipper import RetryLater, Shipper
from slurm_gpu.store import Store
from tests.jetstream.natsd import NatsServer, free_port
from tests.jetstream.rig import CLUSTER, spool_with, stored_intervals


def config_file(tmp_path: Path, natsd: NatsServer, **node: str) -> Path:
    file = tmp_path / "slurm-gpu.toml"
    lines = [
        "[cluster]",
        f'name = "{CLUSTER}"',
        "[store]",
        f'url = "sqlite:///{tmp_path / "store.db"}"',
        "[node]",
        *(f'{k} = "{v}"' for k, v in node.items()),
        "[nats]",
        f'url = "{natsd.url}"',
        'commit_wait = "20s"',
    ]
    file.write_text("\n".join(lines) + "\n")
    return file


def test_the_ingest_command_writes_what_an_agent_ships(tmp_path: Path, natsd: NatsServer) -> None:
    file = config_file(tmp_path, natsd, ship_to="nats")
    config = read_config(file)
    store = Store(config.store.url, cluster=CLUSTER)
    store.upgrade()
    port = free_port()
    log = (tmp_path / "ingest.log").open("wb")
    command = [sys.executable, "-m", "slurm_gpu.cli.main", "--config", str(file), "ingest",
               "run", "--metrics-listen", f"127.0.0.1:{port}"]  # fmt: skip
    worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
    try:
        sink = batch_sink(config, "gpu1")
        assert isinstance(sink, NatsSink)
        spool = spool_with(tmp_path / "gpu1.spool", "gpu1", 7)
        shipper = Shipper(spool, sink, "gpu1")
        try:
            for _ in range(100):  # until the worker has made the stream, as the agent retries
                try:
                    shipper.drain()
                    break
                except RetryLater as exc:
                    assert "an ingest worker makes it" in str(exc)
                    time.sleep(0.1)
        finally:
            sink.close()
        assert (0, 7) == (spool.backlog(), len(stored_intervals(store)))
        metrics = ""
        for _ in range(50):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    metrics = r.read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert "slurm_gpu_ingest_rows_total 7.0" in metrics
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
        log.close()
        store.dispose()
    output = (tmp_path / "ingest.log").read_text()
    assert 0 == code, output
    assert f"ingest worker of cluster {CLUSTER}: {natsd.url}" in output
