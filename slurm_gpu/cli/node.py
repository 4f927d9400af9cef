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
@click.option(
    "--metrics-address",
    default=None,
    metavar="HOST:PORT",
    help="Serve /metrics here (overrides [node] metrics_address; several agents per host).",
)
@pass_app
def run_cmd(
    app: AppContext, node_name: str | None, once: bool, metrics_address: str | None
) -> None:
    """Sample GPUs every interval, spool locally, ship to the store."""
    import dataclasses

    from slurm_gpu.node.daemon import default_node_name, run_node

    config = app.config
    if metrics_address is not None:
        node = dataclasses.replace(config.node, metrics_address=metrics_address)
        config = dataclasses.replace(config, node=node)
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
