"""`slurm-gpu config ...`: inspect the configuration."""

from pathlib import Path

import click

from slurm_gpu.cli.context import AppContext, pass_app
from slurm_gpu.config import locate_config, read_config, render_config


@click.group("config")
def config_group() -> None:
    """Inspect the slurm-gpu configuration."""


@config_group.command("check")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Config file to check (default: the one slurm-gpu would use).",
)
@pass_app
def check(app: AppContext, config_path: Path | None) -> None:
    """Validate the config file and print the effective configuration as TOML.

    Exits 1 with one line per problem (file: key: what is wrong) when it is invalid.
    """
    file = locate_config(config_path or app.config_path, app.env, app.default_path)
    config = read_config(file)
    click.echo(render_config(config), nl=False)
    click.echo(f"config OK: {file if file is not None else 'defaults'}", err=True)
