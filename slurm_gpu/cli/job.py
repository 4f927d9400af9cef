"""`slurm-gpu job JOBID`: how one job used its GPUs, with advice."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.cli.hetjob import het_components, het_header, het_leader
from slurm_gpu.cli.sacct import echo_warnings
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.reports.jobview import (
    Thresholds,
    job_timeline,
    measurement_of,
    notes,
    render_job,
    slot_of,
    stale_nodes,
)
from slurm_gpu.reports.records import is_running, job_records
from slurm_gpu.reports.runs import with_runs
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.timeline import as_json as timeline_json
from slurm_gpu.reports.timeline import encodes
from slurm_gpu.reports.usage import JobFilter, Usage
from slurm_gpu.units import is_known


@click.command("job")
@click.argument("job_id", metavar="JOBID")
@click.option(
    "--json", "as_json", is_flag=True, help="The figures, notes and timeline series as JSON."
)
@click.option(
    "--ascii",
    "ascii_only",
    is_flag=True,
    help="Draw the timeline in ASCII (_.-:=+*#) instead of Unicode blocks.",
)
@pass_app
def job_command(app: App, job_id: str, as_json: bool, ascii_only: bool) -> None:
    """Per-node, per-GPU utilization and memory of one job, energy, cost and notes.

    On GPUs with NVML GPM (Hopper and newer) also SM activity, occupancy, tensor and
    DRAM bandwidth per GPU, effective GPU-hours, and advice from them; on older GPUs
    they are not measured (said so, never 0%).

    A timeline per GPU shows the job's life in 80 columns: utilization (and SM activity
    where measured) as time-weighted means per column, `?` where no reading came
    (unknown, never 0%). Unicode blocks where the output's encoding carries them, ASCII
    otherwise or with --ascii. --json carries the same series (null where unknown).

    Works for running jobs (figures up to the last shipped minute) and finished ones.
    You may look at your own jobs (and your coordinated accounts'; admins: all).
    """
    env = app.report_env
    usage = env.usage(None, None, JobFilter(job_ids=(job_id.strip(),)))
    records = job_records(usage)
    if not records:
        raise SlurmGpuError(f"no job {job_id} that you may see")
    parts = het_components(records) if len(records) > 1 else records
    if parts is None:  # an array's tasks, say: each is a job of its own
        ids = ", ".join(str(r["job_id_text"]) for r in records)
        raise SlurmGpuError(f"job {job_id} has several parts ({ids}); name one")
    # A heterogeneous job's components together under its leader id, as sacct -j lists them.
    # Unicode blocks only where the output carries them (a pipe or mail in ASCII: not).
    ascii_only = ascii_only or not encodes(getattr(sys.stdout, "encoding", None))
    shown = [_view(env, usage, job, as_json, ascii_only) for job in parts]
    if as_json:
        document = (
            shown[0] if len(shown) == 1 else {"het_job_id": het_leader(parts), "components": shown}
        )
        click.echo(json.dumps(document, indent=2, default=_plain))
    else:
        header = f"{het_header(parts)}\n\n" if len(parts) > 1 else ""
        click.echo(header + "\n".join(str(text) for text in shown), nl=False)
    echo_warnings(env)


def _view(
    env: ReportEnv, usage: Usage, job: dict[str, Any], as_json: bool, ascii_only: bool
) -> dict[str, Any] | str:
    """One job's (or one het component's) view: its JSON document, or its text."""
    gpus = with_runs(
        usage.gpus[usage.gpus["job_id"] == job["job_id"]].to_dict("records"),
        env.store.job_summaries(int(job["job_id"])),
    )
    # Slurm's SLUID (25.11+), recorded by the hooks: null / no line without one.
    job = {**job, "sluid": env.store.sluids([int(job["job_id"])]).get(int(job["job_id"]))}
    inventory = env.store.inventory()
    # Whether each GPU has NVML GPM (the agent's inventory): a GPU without it is
    # "not measured", never 0 % SM activity. None: a GPU the inventory does not know.
    gpm = {e.device.uuid: e.device.gpm_supported for e in inventory}
    for g in gpus:
        g["gpm_supported"] = gpm.get(str(g.get("gpu_uuid")))
        if g.get("gpu_uuid"):  # the slot and how it was measured, in words (issue 14)
            g["slot"] = slot_of(g)
            g["measurement"] = measurement_of(g)
    limits = Thresholds(idle_percent=env.config.node.active_threshold_percent)
    stale = (
        stale_nodes(
            job,
            gpus,
            env.store.activity([int(job["job_id"])]),
            env.freshness,
        )
        if is_running(job.get("state"))
        else []
    )
    life = job_timeline(env.store, job, gpus, gpm_supported=gpm)
    if as_json:
        return {
            "job": {k: _known(v) for k, v in job.items() if k != "source"},
            "gpus": [{k: _known(v) for k, v in g.items()} for g in gpus],
            "stale": stale,
            "notes": notes(job, gpus, limits),
            "timeline": timeline_json(life),
            "currency": env.config.cost.currency,
        }
    memory = {e.device.uuid: e.device.memory_total_bytes for e in inventory}
    return render_job(
        job,
        gpus,
        memory_total=memory,
        limits=limits,
        currency=env.config.cost.currency,
        stale=stale,
        timeline=life,
        ascii_only=ascii_only,
    )


def _known(value: Any) -> Any:
    """An unknown figure (NaN) as None: JSON null, never a number."""
    return value if is_known(value) else None


def _plain(value: object) -> object:
    """numpy scalars and NaN for json.dumps."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)
