"""`slurm-gpu controller run`, `audit`, `exempt`, `policy backtest`: the admin's side."""

from __future__ import annotations

import logging
import os
import pwd
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import click

from slurm_gpu.cli.context import AppContext, pass_app
from slurm_gpu.durations import parse_duration


def _now_local() -> Any:
    from slurm_gpu.slurm.timespec import now_local

    return now_local()


def _time(text: str | None, option: str) -> float | None:
    """-S/-E as sacct takes them; a bad time is a usage error (exit 2) naming the option."""
    if text is None:
        return None
    from slurm_gpu.slurm.timespec import parse_time

    try:
        return parse_time(text, _now_local(), argument=option)
    except ValueError as exc:  # the message starts with the option's name
        raise click.BadParameter(str(exc)) from None


def _store(app: AppContext) -> Any:
    from slurm_gpu.store import Store

    config = app.config
    return Store(config.store.url, cluster=config.cluster.name, echo=config.store.echo_sql)


def _caller() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


@click.group("controller")
def controller_group() -> None:
    """The policy controller (head node): idle GPUs, runtimes, quotas, hot nodes."""


@controller_group.command("run")
@click.option("--once", is_flag=True, help="One cycle, print its verdicts, exit.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Decide and audit, change nothing in Slurm (the default until [controller] enforce).",
)
@pass_app
def run_cmd(app: AppContext, once: bool, dry_run: bool) -> None:
    """Read Slurm and the store, evaluate the policies, audit every verdict, then act."""
    from slurm_gpu.policy.controller import Controller
    from slurm_gpu.policy.notify import Notifier
    from slurm_gpu.slurm.client import CliSlurmClient
    from slurm_gpu.slurm.runner import SlurmCommands

    config = app.config
    logging.basicConfig(
        level=config.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    runner = SlurmCommands(
        bin_dir=config.slurm.bin_dir,
        timeout=float(config.slurm.command_timeout),
        conf=config.slurm.conf,
    )
    controller = Controller(
        config,
        CliSlurmClient(runner),
        _store(app),
        Notifier(config.notify, config.cluster.name or "cluster"),
    )
    dry = dry_run or not config.controller.enforce
    if once:
        report = controller.cycle(dry)
        controller.release()
        if report.skipped:
            raise click.ClickException(f"cycle skipped: {report.skipped}")
        mode = "dry-run" if dry else "enforcing"
        for verdict in report.verdicts:
            click.echo(
                f"{mode} {verdict.policy} {verdict.action.value} {verdict.target}: {verdict.reason}"
            )
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    controller.run(dry, stop.is_set, stop.wait)


@click.command("audit")
@click.option("-S", "--starttime", "start", default=None, help="From (sacct time formats).")
@click.option("-E", "--endtime", "end", default=None, help="Until (sacct time formats).")
@click.option("-u", "--user", "users", default="", help="Comma list of users.")
@click.option("-A", "--account", "accounts", default="", help="Comma list of accounts.")
@click.option("-j", "--jobs", "jobs", default="", help="Comma list of job ids.")
@click.option("--policy", "policies", default="", help="Comma list of policies.")
@click.option("--action", "actions", default="", help="Comma list of actions (warn,cancel,...).")
@click.option("-P", "--parsable2", "parsable2", is_flag=True, help="'|' separated, like sacct -P.")
@click.option("-n", "--noheader", is_flag=True, help="No header line.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list.")
@pass_app
def audit_cmd(
    app: AppContext,
    start: str | None,
    end: str | None,
    users: str,
    accounts: str,
    jobs: str,
    policies: str,
    actions: str,
    parsable2: bool,
    noheader: bool,
    as_json: bool,
) -> None:
    """Every controller decision, dry-run or real, with what came of it."""
    from slurm_gpu.reports.render import Column, Field, OutputMode, fmt_text, render
    from slurm_gpu.slurm.timespec import format_sacct_time
    from slurm_gpu.store.control import AuditEntry, ControlStore

    def _cell(get: Callable[[AuditEntry], str]) -> Callable[[Mapping[str, Any]], str]:
        return lambda record: get(record["entry"])

    def split(text: str) -> list[str]:
        return [x for x in text.split(",") if x]

    try:
        job_ids = [int(j) for j in split(jobs)]
    except ValueError:
        raise click.BadParameter(f"job ids must be numbers: {jobs!r}", param_hint="-j") from None
    since, until = _time(start, "-S/--starttime"), _time(end, "-E/--endtime")
    entries = ControlStore(_store(app)).audit_entries(
        since=since,
        until=until,
        users=split(users),
        accounts=split(accounts),
        job_ids=job_ids,
        policies=split(policies),
        actions=split(actions),
    )
    getters: list[tuple[str, int, Callable[[AuditEntry], str]]] = [
        ("Time", 19, lambda e: format_sacct_time(e.time)),
        ("Mode", 8, lambda e: "dry-run" if e.dry_run else "enforce"),
        ("Policy", 12, lambda e: e.policy),
        ("Action", 10, lambda e: e.action),
        ("Target", -16, lambda e: e.target),
        ("User", 9, lambda e: e.user),
        ("Account", 10, lambda e: e.account),
        ("Outcome", 10, lambda e: e.outcome),
        ("Reason", -60, lambda e: e.reason),
    ]
    columns = [
        Column(Field(name, width, name, _cell(get), fmt_text), width)
        for name, width, get in getters
    ]
    mode: OutputMode = "json" if as_json else "parsable2" if parsable2 else "table"
    click.echo(
        render(columns, [{"entry": e} for e in entries], mode, header=not noheader), nl=False
    )


@click.command("exempt")
@click.argument("job_id", required=False, type=int)
@click.option("--user", default=None, help="Exempt a user instead of a job.")
@click.option("--account", default=None, help="Exempt an account instead of a job.")
@click.option("--for", "duration", required=True, help="How long: 6h, 2d, 90m.")
@click.option("--reason", required=True, help="Why (kept in the audit trail).")
@click.option("--policy", default="", help="Only this policy (idle_gpu, max_runtime, gpu_quota).")
@pass_app
def exempt_cmd(
    app: AppContext,
    job_id: int | None,
    user: str | None,
    account: str | None,
    duration: str,
    reason: str,
    policy: str,
) -> None:
    """Exempt a job (or --user / --account) from the policies for a while."""
    from slurm_gpu.store.control import ControlStore

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
    control = ControlStore(_store(app))
    exemption_id = control.add_exemption(
        kind, str(target), now + seconds, reason, _caller(), now, policy=policy
    )
    until = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now + seconds))
    click.echo(
        f"exemption {exemption_id}: {kind} {target} from {policy or 'every policy'} until {until}"
    )


