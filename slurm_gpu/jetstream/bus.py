"""One connection to NATS JetStream, for the node agent's thread or an ingest worker.

nats-py speaks asyncio only; the agent's shipper is a plain thread. `Bus` runs one event
loop in a thread of its own and offers blocking calls that wait for it with a timeout,
so the shipper and the worker stay ordinary sequential code. Every failure to reach or
use NATS is a `BusError` (a SlurmGpuError), which the shipper backs off on like a store
that is down.

Names (docs/design/jetstream.md): a node's batches go to `<prefix>.<cluster>.<node>` of
the stream `[nats] stream`; the last batch the store committed per node is the key
`<cluster>.<node>` of the key-value bucket `[nats] committed_bucket`, its value the
stream sequence of that batch (ASCII digits).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import nats
import nkeys  # type: ignore[import-untyped]
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.errors import SlurmGpuError

T = TypeVar("T")

# A subject token and a key-value key may not hold '.', '*', '>' or spaces; Slurm node and
# cluster names are host names (letters, digits, '-', '_').
_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


class BusError(SlurmGpuError):
    """NATS could not be reached or did not do what was asked (the caller retries later)."""


def token(kind: str, name: str) -> str:
    """`name` as one subject token. Raises BusError naming `kind` where it cannot be."""
    if not _TOKEN.fullmatch(name):
        raise BusError(
            f"{kind} {name!r} cannot be a NATS subject token (letters, digits, '_', '-' only)"
        )
    return name


def batch_subject(settings: NatsSettings, cluster: str, node: str) -> str:
    """The subject `node`'s batches are published to."""
    return f"{settings.subject_prefix}.{token('cluster', cluster)}.{token('node', node)}"


def flush_subject(settings: NatsSettings, cluster: str, node: str) -> str:
    """The subject `node` takes the controller's requests to ship now on (flush.py)."""
    return f"{settings.flush_prefix}.{token('cluster', cluster)}.{token('node', node)}"


def node_of_subject(settings: NatsSettings, cluster: str, subject: str) -> str | None:
    """The node a batch subject names, None where it is not one of `cluster`'s."""
    head = f"{settings.subject_prefix}.{cluster}."
    node = subject[len(head) :] if subject.startswith(head) else ""
    return node if _TOKEN.fullmatch(node) else None


def committed_key(cluster: str, node: str) -> str:
    """The key-value key of `node`'s last committed batch."""
    return f"{token('cluster', cluster)}.{token('node', node)}"


def inbox_prefix(public_key: str) -> str:
    """The prefix of the reply subjects of the connection whose nkey is `public_key`.

    nats-py's default, `_INBOX`, is everyone's: a node allowed to subscribe there could
    read every other client's replies (a worker's pulled batches among them). A prefix of
    its own lets the server grant a node its replies and nothing else (identity.py).
    """
    return f"_INBOX_{public_key}"


def seed_public_key(path: Path) -> str:
    """The public key of the nkey seed file `path`. Raises BusError naming the file."""
    try:
        seed = bytearray(path.read_bytes().strip())
        return str(nkeys.from_seed(seed).public_key.decode())
    except (OSError, ValueError, nkeys.NkeysError) as exc:
        raise BusError(f"[nats] credentials: no nkey seed read from {path}: {exc}") from None


