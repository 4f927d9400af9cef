"""The collector: its wire format, and each batch it refuses with its status and reason."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gpu.collector.credential import CredentialCheck, NodeAddresses
from slurm_gpu.collector.metrics import CollectorMetrics
from slurm_gpu.collector.server import Collector
from slurm_gpu.collector.service import slurm_node_addrs
from slurm_gpu.collector.wire import (
    Refusal,
    WireBatch,
    WireError,
    WireRow,
    decode_batch,
    digest,
    encode_batch,
)
from slurm_gpu.collector.writer import BatchWriter
from slurm_gpu.config import read_config
from slurm_gpu.errors import ConfigError, StoreError
from slurm_gpu.models import GpuInterval, JobEvent, JobEventKind, NodeHeartbeat
from slurm_gpu.munge import EMUNGE_CRED_EXPIRED, EMUNGE_CRED_REPLAYED, MungeCredential, MungeError
from slurm_gpu.node.collector_sink import CollectorSink
from slurm_gpu.node.outbox import encode, fields_of
from slurm_gpu.node.shipper import DecodedBatch, RetryLater, Shipper
from slurm_gpu.node.spool import OutboxRow, Spool
from slurm_gpu.slurm.scontrol import GpuNode
from slurm_gpu.store import Store
from slurm_gpu.testing import FakeSlurmClient

NOW = 1_800_000_000.0


class FakeMunge:
    """A MUNGE stand-in: a credential is JSON of what munged would vouch for.

    `encode` signs as `uid` from `address`; `decode` refuses a credential seen before
    (EMUNGE_CRED_REPLAYED, as munged does) and those in `errors` with their code.
    """

    def __init__(self, uid: int = 0, address: str = "10.0.0.1", at: float = NOW) -> None:
        self.uid, self.address, self.at = uid, address, at
        self.errors: dict[str, int] = {}
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def encode(self, payload: bytes) -> str:
        return "FAKE:" + json.dumps(
            {
                "uid": self.uid,
                "p": payload.decode(),
                "a": self.address,
                "t": self.at,
                "n": time.perf_counter_ns(),
            }
        )

    def decode(self, credential: str) -> MungeCredential:
        if credential in self.errors:
            raise MungeError(
                self.errors[credential], f"munge_decode: error {self.errors[credential]}"
            )
        with self.lock:
            if credential in self.seen:
                raise MungeError(EMUNGE_CRED_REPLAYED, "munge_decode: Replayed credential (17)")
            self.seen.add(credential)
        data = json.loads(credential.removeprefix("FAKE:"))
        return MungeCredential(data["uid"], 0, data["p"].encode(), data["a"], int(data["t"]), 300)


class RecordingStore:
    """The store's batch writer, recorded; `down` makes it fail; `gate` holds it.

    `write_batches` refuses a whole group holding an interval that starts at one of
    `bad` (one batch's bad data), and records the nodes of every group it commits.
    """

    def __init__(self) -> None:
        self.down = False
        self.gate = threading.Event()
        self.gate.set()
        self.intervals: list[GpuInterval] = []
        self.events: list[JobEvent] = []
        self.bad: set[float] = set()
        self.groups: list[list[float]] = []
        self.attempts = 0
        self.entered = 0  # writes begun (some may wait at the gate)

    def _enter(self) -> None:
        self.entered += 1
        self.gate.wait(10)
        if self.down:
            raise StoreError("store down: connection refused")

    def ping(self) -> None:
        if self.down:
            raise StoreError("store down: connection refused")

    def write_batches(self, batches: Sequence[tuple[str, DecodedBatch]]) -> int:
        self.attempts += 1
        self._enter()
        starts = [r.period_start for _, batch in batches for r in batch.intervals]
        if self.bad.intersection(starts):
            raise StoreError("value out of range for column period_start")
        self.groups.append(starts)
        for _node, batch in batches:
            self.events += batch.events
            self.intervals += batch.intervals
        return len(starts)


def interval(node: str, start: float) -> GpuInterval:
    return GpuInterval(
        node, "GPU-1", start, start + 60, 7, 50.0, 60.0, 40.0, 60, 60.0, 60.0,
        None, None, None, None, None, None,
    )  # fmt: skip


def rows_of(node: str, *starts: float, row_node: str | None = None) -> list[WireRow]:
    return [
        WireRow("interval", f"{node}:GPU-1:{s!r}", encode(fields_of(interval(row_node or node, s))))
        for s in starts
    ]


def body_of(node: str, rows: Sequence[WireRow]) -> bytes:
    return encode_batch(node, f"{node}:{NOW!r}:1", NOW, rows)


def make_collector(
    munge: FakeMunge, store: RecordingStore, *, queue_depth: int = 4, max_bytes: int = 2**20
) -> Collector:
    metrics = CollectorMetrics()
    check = CredentialCheck(
        munge, NodeAddresses({"gpu1": ["10.0.0.1"], "gpu2": ["10.0.0.2"]}, resolve=lambda a: [a]),
        ttl=300.0, clock=lambda: NOW + 1,
    )  # fmt: skip
    writer = BatchWriter(store, metrics, pool_size=1, queue_depth=queue_depth, retry_after=7.0)
    return Collector(check, writer, metrics, "127.0.0.1:0", max_batch_bytes=max_bytes)


def signed(munge: FakeMunge, body: bytes) -> str:
    return munge.encode(digest(body).encode())


def refusal_of(collector: Collector, body: bytes, credential: str | None) -> Refusal:
    with pytest.raises(Refusal) as caught:
        collector.accept(body, credential, "10.0.0.1")
    return caught.value


@pytest.fixture
def store() -> RecordingStore:
    return RecordingStore()


@pytest.fixture
def collector(store: RecordingStore) -> Iterator[Collector]:
    collector = make_collector(FakeMunge(), store)
    collector.writer.start()
    yield collector
    collector.writer.stop()


# ---------------------------------------------------------------------------- wire format


def test_wire_batch_round_trips() -> None:
    """A batch encoded by the agent decodes to the same node, id, time and rows."""
    rows = rows_of("gpu1", 0.0, 60.0)
    body = encode_batch("gpu1", "gpu1:1.5:42", 1.5, rows)
    assert WireBatch("gpu1", "gpu1:1.5:42", 1.5, tuple(rows)) == decode_batch(body)


def test_wire_batch_of_another_version_is_refused() -> None:
    """A body of another version is a WireError naming the version."""
    body = json.dumps({"version": 2, "node": "gpu1", "batch": "", "sent": 0, "rows": []})
    with pytest.raises(WireError, match="version: expected 1, got 2"):
        decode_batch(body.encode())


# ---------------------------------------------------------------------------- accepted


def test_batch_of_root_on_its_node_is_written(collector: Collector, store: RecordingStore) -> None:
    """A root credential from gpu1's address over the body, gpu1's rows: written, counted."""
    munge = collector.check.decoder
    assert isinstance(munge, FakeMunge)
    body = body_of("gpu1", rows_of("gpu1", 0.0, 60.0))
    assert 2 == collector.accept(body, signed(munge, body), "10.0.0.1")
    assert [0.0, 60.0] == [r.period_start for r in store.intervals]
    text = collector.metrics.text().decode()
    assert "slurm_gpu_collector_batches_total 1.0" in text
    assert "slurm_gpu_collector_rows_total 2.0" in text


# ---------------------------------------------------------------------------- refusals


def test_forged_digest_is_refused(collector: Collector, caplog: pytest.LogCaptureFixture) -> None:
    """A credential over another body: 403 digest_mismatch, one log line, one count."""
    munge = collector.check.decoder
    assert isinstance(munge, FakeMunge)
    body = body_of("gpu1", rows_of("gpu1", 0.0))
    forged = body_of("gpu1", rows_of("gpu1", 999.0))
    with caplog.at_level(logging.WARNING, logger="slurm_gpu.collector.server"):
        refusal = refusal_of(collector, forged, signed(munge, body))
    assert (403, "digest_mismatch") == (refusal.status, refusal.reason)
    assert 1.0 == collector.metrics.refused_count("digest_mismatch")
    assert [
        f"refused batch gpu1:{NOW!r}:1 of node gpu1 from 10.0.0.1: 403 digest_mismatch:"
        " credential payload is not the body's SHA-256"
    ] == caplog.messages


def test_non_root_credential_is_refused(store: RecordingStore) -> None:
    """A credential of uid 1000 (a user on the node): 403 non_root, nothing written."""
    munge = FakeMunge(uid=1000)
    collector = make_collector(munge, store)
    body = body_of("gpu1", rows_of("gpu1", 0.0))
    refusal = refusal_of(collector, body, signed(munge, body))
    assert (403, "non_root", "credential of uid 1000, not root's (0)") == (
        refusal.status, refusal.reason, str(refusal),
    )  # fmt: skip
    assert (1.0, []) == (collector.metrics.refused_count("non_root"), store.intervals)


def test_replayed_credential_is_refused(collector: Collector, store: RecordingStore) -> None:
    """The same request sent twice: munged refuses the second (403 replayed)."""
    munge = collector.check.decoder
    assert isinstance(munge, FakeMunge)
    body = body_of("gpu1", rows_of("gpu1", 0.0))
    credential = signed(munge, body)
    collector.accept(body, credential, "10.0.0.1")
    refusal = refusal_of(collector, body, credential)
    assert (403, "replayed") == (refusal.status, refusal.reason)
    assert (1.0, 1) == (collector.metrics.refused_count("replayed"), len(store.intervals))


def test_expired_credential_is_refused(collector: Collector) -> None:
    """munged's EMUNGE_CRED_EXPIRED: 403 expired."""
    munge = collector.check.decoder
    assert isinstance(munge, FakeMunge)
    body = body_of("gpu1", rows_of("gpu1", 0.0))
    credential = signed(munge, body)
    munge.errors[credential] = EMUNGE_CRED_EXPIRED
    refusal = refusal_of(collector, body, credential)
    assert (403, "expired", 1.0) == (
        refusal.status, refusal.reason, collector.metrics.refused_count("expired"),
    )  # fmt: skip


def test_credential_older_than_the_ttl_is_refused(store: RecordingStore) -> None:
    """A credential encoded 301 s ago, [collector] credential_ttl 300 s: 403 expired."""
    munge = FakeMunge(at=NOW - 300)
    collector = make_collector(munge, store)
    body = body_of("gpu1", rows_of("gpu1", 0.0))
    refusal = refusal_of(collector, body, signed(munge, body))
    assert (403, "expired", "credential encoded 301s ago (ttl 300s)") == (
        refusal.status, refusal.reason, str(refusal),
    )  # fmt: skip


def test_batch_claiming_another_node_is_refused(collector: Collector) -> None:
    """gpu1's credential on a batch (and rows) claiming gpu2: 403 wrong_node."""
    munge = collector.check.decoder
    assert isinstance(munge, FakeMunge)
    body = body_of("gpu2", rows_of("gpu2", 0.0))
    refusal = refusal_of(collector, body, signed(munge, body))
    assert (403, "wrong_node") == (refusal.status, refusal.reason)
    assert "credential encoded on 10.0.0.1, not on node 'gpu2' (10.0.0.2)" == str(refusal)
    assert 1.0 == collector.metrics.refused_count("wrong_node")


def test_batch_holding_rows_of_another_node_is_refused(
    collector: Collector, store: RecordingStore
) -> None:
    """gpu1's own batch carrying an interval of gpu2: 403 foreign_rows, nothing written."""
    munge = collector.check.decoder
    assert isinstance(munge, FakeMunge)
    body = body_of("gpu1", [*rows_of("gpu1", 0.0), *rows_of("gpu1", 60.0, row_node="gpu2")])
    refusal = refusal_of(collector, body, signed(munge, body))
    assert (403, "foreign_rows") == (refusal.status, refusal.reason)
    assert "batch of node 'gpu1' holds a GpuInterval of node 'gpu2'" == str(refusal)
    assert (1.0, []) == (collector.metrics.refused_count("foreign_rows"), store.intervals)


def test_event_of_another_node_is_refused(collector: Collector) -> None:
    """A job event of gpu2 in gpu1's batch: 403 foreign_rows (a node writes its own jobs)."""
    munge = collector.check.decoder
    assert isinstance(munge, FakeMunge)
    event = JobEvent("gpu2", 7, JobEventKind.STARTED, NOW, user="alice")
    body = body_of("gpu1", [WireRow("event", event.key, encode(fields_of(event)))])
    refusal = refusal_of(collector, body, signed(munge, body))
    assert (403, "foreign_rows") == (refusal.status, refusal.reason)


def test_heartbeat_of_another_node_is_refused(collector: Collector) -> None:
    """gpu2's heartbeat in gpu1's batch: 403 foreign_rows (it would keep gpu2's rows fresh)."""
    munge = collector.check.decoder
    assert isinstance(munge, FakeMunge)
    beat = NodeHeartbeat("gpu2", NOW, ("GPU-b",))
    body = body_of("gpu1", [WireRow("heartbeat", "heartbeat:gpu2", encode(fields_of(beat)))])
    refusal = refusal_of(collector, body, signed(munge, body))
    assert (403, "foreign_rows") == (refusal.status, refusal.reason)
    assert "batch of node 'gpu1' holds a NodeHeartbeat of node 'gpu2'" == str(refusal)


def test_oversized_body_is_refused(store: RecordingStore) -> None:
    """A body over max_batch_bytes: 413 oversized."""
    munge = FakeMunge()
    collector = make_collector(munge, store, max_bytes=100)
    body = body_of("gpu1", rows_of("gpu1", 0.0))
    refusal = refusal_of(collector, body, signed(munge, body))
    assert (413, "oversized", 1.0) == (
        refusal.status, refusal.reason, collector.metrics.refused_count("oversized"),
    )  # fmt: skip


def test_malformed_body_is_refused(collector: Collector) -> None:
    """A body that is not JSON: 400 malformed."""
    refusal = refusal_of(collector, b"{not json", "FAKE:{}")
    assert (400, "malformed", 1.0) == (
        refusal.status, refusal.reason, collector.metrics.refused_count("malformed"),
    )  # fmt: skip


def test_missing_credential_is_refused(collector: Collector) -> None:
    """No X-Slurm-GPU-Credential header: 403 bad_credential."""
    body = body_of("gpu1", rows_of("gpu1", 0.0))
    refusal = refusal_of(collector, body, None)
    assert (403, "bad_credential") == (refusal.status, refusal.reason)


def test_full_queue_is_refused_with_retry_after(store: RecordingStore) -> None:
    """Writer busy, queue full: 503 queue_full with Retry-After [collector] retry_after."""
    munge = FakeMunge()
    collector = make_collector(munge, store, queue_depth=1)
    store.gate.clear()  # the writer holds its batch until the gate opens
    collector.writer.start()
    waiting = []

    def send(start: float) -> None:
        body = body_of("gpu1", rows_of("gpu1", start))
        thread = threading.Thread(
            target=collector.accept, args=(body, signed(munge, body), "10.0.0.1")
        )
        thread.start()
        waiting.append(thread)

    def until(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 5
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)

    try:
        # One held by the writer at the gate, then one in the queue (both queued before
        # the writer took one, it would take them as one group).
        send(0.0)
        until(lambda: store.entered == 1)
        send(60.0)
        until(lambda: collector.writer.depth() == 1)
        body = body_of("gpu1", rows_of("gpu1", 120.0))
        refusal = refusal_of(collector, body, signed(munge, body))
    finally:
        store.gate.set()
        for thread in waiting:
            thread.join(10)
        collector.writer.stop()
    assert (503, "queue_full", 7.0) == (refusal.status, refusal.reason, refusal.retry_after)
    assert (1.0, [0.0, 60.0]) == (
        collector.metrics.refused_count("queue_full"), [r.period_start for r in store.intervals],
    )  # fmt: skip


def test_store_down_is_refused_with_retry_after(
    collector: Collector, store: RecordingStore
) -> None:
    """The store refuses the write: 503 store_down, Retry-After, the agent retries."""
    munge = collector.check.decoder
    assert isinstance(munge, FakeMunge)
    store.down = True
    body = body_of("gpu1", rows_of("gpu1", 0.0))
    refusal = refusal_of(collector, body, signed(munge, body))
    assert (503, "store_down", 7.0) == (refusal.status, refusal.reason, refusal.retry_after)
    assert 1.0 == collector.metrics.refused_count("store_down")


# ---------------------------------------------------------------------------- the agent side


def test_refusal_over_http_keeps_the_rows_and_passes_retry_after(
    tmp_path: Path, store: RecordingStore
) -> None:
    """A 503 with Retry-After: the shipper keeps every row and waits as long as asked."""
    munge = FakeMunge(address="127.0.0.1")
    collector = make_collector(munge, store)
    collector.check.addresses = NodeAddresses({"gpu1": ["127.0.0.1"]}, resolve=lambda a: [a])
    store.down = True
    collector.start()
    spool = Spool(tmp_path / "spool.db")
    try:
        with spool.transaction() as db:
            Spool.queue(db, "interval", "i0", fields_of(interval("gpu1", 0.0)))
        sink = CollectorSink(f"http://{collector.address}", munge.encode)
        shipper = Shipper(spool, sink, "gpu1", backoff_max=60.0)
        with pytest.raises(RetryLater) as caught:
            shipper.ship_once()
    finally:
        collector.stop()
        backlog = spool.backlog()
        spool.close()
    assert "503 store_down: store: store down: connection refused" in str(caught.value)
    assert (7.0, 1) == (caught.value.retry_after, backlog)
    assert 7.0 == shipper.retry_delay(caught.value, 1.0)


def test_retry_after_is_capped_by_the_longest_backoff(tmp_path: Path) -> None:
    """A Retry-After beyond [node] ship_backoff_max waits ship_backoff_max."""
    spool = Spool(tmp_path / "spool.db")
    shipper = Shipper(spool, RecordingStore(), "gpu1", backoff_max=60.0)
    spool.close()
    assert (60.0, 8.0) == (
        shipper.retry_delay(RetryLater("busy", retry_after=3600), 1.0),
        shipper.retry_delay(RetryLater("busy", retry_after=None), 8.0),
    )


def test_sink_sends_the_outbox_rows_as_read() -> None:
    """The body holds the spool's rows byte for byte, signed over its own digest."""
    munge = FakeMunge()
    sent: list[tuple[str, int | None, str, bytes, str]] = []

    class Answer:
        status = 200
        will_close = False

        def read(self) -> bytes:
            return b'{"rows": 1}'

    class Connection:
        def __init__(self, host: str, port: int | None, timeout: float) -> None:
            self.host, self.port = host, port

        def request(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> None:
            sent.append((self.host, self.port, path, body, headers["X-Slurm-GPU-Credential"]))

        def getresponse(self) -> Answer:
            return Answer()

    payload = encode(fields_of(interval("gpu1", 0.0)))
    sink = CollectorSink(
        "http://head:6830/",
        munge.encode,
        clock=lambda: NOW,
        connect=Connection,  # type: ignore[arg-type]
    )
    sink.ship_batch("gpu1", [OutboxRow(42, "interval", "k", payload)])
    ((host, port, path, body, credential),) = sent
    assert ("head", 6830, "/v1/batch") == (host, port, path)
    batch = decode_batch(body)
    assert ("gpu1", f"gpu1:{NOW!r}:42", (WireRow("interval", "k", payload),)) == (
        batch.node, batch.batch, batch.rows,
    )  # fmt: skip
    assert digest(body).encode() == munge.decode(credential).payload


def test_oversized_request_is_refused_before_its_body_is_read(store: RecordingStore) -> None:
    """Over HTTP, a Content-Length beyond max_batch_bytes is answered 413 with the reason."""
    collector = make_collector(FakeMunge(), store, max_bytes=1000)
    collector.start()
    request = urllib.request.Request(
        f"http://{collector.address}/v1/batch", data=b"x" * 5000, method="POST"
    )
    try:
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        answer = json.loads(caught.value.read())
    finally:
        collector.stop()
    assert (413, "oversized") == (caught.value.code, answer["error"])
    assert 1.0 == collector.metrics.refused_count("oversized")


def test_node_addresses_come_from_slurm_for_nodes_not_listed() -> None:
    """A node [collector] nodes does not list is checked against its Slurm NodeAddr."""
    slurm = FakeSlurmClient(gpu_nodes=[GpuNode("gpu7", "IDLE", 4, 0, "gpu7-ib")])
    resolved = {"10.1.0.1": ["10.1.0.1"], "gpu7-ib": ["10.2.0.7"]}
    addresses = NodeAddresses(
        {"gpu1": ["10.1.0.1"]}, slurm_node_addrs(slurm), resolve=resolved.__getitem__
    )
    assert (frozenset({"10.1.0.1"}), frozenset({"10.2.0.7"}), frozenset()) == (
        addresses("gpu1"), addresses("gpu7"), addresses("gpu9"),
    )  # fmt: skip
    assert 1 == len(slurm.calls_to("gpu_nodes"))  # gpu9 unknown: not asked again at once


def test_collector_mode_needs_a_collector_url(tmp_path: Path) -> None:
    """[node] ship_to = "collector" without collector_url is a config error naming both."""
    file = tmp_path / "slurm-gpu.toml"
    file.write_text('[node]\nship_to = "collector"\n')
    with pytest.raises(ConfigError) as caught:
        read_config(file)
    assert [
        f'{file}: node: ship_to = "collector" needs collector_url (e.g. "http://head:6830")'
    ] == caught.value.problems


# ---------------------------------------------------------------------------- group commit


def batch_at(*starts: float) -> DecodedBatch:
    return DecodedBatch(intervals=[interval("gpu1", s) for s in starts])


def grouped_writes(writer: BatchWriter, *batches: DecodedBatch) -> dict[float, str]:
    """Each batch by a caller of its own, all queued (in this order) before any writer runs.

    Returns {the batch's first interval start: "ok", or the refusal's status and reason},
    each caller's own answer.
    """
    answers: dict[float, str] = {}

    def write(batch: DecodedBatch) -> None:
        start = batch.intervals[0].period_start
        try:
            writer.write("gpu1", batch)
            answers[start] = "ok"
        except Refusal as refusal:
            answers[start] = f"{refusal.status} {refusal.reason}"

    threads: list[threading.Thread] = []
    deadline = time.monotonic() + 5
    for batch in batches:
        threads.append(threading.Thread(target=write, args=(batch,)))
        threads[-1].start()
        while writer.depth() != len(threads) and time.monotonic() < deadline:
            time.sleep(0.01)
    unanswered = [t.is_alive() for t in threads]
    writer.start()
    for thread in threads:
        thread.join(10)
    writer.stop()
    assert [True] * len(batches) == unanswered  # nobody is answered before a commit
    return answers


def test_group_commit_answers_every_caller_after_one_commit(store: RecordingStore) -> None:
    """Batches waiting in the queue are committed together; each caller gets its 200."""
    metrics = CollectorMetrics()
    writer = BatchWriter(store, metrics, pool_size=1, queue_depth=8, group_max_batches=8)
    answers = grouped_writes(writer, *map(batch_at, (0.0, 60.0, 120.0, 180.0)))
    assert ({0.0: "ok", 60.0: "ok", 120.0: "ok", 180.0: "ok"}, [[0.0, 60.0, 120.0, 180.0]]) == (
        answers, store.groups,
    )  # fmt: skip
    text = metrics.text().decode()
    assert "slurm_gpu_collector_rows_written_total 4.0" in text
    assert "slurm_gpu_collector_group_batches_count 1.0" in text
    assert "slurm_gpu_collector_group_batches_sum 4.0" in text


def test_group_is_cut_at_group_max_batches(store: RecordingStore) -> None:
    """No transaction holds more than [collector] group_max_batches batches."""
    writer = BatchWriter(store, CollectorMetrics(), pool_size=1, group_max_batches=3)
    answers = grouped_writes(writer, *map(batch_at, (0.0, 60.0, 120.0, 180.0)))
    assert (4, [[0.0, 60.0, 120.0], [180.0]]) == (
        list(answers.values()).count("ok"), store.groups,
    )  # fmt: skip


def staggered_writes(writer: BatchWriter, *batches: DecodedBatch, gap: float) -> list[str]:
    """Each batch by a caller of its own, `gap` seconds apart, the writers running.

    Returns each caller's answer ("ok" or the refusal's status and reason), in order.
    """
    answers = [""] * len(batches)

    def write(index: int) -> None:
        try:
            writer.write("gpu1", batches[index])
            answers[index] = "ok"
        except Refusal as refusal:
            answers[index] = f"{refusal.status} {refusal.reason}"

    writer.start()
    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(batches))]
    for thread in threads:
        thread.start()
        time.sleep(gap)
    for thread in threads:
        thread.join(10)
    writer.stop()
    return answers


