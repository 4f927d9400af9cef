"""What a batch must prove before the collector writes it (docs/design/collector.md).

Its MUNGE credential decodes (munged refuses a replayed or expired one itself), was made
by uid 0 (the agent runs as root; a user on a node cannot sign for it), carries the
SHA-256 digest of the very body it came with, and was encoded on a host whose address
belongs to the node the batch names; and every row in it is that node's own. Each failure
is a `Refusal` with its status and reason.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from slurm_gpu.collector.wire import Refusal, WireBatch, digest
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.models import (
    GpuActivity,
    GpuInterval,
    GpuPhysicalInterval,
    JobEvent,
    JobGpuSummary,
    NodeHeartbeat,
)
from slurm_gpu.munge import (
    EMUNGE_CRED_EXPIRED,
    EMUNGE_CRED_REPLAYED,
    EMUNGE_CRED_REWOUND,
    EMUNGE_SOCKET,
    EMUNGE_TIMEOUT,
    MungeCredential,
    MungeError,
)
from slurm_gpu.node.outbox import OutboxError
from slurm_gpu.node.shipper import DecodedBatch

log = logging.getLogger(__name__)

# munged not answering on the collector's side is no fault of the batch: 503, retried.
_MUNGED_DOWN = (EMUNGE_SOCKET, EMUNGE_TIMEOUT)


class MungeDecoder(Protocol):
    """Decodes a MUNGE credential (`slurm_gpu.munge.Libmunge`; tests pass their own)."""

    def decode(self, credential: str) -> MungeCredential:
        """The credential's contents. Raises MungeError with munged's code."""
        ...


class NodeAddresses:
    """Which addresses each node's credentials may come from.

    Args:
        listed: [collector] nodes, {node: [addresses or host names]}; these are final.
        slurm_addrs: {node: NodeAddr} from Slurm (`scontrol show node`), asked for a node
            not listed; None when Slurm is not asked.
        resolve: a host name or address -> its IPv4 addresses (getaddrinfo).
        refresh_after: seconds before Slurm is asked again about a node it did not know.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        listed: Mapping[str, Sequence[str]],
        slurm_addrs: Callable[[], Mapping[str, str]] | None = None,
        resolve: Callable[[str], Iterable[str]] | None = None,
        refresh_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolve = resolve or _ipv4_addresses
        self._listed = {node: self._addresses(names) for node, names in listed.items()}
        self._slurm_addrs = slurm_addrs
        self._from_slurm: dict[str, frozenset[str]] = {}
        self._asked_at: float | None = None
        self._refresh_after = refresh_after
        self._clock = clock
        self._lock = threading.Lock()

    def _addresses(self, names: Iterable[str]) -> frozenset[str]:
        found: set[str] = set()
        for name in names:
            try:
                found.update(self._resolve(name))
            except OSError as exc:
                log.warning("cannot resolve %s: %s", name, exc)
        return frozenset(found)

    def __call__(self, node: str) -> frozenset[str]:
        """The node's addresses (empty: an unknown node)."""
        if node in self._listed:
            return self._listed[node]
        with self._lock:
            now = self._clock()
            stale = self._asked_at is None or now - self._asked_at >= self._refresh_after
            if node not in self._from_slurm and stale and self._slurm_addrs is not None:
                self._asked_at = now
                try:
                    addrs = self._slurm_addrs()
                except SlurmGpuError as exc:
                    log.warning("cannot ask Slurm for the nodes' addresses: %s", exc)
                else:
                    self._from_slurm = {n: self._addresses([a]) for n, a in addrs.items()}
            return self._from_slurm.get(node, frozenset())


def _ipv4_addresses(name: str) -> list[str]:
    infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class CredentialCheck:
    """The checks of one batch's credential and rows.

    Args:
        decoder: MUNGE (`Libmunge()` in production).
        addresses: node -> the addresses its credentials may come from.
        ttl: a credential encoded longer ago than this is expired ([collector]
            credential_ttl), whatever munged's own TTL.
        clock: POSIX seconds.
    """

    def __init__(
        self,
        decoder: MungeDecoder,
        addresses: Callable[[str], frozenset[str]],
        ttl: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.decoder = decoder
        self.addresses = addresses
        self.ttl = ttl
        self.clock = clock

    def check_credential(self, credential: str | None, body: bytes, node: str) -> MungeCredential:
        """The decoded credential of a batch from `node`, if it may write.

        Raises:
            Refusal: 403 (bad_credential, replayed, expired, non_root, digest_mismatch,
                wrong_node), 503 (munge_unavailable) when the collector's munged is down.
        """
        if not credential:
            raise Refusal(403, "bad_credential", "no X-Slurm-GPU-Credential header")
        try:
            cred = self.decoder.decode(credential.strip())
        except MungeError as exc:
            if exc.code == EMUNGE_CRED_REPLAYED:
                raise Refusal(403, "replayed", f"credential replayed: {exc}") from None
            if exc.code in (EMUNGE_CRED_EXPIRED, EMUNGE_CRED_REWOUND):
                raise Refusal(403, "expired", f"credential expired: {exc}") from None
            if exc.code in _MUNGED_DOWN or exc.code == 0:
                raise Refusal(
                    503, "munge_unavailable", f"cannot check credentials: {exc}", 5.0
                ) from None
            raise Refusal(403, "bad_credential", f"credential refused: {exc}") from None
        if cred.uid != 0:
            raise Refusal(403, "non_root", f"credential of uid {cred.uid}, not root's (0)")
        age = self.clock() - cred.encode_time
        if age > self.ttl:
            raise Refusal(403, "expired", f"credential encoded {age:.0f}s ago (ttl {self.ttl:g}s)")
        if cred.payload != digest(body).encode():
            raise Refusal(403, "digest_mismatch", "credential payload is not the body's SHA-256")
        allowed = self.addresses(node)
        if not allowed:
            raise Refusal(403, "wrong_node", f"node {node!r} has no known address")
        if cred.address not in allowed:
            raise Refusal(
                403,
                "wrong_node",
                f"credential encoded on {cred.address}, not on node {node!r}"
                f" ({', '.join(sorted(allowed))})",
            )
        return cred


def decode_rows(batch: WireBatch) -> DecodedBatch:
    """The batch's rows decoded with the agent's own decoders, each checked to be its node's.

    Raises:
        Refusal: 400 malformed (a row that does not decode), 403 foreign_rows (a row of
            another node).
    """
    decoded = DecodedBatch()
    for number, row in enumerate(batch.rows, 1):
        try:
            decoded.add(row.kind, row.payload)
        except OutboxError as exc:
            raise Refusal(400, "malformed", f"rows[{number}] ({row.key}): {exc}") from None
    owned: list[
        JobEvent | GpuActivity | GpuInterval | GpuPhysicalInterval | JobGpuSummary | NodeHeartbeat
    ] = [
        *decoded.events,
        *decoded.activity,
        *decoded.intervals,
        *decoded.physical,
        *decoded.summaries,
        *decoded.heartbeats,  # else a node could keep another's stale rows looking fresh
    ]
    for model in owned:
        if model.node != batch.node:
            raise Refusal(
                403,
                "foreign_rows",
                f"batch of node {batch.node!r} holds a {type(model).__name__} of node"
                f" {model.node!r}",
            )
    return decoded
