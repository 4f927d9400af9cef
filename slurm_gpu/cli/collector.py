"""`slurm-gpu collector ...`: the head node's collector of the node agents' batches."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from pathlib import Path

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import AppContext, pass_app
from slurm_gpu.collector.admin_comments import AdminComments
from slurm_gpu.collector.processes import SummaryNotices, die_with_parent, pool_shares, run_workers
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
    written into [store] url. With [collector] processes > 1, that many worker processes
    serve the one port (collector/processes.py).
    """
    config = app.config
    logging.basicConfig(
        level=config.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    settings = config.collector
    # [node] write_admin_comment: the agents that ship here cannot write it themselves.
    comment = config.node.write_admin_comment
    if settings.processes > 1:
        try:
            shares = pool_shares(settings.pool_size, settings.processes, 1 if comment else 0)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        status = 0
        with contextlib.ExitStack() as stack:
            comments = None
            if comment:  # one writer of every job's token: its own store connection
                store = stack.enter_context(collector_store(config, pool_size=1))
                comments = AdminComments(app.runner, store, config.cluster.name)
                comments.start()
                stack.callback(comments.stop)
            status = run_workers(
                listen or settings.listen, shares, click_config_path(), stop, comments
            )
        raise SystemExit(status)
    # Its own store, not app.store: its pool holds [collector] pool_size connections.
    with collector_store(config) as store:
        collector = build_collector(config, store, app.slurm, listen=listen)
        comments = None
        if comment:
            comments = AdminComments(app.runner, store, config.cluster.name)
            collector.on_summaries = comments
            comments.start()
        run_collector(collector, stop)
        if comments is not None:
            comments.stop()


@collector_group.command("worker", hidden=True)
@click.option("--listening-fd", type=int, required=True)
@click.option("--pool-size", type=click.IntRange(min=1), required=True)
@click.option("--parent", type=int, required=True)
@click.option("--summaries-fd", type=int, default=None)
@pass_app
def worker_cmd(
    app: App, listening_fd: int, pool_size: int, parent: int, summaries_fd: int | None
) -> None:
    """One of the processes `collector run` starts: serves the socket it was handed."""
    config = app.config
    logging.basicConfig(
        level=config.logging.level,
        format=f"%(asctime)s %(levelname)s %(name)s[worker {os.getpid()}]: %(message)s",
    )
    die_with_parent(parent)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    listening = socket.socket(fileno=listening_fd)
    with collector_store(config, pool_size=pool_size) as store:
        collector = build_collector(
            config, store, app.slurm, listening=listening, pool_size=pool_size
        )
        if summaries_fd is not None:
            collector.on_summaries = SummaryNotices(summaries_fd)
        threading.Thread(
            target=collector.metrics.refresh, args=(stop,), name="collector-gauges", daemon=True
        ).start()
        run_collector(collector, stop)


def click_config_path() -> Path | None:
    """The --config of this command line (None: $SLURM_GPU_CONFIG or the default)."""
    ctx = click.get_current_context()
    context = ctx.find_object(AppContext)
    return context.config_path if context is not None else None
