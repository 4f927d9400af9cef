"""`slurm-gpu ingest run`: a worker from the NATS JetStream stream to the store (issue 26)."""

from __future__ import annotations

import logging
import signal
import threading

import click
from prometheus_client import start_http_server

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.collector.admin_comments import AdminComments
from slurm_gpu.config.collector import check_listen
from slurm_gpu.store import Store


def _listen(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    problem = check_listen(value) if value is not None else None
    if problem:
        raise click.BadParameter(problem)
    return value


@click.group("ingest")
def ingest_group() -> None:
    """Ingest workers: the node agents' batches from NATS JetStream into the store."""


@ingest_group.command("run")
@click.option(
    "--metrics-listen",
    default=None,
    metavar="HOST:PORT",
    callback=_listen,
    help="Serve the worker's Prometheus metrics here (slurm_gpu_ingest_*).",
)
@pass_app
def run_cmd(app: App, metrics_listen: str | None) -> None:
    """Pull batches from the stream of [nats] and write them into [store] url until SIGTERM.

    Agents with [node] ship_to = "nats" publish their spool batches to NATS JetStream;
    any number of these workers, on any hosts, share them (one durable consumer per
    cluster). Each batch is checked (its subject's node, that node's rows only), written
    with the others of its pull in one transaction, recorded as committed for its node
    (the agent then deletes it) and acked. The worker holds one store connection.
    """
    # Here, not at the top: nats-py is the [nats] extra, and every command loads this module.
    from slurm_gpu.jetstream.bus import Bus
    from slurm_gpu.jetstream.ingest import IngestWorker

    config = app.config
    logging.basicConfig(
        level=config.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    cluster = config.cluster.name
    # One connection (and one for the AdminComment writer): a worker writes one pull at a
    # time, so the store sees as many connections as workers, whatever the number of nodes.
    connections = 2 if config.node.write_admin_comment else 1
    store = Store(
        config.store.url, cluster=cluster, echo=config.store.echo_sql, pool_size=connections
    )
    bus = Bus(config.nats, f"slurm-gpu-ingest {cluster}")
    worker = IngestWorker(config.nats, cluster, store, bus)
    comments = None
    if config.node.write_admin_comment:  # the agents that ship over NATS read no store
        comments = AdminComments(app.runner, store, cluster)
        worker.on_summaries = comments
        comments.start()
    if metrics_listen is not None:
        host, _, port = metrics_listen.rpartition(":")
        start_http_server(int(port), addr=host.strip("[]"), registry=worker.metrics.registry)
    logging.getLogger(__name__).info(
        "ingest worker of cluster %s: %s stream %s", cluster, config.nats.url, config.nats.stream
    )
    try:
        worker.run(stop)
    finally:
        if comments is not None:
            comments.stop()
        bus.close()
        store.dispose()
