"""`slurm-gpu job JOBID`: how one job used its GPUs, with advice."""

from __future__ import annotations

import json

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.cli.sacct import echo_warnings
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.reports.jobview import Thresholds, notes, render_job, stale_nodes
from slurm_gpu.reports.records import is_running, job_records
from slurm_gpu.reports.runs import with_runs
from slurm_gpu.reports.status import Freshness
from slurm_gpu.reports.usage import JobFilter


@click.command("job")
@click.argument("job_id", metavar="JOBID")
@click.option("--json", "as_json", is_flag=True, help="The figures and notes as JSON.")
@pass_app
def job_command(app: App, job_id: str, as_json: bool) -> None:
    """Per-node, per-GPU utilization and memory of one job, energy, cost and notes.

    Works for running jobs (figures up to the last shipped minute) and finished ones.
    You may look at your own jobs (and your coordinated accounts'; admins: all).
    """
    env = app.report_env
    usage = env.usage(None, None, JobFilter(job_ids=(job_id.strip(),)))
    records = job_records(usage)
    if not records:
        raise SlurmGpuError(f"no job {job_id} that you may see")
    if len(records) > 1:
        ids = ", ".join(str(r["job_id_text"]) for r in records)
        raise SlurmGpuError(f"job {job_id} has several parts ({ids}); name one")
    job = records[0]
    gpus = with_runs(
        usage.gpus[usage.gpus["job_id"] == job["job_id"]].to_dict("records"),
        env.store.job_summaries(int(job["job_id"])),
    )
    limits = Thresholds(idle_percent=env.config.node.active_threshold_percent)
    stale = (
        stale_nodes(
            job,
            gpus,
            env.store.activity([int(job["job_id"])]),
            Freshness(env.now_seconds, env.stale_after, env.interval_lag),
        )
        if is_running(job.get("state"))
        else []
    )
    if as_json:
        document = {
            "job": {k: v for k, v in job.items() if k != "source"},
            "gpus": gpus,
            "stale": stale,
            "notes": notes(job, gpus, limits),
            "currency": env.config.cost.currency,
        }
        click.echo(json.dumps(document, indent=2, default=_plain))
    else:
        memory = {e.device.uuid: e.device.memory_total_bytes for e in env.store.inventory()}
        click.echo(
            render_job(
                job,
                gpus,
                memory_total=memory,
                limits=limits,
                currency=env.config.cost.currency,
                stale=stale,
            ),
            nl=False,
        )
    echo_warnings(env)


def _plain(value: object) -> object:
    """numpy scalars and NaN for json.dumps."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)
