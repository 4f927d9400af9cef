"""`slurm-gpu nats ...`: the NATS identities of the nodes and ingest workers (issue 26).

The keys are made and the server's `authorization` block written on the head node; each
node then gets its own seed (docs/design/jetstream.md, "Node identity").
"""

from __future__ import annotations

from pathlib import Path

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app

_DIR = click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The keys directory: nodes/<node>.nk|.pub and workers/<name>.nk|.pub.",
)


@click.group("nats")
def nats_group() -> None:
    """NATS nkeys: one identity per node and per ingest worker, and the server's config."""


@nats_group.command("keygen")
@click.argument("names", nargs=-1, required=True)
@_DIR
@click.option(
    "--worker",
    is_flag=True,
    help="Ingest workers' keys (every subject), in workers/; default: nodes' keys, in nodes/.",
)
@click.option(
    "--force", is_flag=True, help="Replace a key that exists (its old seed stops working)."
)
def keygen_cmd(names: tuple[str, ...], directory: Path, worker: bool, force: bool) -> None:
    """Make a user nkey pair per NAME: the seed NAME.nk (mode 0600) and NAME.pub.

    A node's NAME is its Slurm node name. Copy nodes/NAME.nk to that node as a root-only
    file and name it in its [nats] credentials; then run `slurm-gpu nats server-config`
    and reload nats-server. Prints each public key.
    """
    # Here, not at the top: nkeys is the [nats] extra, and every command loads this module.
    from slurm_gpu.jetstream.identity import keygen

    for name in names:
        made = keygen(directory, name, worker=worker, force=force)
        click.echo(f"{made.seed}: {made.public_key}")


@nats_group.command("server-config")
@_DIR
@click.option(
    "--cluster",
    default=None,
    help="The cluster whose batch subjects the nodes get (default: [cluster] name).",
)
@pass_app
def server_config_cmd(app: App, directory: Path, cluster: str | None) -> None:
    """Print nats-server's authorization block for the public keys in --dir.

    Workers get every subject; each node its own batch subject of [nats] subject_prefix,
    reading its committed batch in [nats] committed_bucket, the controller's requests on
    its own flush subject (answering them), and its own replies. Include the output in
    nats-server.conf.
    """
    from slurm_gpu.jetstream.identity import server_config

    name = cluster if cluster is not None else app.config.cluster.name
    if not name:
        raise click.UsageError("no cluster name: give --cluster or set [cluster] name")
    click.echo(server_config(directory, app.config.nats, name), nl=False)
