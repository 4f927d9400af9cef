"""The collector's HTTP server: POST /v1/batch, GET /metrics, GET /healthz.

A batch passes, in order: its size ([collector] max_batch_bytes, 413), its wire format
(400), its MUNGE credential and origin (403, `credential`), its rows (400/403), and the
write queue (503 with Retry-After); then a writer commits it and the answer is 200. Every
refusal is one log line (node, peer, batch, reason, why) and one count in
`slurm_gpu_collector_refused_total{reason=...}`; the agent keeps the batch and retries.

HTTP/1.1 with keep-alive (stdlib http.server; no framework): an agent ships every tick
over the one connection it keeps, so a batch costs no TCP handshake, accept or handler
setup. Idle connections wait in one epoll (Linux), not in a thread each; a fixed pool of
threads waits on it and serves one request per event. Connections idle past
`idle_timeout`, or beyond `max_connections` (the longest idle first), are closed: the
agent opens a new one (CollectorSink).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import resource
import select
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, cast

from slurm_gpu.collector.credential import CredentialCheck, decode_rows
from slurm_gpu.collector.metrics import CollectorMetrics
from slurm_gpu.collector.wire import CREDENTIAL_HEADER, PATH, Refusal, WireError, decode_batch
from slurm_gpu.collector.writer import BatchWriter
from slurm_gpu.errors import SlurmGpuError

log = logging.getLogger(__name__)

# Seconds a connection may stay idle (agents ship every [node] interval, 10 s; longer
# after a refusal, as they back off).
IDLE_TIMEOUT = 120.0
# Seconds a request may take to arrive once it started (a stalled client frees its thread).
REQUEST_TIMEOUT = 60.0


def default_max_connections() -> int:
    """Connections kept open: the process's file limit, less room for the store and logs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, (soft if soft != resource.RLIM_INFINITY else 65536) - 256)


class _Connection:
    """One client connection and the handler that reads its requests (its buffers)."""

    __slots__ = ("busy", "handler", "idle_since", "peer", "sock")

    def __init__(self, sock: socket.socket, peer: Any) -> None:
        self.sock = sock
        self.peer = peer
        self.handler: _KeepAliveHandler | None = None
        self.busy = False  # a thread serves it (not idle: never closed as such)
        self.idle_since = time.monotonic()


# An fd reports once, then waits to be re-armed: one thread serves each request.
_ARMED = select.EPOLLIN | select.EPOLLONESHOT


class _KeepAliveHTTPServer(HTTPServer):
    """An HTTPServer with keep-alive: idle connections in one epoll, served by a thread pool.

    Every request thread waits in the same epoll (one-shot events): the thread that gets a
    connection's event serves its request and re-arms it, and the one that gets the
    listening socket's accepts. No hand-over between threads, which in one Python process
    (one interpreter lock) costs a switch each; no thread held by an idle connection.
    `serve_forever` closes connections idle past `idle_timeout`, once a second.
    """

    request_queue_size = 1024  # listen backlog: thousands of agents reconnect at once

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[_KeepAliveHandler],
        workers: int,
        metrics: CollectorMetrics,
        idle_timeout: float = IDLE_TIMEOUT,
        max_connections: int | None = None,
        listening: socket.socket | None = None,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        if listening is None:
            super().__init__(address, handler)
        else:  # bound and listening already (collector/processes.py: one port, N processes)
            super().__init__(address, handler, bind_and_activate=False)
            self.socket.close()
            self.socket = listening
            self.server_address = listening.getsockname()
            self.server_name, self.server_port = str(address[0]), int(self.server_address[1])
        self.handler_class = handler
        self.workers = workers
        self.metrics = metrics
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections or default_max_connections()
        self._epoll = select.epoll()
        self._conns: dict[int, _Connection] = {}  # by fd; under _lock
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        # Written once to stop: level-triggered, it wakes every request thread in turn (they
        # wait without a timeout, since each wake-up takes the interpreter lock from the
        # thread at work).
        self._wake_r, self._wake_w = socket.socketpair()
        metrics.track_connections(lambda: len(self._conns))

    def serve_forever(self, poll_interval: float = 1.0) -> None:
        """Starts the request threads; closes idle connections until `shutdown`."""
        self._stopped.clear()
        self.socket.setblocking(False)
        self._epoll.register(self.socket.fileno(), _ARMED)
        self._epoll.register(self._wake_r.fileno(), select.EPOLLIN)
        threads = [
            threading.Thread(target=self._work, name=f"collector-http-{n}", daemon=True)
            for n in range(self.workers)
        ]
        for thread in threads:
            thread.start()
        try:
            while not self._stopping.wait(poll_interval):
                self._close_idle(time.monotonic() - self.idle_timeout)
        finally:
            for thread in threads:
                thread.join()
            with self._lock:
                left = list(self._conns.values())
                self._conns.clear()
            for conn in left:
                self._close(conn)
            self._stopped.set()

    def _work(self) -> None:
        listening, wake = self.socket.fileno(), self._wake_r.fileno()
        while True:
            for fd, _ in self._epoll.poll(-1, 1):
                if fd == wake:  # shutdown(); left unread, so that it wakes the others too
                    return
                if fd == listening:
                    self._accept()
                    self._epoll.modify(listening, _ARMED)
                    continue
                with self._lock:
                    conn = self._conns.get(fd)
                    if conn is None:  # closed meanwhile
                        continue
                    conn.busy = True
                self._serve_one(conn)

    def _accept(self) -> None:
        for _ in range(64):  # a burst of connections in one wake-up
            try:
                sock, peer = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE: make room, take it at the next wake-up
                log.warning("cannot accept a connection (%d open): %s", len(self._conns), exc)
                self._close_oldest()
                return
            if len(self._conns) >= self.max_connections:
                self._close_oldest()
            sock.setblocking(True)
            conn = _Connection(sock, peer)
            with self._lock:
                self._conns[sock.fileno()] = conn
            self.metrics.connections.inc()
            self._epoll.register(sock.fileno(), _ARMED)

    def _serve_one(self, conn: _Connection) -> None:
        """Serves the connection's next request (and any already sent behind it)."""
        keep = False
        try:
            if conn.handler is None:
                conn.handler = self.handler_class(conn.sock, conn.peer, self)
            keep = conn.handler.serve_request()
        except Exception:
            self.handle_error(conn.sock, conn.peer)
        if keep and not self._stopping.is_set():
            with self._lock:
                conn.busy = False
                conn.idle_since = time.monotonic()
            self._epoll.modify(conn.sock.fileno(), _ARMED)
            return
        with self._lock:
            self._conns.pop(conn.sock.fileno(), None)
        self._close(conn)

    def _close_idle(self, before: float) -> None:
        with self._lock:
            idle = [c for c in self._conns.values() if not c.busy and c.idle_since < before]
            for conn in idle:
                del self._conns[conn.sock.fileno()]
        for conn in idle:
            self._close(conn)

    def _close_oldest(self) -> None:
        with self._lock:
            idle = [c for c in self._conns.values() if not c.busy]
            oldest = min(idle, key=lambda c: c.idle_since) if idle else None
            if oldest is not None:
                del self._conns[oldest.sock.fileno()]
        if oldest is not None:
            self._close(oldest)

    def _close(self, conn: _Connection) -> None:
        """Closes a connection already taken out of `_conns`."""
        with contextlib.suppress(OSError, ValueError):  # closed already
            self._epoll.unregister(conn.sock.fileno())
        if conn.handler is not None:
            conn.handler.done()
        self.shutdown_request(conn.sock)

    def shutdown(self) -> None:
        """Stops the request threads (each after its request) and closes the connections."""
        self._stopping.set()
        self._wake_w.send(b"\0")
        self._stopped.wait()

    def server_close(self) -> None:
        """Closes the listening socket and the epoll."""
        super().server_close()
        self._epoll.close()
        self._wake_r.close()
        self._wake_w.close()


