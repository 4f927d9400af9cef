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
from slurm_gpu.cli.audit import audit_cmd
from slurm_gpu.cli.config_cmd import config_group
from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.controller import controller_group
from slurm_gpu.cli.db import db
from slurm_gpu.cli.exempt import exempt_cmd
from slurm_gpu.cli.exporter import exporter_command
from slurm_gpu.cli.job import job_command
from slurm_gpu.cli.mailprog import mailprog_command
from slurm_gpu.cli.node import node_group
from slurm_gpu.cli.policy import policy_group
from slurm_gpu.cli.report import report_command
from slurm_gpu.cli.sacct import sacct_command
from slurm_gpu.cli.status import status_command
from slurm_gpu.cli.sync import sync_command
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


@click.group(cls=SlurmGpuGroup)
@click.version_option(
    __version__, "--version", prog_name="slurm-gpu", message="%(prog)s %(version)s"
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


if __name__ == "__main__":  # python -m slurm_gpu.cli.main, where no console script is installed
    cli()
