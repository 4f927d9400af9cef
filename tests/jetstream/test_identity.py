"""Node identities with NATS nkeys (issue 26, docs/design/jetstream.md "Node identity").

The keys and the server's authorization block are made with `slurm-gpu nats keygen` and
`slurm-gpu nats server-config`, as an admin makes them, and a real nats-server runs with
that block. What is checked is what the server allows each key: a node its own batch
subject and reading its committed batch, nothing else; a worker everything; a client
without a known key nothing at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from click.testing import CliRunner, Result
from nats.aio.client import Client
from nats.js.api import StreamConfig

from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.jetstream.bus import (
    Bus,
    BusError,
    batch_subject,
    committed_key,
    flush_subject,
    inbox_prefix,
    seed_public_key,
)
from slurm_gpu.jetstream.flush import FlushRequests, ask_to_flush
from slurm_gpu.jetstream.identity import IdentityError, keygen
from tests.jetstream.natsd import NatsServer

CLUSTER = "c1"
# A refused request gets no answer: the caller waits this long for nothing.
REFUSED_WAIT = 1.5


@dataclass
class Secured:
    """A nats-server whose authorization block the CLI wrote for the keys in `keys`."""

    server: NatsServer
    keys: Path
    settings: NatsSettings

    def seed(self, name: str, worker: bool = False) -> Path:
        return self.keys / ("workers" if worker else "nodes") / f"{name}.nk"

    def bus(self, name: str, worker: bool = False, timeout: float = 10.0) -> Bus:
        settings = dataclasses.replace(self.settings, credentials=str(self.seed(name, worker)))
        return Bus(settings, f"test {name}", timeout=timeout)

    def messages(self) -> int:
        """How many batches the stream holds (read with a worker's key)."""
        bus = self.bus("ingest1", worker=True)
        try:
            info = bus.call(bus.jetstream().stream_info(self.settings.stream))
            return int(info.state.messages)
        finally:
            bus.close()


def invoke(tmp_path: Path, *args: str) -> Result:
    """Runs `slurm-gpu ARGS` with a config of cluster c1."""
    config = tmp_path / "slurm-gpu.toml"
    config.write_text(f'[cluster]\nname = "{CLUSTER}"\n')
    return CliRunner().invoke(cli, list(args), obj=AppContext(config_path=config, env={}))


def slurm_gpu(tmp_path: Path, *args: str) -> str:
    """Runs `slurm-gpu ARGS` (it must succeed); its output."""
    result = invoke(tmp_path, *args)
    assert 0 == result.exit_code, result.output
    return result.output


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    keys = tmp_path / "keys"
    slurm_gpu(tmp_path, "nats", "keygen", "ingest1", "--worker", "--dir", str(keys))
    slurm_gpu(tmp_path, "nats", "keygen", "gpu1", "gpu2", "--dir", str(keys))
    authorization = slurm_gpu(tmp_path, "nats", "server-config", "--dir", str(keys))
    server = NatsServer(tmp_path / "natsd", config=authorization)
    try:
        secured = Secured(server, keys, NatsSettings(url=server.url))
        worker = secured.bus("ingest1", worker=True)
        worker.ensure_stream()  # the workers make the stream and the bucket
        worker.close()
        yield secured
    finally:
        server.stop()


async def connect(secured: Secured, node: str, errors: list[str]) -> Client:
    """A plain nats-py client with `node`'s key, the errors the server sends in `errors`."""

    async def collect(exc: Exception) -> None:
        errors.append(str(exc))

    seed = secured.seed(node)
    return await nats.connect(
        secured.server.url,
        nkeys_seed=str(seed),
        inbox_prefix=_inbox(seed),
        error_cb=collect,
        allow_reconnect=False,
    )


def _inbox(seed: Path) -> str:
    """The inbox prefix the Bus of this seed uses (the only one its node may read)."""
    return inbox_prefix(seed_public_key(seed))


def test_node_publishes_a_batch_on_its_own_subject(secured: Secured) -> None:
    """A node's key publishes on <prefix>.<cluster>.<node> and JetStream acks it."""
    bus = secured.bus("gpu1")
    try:
        subject = batch_subject(secured.settings, CLUSTER, "gpu1")
        ack = bus.call(bus.jetstream().publish(subject, b"batch", headers={"Nats-Msg-Id": "b1"}))
    finally:
        bus.close()
    assert (secured.settings.stream, 1) == (ack.stream, ack.seq)
    assert 1 == secured.messages()


def test_node_cannot_publish_under_another_nodes_subject(secured: Secured) -> None:
    """gpu1 publishing on gpu2's subject is refused by the server; nothing is stored."""
    errors: list[str] = []
    forged = batch_subject(secured.settings, CLUSTER, "gpu2")

    async def forge() -> None:
        client = await connect(secured, "gpu1", errors)
        try:
            await client.publish(forged, b"not gpu1's batch")  # plain NATS, no ack asked
            with pytest.raises(nats.errors.TimeoutError):
                await client.jetstream().publish(forged, b"not gpu1's batch", timeout=1.0)
        finally:
            await client.close()

    asyncio.run(forge())
    assert [f'nats: permissions violation for publish to "{forged}"'] * 2 == errors
    assert 0 == secured.messages()
    # The agent's own Bus sees no ack: its shipper keeps the rows and retries.
    bus = secured.bus("gpu1", timeout=REFUSED_WAIT)
    try:
        with pytest.raises(BusError, match=r"did not answer|timeout"):
            bus.call(bus.jetstream().publish(forged, b"batch"))
    finally:
        bus.close()
    assert 0 == secured.messages()
    gpu1 = (secured.keys / "nodes" / "gpu1.pub").read_text().strip()
    violation = f'Publish Violation - Nkey "{gpu1}", Subject "{forged}"'
    assert 3 == secured.server.log.read_text().count(violation)


def test_client_without_a_known_key_cannot_connect(secured: Secured, tmp_path: Path) -> None:
    """No seed, or a seed the server's config does not list: the server refuses the client."""
    stranger = keygen(tmp_path / "other-keys", "gpu1")  # the right name, an unknown key

    async def refused(seed: Path | None) -> str:
        options = {"nkeys_seed": str(seed)} if seed else {}
        with pytest.raises(nats.errors.Error) as refusal:
            await nats.connect(secured.server.url, allow_reconnect=False, **options)
        return str(refusal.value)

    assert "nats: 'Authorization Violation'" == asyncio.run(refused(None))
    assert "nats: 'Authorization Violation'" == asyncio.run(refused(stranger.seed))
    # The agent's Bus keeps trying (the server may be restarting) and gives up after its
    # timeout: its shipper backs off and the rows stay in the spool.
    for credentials in ("", str(stranger.seed)):
        settings = dataclasses.replace(secured.settings, credentials=credentials)
        bus = Bus(settings, "stranger", timeout=REFUSED_WAIT)
        with pytest.raises(BusError, match="did not answer"):
            bus.client()
        bus.close()
    assert 4 <= secured.server.log.read_text().count("authentication error")


def test_node_reads_its_committed_batch(secured: Secured) -> None:
    """What a worker recorded for the node, the node reads through Bus.committed_seq."""
    worker = secured.bus("ingest1", worker=True)
    worker.record_committed(committed_key(CLUSTER, "gpu1"), 7)
    worker.close()
    bus = secured.bus("gpu1")
    try:
        assert 7 == bus.committed_seq(committed_key(CLUSTER, "gpu1"))
        assert 0 == bus.committed_seq(committed_key(CLUSTER, "gpu3"))  # none recorded yet
    finally:
        bus.close()


def test_node_cannot_manage_streams_or_write_the_bucket(secured: Secured) -> None:
    """A node cannot make or delete a stream, nor move its committed mark itself."""
    key = committed_key(CLUSTER, "gpu1")
    worker = secured.bus("ingest1", worker=True)
    worker.record_committed(key, 3)
    bus = secured.bus("gpu1", timeout=REFUSED_WAIT)
    try:
        js = bus.jetstream()
        with pytest.raises(BusError):
            bus.call(js.add_stream(StreamConfig(name="MINE", subjects=["mine.>"])))
        with pytest.raises(BusError):
            bus.call(js.delete_stream(secured.settings.stream))
        kv = bus.committed()  # reading is allowed, writing is not
        with pytest.raises(BusError):
            bus.call(kv.put(key, b"999"))
        with pytest.raises(BusError):
            bus.call(js.purge_stream(secured.settings.stream))
    finally:
        bus.close()
    try:
        assert 3 == worker.committed_seq(key)
        names = worker.call(worker.jetstream().streams_info())
        assert {secured.settings.stream, f"KV_{secured.settings.committed_bucket}"} == {
            s.config.name for s in names
        }
    finally:
        worker.close()


def test_node_cannot_read_other_nodes_batches_or_replies(secured: Secured) -> None:
    """Subscribing to the batch subjects or to the shared inbox is refused."""
    errors: list[str] = []

    async def snoop() -> None:
        client = await connect(secured, "gpu1", errors)
        try:
            await client.subscribe(f"{secured.settings.subject_prefix}.>")
            await client.subscribe("_INBOX.>")
            await client.flush(timeout=2)
            await asyncio.sleep(0.2)
        finally:
            await client.close()

    asyncio.run(snoop())
    prefix = secured.settings.subject_prefix
    assert [
        f'nats: permissions violation for subscription to "{prefix}.>"',
        'nats: permissions violation for subscription to "_inbox.>"',  # nats-py lowers it
    ] == errors


def test_seed_is_created_private_and_never_overwritten_unasked(tmp_path: Path) -> None:
    """The seed is 0600 even under umask 0; a second keygen refuses, --force replaces."""
    old = os.umask(0)
    try:
        made = keygen(tmp_path, "gpu1")
    finally:
        os.umask(old)
    assert 0o600 == stat.S_IMODE(made.seed.stat().st_mode)
    assert made.public_key == made.seed.with_suffix(".pub").read_text().strip()
    assert made.public_key == _inbox(made.seed).removeprefix("_INBOX_")
    seed = made.seed.read_bytes()
    with pytest.raises(IdentityError, match=f"{made.seed} exists"):
        keygen(tmp_path, "gpu1")
    assert seed == made.seed.read_bytes()
    again = keygen(tmp_path, "gpu1", force=True)
    assert again.public_key != made.public_key
    assert 0o600 == stat.S_IMODE(again.seed.stat().st_mode)
    assert [] == [p.name for p in again.seed.parent.iterdir() if p.name.startswith(".")]


def test_keygen_refuses_a_name_that_is_no_subject_token(tmp_path: Path) -> None:
    """A node name with a dot or a wildcard would widen its subject: refused, nothing made."""
    for name in ("gpu1.gpu2", "*", "gpu>"):
        with pytest.raises(IdentityError, match="cannot be a NATS subject token"):
            keygen(tmp_path, name)
    assert not (tmp_path / "nodes").exists() or [] == list((tmp_path / "nodes").iterdir())


def test_keygen_command_refuses_to_replace_a_key(tmp_path: Path) -> None:
    """`slurm-gpu nats keygen` of a node that has a key: exit 1 naming the seed file."""
    keys = tmp_path / "keys"
    first = slurm_gpu(tmp_path, "nats", "keygen", "gpu1", "--dir", str(keys))
    seed = keys / "nodes" / "gpu1.nk"
    assert first.startswith(f"{seed}: U")
    again = invoke(tmp_path, "nats", "keygen", "gpu1", "--dir", str(keys))
    assert 1 == again.exit_code
    assert again.output.startswith(f"slurm-gpu: {seed} exists: gpu1 has a key already")
    replaced = slurm_gpu(tmp_path, "nats", "keygen", "gpu1", "--dir", str(keys), "--force")
    assert replaced != first
    assert replaced.split(": ")[1] == (keys / "nodes" / "gpu1.pub").read_text()


def test_node_answers_the_controllers_flush_request_but_takes_no_other_nodes(
    secured: Secured,
) -> None:
    """gpu1 takes requests on its flush subject and answers them; gpu2's is refused."""
    node = secured.bus("gpu1")
    head = secured.bus("ingest1", worker=True)  # the controller runs with the head's key
    wake = threading.Event()
    requests = FlushRequests(node, flush_subject(secured.settings, CLUSTER, "gpu1"), wake)
    errors: list[str] = []

    async def snoop() -> None:
        client = await connect(secured, "gpu1", errors)
        try:
            await client.subscribe(flush_subject(secured.settings, CLUSTER, "gpu2"))
            await client.flush(timeout=2)
            await asyncio.sleep(0.2)
        finally:
            await client.close()

    try:
        requests.listen()

        def answer_when_asked() -> None:
            wake.wait(5)
            requests.answer(time.time())

        threading.Thread(target=answer_when_asked, daemon=True).start()
        answers = ask_to_flush(head, secured.settings, CLUSTER, ["gpu1"], timeout=5.0)
        asyncio.run(snoop())
    finally:
        node.close()
        head.close()
    assert answers["gpu1"] is not None
    prefix = secured.settings.flush_prefix
    assert [f'nats: permissions violation for subscription to "{prefix}.c1.gpu2"'] == errors
