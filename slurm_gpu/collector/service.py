"""`slurm-gpu collector run`: the collector built from the configuration, run until a signal."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping

from slurm_gpu.collector.credential import CredentialCheck, MungeDecoder, NodeAddresses
from slurm_gpu.collector.metrics import CollectorMetrics
from slurm_gpu.collector.server import Collector
from slurm_gpu.collector.writer import BatchWriter
from slurm_gpu.config import Config
from slurm_gpu.munge import Libmunge
from slurm_gpu.slurm.client import SlurmClient
from slurm_gpu.store import Store

log = logging.getLogger(__name__)


def slurm_node_addrs(slurm: SlurmClient) -> Callable[[], Mapping[str, str]]:
    """{node: NodeAddr} from `scontrol -o show node` (a node without one: its name)."""

    def addrs() -> Mapping[str, str]:
        return {n.name: n.addr or n.name for n in slurm.gpu_nodes()}

    return addrs


def collector_store(config: Config, pool_size: int | None = None) -> Store:
    """The store of [store] url, its pool [collector] pool_size connections, no more.

    One writer thread per connection (`BatchWriter`): the store sees at most pool_size
    connections from the collector, whatever the number of nodes. `pool_size`: a
    process's share of it (collector/processes.py).
    """
    return Store(
        config.store.url,
        cluster=config.cluster.name,
        echo=config.store.echo_sql,
        pool_size=pool_size or config.collector.pool_size,
    )


def build_collector(
    config: Config,
    store: Store,
    slurm: SlurmClient | None,
    decoder: MungeDecoder | None = None,
    listen: str | None = None,
    listening: socket.socket | None = None,
    pool_size: int | None = None,
) -> Collector:
    """A collector over `store` as [collector] says (not started).

    Args:
        config: [collector] settings.
        store: the accounting store, which the collector alone writes
            (`collector_store`: its pool holds [collector] pool_size connections).
        slurm: asked for the NodeAddr of nodes [collector] nodes does not list (None:
            only the listed nodes may ship).
        decoder: MUNGE (default: libmunge on [collector] munge_socket).
        listen: overrides [collector] listen.
        listening: a socket bound to it already (a worker of collector/processes.py).
        pool_size: this process's writers (default [collector] pool_size).
    """
    settings = config.collector
    writers = pool_size or settings.pool_size
    metrics = CollectorMetrics()
    addresses = NodeAddresses(
        settings.nodes, slurm_node_addrs(slurm) if slurm is not None else None
    )
    check = CredentialCheck(
        decoder or Libmunge(settings.munge_socket),
        addresses,
        ttl=float(settings.credential_ttl),
    )
    writer = BatchWriter(
        store,
        metrics,
        pool_size=writers,
        group_max_batches=settings.group_max_batches,
        group_wait=float(settings.group_wait),
        queue_depth=settings.queue_depth,
        retry_after=float(settings.retry_after),
    )
    return Collector(
        check,
        writer,
        metrics,
        listen=listen or settings.listen,
        max_batch_bytes=settings.max_batch_bytes,
        health=store.ping,
        # every writer busy and every queue slot taken, plus as many to answer 503 at once
        workers=writers + 2 * settings.queue_depth,
        listening=listening,
    )


def run_collector(collector: Collector, stop: threading.Event) -> None:
    """Serves until `stop` is set, then finishes the batches under way."""
    collector.start()
    log.info("collector serving on %s", collector.address)
    stop.wait()
    log.info("collector stopping")
    collector.stop()
