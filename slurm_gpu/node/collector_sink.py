"""Shipping spool batches to the head node's collector instead of the store (issue 16).

With `[node] ship_to = "collector"` the agent holds no store URL and no password: each
batch the shipper reads is POSTed whole to `[node] collector_url`/v1/batch, with a MUNGE
credential (made by this process, root, per batch) over the body's SHA-256 digest
(slurm_gpu/collector/wire.py, docs/design/collector.md). Anything but a 200 is a
`RetryLater`: the shipper keeps the rows and backs off, at least as long as the
collector's Retry-After says.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

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

Opener = Callable[[urllib.request.Request, float], Any]


def _open(request: urllib.request.Request, timeout: float) -> Any:
    return urllib.request.urlopen(request, timeout=timeout)


class CollectorSink:
    """A shipper's BatchSink that POSTs each batch to the collector.

    Args:
        url: the collector, "http://head:6830" ([node] collector_url).
        sign: a MUNGE credential over the given payload (`Libmunge().encode`).
        timeout: seconds before a request is abandoned (and retried later).
        clock: POSIX seconds, for the batch's `sent`.
        opener: sends a request (urllib's urlopen; tests pass their own).
    """

    def __init__(
        self,
        url: str,
        sign: Callable[[bytes], str],
        timeout: float = 60.0,
        clock: Callable[[], float] = time.time,
        opener: Opener = _open,
    ) -> None:
        self.url = url.rstrip("/") + PATH
        self.sign = sign
        self.timeout = timeout
        self.clock = clock
        self.opener = opener

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
        credential = self.sign(digest(body).encode())
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", CREDENTIAL_HEADER: credential},
        )
        try:
            with self.opener(request, self.timeout) as response:
                status = response.status
                answer = response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                raise RetryLater(
                    f"collector {self.url} refused batch {batch_id}: {exc.code} {_why(exc.read())}",
                    _retry_after(exc.headers.get("Retry-After")),
                ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RetryLater(f"collector {self.url} unreachable: {reason}") from None
        if status != 200:
            raise RetryLater(f"collector {self.url} answered {status}: {_why(answer)}")


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