@click.group("policy")
def policy_group() -> None:
    """Policies: try them on history before enforcing."""


@policy_group.command("backtest")
@click.option("-S", "--starttime", "start", required=True, help="From (sacct time formats).")
@click.option("-E", "--endtime", "end", default="now", show_default=True, help="Until.")
@click.option("--step", default=None, help="Replay step (default: [controller] interval).")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@pass_app
def backtest_cmd(app: AppContext, start: str, end: str, step: str | None, as_json: bool) -> None:
    """What idle_gpu and max_runtime would have done over the stored history."""
    import json

    from slurm_gpu.policy.backtest import backtest

    since = _time(start, "-S/--starttime")
    until = _time(end, "-E/--endtime")
    assert since is not None and until is not None
    try:
        step_seconds = parse_duration(step) if step else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--step") from None
    result = backtest(_store(app), app.config, since, until, step_seconds)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "since": result.since,
                    "until": result.until,
                    "jobs": result.jobs,
                    "policies": {
                        name: {
                            "warned": sorted(o.warned),
                            "cancelled": sorted(o.cancelled),
                            "gpu_hours_returned": round(o.gpu_hours_returned, 4),
                        }
                        for name, o in result.policies.items()
                    },
                },
                indent=2,
            )
        )
        return
    click.echo(f"{result.jobs} GPU jobs replayed every {result.step:g}s")
    for name, outcome in result.policies.items():
        click.echo(
            f"{name}: warned {len(outcome.warned)} {sorted(outcome.warned)}; "
            f"cancelled {len(outcome.cancelled)} {sorted(outcome.cancelled)}; "
            f"GPU-hours returned {outcome.gpu_hours_returned:.2f}"
        )
