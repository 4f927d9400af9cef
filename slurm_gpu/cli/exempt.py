"""`slurm-gpu exempt`: keep a job, user or account out of the policies for a while."""

from __future__ import annotations

import os
import pwd
import time

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.durations import parse_duration


def _caller() -> str:
    """The name of the real uid running the command (kept with the exemption)."""
    return pwd.getpwuid(os.getuid()).pw_name


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
    # The job's owner, as the store knows it, goes into the audit row, so that the
    # exemption shows among the job's rows.
    known = app.store.job(int(target)) if kind == "job" else None
    exemption_id = app.control.add_exemption(
        kind,
        str(target),
        now + seconds,
        reason,
        _caller(),
        now,
        policy=policy,
        user=str((known or {}).get("user") or ""),
        account=str((known or {}).get("account") or ""),
    )
    until = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now + seconds))
    click.echo(
        f"exemption {exemption_id}: {kind} {target} from {policy or 'every policy'} until {until}"
    )
