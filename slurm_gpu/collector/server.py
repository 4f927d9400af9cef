"""The collector's HTTP server: POST /v1/batch, GET /metrics, GET /healthz.

A batch passes, in order: its size ([collector] max_batch_bytes, 413), its wire format
(400), its MUNGE credential and origin (403, `credential`), its rows (400/403), and the
write queue (503 with Retry-After); then a writer commits it and the answer is 200. Every
refusal is one log line (node, peer, batch, reason, why) and one count in
`slurm_gpu_collector_refused_total{reason=...}`; the agent keeps the batch and retries.

Requests are served by a fixed pool of threads (stdlib http.server; no framework): a
connection waits in the pool's queue rather than getting a thread of its own.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from slurm_gpu.collector.credential import CredentialCheck, decode_rows
from slurm_gpu.collector.metrics import CollectorMetrics
from slurm_gpu.collector.wire import CREDENTIAL_HEADER, PATH, Refusal, WireError, decode_batch
from slurm_gpu.collector.writer import BatchWriter
from slurm_gpu.errors import SlurmGpuError

log = logging.getLogger(__name__)


class _PooledHTTPServer(HTTPServer):
    """An HTTPServer whose requests run on a fixed pool of threads."""

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], workers: int
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="collector-http")

    def process_request(self, request: Any, client_address: Any) -> None:
        """Hands the connection to the pool (the listening thread accepts the next)."""
        self.pool.submit(self._serve, request, client_address)

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def server_close(self) -> None:
        """Closes the socket, then waits for the requests under way."""
        super().server_close()
        self.pool.shutdown(wait=True)


class Collector:
    """The collector: the checks, the writers and the HTTP server together.

    Args:
        check: the credential and row checks.
        writer: the write queue and its writers.
        metrics: the counters /metrics shows.
        listen: "host:port" to serve on (port 0: any free port; see `address`).
        max_batch_bytes: largest body taken.
        health: raises SlurmGpuError when the store is unusable (`Store.ping`).
        workers: request threads.
    """

    def __init__(
        self,
        check: CredentialCheck,
        writer: BatchWriter,
        metrics: CollectorMetrics,
        listen: str = "0.0.0.0:6830",
        max_batch_bytes: int = 32 * 2**20,
        health: Callable[[], None] = lambda: None,
        workers: int = 32,
    ) -> None:
        self.check = check
        self.writer = writer
        self.metrics = metrics
        self.max_batch_bytes = max_batch_bytes
        self.health = health
        host, _, port = listen.rpartition(":")
        self._server = _PooledHTTPServer((host.strip("[]"), int(port)), _handler(self), workers)
        self._thread: threading.Thread | None = None
        # Called with the job ids of a committed batch's summaries (their AdminComment:
        # collector/admin_comments.py); None: nothing is called.
        self.on_summaries: Callable[[list[int]], None] | None = None

    @property
    def address(self) -> str:
        """The "host:port" served on (the port chosen when it was 0)."""
        host, port = self._server.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"

    def start(self) -> None:
        """Starts the writers and serves in a background thread."""
        self.writer.start()
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="collector-listen", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops taking requests, finishes those under way, then the writers."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.writer.stop()

    def accept(self, body: bytes, credential: str | None, peer: str) -> int:
        """Checks and writes one batch; returns its rows. Raises Refusal.

        Every refusal is logged and counted here.
        """
        node, batch_id = "?", "?"
        try:
            if len(body) > self.max_batch_bytes:
                raise _oversized(len(body), self.max_batch_bytes)
            try:
                batch = decode_batch(body)
            except WireError as exc:
                raise Refusal(400, "malformed", str(exc)) from None
            node, batch_id = batch.node, batch.batch
            self.check.check_credential(credential, body, batch.node)
            decoded = decode_rows(batch)
            self.writer.write(batch.node, decoded)
        except Refusal as refusal:
            self.refused(refusal, node, peer, batch_id)
            raise
        if self.on_summaries is not None and decoded.summaries:
            self.on_summaries(sorted({s.job_id for s in decoded.summaries}))
        self.metrics.batches.inc()
        self.metrics.rows.inc(len(batch.rows))
        return len(batch.rows)

    def refused(self, refusal: Refusal, node: str, peer: str, batch_id: str) -> None:
        """Logs one line and counts one refusal."""
        self.metrics.refused.labels(reason=refusal.reason).inc()
        log.warning(
            "refused batch %s of node %s from %s: %d %s: %s",
            batch_id,
            node,
            peer,
            refusal.status,
            refusal.reason,
            refusal,
        )


def _oversized(size: int, limit: int) -> Refusal:
    return Refusal(413, "oversized", f"body of {size} bytes, over max_batch_bytes {limit}")


def _handler(collector: Collector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "slurm-gpu-collector"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _answer(
            self,
            status: int,
            document: dict[str, Any],
            retry_after: float | None = None,
        ) -> None:
            body = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if retry_after is not None:
                self.send_header("Retry-After", str(max(1, round(retry_after))))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            """POST /v1/batch: one spool batch."""
            if self.path != PATH:
                self._answer(404, {"error": "not_found", "message": f"no {self.path}"})
                return
            peer = self.client_address[0]
            try:
                body = self._body()
                rows = collector.accept(body, self.headers.get(CREDENTIAL_HEADER), peer)
            except Refusal as refusal:
                self.close_connection = True
                self._answer(
                    refusal.status,
                    {"error": refusal.reason, "message": str(refusal)},
                    refusal.retry_after,
                )
                return
            self._answer(200, {"rows": rows})

        def _body(self) -> bytes:
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                refusal = Refusal(400, "malformed", "no Content-Length")
            else:
                if length < 0:
                    refusal = Refusal(400, "malformed", "negative Content-Length")
                elif length > collector.max_batch_bytes:
                    # Refused before reading it: the connection is closed after the answer.
                    refusal = _oversized(length, collector.max_batch_bytes)
                else:
                    return self.rfile.read(length)
            collector.refused(refusal, "?", self.client_address[0], "?")
            raise refusal

        def do_GET(self) -> None:
            """GET /metrics (Prometheus text) and /healthz (the store answers)."""
            if self.path == "/metrics":
                body = collector.metrics.text()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path == "/healthz":
                try:
                    collector.health()
                except SlurmGpuError as exc:
                    self._answer(503, {"status": "store_down", "message": str(exc)}, 5.0)
                    return
                self._answer(200, {"status": "ok", "queue_depth": collector.writer.depth()})
            else:
                self._answer(404, {"error": "not_found", "message": f"no {self.path}"})

    return Handler
