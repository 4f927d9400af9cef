"""The `slurm-gpu` command: a click group that other command modules plug into.

Each module in slurm_gpu/cli/ defines one command or group; import it at the top and
register it at the bottom of this file with `cli.add_command(...)`. Commands get the
invocation's `App` (the lazily loaded Config and the services built from it) through
`slurm_gpu.cli.context.pass_app`; the App is closed when the command ends.
"""

from pathlib import Path
from typing import Any

import click

from slurm_gpu import __version__
from slurm_gpu.access import NotAnAdmin
from slurm_gpu.cli import config_cmd
from slurm_gpu.cli.audit import audit_cmd
from slurm_gpu.cli.collector import collector_group
from slurm_gpu.cli.config_cmd import config_group
from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.controller import controller_group
from slurm_gpu.cli.db import db
from slurm_gpu.cli.exempt import exempt_cmd
from slurm_gpu.cli.exporter import exporter_command
from slurm_gpu.cli.ingest import ingest_group
from slurm_gpu.cli.job import job_command
from slurm_gpu.cli.mailprog import mailprog_command
from slurm_gpu.cli.nats import nats_group
from slurm_gpu.cli.node import node_group
from slurm_gpu.cli.policy import policy_group
from slurm_gpu.cli.report import report_command
from slurm_gpu.cli.sacct import sacct_command
from slurm_gpu.cli.status import status_command
from slurm_gpu.cli.sync import sync_command
from slurm_gpu.config import Config
from slurm_gpu.errors import SlurmGpuError


class SlurmGpuGroup(click.Group):
    """A click group that turns expected failures into one line each on stderr, exit 1.

    A command for administrators run by someone else exits 2 (`access.NotAnAdmin`), as
    the users' command does. Anything that is not a SlurmGpuError is a bug and keeps its
    traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a SlurmGpuError becomes its lines on stderr and exit 1 (or 2)."""
        try:
            return super().invoke(ctx)
        except SlurmGpuError as exc:
            for line in str(exc).splitlines() or [type(exc).__name__]:
                click.echo(f"slurm-gpu: {line}", err=True)
            ctx.exit(2 if isinstance(exc, NotAnAdmin) else 1)


def print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """--version: slurm-gpu's version, then the Slurm release it talks to.

    `slurm-gpu X`, then `Slurm 24.11.5 (tested releases: ...)` or `Slurm not reachable:
    WHY`; a release outside the tested ones adds a warning on stderr. Exits 0 either way.
    The config is $SLURM_GPU_CONFIG's or the default (--version is read before --config);
    one that cannot be read leaves Slurm's commands on $PATH.
    """
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"slurm-gpu {__version__}")
    try:
        config: Config | None = ctx.ensure_object(AppContext).config
    except SlurmGpuError:
        config = None
    line, warning = config_cmd.slurm_release_lines(config)
    click.echo(line)
    if warning:
        click.echo(f"warning: {warning}", err=True)
    ctx.exit(0)


@click.group(cls=SlurmGpuGroup)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=print_version,
    help="Show slurm-gpu's version and the Slurm release it talks to, and exit.",
)
@click.option(
    "--config",
    "config_path",
    # readable=False: click would test with access(2), i.e. the real gid, and refuse the
    # users' setgid command a file its effective group may read. read_config() checks.
    type=click.Path(dir_okay=False, readable=False, path_type=Path),
    default=None,
    help="Config file (default: $SLURM_GPU_CONFIG, else /etc/slurm-gpu/slurm-gpu.toml).",
)
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None) -> None:
    """GPU usage accounting and policy enforcement for Slurm clusters."""
    app = ctx.ensure_object(AppContext)
    if config_path is not None:
        app.config_path = config_path


# Command modules register here, one line each.
cli.add_command(config_group)
cli.add_command(node_group)
cli.add_command(controller_group)
cli.add_command(audit_cmd)
cli.add_command(exempt_cmd)
cli.add_command(policy_group)
cli.add_command(db)
cli.add_command(sacct_command)
cli.add_command(report_command)
cli.add_command(job_command)
cli.add_command(status_command)
cli.add_command(sync_command)
cli.add_command(exporter_command)
cli.add_command(mailprog_command)
cli.add_command(collector_group)
cli.add_command(ingest_group)
cli.add_command(nats_group)


if __name__ == "__main__":  # python -m slurm_gpu.cli.main, where no console script is installed
    cli()
