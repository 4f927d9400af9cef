"""`slurm-gpu report ...`: sreport-style GPU usage totals for a period."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
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
from slurm_gpu.delivery import Mailing, OutboxTransport, SmtpTransport, Transport, deliver
from slurm_gpu.errors import SlurmError
from slurm_gpu.reports import rollups
from slurm_gpu.reports.monthly import MonthlyReport, build_monthly_with_tables, write_monthly
from slurm_gpu.reports.monthly_tables import Tables
from slurm_gpu.reports.render import json_record, parse_format, render
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.statements import build_statements, empty_note, write_statements
from slurm_gpu.reports.summary import GROUP_KEYS, report_fields
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
    """GPU usage per users, accounts, partitions, nodes, gpu-models, slots or the cluster.

    `slurm-gpu report monthly --month YYYY-MM --out DIR` writes the monthly report
    (index.html and CSV files); see `slurm-gpu report monthly --help`.

    Jobs, GPU-hours, GPU-memory-hours (GiB-hours), utilization weighted by GPU-hours,
    idle GPU-hours (measured, below the active threshold) and their share, missing
    GPU-hours (held with no readings: never idle) and their share, energy, cost, queue
    wait (mean, p95), the GPM figures of Hopper and newer GPUs (SM activity, occupancy,
    tensor activity, DRAM bandwidth over the GPU-hours GPM measured, effective GPU-hours
    and the share GPM measured; blank where nothing was), and the top users by idle
    GPU-hours. `slots` groups by GPU model and slot ("H100 MIG 1g.10gb", "A100 shard");
    where a row is a MIG slice or a share, GPUHours are slot-hours held and PhysGPUHours
    the physical GPU-hours (share x slot-hours). With [cost] charge = "effective",
    IdleHeldCost is priced apart. The
    period defaults to the month so far; usage is counted inside the period only. You
    see only the jobs you may see (your own, your coordinated accounts', or all for
    admins).
    """
    mode = output_mode(parsable2, parsable, as_json, as_csv)
    env = app.report_env
    group = GROUP_KEYS[kind]
    since, until = _period(env, starttime, endtime, month)
    selection = JobFilter(
        users=_split(users), accounts=_split(accounts), partitions=_split(partitions)
    )
    nodes = sorted({e.node for e in env.store.inventory()}) if group == "node" else []
    shape: dict[str, Any] = {
        "since": since,
        "until": until,
        "now": env.now_seconds,
        "cluster": env.config.cluster.name,
        "all_nodes": nodes,
        "busy_factor": env.config.reports.busy_node_factor,
        "top": top,
        "sort": sort,
    }
    try:
        report = rollups.build_report_from_rollups(
            env.store,
            group,
            scope=env.scope,
            filters=selection,
            cost=env.config.cost,
            lag=env.freshness.interval_lag,
            **shape,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    # One road (issue 24): the period's sums (the rollups of folded jobs, the raw rows of
    # the others; store/ knows which), the ledger's figures of them. PhysGPUHours (share x
    # slot-hours) wherever a row summed is a MIG slice or a share.
    slots = group == "slot" or report.held_slots
    fields = report_fields(env.config.cost.currency, group, env.config.cost.charge, slots)
    try:
        columns = parse_format(fmt or ",".join(fields), fields)
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
            "notes": report.notes,
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
        if mode == "table" and any(c.field.name.startswith("QueueWait") for c in columns):
            for note in report.notes:  # how a figure was found (QueueWaitP95 from buckets)
                click.echo(f"Note: {note}")
    echo_warnings(env)


def resolve_month(text: str | None, now: dt.datetime) -> str:
    """`--month`: YYYY-MM as given, "last" (or nothing) the previous month, "this" this one.

    Raises:
        click.BadParameter: none of these.
    """
    if text is None or text == "last":
        return (now.replace(day=1) - dt.timedelta(days=1)).strftime("%Y-%m")
    if text == "this":
        return now.strftime("%Y-%m")
    month_period(text, now.tzinfo)  # a bad --month is a usage error naming the option
    return text


@click.command("monthly")
@click.option(
    "--month",
    default=None,
    metavar="YYYY-MM|last|this",
    help="The calendar month (local time; default: last, the previous month).",
)
@click.option(
    "--out",
    "out",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for index.html and the CSV files (created; default: "
    "<[reports] monthly_dir>/<YYYY-MM>).",
)
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True,
              metavar="N", help="Wasteful jobs listed.")  # fmt: skip
@click.option(
    "--deliver",
    "--mail",
    "deliver",
    is_flag=True,
    help="Mail the report to [notify] admin_emails and each account's statement to its "
    "coordinators (sacctmgr), once per month and recipient (admins only).",
)
@click.option("--resend", is_flag=True, help="With --deliver: send again what went out before.")
@click.option(
    "--outbox",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="With --deliver: write the messages as .eml files here instead of sending them "
    "(default: [reports] mail_outbox; unset sends by [notify] SMTP).",
)
@pass_app
def monthly_command(
    app: App,
    month: str | None,
    out: Path | None,
    top: int,
    deliver: bool,
    resend: bool,
    outbox: Path | None,
) -> None:
    """The monthly report: one self-contained HTML page (inline SVG charts) and CSV files.

    Cluster overview, GPU-hours and cost by account and user, utilization distribution,
    idle waste, top wasteful jobs, queue wait by partition, a node heat map, and what the
    controller did. You see only the jobs you may see (all of them for admins). A month
    without usage gets a report that says so.

    With --deliver (the monthly timer, conf/systemd/slurm-gpu-monthly.timer), each
    account's statement (its users, GPU-hours, idle GPU-hours, cost, the controller's
    actions on its jobs) is written under <out>/statements/ and mailed to the account's
    coordinators, the whole report to the admins; a second run sends nothing twice.
    """
    if (resend or outbox is not None) and not deliver:
        raise click.UsageError("--resend and --outbox go with --deliver")
    if deliver:
        app.require_admin("report monthly --deliver")
    env = app.report_env
    month = resolve_month(month, env.now)
    if out is None:
        out = Path(env.config.reports.monthly_dir) / month
    if deliver:
        transport = _transport(app, outbox)
    report, tables = build_monthly_with_tables(env, month, waste_top=top)
    empty = empty_note(report)
    if empty is not None:
        report.notes.insert(0, empty)
    try:
        files = write_monthly(report, out)
    except OSError as exc:  # e.g. a file in --out that the caller may not write
        raise click.ClickException(f"cannot write the report into {out}: {exc}") from None
    click.echo(f"monthly report {month} ({env.scope.describe()}): {files[0]}")
    click.echo(f"CSV files: {', '.join(f.name for f in files[1:])}")
    if empty is not None:
        click.echo(empty)
    if deliver:
        _deliver(app, report, tables, files, out, transport, resend)
    echo_warnings(env)


def _transport(app: App, outbox: Path | None) -> Transport:
    """Where --deliver's messages go: the outbox folder, else [notify] SMTP."""
    folder = outbox or (Path(app.config.reports.mail_outbox) if app.config.reports.mail_outbox
                        else None)  # fmt: skip
    if folder is not None:
        return OutboxTransport(folder)
    if not app.config.notify.smtp_host:
        raise click.UsageError(
            "--deliver has nowhere to send: set [notify] smtp_host, or [reports] mail_outbox "
            "(or --outbox DIR) to write the messages into a folder"
        )
    return SmtpTransport(app.config.notify)


