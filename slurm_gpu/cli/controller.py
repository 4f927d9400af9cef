"""`slurm-gpu controller run`: the policy controller on the head node."""

from __future__ import annotations

import logging
import signal
import threading

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.policy.controller import Controller
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