class Bus:
    """A NATS connection and its event loop thread; blocking calls with timeouts.

    Args:
        settings: [nats].
        name: the connection's name in the server's monitoring (e.g. "slurm-gpu-agent gpu1").
        timeout: seconds a call waits for NATS before it raises BusError.
    """

    def __init__(self, settings: NatsSettings, name: str, timeout: float = 10.0) -> None:
        self.settings = settings
        self.name = name
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="nats-loop", daemon=True
        )
        self._thread.start()
        self._client: Client | None = None
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None
        # What NATS last reported asynchronously (an authorization violation, a refused
        # connection): nats-py keeps reconnecting, so a call only times out; its message
        # says why.
        self.last_error: str | None = None

    # ---- running coroutines from a plain thread ----------------------------------------

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Runs `coroutine` on the bus's loop and waits for it (BusError on failure)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        wait = self.timeout if timeout is None else timeout
        try:
            return future.result(wait)
        except TimeoutError:
            future.cancel()
            why = f"; last error: {self.last_error}" if self.last_error else ""
            raise BusError(
                f"NATS did not answer within {wait:.0f}s ({self.settings.url}){why}"
            ) from None
        except BusError:
            raise
        except (NatsError, OSError) as exc:
            raise BusError(f"NATS ({self.settings.url}): {type(exc).__name__}: {exc}") from None

    # ---- the connection -----------------------------------------------------------------

    def client(self) -> Client:
        """The connection, made on first use (BusError when NATS is unreachable)."""
        if self._client is None or self._client.is_closed:
            self._client = self.call(self._connect())
            self._js, self._kv = None, None
        return self._client

    async def _connect(self) -> Client:
        options: dict[str, Any] = {
            "name": self.name,
            "connect_timeout": min(self.timeout, 5.0),
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 1.0,
            # Reconnecting goes on in the background; what went wrong is kept for the
            # message of the call that times out meanwhile.
            "error_cb": self._note_error,
            "disconnected_cb": _none,
        }
        seed = self.settings.credentials
        if seed:
            path = Path(seed)
            if not path.is_file():
                raise BusError(f"[nats] credentials: no nkey seed file {seed}")
            options["nkeys_seed"] = str(path)
            options["inbox_prefix"] = inbox_prefix(seed_public_key(path))
        servers = [s.strip() for s in self.settings.url.split(",")]
        try:
            return await nats.connect(servers, **options)
        except NatsError as exc:
            raise BusError(f"cannot connect to NATS ({self.settings.url}): {exc}") from None

    async def _note_error(self, exc: Exception) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"

    def jetstream(self) -> JetStreamContext:
        """The connection's JetStream context."""
        client = self.client()
        if self._js is None:
            self._js = client.jetstream(timeout=self.timeout)
        return self._js

    def committed(self) -> KeyValue:
        """The bucket of committed batches (it must exist: `ensure_stream` makes it)."""
        if self._kv is None:
            js, bucket = self.jetstream(), self.settings.committed_bucket

            async def find() -> KeyValue:
                try:
                    return await js.key_value(bucket)
                except BucketNotFoundError:
                    raise BusError(
                        f"no key-value bucket {bucket!r} yet: start an ingest worker"
                        " (`slurm-gpu ingest run`), which makes it"
                    ) from None

            self._kv = self.call(find())
        return self._kv

    def ensure_stream(self) -> None:
        """Makes the stream and the bucket where they are missing (the workers' part).

        File storage, work-queue retention (a batch is gone once a worker acked it),
        `duplicate_window` for the batch ids, `max_batch_bytes` per message.
        """
        js = self.jetstream()
        s = self.settings
        config = StreamConfig(
            name=s.stream,
            subjects=[f"{s.subject_prefix}.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=float(s.duplicate_window),
            max_msg_size=s.max_batch_bytes,
            num_replicas=s.replicas,
        )

        async def ensure() -> None:
            try:
                await js.stream_info(s.stream)
            except NotFoundError:
                await js.add_stream(config)
            try:
                await js.key_value(s.committed_bucket)
            except BucketNotFoundError:
                await js.create_key_value(
                    KeyValueConfig(
                        bucket=s.committed_bucket,
                        history=1,
                        storage=StorageType.FILE,
                        replicas=s.replicas,
                    )
                )

        self.call(ensure())

    def committed_seq(self, key: str) -> int:
        """The stream sequence of the last batch committed under `key` (0: none yet)."""
        kv = self.committed()

        async def read() -> int:
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:
                return 0
            return int(entry.value or b"0")

        return self.call(read())

    def record_committed(self, key: str, seq: int) -> None:
        """Raises `key`'s committed sequence to `seq`, never lowers it.

        A batch redelivered after a later one was committed must not move the agent's
        mark back.
        """
        kv = self.committed()

        async def raise_to() -> None:
            for _ in range(10):  # another worker's update in between: read again
                try:
                    entry = await kv.get(key)
                except KeyNotFoundError:
                    try:
                        await kv.create(key, str(seq).encode())
                        return
                    except KeyWrongLastSequenceError:
                        continue
                if int(entry.value or b"0") >= seq:
                    return
                try:
                    await kv.update(key, str(seq).encode(), last=entry.revision)
                    return
                except KeyWrongLastSequenceError:
                    continue
            raise BusError(f"could not record batch {seq} of {key}: updated concurrently")

        self.call(raise_to())

    def close(self) -> None:
        """Drains and closes the connection, then ends the loop and its thread."""
        client, self._client = self._client, None

        async def shutdown() -> None:
            if client is not None and not client.is_closed:
                # Not drain(): every call here waited for its answer, so nothing is in
                # flight, and a pull subscription's drain waits out its fetch.
                await client.close()
            # nats-py's reader, pinger and flusher tasks end with the loop, not before.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        if self._thread.is_alive():
            with contextlib.suppress(BusError):  # closing: nothing left to tell
                self.call(shutdown(), timeout=10.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5.0)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()


async def _none() -> None:
    return None
