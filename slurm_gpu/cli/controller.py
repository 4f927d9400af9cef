"""`slurm-gpu controller run`: the policy controller on the head node."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.config import Config
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.policy.controller import Controller, Flusher
from slurm_gpu.policy.notify import Notifier


@click.group("controller")
def controller_group() -> None:
    """The policy controller (head node): idle GPUs, runtimes, quotas, hot nodes."""


@controller_group.command("run")
@click.option("--once", is_flag=True, help="One cycle, print its verdicts, exit.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Decide and audit, change nothing in Slurm (the default until [controller] enforce).",
)
@pass_app
def run_cmd(app: App, once: bool, dry_run: bool) -> None:
    """Read Slurm and the store, evaluate the policies, audit every verdict, then act."""
    config = app.config
    logging.basicConfig(
        level=config.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    controller = Controller(
        config,
        app.slurm,
        app.store,
        Notifier(config.notify, config.cluster.name or "cluster"),
        quota_meter=app.quota_meter,
        flusher=nats_flusher(config) if config.controller.flush_over_nats else None,
    )
    dry = dry_run or not config.controller.enforce
    if once:
        report = controller.cycle(dry)
        controller.release_lease()
        if report.skipped:
            raise click.ClickException(f"cycle skipped: {report.skipped}")
        mode = "dry-run" if dry else "enforcing"
        if report.store_down_since is not None:
            click.echo(
                f"store unavailable: {report.spooled} decision(s) spooled to "
                f"{controller.spool.path}",
                err=True,
            )
        for verdict in report.verdicts:
            click.echo(
                f"{mode} {verdict.policy} {verdict.action.value} {verdict.target}: {verdict.reason}"
            )
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    controller.run(dry, stop.is_set, stop.wait)


def nats_flusher(config: Config) -> Flusher:
    """[controller] flush_over_nats: asks nodes over [nats], waiting commit_wait at most."""
    # Here, not at the top: nats-py is the [nats] extra.
    from slurm_gpu.jetstream.bus import Bus
    from slurm_gpu.jetstream.flush import ask_to_flush

    bus = Bus(config.nats, f"slurm-gpu-controller {config.cluster.name}")
    wait = float(config.nats.commit_wait)

    def flush(nodes: Sequence[str]) -> dict[str, float | None]:
        try:
            return ask_to_flush(bus, config.nats, config.cluster.name, nodes, wait)
        except SlurmGpuError as exc:  # NATS down: judged on what the store has, as before
            logging.getLogger(__name__).warning("could not ask nodes to ship: %s", exc)
            return dict.fromkeys(nodes)

    return flush
