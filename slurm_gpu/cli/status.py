"""`slurm-gpu status`: the cluster's GPUs now (Slurm's allocations and the agents' readings)."""

from __future__ import annotations

import dataclasses
import json

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.cli.sacct import echo_warnings
from slurm_gpu.durations import format_duration
from slurm_gpu.errors import SlurmError
from slurm_gpu.reports.status import build_status, render_status
from slurm_gpu.slurm.scontrol import GpuNode
from slurm_gpu.slurm.squeue import JobOwner
from slurm_gpu.store import queries


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="The figures as JSON.")
@pass_app
def status_command(app: App, as_json: bool) -> None:
    """GPUs total, allocated, idle while allocated, free; utilization per node.

    GPU use outside any allocation (admins only). Non-admins see utilization of their own
    jobs.
    """
    env = app.report_env
    nodes: list[GpuNode] = []
    owners: dict[int, JobOwner] = {}
    try:
        nodes = app.slurm.gpu_nodes()
        owners = app.slurm.running_owners()
    except SlurmError as exc:
        env.warnings.append(f"Slurm unreachable, showing the store's view: {exc}")
    window = float(env.config.reports.status_window)
    intervals = queries.recent_intervals(env.store, env.now_seconds - window)
    inventory: dict[str, list[str]] = {}
    for entry in env.store.inventory():
        inventory.setdefault(entry.node, []).append(entry.device.uuid)
    status = build_status(
        nodes,
        intervals,
        inventory,
        owners,
        env.scope,
        idle_percent=env.config.node.active_threshold_percent,
        freshness=env.freshness,
        activity=env.store.activity(),
    )
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(status), indent=2))
    else:
        click.echo(render_status(status, env.scope.describe(), format_duration(window)), nl=False)
    echo_warnings(env)
