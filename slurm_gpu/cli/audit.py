"""`slurm-gpu audit`: the controller's decisions, as the audit log holds them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.cli.params import comma_list, sacct_time
from slurm_gpu.reports.render import ChosenField, Field, OutputMode, fmt_text, render
from slurm_gpu.slurm.timespec import format_sacct_time
from slurm_gpu.store.control import AuditEntry

# (header, width: negative for text that may be cut, what the cell shows)
_COLUMNS: list[tuple[str, int, Callable[[AuditEntry], str]]] = [
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


def _cell(get: Callable[[AuditEntry], str]) -> Callable[[Mapping[str, Any]], str]:
    """A render cell reading one AuditEntry field from a record `{"entry": entry}`."""
    return lambda record: get(record["entry"])


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
    app: App,
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
    """Every controller decision, dry-run or real, with what came of it.

    Like sacct: a user sees the decisions about their own jobs (so why one was
    cancelled), a coordinator also their accounts', an admin every row.
    """
    try:
        job_ids = [int(j) for j in comma_list(jobs)]
    except ValueError:
        raise click.BadParameter(f"job ids must be numbers: {jobs!r}", param_hint="-j") from None
    since, until = sacct_time(start, "-S/--starttime"), sacct_time(end, "-E/--endtime")
    entries = app.control.audit_entries(
        since=since,
        until=until,
        users=comma_list(users),
        accounts=comma_list(accounts),
        job_ids=job_ids,
        policies=comma_list(policies),
        actions=comma_list(actions),
    )
    entries = app.visible(entries)  # a user's own jobs, a coordinator's accounts (as sacct)
    columns = [
        ChosenField(Field(name, width, name, _cell(get), fmt_text), width)
        for name, width, get in _COLUMNS
    ]
    mode: OutputMode = "json" if as_json else "parsable2" if parsable2 else "table"
    click.echo(
        render(columns, [{"entry": e} for e in entries], mode, header=not noheader), nl=False
    )
