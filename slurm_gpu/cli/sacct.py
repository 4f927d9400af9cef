"""`slurm-gpu sacct`: sacct's job list with the GPU figures, and sacct's own flags."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.reports.fields import DEFAULT_FORMAT, GPU_FORMAT, HELD_COST_FORMAT, job_fields
from slurm_gpu.reports.records import gpu_records, job_records
from slurm_gpu.reports.render import (
    OutputMode,
    help_format,
    json_record,
    parse_format,
    render,
)
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.usage import JobFilter
from slurm_gpu.slurm.sacct import state_name
from slurm_gpu.slurm.timespec import parse_time

F = Callable[..., Any]


def _split(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def output_options(function: F) -> F:
    """-P/--parsable2, -p/--parsable, -n/--noheader, --json, --csv."""
    for decorator in reversed(
        [
            click.option("-P", "--parsable2", is_flag=True, help="'|' between fields, none after."),
            click.option("-p", "--parsable", is_flag=True, help="'|' after every field."),
            click.option("-n", "--noheader", is_flag=True, help="No header row."),
            click.option("--json", "as_json", is_flag=True, help="JSON list of objects."),
            click.option("--csv", "as_csv", is_flag=True, help="CSV with a header row."),
        ]
    ):
        function = decorator(function)
    return function


def output_mode(parsable2: bool, parsable: bool, as_json: bool, as_csv: bool) -> OutputMode:
    """The chosen output mode; two at once is a usage error."""
    chosen = [
        m
        for m, on in (
            ("parsable2", parsable2),
            ("parsable", parsable),
            ("json", as_json),
            ("csv", as_csv),
        )
        if on
    ]
    if len(chosen) > 1:
        raise click.UsageError("choose one of -P, -p, --json, --csv")
    return chosen[0] if chosen else "table"  # type: ignore[return-value]


def period_options(function: F) -> F:
    """-S/--starttime and -E/--endtime in sacct's time formats."""
    function = click.option(
        "-E", "--endtime", default=None, metavar="TIME", help="End of the period (default: now)."
    )(function)
    return click.option(
        "-S",
        "--starttime",
        default=None,
        metavar="TIME",
        help="Start of the period, as sacct takes it: now-7days, 2026-11-01T00:00, "
        "11/01, midnight, noon, fika, teatime, 14:30... (default: midnight today).",
    )(function)


def resolve_period(
    env: ReportEnv, starttime: str | None, endtime: str | None, default_start: str = "midnight"
) -> tuple[float, float]:
    """(-S, -E) as POSIX seconds; a bad time is a usage error naming the option."""
    try:
        since = parse_time(starttime or default_start, env.now, argument="-S/--starttime")
        until = (
            parse_time(endtime, env.now, argument="-E/--endtime") if endtime else env.now_seconds
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if until < since:
        raise click.UsageError("-E/--endtime is before -S/--starttime")
    return since, until


def echo_warnings(env: ReportEnv) -> None:
    """Warnings on stderr, one line each."""
    for warning in env.warnings:
        click.echo(f"slurm-gpu: warning: {warning}", err=True)


@click.command("sacct")
@period_options
@click.option("-a", "--allusers", is_flag=True, help="Jobs of all users (that you may see).")
@click.option("-u", "--user", "--uid", "users", multiple=True, metavar="LIST", help="Users.")
@click.option("-A", "--account", "--accounts", "accounts", multiple=True, metavar="LIST")
@click.option("-r", "--partition", "partitions", multiple=True, metavar="LIST")
@click.option("-j", "--jobs", "jobs", multiple=True, metavar="LIST", help="Job ids.")
@click.option("-N", "--nodelist", "nodes", multiple=True, metavar="LIST")
@click.option("-s", "--state", "states", multiple=True, metavar="LIST")
@click.option("-o", "--format", "fmt", default=None, metavar="FIELDS", help="Fields[%width].")
@click.option("--gpus", "per_gpu", is_flag=True, help="One row per job and GPU.")
@click.option("--helpformat", "-e", is_flag=True, help="List the fields and exit.")
@click.option(
    "--delimiter",
    default="|",
    show_default=True,
    metavar="CHARACTERS",
    help="Between fields with -p/-P, as sacct's --delimiter.",
)
@output_options
@pass_app
def sacct_command(
    app: App,
    starttime: str | None,
    endtime: str | None,
    allusers: bool,
    users: tuple[str, ...],
    accounts: tuple[str, ...],
    partitions: tuple[str, ...],
    jobs: tuple[str, ...],
    nodes: tuple[str, ...],
    states: tuple[str, ...],
    fmt: str | None,
    per_gpu: bool,
    helpformat: bool,
    delimiter: str,
    parsable2: bool,
    parsable: bool,
    noheader: bool,
    as_json: bool,
    as_csv: bool,
) -> None:
    """Jobs with their GPU use: sacct's rows plus GPU-hours, utilization, memory, cost.

    GPM figures of Hopper and newer GPUs on -o: SMActiveAvg, SMOccupancyAvg,
    TensorActiveAvg, DRAMBWAvg, EffectiveGPUHours, GPMGPUHours (blank where not
    measured); --helpformat lists every field.

    Like sacct: without -a you see your own jobs (root: all); the period defaults to
    midnight today until now, and -j selects jobs whenever they ran. Non-admins only
    ever see their own jobs (and their coordinated accounts'), whatever the flags.
    """
    if helpformat:
        click.echo(help_format(job_fields()), nl=False)
        return
    mode = output_mode(parsable2, parsable, as_json, as_csv)
    if not delimiter or "\n" in delimiter:
        raise click.BadParameter("one or more characters, no newline", param_hint="--delimiter")
    env = app.report_env
    fields = job_fields(env.config.cost.currency)
    default = GPU_FORMAT if per_gpu else DEFAULT_FORMAT
    if env.config.cost.charge == "effective" and not per_gpu:
        default += HELD_COST_FORMAT  # the bill's other part, next to Cost
    try:
        columns = parse_format(fmt or default, fields)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    job_list = _split(jobs)
    user_list = _split(users)
    if not allusers and not user_list and env.scope.caller.uid != 0:
        user_list = (env.scope.caller.name,)
    since, until = resolve_period(env, starttime, endtime)
    selection = JobFilter(
        users=user_list,
        accounts=_split(accounts),
        partitions=_split(partitions),
        job_ids=job_list,
        nodes=_split(nodes),
        states=tuple(state_name(s) for s in _split(states)),
    )
    usage = env.usage(None if job_list else since, None if job_list else until, selection)
    records = gpu_records(usage) if per_gpu else job_records(usage)
    if mode == "json" and not per_gpu:
        # Each job also says its Slurm SLUID (25.11+, from the hooks; null without one).
        sluids = env.store.sluids([int(r["job_id"]) for r in records]) if records else {}
        document = [
            {**json_record(columns, r), "sluid": sluids.get(int(r["job_id"]))} for r in records
        ]
        click.echo(json.dumps(document, indent=2))
    else:
        text = render(columns, records, mode, header=not noheader, delimiter=delimiter)
        click.echo(text, nl=False)
    echo_warnings(env)
