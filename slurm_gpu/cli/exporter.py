"""`slurm-gpu exporter`: /metrics for Prometheus from Slurm and the accounting store."""

from __future__ import annotations

import logging
import re
import signal
import threading

import click
from prometheus_client import CollectorRegistry, generate_latest

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.durations import parse_duration
from slurm_gpu.metrics.collector import ClusterCollector, serve

_ADDRESS = re.compile(r"(?:\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]*):\d{1,5}")


def _address(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    if not _ADDRESS.fullmatch(value) or not 0 < int(value.rpartition(":")[2]) < 65536:
        raise click.BadParameter(f'expected "host:port" like 127.0.0.1:19900, got {value!r}')
    return value


def _seconds(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    try:
        return float(parse_duration(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("exporter")
@click.option(
    "--listen",
    default="127.0.0.1:19900",
    show_default=True,
    metavar="HOST:PORT",
    callback=_address,
    help="Serve /metrics here.",
)
@click.option(
    "--max-age",
    default="15s",
    show_default=True,
    callback=_seconds,
    help="Answer scrapes from one read of Slurm and the store for this long.",
)
@click.option("--once", is_flag=True, help="Print the metrics once (text format) and exit.")
@pass_app
def exporter_command(app: App, listen: str, max_age: float, once: bool) -> None:
    """GPUs by state, GPU-hours and cost per user and account, controller actions.

    Run one on the head node, next to the controller; the node agents export each GPU's
    readings themselves (`slurm-gpu node run --metrics-address`).
    """
    config = app.config
    logging.basicConfig(
        level=config.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    collector = ClusterCollector(config, app.store, app.slurm, max_age=max_age)
    if once:
        registry = CollectorRegistry()
        registry.register(collector)
        click.echo(generate_latest(registry).decode(), nl=False)
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    shutdown = serve(collector, listen)
    logging.getLogger(__name__).info("serving /metrics on %s", listen)
    stop.wait()
    shutdown()
