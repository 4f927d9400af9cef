"""Shipping spool batches to the head node's collector instead of the store (issue 16).

With `[node] ship_to = "collector"` the agent holds no store URL and no password: each
batch the shipper reads is POSTed whole to `[node] collector_url`/v1/batch, with a MUNGE
credential (made by this process, root, per batch) over the body's SHA-256 digest
(slurm_gpu/collector/wire.py, docs/design/collector.md). Anything but a 200 is a
`RetryLater`: the shipper keeps the rows and backs off, at least as long as the
collector's Retry-After says.

The sink keeps one HTTP/1.1 connection open between batches (the collector keeps it
alive), so a tick costs no TCP handshake on either side. A kept connection the collector
closed meanwhile (idle, restarted) fails before any answer: the batch is then sent once
more, with a fresh credential, on a new connection. Sending it twice is harmless: the
store's idempotent keys land it once.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Callable, Sequence

from slurm_gpu.collector.wire import (
    CREDENTIAL_HEADER,
    PATH,
    WireRow,
    digest,
    encode_batch,
)
from slurm_gpu.errors import brief
from slurm_gpu.node.shipper import RetryLater
from slurm_gpu.node.spool import OutboxRow

# host, port, timeout -> a connection (http.client's; tests pass their own).
Connect = Callable[[str, int | None, float], http.client.HTTPConnection]

# What a kept connection that the collector closed meanwhile fails with (not a timeout:
# a slow collector is not asked twice).
_STALE = (
    http.client.RemoteDisconnected,
    http.client.BadStatusLine,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
)


class CollectorSink:
    """A shipper's BatchSink that POSTs each batch to the collector, over one connection.

    Args:
        url: the collector, "http://head:6830" ([node] collector_url; https too).
        sign: a MUNGE credential over the given payload (`Libmunge().encode`).
        timeout: seconds before a request is abandoned (and retried later).
        clock: POSIX seconds, for the batch's `sent`.
        connect: opens a connection (http.client's HTTPConnection or HTTPSConnection
            by the URL's scheme; tests pass their own).
    """

    def __init__(
        self,
        url: str,
        sign: Callable[[bytes], str],
        timeout: float = 60.0,
        clock: Callable[[], float] = time.time,
        connect: Connect | None = None,
    ) -> None:
        self.url = url.rstrip("/") + PATH
        self.sign = sign
        self.timeout = timeout
        self.clock = clock
        parts = urllib.parse.urlsplit(self.url)
        self._host, self._port = parts.hostname or "", parts.port
        self._path = parts.path
        opener = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        self._connect: Connect = connect or (
            lambda host, port, timeout: opener(host, port, timeout=timeout)
        )
        self._conn: http.client.HTTPConnection | None = None

    def ship_batch(self, node: str, rows: Sequence[OutboxRow]) -> None:
        """POSTs the rows as one batch; returns once the collector committed them.

        Raises:
            RetryLater: the collector refused the batch (any status but 200; its
                Retry-After kept) or could not be reached.
            MungeError: munged on this node is not answering.
        """
        sent = self.clock()
        batch_id = f"{node}:{sent!r}:{rows[0].id if rows else 0}"
        body = encode_batch(node, batch_id, sent, [WireRow(r.kind, r.key, r.payload) for r in rows])
        payload = digest(body).encode()
        while True:
            reused = self._conn is not None
            conn = self._conn or self._connect(self._host, self._port, self.timeout)
            self._conn = conn
            headers = {
                "Content-Type": "application/json",
                "Content-Length": str(len(body)),
                CREDENTIAL_HEADER: self.sign(payload),  # a credential decodes once: one each
            }
            try:
                conn.request("POST", self._path, body, headers)
                response = conn.getresponse()
                status, answer = response.status, response.read()
            except _STALE as exc:
                self.close()
                if reused:  # closed by the collector while idle: once more, on a new one
                    continue
                raise RetryLater(f"collector {self.url} unreachable: {exc}") from None
            except (http.client.HTTPException, OSError) as exc:
                self.close()
                raise RetryLater(f"collector {self.url} unreachable: {exc}") from None
            if response.will_close:
                self.close()
            break
        if status != 200:
            raise RetryLater(
                f"collector {self.url} refused batch {batch_id}: {status} {_why(answer)}",
                _retry_after(response.getheader("Retry-After")),
            )

    def close(self) -> None:
        """Closes the kept connection (the next batch opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _why(body: bytes) -> str:
    """The collector's reason from an error body ({"error": ..., "message": ...})."""
    try:
        document = json.loads(body)
        return f"{document['error']}: {document['message']}"
    except (ValueError, KeyError, TypeError):
        return brief(body.decode(errors="replace"), 120)


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the collector sends seconds; an HTTP date is ignored)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None
