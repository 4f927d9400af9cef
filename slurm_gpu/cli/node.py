"""`slurm-gpu node ...`: the node agent."""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.gpu.nvml import NvmlSource
from slurm_gpu.node.daemon import default_node_name, dump_spool, run_node


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
def run_cmd(app: App, node_name: str | None, once: bool, metrics_address: str | None) -> None:
    """Sample GPUs every interval, spool locally, ship to the store (or collector, or NATS)."""
    config = app.config
    if metrics_address is not None:
        node = dataclasses.replace(config.node, metrics_address=metrics_address)
        config = dataclasses.replace(config, node=node)
    logging.basicConfig(
        level=config.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # ship_to = "collector" or "nats": the agent holds no store URL, and opens no store.
    store = app.store if config.node.ship_to == "store" else None
    run_node(config, node_name or default_node_name(), store, app.runner, once=once)


@node_group.command("spool")
@click.option(
    "--node", "node_name", default=None, help="Slurm node name (default: short hostname)."
)
@pass_app
def spool_cmd(app: App, node_name: str | None) -> None:
    """List what waits in the spool for the store."""
    click.echo(dump_spool(app.config, node_name or default_node_name()))


@node_group.command("gpus")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per GPU.")
def gpus_cmd(as_json: bool) -> None:
    """Read every GPU of this node once through NVML (like `nvidia-smi`).

    Checks that the agent's NVML path works here: library, driver, every field.
    """
    source = NvmlSource()
    try:
        for device in source.devices():
            snap = source.snapshot(device, time.time() - 10)
            util = (
                sum(s.util_percent for s in snap.samples) / len(snap.samples)
                if snap.samples
                else None
            )
            if as_json:
                record = {
                    **dataclasses.asdict(device),
                    **dataclasses.asdict(snap),
                    "gpm": None if snap.gpm is None else snap.gpm._asdict(),
                    "util_mean_percent": util,
                }
                record.pop("samples")
                click.echo(json.dumps(record))
                continue
            mib = (
                "?" if snap.mem_used_bytes is None else f"{snap.mem_used_bytes // 2**20}"
            ) + f"/{(device.memory_total_bytes or 0) // 2**20}MiB"
            pids = ",".join(str(p.pid) for p in snap.processes or ()) or "-"
            click.echo(
                f"{device.nvml_index} minor={device.minor} {device.uuid} {device.name}"
                f" util={'?' if util is None else f'{util:.0f}%'} mem={mib}"
                f" power={snap.power_watts if snap.power_watts is not None else '?'}W"
                f" pids={pids}" + (f" ERROR={snap.error}" if snap.error else "")
            )
    finally:
        source.close()
