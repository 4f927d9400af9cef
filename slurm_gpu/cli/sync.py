"""`slurm-gpu sync`: copy job facts from sacct into the store's jobs table."""

from __future__ import annotations

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.cli.sacct import period_options, resolve_period
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.slurm.sacct import run_sacct
from slurm_gpu.store import queries


@click.command("sync")
@period_options
@pass_app
def sync_command(app: App, starttime: str | None, endtime: str | None) -> None:
    """Store sacct's submit/start/end, state, name and nodes of the period's jobs.

    Reports ask sacct themselves for the period they show ([reports] live_sacct), so this
    is for keeping the store complete on its own (run it daily, e.g. with -S now-2days,
    from a timer as root). Only admins may write the store.
    """
    env = app.report_env
    if not env.scope.all:
        raise SlurmGpuError("sync writes the store: only admins may run it")
    if env.runner is None:
        raise SlurmGpuError("sync needs Slurm")
    since, until = resolve_period(env, starttime, endtime, default_start="now-1days")
    jobs = run_sacct(env.runner, tz=env.tz, start=since, end=until, all_users=True)
    written = queries.sync_jobs(env.store, [job.store_row() for job in jobs])
    click.echo(f"{env.store.where}: {written} jobs synced from sacct")
