"""A real nats-server with JetStream on loopback, for the transport's tests.

Debian's nats-server (scripts/install-deps), started on a free 127.0.0.1 port with its
JetStream store in a test's directory, an optional config file (authorization blocks),
and stopped by its pid. `restart()` keeps the store: what was published survives, as on
a server that was restarted in production.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

NATS_SERVER = shutil.which("nats-server") or "/usr/bin/nats-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """One nats-server process: `url`, `restart()`, `stop()`; `log` holds its output."""

    def __init__(self, directory: Path, config: str = "", max_payload: int | None = None) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.log = directory / "nats-server.log"
        self.config = directory / "nats-server.conf"
        store = directory / "jetstream"
        store.mkdir(parents=True, exist_ok=True)
        lines = [
            f"listen: 127.0.0.1:{self.port}",
            f"jetstream {{ store_dir: {_quoted(str(store))} }}",
        ]
        if max_payload is not None:
            lines.append(f"max_payload: {max_payload}")
        self.config.write_text("\n".join([*lines, config]) + "\n")
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [NATS_SERVER, "-c", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"nats-server did not listen on {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
