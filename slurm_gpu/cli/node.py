"""`slurm-gpu node ...`: the node agent."""

from __future__ import annotations

import logging

import click

from slurm_gpu.cli.context import AppContext, pass_app


@click.group("node")
def node_group() -> None:
    """The node agent: records every GPU of this node into the accounting store."""


@node_group.command("run")
@click.option(
    "--node", "node_name", default=None, help="Slurm node name (default: short hostname)."
)
@click.option("--once", is_flag=True, help="One sampling round and one shipping pass, then exit.")
@pass_app
def run_cmd(app: AppContext, node_name: str | None, once: bool) -> None:
    """Sample GPUs every interval, spool locally, ship to the store."""
    from slurm_gpu.node.daemon import default_node_name, run_node

    config = app.config
    logging.basicConfig(
        level=config.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run_node(config, node_name or default_node_name(), once=once)


@node_group.command("spool")
@click.option(
    "--node", "node_name", default=None, help="Slurm node name (default: short hostname)."
)
@pass_app
def spool_cmd(app: AppContext, node_name: str | None) -> None:
    """List what waits in the spool for the store."""
    from slurm_gpu.node.daemon import default_node_name, dump_spool

    click.echo(dump_spool(app.config, node_name or default_node_name()))