def _deliver(
    app: App,
    report: MonthlyReport,
    tables: Tables,
    files: list[Path],
    out: Path,
    transport: Transport,
    resend: bool,
) -> None:
    """Statements for every coordinated account, then the mails; exit 1 if one failed.

    The statements are parts of `tables`, the rows the report was built from (read once).
    """
    notify = app.config.notify
    try:
        coordinators = app.slurm.coordinators()
    except SlurmError as exc:
        raise click.ClickException(f"cannot ask sacctmgr for the coordinators: {exc}") from None
    mailing = Mailing(notify.admin_emails, coordinators, notify.user_email_domain,
                      notify.smtp_from)  # fmt: skip
    stated = sorted({*mailing.statement_accounts(), *(a["key"] for a in report.accounts)})
    statements = build_statements(report, tables, stated, owner=_account_of(app))
    try:
        written = write_statements(statements, out / "statements")
    except OSError as exc:
        raise click.ClickException(f"cannot write the statements into {out}: {exc}") from None
    if written:
        click.echo(f"statements of {len(statements)} accounts: {out / 'statements'}")
    if not mailing.admins:
        click.echo("no report mailed to admins: [notify] admin_emails is empty")
    outcomes = deliver(report, files, statements, mailing, app.store.deliveries, transport,
                       resend=resend)  # fmt: skip
    for outcome in outcomes:
        click.echo(outcome.describe())
    for account in sorted(set(stated) - set(mailing.statement_accounts())):
        click.echo(f"statement {account}: no coordinator in sacctmgr, not mailed")
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(outcomes)} messages failed")


def _account_of(app: App) -> Callable[[int], str | None]:
    def owner(job_id: int) -> str | None:
        job = app.store.job(job_id)
        return (job.get("account") or None) if job else None

    return owner
