"""Who may do what on NATS: one nkey per node and per ingest worker (issue 26).

nats-server 2.9 has no auth callout, so identities are static: `slurm-gpu nats keygen`
makes a user nkey pair per node and per ingest worker, each process keeps its seed (root
only, `[nats] credentials`), and `slurm-gpu nats server-config` writes the server's
`authorization` block from the public keys. A node may publish on its own batch subject
and read the committed-batches bucket, nothing else, so a batch published under another
node's subject is refused by the server before any worker sees it. The workers, on the
head node, are trusted with every subject.

A keys directory holds `nodes/<node>.nk` (seed) and `nodes/<node>.pub` (public key) per
node, `workers/<name>.nk` and `workers/<name>.pub` per ingest worker: where a key sits
says what it may do.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import nkeys  # type: ignore[import-untyped]

from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.jetstream.bus import (
    BusError,
    batch_subject,
    flush_subject,
    inbox_prefix,
    token,
)

NODES = "nodes"
WORKERS = "workers"
SEED_SUFFIX = ".nk"
PUBLIC_SUFFIX = ".pub"

# A user's public nkey: 'U' and 55 more base32 characters. Checked before it is written
# into the server's config, where anything else could add permissions of its own.
_USER_KEY = re.compile(r"U[A-Z2-7]{55}")


class IdentityError(SlurmGpuError):
    """A key could not be made or read, or a name cannot be a node's identity."""


@dataclass(frozen=True)
class Identity:
    """One key of a keys directory.

    Attributes:
        name: the node's name, or the worker's.
        worker: an ingest worker's key (every subject) rather than a node's.
        public_key: the user nkey ("U...").
        seed: its seed file (it may have been moved away to the node: only the public
            key is needed for the server's config).
    """

    name: str
    worker: bool
    public_key: str
    seed: Path


