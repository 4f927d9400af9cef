"""`slurm-gpu report ...`: sreport-style GPU usage totals for a period."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.cli.sacct import (
    _split,
    echo_warnings,
    output_mode,
    output_options,
    period_options,
    resolve_period,
)
from slurm_gpu.reports.monthly import build_monthly, write_monthly
from slurm_gpu.reports.render import json_record, parse_format, render
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.summary import GROUP_KEYS, build_report, report_fields
from slurm_gpu.reports.usage import JobFilter
from slurm_gpu.slurm.timespec import format_sacct_time


def charge_lines(charge: str) -> list[str]:
    """What Cost charges under `[cost] charge`, for a report's header ([] for "held")."""
    if charge != "effective":
        return []
    return [
        'Charge "effective": Cost is the GPU time GPM measured x its SM activity, plus all',
        "GPU time GPM did not measure (GPMPct < 100: older GPUs, missing readings), charged",
        "as held; IdleHeldCost prices the measured time with SMs not active, not in Cost.",
    ]


def month_period(text: str, tz: dt.tzinfo | None) -> tuple[float, float]:
    """`2026-11` -> [first of November 00:00, first of December 00:00) in local time.

    Raises:
        click.BadParameter: not YYYY-MM.
    """
    try:
        first = dt.datetime.strptime(text, "%Y-%m").replace(tzinfo=tz)
    except ValueError:
        raise click.BadParameter(f"expected YYYY-MM, got {text!r}", param_hint="--month") from None
    following = (first.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
    return first.timestamp(), following.timestamp()


def _period(
    env: ReportEnv, starttime: str | None, endtime: str | None, month: str | None
) -> tuple[float, float]:
    if month is not None:
        if starttime or endtime:
            raise click.UsageError("--month and -S/-E exclude each other")
        return month_period(month, env.tz)
    # sreport's habit is yesterday; a bill wants the month so far.
    first = env.now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return resolve_period(
        env, starttime, endtime, default_start=first.strftime("%Y-%m-%dT%H:%M:%S")
    )


class _ReportCommand(click.Command):
    """`report KIND ...`, except `report monthly ...`, which is its own command."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        if args and args[0] == "monthly":
            return monthly_command.make_context("report monthly", args[1:], parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)


@click.command("report", cls=_ReportCommand)
@click.argument("kind", type=click.Choice(list(GROUP_KEYS)))
@period_options
@click.option("--month", default=None, metavar="YYYY-MM", help="A calendar month (local time).")
@click.option("-u", "--user", "users", multiple=True, metavar="LIST", help="Only these users.")
@click.option("-A", "--account", "accounts", multiple=True, metavar="LIST")
@click.option("-r", "--partition", "partitions", multiple=True, metavar="LIST")
@click.option(
    "--sort", default=None, metavar="FIELD", help="Sort by this column (default GPUHours)."
)
@click.option("--top", type=click.IntRange(min=1), default=None, metavar="N", help="First N rows.")
@click.option("-o", "--format", "fmt", default=None, metavar="FIELDS", help="Columns[%width].")
@output_options
@pass_app
def report_command(
    app: App,
    kind: str,
    starttime: str | None,
    endtime: str | None,
    month: str | None,
    users: tuple[str, ...],
    accounts: tuple[str, ...],
    partitions: tuple[str, ...],
    sort: str | None,
    top: int | None,
    fmt: str | None,
    parsable2: bool,
    parsable: bool,
    noheader: bool,
    as_json: bool,
    as_csv: bool,
) -> None:
    """GPU usage per users, accounts, partitions, nodes, gpu-models or the cluster.

    `slurm-gpu report monthly --month YYYY-MM --out DIR` writes the monthly report
    (index.html and CSV files); see `slurm-gpu report monthly --help`.

    Jobs, GPU-hours, GPU-memory-hours (GiB-hours), utilization weighted by GPU-hours,
    idle GPU-hours (measured, below the active threshold) and their share, missing
    GPU-hours (held with no readings: never idle) and their share, energy, cost, queue
    wait (mean, p95), the GPM figures of Hopper and newer GPUs (SM activity, occupancy,
    tensor activity, DRAM bandwidth over the GPU-hours GPM measured, effective GPU-hours
    and the share GPM measured; blank where nothing was), and the top users by idle
    GPU-hours. With [cost] charge = "effective", IdleHeldCost is priced apart. The
    period defaults to the month so far; usage is counted inside the period only. You
    see only the jobs you may see (your own, your coordinated accounts', or all for
    admins).
    """
    mode = output_mode(parsable2, parsable, as_json, as_csv)
    env = app.report_env
    group = GROUP_KEYS[kind]
    fields = report_fields(env.config.cost.currency, group, env.config.cost.charge)
    try:
        columns = parse_format(fmt or ",".join(fields), fields)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    since, until = _period(env, starttime, endtime, month)
    selection = JobFilter(
        users=_split(users), accounts=_split(accounts), partitions=_split(partitions)
    )
    usage = env.usage(since, until, selection)
    nodes = sorted({e.node for e in env.store.inventory()}) if group == "node" else []
    try:
        report = build_report(
            usage,
            group,
            since=since,
            until=until,
            now=env.now_seconds,
            cluster=env.config.cluster.name,
            all_nodes=nodes,
            busy_factor=env.config.reports.busy_node_factor,
            top=top,
            sort=sort,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    period = f"{format_sacct_time(since, env.tz)} - {format_sacct_time(until, env.tz)}"
    if mode == "json":
        waste_columns = parse_format(
            "User,IdleGPUHours,IdlePct,GPUHours,Cost", report_fields("", "user")
        )
        document = {
            "report": kind,
            "period": {"start": since, "end": until, "text": period},
            "scope": env.scope.describe(),
            "currency": env.config.cost.currency,
            "charge": env.config.cost.charge,
            "rows": [json_record(columns, r) for r in report.rows],
            "total": json_record(columns, report.total),
            "top_waste": [json_record(waste_columns, r) for r in report.top_waste],
        }
        click.echo(json.dumps(document, indent=2))
    else:
        if mode == "table" and not noheader:
            click.echo("-" * 80)
            click.echo(f"GPU usage by {kind} {period} ({env.scope.describe()})")
            click.echo(f"Cost in {env.config.cost.currency} per {env.config.cost.unit}")
            for line in charge_lines(env.config.cost.charge):
                click.echo(line)
            click.echo("-" * 80)
        click.echo(
            render(columns, [*report.rows, report.total], mode, header=not noheader), nl=False
        )
        if mode == "table" and report.top_waste:
            click.echo("")
            click.echo("Top users by idle GPU-hours:")
            waste = parse_format(
                "User,IdleGPUHours,IdlePct,GPUHours,Cost", report_fields("", "user")
            )
            click.echo(render(waste, report.top_waste, "table"), nl=False)
    echo_warnings(env)


@click.command("monthly")
@click.option(
    "--month",
    default=None,
    metavar="YYYY-MM",
    help="The calendar month (local time; default: the previous month).",
)
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for index.html and the CSV files (created).",
)
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True,
              metavar="N", help="Wasteful jobs listed.")  # fmt: skip
@pass_app
def monthly_command(app: App, month: str | None, out: Path, top: int) -> None:
    """The monthly report: one self-contained HTML page (inline SVG charts) and CSV files.

    Cluster overview, GPU-hours and cost by account and user, utilization distribution,
    idle waste, top wasteful jobs, queue wait by partition, a node heat map, and what the
    controller did. You see only the jobs you may see (all of them for admins).
    """
    env = app.report_env
    if month is None:
        previous = env.now.replace(day=1) - dt.timedelta(days=1)
        month = previous.strftime("%Y-%m")
    month_period(month, env.tz)  # a bad --month is a usage error naming the option
    report = build_monthly(env, month, waste_top=top)
    try:
        files = write_monthly(report, out)
    except OSError as exc:  # e.g. a file in --out that the caller may not write
        raise click.ClickException(f"cannot write the report into {out}: {exc}") from None
    click.echo(f"monthly report {month} ({env.scope.describe()}): {files[0]}")
    click.echo(f"CSV files: {', '.join(f.name for f in files[1:])}")
    echo_warnings(env)