class _KeepAliveHandler(BaseHTTPRequestHandler):
    """A request handler that lives as long as its connection, serving one request a call.

    The server calls `serve_request` each time the connection has a request to read, and
    `done` when it closes it (BaseRequestHandler would serve the whole connection at once,
    holding a thread while it is idle).
    """

    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT
    # The head and the body of an answer are two writes: with Nagle's algorithm the body
    # would wait for the client's delayed ACK of the head (40 ms) on a kept connection.
    disable_nagle_algorithm = True

    def __init__(self, request: Any, client_address: Any, server: Any) -> None:
        self.request = request
        self.client_address = client_address
        self.server = server
        self.setup()

    def serve_request(self) -> bool:
        """Serves the next request, and those already sent behind it; False: close."""
        while True:
            self.close_connection = True
            self.handle_one_request()
            self.wfile.flush()
            if self.close_connection:
                return False
            if not self._buffered():
                return True

    def _buffered(self) -> bool:
        """Whether the next request is here already (read without waiting for one)."""
        self.request.setblocking(False)
        try:
            return bool(cast(io.BufferedReader, self.rfile).peek(1))
        except OSError:
            return False
        finally:
            self.request.settimeout(self.timeout)

    def done(self) -> None:
        """Releases the connection's buffers (the server closes the socket)."""
        with contextlib.suppress(OSError):
            self.finish()


class Collector:
    """The collector: the checks, the writers and the HTTP server together.

    Args:
        check: the credential and row checks.
        writer: the write queue and its writers.
        metrics: the counters /metrics shows.
        listen: "host:port" to serve on (port 0: any free port; see `address`).
        max_batch_bytes: largest body taken.
        health: raises SlurmGpuError when the store is unusable (`Store.ping`).
        workers: request threads (requests served at once; idle connections hold none).
        idle_timeout: seconds before an idle connection is closed.
        max_connections: connections kept open (default: the file limit, less a margin).
        listening: a socket bound and listening on `listen` already, to serve instead
            of binding one (the processes of collector/processes.py share one).
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
        idle_timeout: float = IDLE_TIMEOUT,
        max_connections: int | None = None,
        listening: socket.socket | None = None,
    ) -> None:
        self.check = check
        self.writer = writer
        self.metrics = metrics
        self.max_batch_bytes = max_batch_bytes
        self.health = health
        host, _, port = listen.rpartition(":")
        self._server = _KeepAliveHTTPServer(
            (host.strip("[]"), int(port)),
            _handler(self),
            workers,
            metrics,
            idle_timeout=idle_timeout,
            max_connections=max_connections,
            listening=listening,
        )
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


def _handler(collector: Collector) -> type[_KeepAliveHandler]:
    class Handler(_KeepAliveHandler):
        server_version = "slurm-gpu-collector"

        def log_message(self, format: str, *args: Any) -> None:
            if log.isEnabledFor(logging.DEBUG):
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
            except Refusal as refusal:
                # The body was not read: what follows on the connection is not a request.
                self.close_connection = True
                self._refuse(refusal)
                return
            try:
                rows = collector.accept(body, self.headers.get(CREDENTIAL_HEADER), peer)
            except Refusal as refusal:  # the connection stays open for the next batch
                self._refuse(refusal)
                return
            self._answer(200, {"rows": rows})

        def _refuse(self, refusal: Refusal) -> None:
            self._answer(
                refusal.status,
                {"error": refusal.reason, "message": str(refusal)},
                refusal.retry_after,
            )

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