def test_batches_arriving_within_group_wait_are_one_group(store: RecordingStore) -> None:
    """Idle writers do not split arrivals: what comes within group_wait is one transaction.

    Two writers are free when the first batch comes; without one gatherer at a time, the
    second batch would go to the other writer, a transaction of its own.
    """
    writer = BatchWriter(store, CollectorMetrics(), pool_size=2, group_wait=1.0)
    answers = staggered_writes(writer, *map(batch_at, (0.0, 60.0, 120.0)), gap=0.05)
    assert (["ok"] * 3, [[0.0, 60.0, 120.0]]) == (answers, store.groups)


def test_group_wait_zero_commits_what_is_queued_at_once(store: RecordingStore) -> None:
    """group_wait = 0: a lone batch is committed at once, not held for others."""
    writer = BatchWriter(store, CollectorMetrics(), pool_size=1, group_wait=0.0)
    answers = staggered_writes(writer, *map(batch_at, (0.0, 60.0)), gap=0.5)
    assert (["ok"] * 2, [[0.0], [60.0]]) == (answers, store.groups)


def test_one_bad_batch_does_not_refuse_the_others(
    store: RecordingStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The group fails on one batch's data, the store answers: the others are written."""
    store.bad = {120.0}
    writer = BatchWriter(store, CollectorMetrics(), pool_size=1, queue_depth=8)
    with caplog.at_level(logging.ERROR):
        answers = grouped_writes(writer, *map(batch_at, (0.0, 60.0, 120.0, 180.0)))
    assert {0.0: "ok", 60.0: "ok", 120.0: "503 store_down", 180.0: "ok"} == answers
    assert ([[0.0], [60.0], [180.0]], [0.0, 60.0, 180.0]) == (
        store.groups, [r.period_start for r in store.intervals],
    )  # fmt: skip
    assert ["the store refused the batch of gpu1: value out of range for column period_start"] == [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
    ]


def test_store_down_refuses_every_batch_of_the_group(store: RecordingStore) -> None:
    """The store is down: every caller of the group gets 503 store_down, no batch alone."""
    store.down = True
    writer = BatchWriter(store, CollectorMetrics(), pool_size=1, queue_depth=8)
    answers = grouped_writes(writer, *map(batch_at, (0.0, 60.0, 120.0)))
    assert {0.0: "503 store_down", 60.0: "503 store_down", 120.0: "503 store_down"} == answers
    assert (1, []) == (store.attempts, store.groups)


def test_bad_batch_in_a_group_leaves_nothing_of_it_in_a_real_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite: a batch breaking NOT NULL fails its group; the others land, none of it."""
    real = Store(f"sqlite:///{tmp_path / 'store.db'}", cluster="alpha")
    real.upgrade()
    broken = replace(interval("gpu1", 90.0), util_sample_count=None)  # type: ignore[arg-type]
    writer = BatchWriter(real, CollectorMetrics(), pool_size=1)
    bad = DecodedBatch(intervals=[interval("gpu1", 60.0), broken])  # neither may land
    with caplog.at_level(logging.ERROR):
        answers = grouped_writes(writer, batch_at(0.0), bad, batch_at(120.0))
    stored = [r.period_start for r in real.intervals()]
    real.dispose()
    assert ({0.0: "ok", 60.0: "503 store_down", 120.0: "ok"}, [0.0, 120.0]) == (answers, stored)
    (logged,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "NOT NULL constraint failed: gpu_intervals.util_sample_count" in logged


class _GatedSink:
    """A store whose writes wait until the test opens the gate; records the nodes written."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.nodes: list[str] = []

    def write_batches(self, batches: Sequence[tuple[str, DecodedBatch]]) -> int:
        self.gate.wait(10)
        self.nodes += [node for node, _ in batches]
        return len(batches)

    def ping(self) -> None:
        pass


def test_a_batch_finding_the_queue_full_waits_queue_wait_for_room() -> None:
    """A full queue refuses a batch only after queue_wait.

    The writer busy, the one queue slot taken: a third batch gets in once room frees
    within queue_wait (a burst over kept connections); refused 503 only past it.
    """
    sink = _GatedSink()
    writer = BatchWriter(sink, CollectorMetrics(), pool_size=1, queue_depth=1, queue_wait=5.0)
    writer.start()
    batch = DecodedBatch()
    threads = [threading.Thread(target=writer.write, args=(f"gpu{n}", batch)) for n in (1, 2)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)  # gpu1 with the writer, gpu2 in the queue
    waited: list[BaseException] = []

    def third() -> None:
        try:
            writer.write("gpu3", batch)
        except Exception as exc:
            waited.append(exc)

    late = threading.Thread(target=third)
    late.start()
    time.sleep(0.3)
    sink.gate.set()
    for thread in [*threads, late]:
        thread.join(10)
    writer.stop()
    assert [] == waited
    assert ["gpu1", "gpu2", "gpu3"] == sorted(sink.nodes)
    quick = BatchWriter(
        _GatedSink(), CollectorMetrics(), pool_size=1, queue_depth=1, queue_wait=0.1
    )
    quick.start()
    for n in (1, 2):
        threading.Thread(target=quick.write, args=(f"gpu{n}", batch), daemon=True).start()
        time.sleep(0.2)
    with pytest.raises(Refusal) as refused:
        quick.write("gpu3", batch)
    assert ("queue_full", 503) == (refused.value.reason, refused.value.status)
