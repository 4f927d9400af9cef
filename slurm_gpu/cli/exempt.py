"""`slurm-gpu exempt`: keep a job, user or account out of the policies for a while."""

from __future__ import annotations

import os
import pwd
import time

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.durations import parse_duration
from slurm_gpu.errors import SlurmError


def _caller() -> str:
    """The name of the real uid running the command (kept with the exemption)."""
    return pwd.getpwuid(os.getuid()).pw_name


def _owner(app: App, job_id: int) -> tuple[str, str]:
    """The job's user and account, for its audit row (so its owner finds the exemption).

    From the store, else from squeue (a job that started seconds ago may not have reached
    the store yet); ("", "") when neither knows it.
    """
    known = app.store.job(job_id) or {}
    if known.get("user"):
        return str(known["user"]), str(known.get("account") or "")
    try:
        queued = [j for j in app.slurm.jobs() if job_id in (j.job_id, j.array_job_id)]
    except SlurmError:
        return "", ""
    return (queued[0].user, queued[0].account) if queued else ("", "")


@click.command("exempt")
@click.argument("job_id", required=False, type=int)
@click.option("--user", default=None, help="Exempt a user instead of a job.")
@click.option("--account", default=None, help="Exempt an account instead of a job.")
@click.option("--for", "duration", required=True, help="How long: 6h, 2d, 90m.")
@click.option("--reason", required=True, help="Why (kept in the audit trail).")
@click.option("--policy", default="", help="Only this policy (idle_gpu, max_runtime, gpu_quota).")
@pass_app
def exempt_cmd(
    app: App,
    job_id: int | None,
    user: str | None,
    account: str | None,
    duration: str,
    reason: str,
    policy: str,
) -> None:
    """Exempt a job (or --user / --account) from the policies for a while."""
    chosen = [(k, v) for k, v in (("job", job_id), ("user", user), ("account", account)) if v]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of JOBID, --user or --account")
    kind, target = chosen[0]
    try:
        seconds = parse_duration(duration)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--for") from None
    if seconds <= 0:
        raise click.BadParameter("must be longer than 0s", param_hint="--for")
    now = time.time()
    user, account = _owner(app, int(target)) if kind == "job" else ("", "")
    exemption_id = app.control.add_exemption(
        kind,
        str(target),
        now + seconds,
        reason,
        _caller(),
        now,
        policy=policy,
        user=user,
        account=account,
    )
    until = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now + seconds))
    click.echo(
        f"exemption {exemption_id}: {kind} {target} from {policy or 'every policy'} until {until}"
    )
