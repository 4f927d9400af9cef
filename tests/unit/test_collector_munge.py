"""The collector against this machine's real munged (libmunge), and end to end over SQLite.

The tests that take the `munge` fixture (tests/conftest.py) carry the `slurm` marker: the
test bed brings munged up on this host, so `-m "not slurm and not db"` passes without it.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest

from slurm_gpu.collector.credential import CredentialCheck, NodeAddresses
from slurm_gpu.collector.server import Collector
from slurm_gpu.collector.service import build_collector
from slurm_gpu.collector.wire import Refusal, WireRow, digest, encode_batch
from slurm_gpu.config import Config
from slurm_gpu.config.collector import CollectorSettings
from slurm_gpu.models import GpuInterval, JobEvent, JobEventKind
from slurm_gpu.munge import Libmunge, MungeCredential
from slurm_gpu.node.collector_sink import CollectorSink
from slurm_gpu.node.outbox import fields_of
from slurm_gpu.node.shipper import RetryLater, Shipper
from slurm_gpu.node.spool import Spool
from slurm_gpu.store import Store


def this_host() -> NodeAddresses:
    # munged reports the address it resolved its own host name to (ENCODE_HOST).
    return NodeAddresses({"gpu1": [socket.gethostname(), "127.0.0.1"]})


@pytest.mark.slurm  # munged
def test_real_root_credential_is_accepted_and_its_replay_refused(munge: Libmunge) -> None:
    """munge as root over the body's digest passes; the same credential again is replayed."""
    body = encode_batch("gpu1", "gpu1:1.0:1", 1.0, [WireRow("interval", "k", "{}")])
    credential = munge.encode(digest(body).encode())
    check = CredentialCheck(munge, this_host())
    accepted = check.check_credential(credential, body, "gpu1")
    assert (0, digest(body).encode()) == (accepted.uid, accepted.payload)
    with pytest.raises(Refusal) as caught:
        check.check_credential(credential, body, "gpu1")
    assert (403, "replayed") == (caught.value.status, caught.value.reason)
    assert "credential replayed: munge_decode: Replayed credential (17)" == str(caught.value)


@pytest.mark.slurm  # munged
def test_real_credential_decodes_like_unmunge(munge: Libmunge) -> None:
    """libmunge gives what `unmunge` prints: UID 0, the payload, the host, a TTL."""
    decoded = munge.decode(munge.encode(b"x"))
    assert isinstance(decoded, MungeCredential)
    assert (0, 0, b"x") == (decoded.uid, decoded.gid, decoded.payload)
    assert decoded.address in this_host()("gpu1")
    assert decoded.ttl > 0


@pytest.mark.slurm  # munged
def test_garbage_credential_is_a_bad_credential(munge: Libmunge) -> None:
    """A string that is no credential: 403 bad_credential with munged's reason."""
    check = CredentialCheck(munge, this_host())
    with pytest.raises(Refusal) as caught:
        check.check_credential("MUNGE:not-a-credential:", b"{}", "gpu1")
    assert (403, "bad_credential") == (caught.value.status, caught.value.reason)
    assert "Invalid credential" in str(caught.value)


# ---------------------------------------------------------------------------- end to end


def start_collector(store: Store, listen: str = "127.0.0.1:0") -> Collector:
    nodes = {"gpu1": [socket.gethostname(), "127.0.0.1"]}
    config = Config(collector=CollectorSettings(nodes=nodes, pool_size=2))
    collector = build_collector(config, store, None, listen=listen)
    collector.start()
    return collector


def interval(start: float) -> GpuInterval:
    return GpuInterval(
        "gpu1", "GPU-1", start, start + 60, 7, 50.0, 60.0, 40.0, 60, 60.0, 60.0,
        None, None, None, None, None, None,
    )  # fmt: skip


def queue_intervals(spool: Spool, *starts: float) -> None:
    with spool.transaction() as db:
        for start in starts:
            Spool.queue(db, "interval", f"gpu1:GPU-1:{start!r}", fields_of(interval(start)))


@pytest.mark.slurm  # munged
def test_spool_shipped_through_the_collector_lands_once(
    tmp_path: Path, store: Store, munge: Libmunge
) -> None:
    """A Shipper with a CollectorSink lands every row once; the same batch again adds none."""
    event = JobEvent("gpu1", 7, JobEventKind.STARTED, 0.0, user="alice", account="phys")
    spool = Spool(tmp_path / "spool.db")
    with spool.transaction() as db:
        Spool.queue(db, "event", event.key, fields_of(event))
    queue_intervals(spool, 0.0, 60.0, 120.0)
    rows = spool.pending(100)
    collector = start_collector(store)
    try:
        sink = CollectorSink(f"http://{collector.address}", munge.encode)
        assert 4 == Shipper(spool, sink, "gpu1", batch_size=2).drain()
        sink.ship_batch("gpu1", rows)  # shipped again, as after a crash before the delete
    finally:
        collector.stop()
        backlog = spool.backlog()
        spool.close()
    assert (0, [0.0, 60.0, 120.0]) == (
        backlog, [r.period_start for r in store.intervals(node="gpu1")],
    )  # fmt: skip
    job = store.job(7)
    assert job is not None
    assert ("alice", "phys") == (job["user"], job["account"])
    # two batches of two rows, and the one shipped again
    assert 3.0 == collector.metrics.registry.get_sample_value("slurm_gpu_collector_batches_total")


@pytest.mark.slurm  # munged
def test_rows_wait_while_the_collector_is_down_and_ship_when_it_is_back(
    tmp_path: Path, store: Store, munge: Libmunge
) -> None:
    """Collector stopped: the agent keeps its rows; restarted: they land, once."""
    collector = start_collector(store)
    address = collector.address
    collector.stop()
    spool = Spool(tmp_path / "spool.db")
    queue_intervals(spool, 0.0, 60.0)
    shipper = Shipper(spool, CollectorSink(f"http://{address}", munge.encode), "gpu1")
    try:
        with pytest.raises(RetryLater, match="unreachable"):
            shipper.ship_once()
        kept = spool.backlog()
        collector = start_collector(store, listen=address)
        try:
            shipped = shipper.drain()
        finally:
            collector.stop()
        backlog = spool.backlog()
    finally:
        spool.close()
    assert (2, 2, 0) == (kept, shipped, backlog)
    assert [0.0, 60.0] == [r.period_start for r in store.intervals(node="gpu1")]


def test_healthz_and_metrics_answer(store: Store) -> None:
    """GET /healthz is 200 while the store answers; /metrics lists every refusal reason."""
    collector = start_collector(store)
    try:
        with urllib.request.urlopen(f"http://{collector.address}/healthz", timeout=10) as r:
            health = (r.status, json.loads(r.read()))
        with urllib.request.urlopen(f"http://{collector.address}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    finally:
        collector.stop()
    assert (200, {"status": "ok", "queue_depth": 0}) == health
    assert 'slurm_gpu_collector_refused_total{reason="replayed"} 0.0' in metrics
