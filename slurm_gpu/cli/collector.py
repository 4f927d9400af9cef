"""`slurm-gpu collector ...`: the head node's collector of the node agents' batches."""

from __future__ import annotations

import logging
import signal
import threading

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.collector.admin_comments import AdminComments
from slurm_gpu.collector.service import build_collector, collector_store, run_collector
from slurm_gpu.config.collector import check_listen


def _listen(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    problem = check_listen(value) if value is not None else None
    if problem:
        raise click.BadParameter(problem)
    return value


@click.group("collector")
def collector_group() -> None:
    """The collector: takes the node agents' batches and alone writes the store."""


@collector_group.command("run")
@click.option(
    "--listen",
    default=None,
    metavar="HOST:PORT",
    callback=_listen,
    help="Serve here (overrides [collector] listen).",
)
@pass_app
def run_cmd(app: App, listen: str | None) -> None:
    """Serve POST /v1/batch, /metrics and /healthz until SIGTERM.

    Agents with [node] ship_to = "collector" post their spool batches here; each is
    checked (MUNGE credential of root on the node it names, its own rows only) and
    written into [store] url.
    """
    config = app.config
    logging.basicConfig(
        level=config.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Its own store, not app.store: its pool holds [collector] pool_size connections.
    with collector_store(config) as store:
        collector = build_collector(config, store, app.slurm, listen=listen)
        # [node] write_admin_comment: the agents that ship here cannot write it themselves.
        comments = None
        if config.node.write_admin_comment:
            comments = AdminComments(app.runner, store, config.cluster.name)
            collector.on_summaries = comments
            comments.start()
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        run_collector(collector, stop)
        if comments is not None:
            comments.stop()
