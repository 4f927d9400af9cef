"""The wire format of `POST /v1/batch`: one spool batch, its outbox rows as read.

```json
{"version": 1, "node": "gpu1", "batch": "gpu1:1733061234.5:42", "sent": 1733061234.5,
 "rows": [{"kind": "interval", "key": "gpu1:GPU-...:1733061180.0", "payload": "{...}"}]}
```

The rows are the spool's outbox rows exactly (kind, key, payload: slurm_gpu/node/outbox.py),
so the collector decodes them with the agent's own decoders. The request carries a MUNGE
credential whose payload is `digest(body)` (docs/design/collector.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slurm_gpu.errors import SlurmGpuError, brief

VERSION = 1
CREDENTIAL_HEADER = "X-Slurm-GPU-Credential"
PATH = "/v1/batch"


class WireError(SlurmGpuError):
    """A request body that is not a batch of this version (the collector answers 400)."""


@dataclass(frozen=True)
class WireRow:
    """One outbox row: its kind, idempotency key and JSON payload."""

    kind: str
    key: str
    payload: str


@dataclass(frozen=True)
class WireBatch:
    """One spool batch as shipped.

    Attributes:
        node: the Slurm node the batch comes from (its credential must too).
        batch: the agent's name for the batch, for the logs ("gpu1:1733061234.5:42").
        sent: when the agent sent it, POSIX seconds.
        rows: the outbox rows, in the order they are written.
    """

    node: str
    batch: str
    sent: float
    rows: tuple[WireRow, ...]


def digest(body: bytes) -> str:
    """The SHA-256 hex digest of a request body: the payload its credential carries."""
    return hashlib.sha256(body).hexdigest()


def encode_batch(node: str, batch: str, sent: float, rows: Sequence[WireRow]) -> bytes:
    """The request body of one batch (compact JSON, UTF-8)."""
    document = {
        "version": VERSION,
        "node": node,
        "batch": batch,
        "sent": sent,
        "rows": [{"kind": r.kind, "key": r.key, "payload": r.payload} for r in rows],
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_batch(body: bytes) -> WireBatch:
    """A request body back into its batch.

    Raises:
        WireError: not JSON, another version, or a field missing or of the wrong type.
    """
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise WireError(f"body is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise WireError(f"expected a JSON object, got {_brief(data)}")
    if data.get("version") != VERSION:
        raise WireError(f"version: expected {VERSION}, got {_brief(data.get('version'))}")
    node, batch, sent, rows = (data.get(k) for k in ("node", "batch", "sent", "rows"))
    if not isinstance(node, str) or not node:
        raise WireError(f"node: expected a node name, got {_brief(node)}")
    if not isinstance(batch, str):
        raise WireError(f"batch: expected a string, got {_brief(batch)}")
    if not isinstance(sent, int | float) or isinstance(sent, bool):
        raise WireError(f"sent: expected a number, got {_brief(sent)}")
    if not isinstance(rows, list):
        raise WireError(f"rows: expected a list, got {_brief(rows)}")
    return WireBatch(node, batch, float(sent), tuple(_row(i, r) for i, r in enumerate(rows, 1)))


def _row(number: int, row: Any) -> WireRow:
    if not isinstance(row, dict) or set(row) != {"kind", "key", "payload"}:
        raise WireError(f"rows[{number}]: expected kind, key and payload, got {_brief(row)}")
    if not all(isinstance(row[k], str) for k in ("kind", "key", "payload")):
        raise WireError(f"rows[{number}]: kind, key and payload must be strings")
    return WireRow(row["kind"], row["key"], row["payload"])


def _brief(value: Any) -> str:
    return brief(value, 60, lambda v: json.dumps(v, default=str))


class Refusal(SlurmGpuError):
    """A batch the collector does not take: the HTTP status, the reason and one line why.

    Attributes:
        status: 400 malformed, 403 credential or rows, 413 oversized, 503 try again later.
        reason: the `reason` label of slurm_gpu_collector_refused_total ("replayed").
        retry_after: seconds for the Retry-After header of a 503, else None.
    """

    def __init__(
        self, status: int, reason: str, message: str, retry_after: float | None = None
    ) -> None:
        self.status = status
        self.reason = reason
        self.retry_after = retry_after
        super().__init__(message)