@dataclass(frozen=True)
class Permissions:
    """The subjects a node's key may publish to and subscribe to (allow lists)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def keygen(directory: Path, name: str, *, worker: bool = False, force: bool = False) -> Identity:
    """Makes a user nkey pair for node (or worker) `name` in `directory`.

    The seed file is created with mode 0600 (it is the identity: whoever reads it may
    publish as the node) and replaces an existing one only with `force`; the public key
    is written beside it, readable by all.

    Raises:
        IdentityError: a bad name, a seed already there, or a file that cannot be written.
    """
    folder = directory / (WORKERS if worker else NODES)
    seed_path = folder / f"{_token(_kind(worker), name)}{SEED_SUFFIX}"
    seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    public_key = str(nkeys.from_seed(bytearray(seed)).public_key.decode())
    try:
        # 0700: the seeds' folder is the admin's alone, as each seed is.
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise IdentityError(f"cannot make the keys' folder {folder}: {exc}") from None
    try:
        _write(seed_path, seed + b"\n", mode=0o600, replace=force)
        _write(seed_path.with_suffix(PUBLIC_SUFFIX), f"{public_key}\n".encode(), 0o644, True)
    except FileExistsError:
        raise IdentityError(
            f"{seed_path} exists: {name} has a key already (--force replaces it; the old key"
            " stops working once the server's config is made again)"
        ) from None
    except OSError as exc:
        raise IdentityError(f"cannot write the key of {name} in {folder}: {exc}") from None
    return Identity(name, worker, public_key, seed_path)


def identities(directory: Path) -> list[Identity]:
    """The keys of `directory` (its `nodes/` and `workers/` public keys), by kind and name.

    Raises:
        IdentityError: a public key file that is not a user nkey, or a bad name.
    """
    found = []
    for worker, kind in ((True, WORKERS), (False, NODES)):
        for path in sorted((directory / kind).glob(f"*{PUBLIC_SUFFIX}")):
            name = _token(_kind(worker), path.stem)
            try:
                public_key = path.read_text().strip()
            except OSError as exc:
                raise IdentityError(f"cannot read {path}: {exc}") from None
            if not _USER_KEY.fullmatch(public_key):
                raise IdentityError(f"{path}: not a user public nkey (U...), {public_key[:60]!r}")
            found.append(Identity(name, worker, public_key, path.with_suffix(SEED_SUFFIX)))
    return found


def node_permissions(
    settings: NatsSettings, cluster: str, node: str, public_key: str
) -> Permissions:
    """What node `node`'s key needs and no more: the agent's publishes and its replies.

    - its batch subject: each batch (JetStream answers the publish with a PubAck);
    - `$JS.API.STREAM.INFO.KV_<bucket>`: nats-py's `js.key_value(bucket)` asks for the
      bucket's stream before it hands out the bucket;
    - `$JS.API.STREAM.MSG.GET.KV_<bucket>`: `kv.get(key)`, reading the node's committed
      sequence (a bucket without allow_direct, as `Bus.ensure_stream` makes it);
    - subscribing to its own inbox: the replies to all three;
    - subscribing to its flush subject (jetstream/flush.py): the controller's requests
      to ship now, which it answers on the requester's inbox (`allow_responses` in the
      server's config: the one reply to a request it took, nowhere else).
    """
    stream = f"KV_{settings.committed_bucket}"
    return Permissions(
        publish=(
            batch_subject(settings, cluster, node),
            f"$JS.API.STREAM.INFO.{stream}",
            f"$JS.API.STREAM.MSG.GET.{stream}",
        ),
        subscribe=(f"{inbox_prefix(public_key)}.>", flush_subject(settings, cluster, node)),
    )


def server_config(directory: Path, settings: NatsSettings, cluster: str) -> str:
    """nats-server's `authorization` block for the keys of `directory`.

    Raises:
        IdentityError: no keys there, or a key file that cannot be used.
    """
    _token("cluster", cluster)
    keys = identities(directory)
    if not keys:
        raise IdentityError(
            f"no public keys in {directory}/{WORKERS} or {directory}/{NODES}: make them with"
            " `slurm-gpu nats keygen`"
        )
    lines = [
        f"# slurm-gpu nats server-config: cluster {cluster}, stream {settings.stream},"
        f" bucket {settings.committed_bucket}",
        "authorization {",
        "  users = [",
    ]
    for key in keys:
        if key.worker:
            lines += [
                f"    # ingest worker {key.name}: every subject",
                f"    {{ nkey: {_q(key.public_key)} }}",
            ]
            continue
        allowed = node_permissions(settings, cluster, key.name, key.public_key)
        lines += [
            f"    # node {key.name}",
            "    {",
            f"      nkey: {_q(key.public_key)}",
            "      permissions: {",
            f"        publish: {{ allow: {_list(allowed.publish)} }}",
            f"        subscribe: {{ allow: {_list(allowed.subscribe)} }}",
            "        allow_responses: true",
            "      }",
            "    }",
        ]
    return "\n".join([*lines, "  ]", "}"]) + "\n"


def _kind(worker: bool) -> str:
    return "worker" if worker else "node"


def _token(kind: str, name: str) -> str:
    """`name` where it can be a subject token (a node's is one; a worker's names files)."""
    try:
        return token(kind, name)
    except BusError as exc:
        raise IdentityError(str(exc)) from None


def _write(path: Path, data: bytes, mode: int, replace: bool) -> None:
    """Writes `path` whole, its file created with mode 0600 and then given `mode`.

    A seed is never readable by others, not even while it is written; a crash leaves no
    half-written key. Raises FileExistsError where `path` exists and not `replace`.
    """
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)  # fails where the file exists, atomically
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _q(text: str) -> str:
    """A quoted string of nats-server's config (JSON's quoting is its own)."""
    return json.dumps(text)


def _list(subjects: Sequence[str]) -> str:
    return "[" + ", ".join(_q(s) for s in subjects) + "]"
