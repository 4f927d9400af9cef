"""What the monthly mails say: one account's statement, and the report's summary for admins.

A statement is one account's month: its users, their GPU-hours, idle GPU-hours, cost and
idle cost, and what the controller did on the account's jobs (the audit log's enforced
entries, as the monthly report lists them). It is built from that account's rows alone
(prorated to the month like every report), so a user who works in two accounts shows
in each statement with that account's part only, and a statement never names another
account's users. A month without usage still has a
statement (and a report) that says so. The statements are parts of the tables the
monthly report mailed beside them was built from (`build_monthly_with_tables`): the
month's rows are read and summed once, and each statement's total is its account's row
of that report.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_gpu.reports.monthly import MonthlyReport
from slurm_gpu.reports.monthly_tables import Tables
from slurm_gpu.reports.usage import JobFilter
from slurm_gpu.units import is_known

USER_COLUMNS = (
    "user", "jobs", "gpu_hours", "idle_gpu_hours", "idle_percent", "missing_gpu_hours",
    "util_mean_percent", "cost", "idle_cost",
)  # fmt: skip
"""The statement CSV's user columns (a TOTAL row ends it)."""
ACTION_COLUMNS = (
    "time", "kind", "policy", "action", "target", "job_id", "user", "outcome", "reason",
)  # fmt: skip
"""The statement's controller actions CSV columns."""
ACTIONS_SHOWN = 30
"""Actions a statement's text lists (its CSV lists all)."""


@dataclass
class Statement:
    """One account's month.

    Attributes:
        month: YYYY-MM.
        account: the account.
        cluster: the cluster's name.
        currency: [cost] currency.
        unit: [cost] unit.
        charge: [cost] charge.
        since: the month's first second (POSIX).
        until: the next month's first second (POSIX).
        users: one record per user of the account (USER_COLUMNS), most GPU-hours first.
        total: the account's figures (USER_COLUMNS but "user").
        actions: the controller's enforced actions on the account's jobs (ACTION_COLUMNS).
    """

    month: str
    account: str
    cluster: str
    currency: str
    unit: str
    charge: str
    since: float
    until: float
    users: list[dict[str, Any]]
    total: dict[str, Any]
    actions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """No GPU usage in the month."""
        return not self.users


def _record(key: str, figures: Mapping[str, Any], idle_cost: float) -> dict[str, Any]:
    record = {"user": key, **{k: figures.get(k) for k in USER_COLUMNS if k != "user"}}
    record["idle_cost"] = idle_cost
    return record


def build_statements(
    report: MonthlyReport,
    tables: Tables,
    accounts: Iterable[str],
    actions: Sequence[Mapping[str, Any]] | None = None,
    owner: Callable[[int], str | None] = lambda _job_id: None,
) -> dict[str, Statement]:
    """The statements of `accounts` for the month of `report`.

    Each is its account's part of the rows the report was made of (`tables`, from
    `build_monthly_with_tables`): its total is its account's row of the report, read and
    summed once for the report and every statement.

    Args:
        report: the monthly report mailed beside the statements (an admin's: its scope
            must see the accounts' jobs).
        tables: the tables `report` was built from.
        accounts: the accounts to state (one without usage gets an empty statement).
        actions: the month's controller actions (default: `report.actions`).
        owner: the account of a job, for an action that was audited without one.

    Raises:
        ValueError: `tables` are not `report`'s, or were selected by -u/-A/-r (a
            statement is its account's whole month).
    """
    if tables.accounts is not report.accounts:
        raise ValueError("the statements take the tables their monthly report was built from")
    if tables.filters != JobFilter():
        raise ValueError("a statement is an account's whole month: a report of every job")
    acted = _actions_by_account(report.actions if actions is None else actions, owner)
    out = {}
    for account in sorted(set(accounts)):
        part = tables.statement_of(account)
        users = [_record(str(r["key"]), r, float(r["idle_cost"])) for r in part.users]
        total: dict[str, Any] = {k: None for k in USER_COLUMNS if k != "user"}
        total.update({"jobs": 0, "gpu_hours": 0.0, "cost": 0.0, "idle_cost": 0.0})
        if part.users:
            total = _record("", part.total, part.idle_cost)
            del total["user"]
        users.sort(key=lambda r: (-(r["gpu_hours"] or 0.0), r["user"]))
        out[account] = Statement(
            month=report.month,
            account=account,
            cluster=report.cluster,
            currency=report.currency,
            unit=report.unit,
            charge=report.charge,
            since=report.since,
            until=report.until,
            users=users,
            total=total,
            actions=acted.get(account, []),
        )
    return out


def _actions_by_account(
    actions: Sequence[Mapping[str, Any]], owner: Callable[[int], str | None]
) -> dict[str, list[dict[str, Any]]]:
    """The actions on each account's jobs (or on the account itself), in time order.

    An action audited without an account is its job's account's (`owner`, asked once a job).
    """
    owners: dict[int, str] = {}
    out: dict[str, list[dict[str, Any]]] = {}
    for a in actions:
        of = a.get("account") or ""
        if not of and a.get("job_id") is not None:
            job_id = int(a["job_id"])
            if job_id not in owners:
                owners[job_id] = owner(job_id) or ""
            of = owners[job_id]
        out.setdefault(of, []).append({k: a.get(k) for k in ACTION_COLUMNS})
    for part in out.values():
        part.sort(key=lambda r: float(r["time"] or 0.0))
    return out


# ---- text and CSV ---------------------------------------------------------------------


def _num(value: Any, digits: int = 2) -> str:
    return f"{float(value):,.{digits}f}" if is_known(value) else "-"


def _when(seconds: float, tz: dt.tzinfo | None = None) -> str:
    return dt.datetime.fromtimestamp(seconds, tz).strftime("%Y-%m-%d %H:%M")


def statement_text(s: Statement, tz: dt.tzinfo | None = None) -> str:
    """The statement as the mail's plain text (80 columns)."""
    lines = [
        f"GPU usage statement of account {s.account}, cluster {s.cluster}, {s.month}",
        f"Period: {_when(s.since, tz)} to {_when(s.until, tz)}; cost in {s.currency} per {s.unit}.",
        "",
    ]
    if s.empty:
        lines.append(f"No GPU usage was recorded for account {s.account} in {s.month}.")
    else:
        cur = s.currency
        head = f"{'User':<16}{'Jobs':>6}{'GPU-hours':>11}{'Idle GPU-h':>11}{'Idle %':>8}"
        head += f"{'Cost ' + cur:>13}{'Idle cost':>12}"
        lines += [head, "-" * len(head)]
        for r in [*s.users, {"user": "TOTAL", **s.total}]:
            lines.append(
                f"{str(r['user'])[:15]:<16}{r['jobs'] or 0:>6}{_num(r['gpu_hours']):>11}"
                f"{_num(r['idle_gpu_hours']):>11}{_num(r['idle_percent'], 1):>8}"
                f"{_num(r['cost']):>13}{_num(r['idle_cost']):>12}"
            )
        missing = s.total.get("missing_gpu_hours")
        if is_known(missing) and float(missing) > 0:
            lines += [
                "",
                f"{_num(missing)} GPU-hours were held with no readings (agent down, GPU "
                "lost): charged, never counted as idle.",
            ]
        if s.charge == "effective":
            lines += ["", 'Charge "effective": Cost is the GPU time x its SM activity where '
                      "GPM measured it, held time elsewhere."]  # fmt: skip
    lines += ["", "What the controller did on this account's jobs:"]
    if not s.actions:
        lines.append("  nothing.")
    for a in s.actions[:ACTIONS_SHOWN]:
        job = f"job {a['job_id']}" if a.get("job_id") is not None else str(a["target"])
        lines.append(
            f"  {_when(float(a['time']), tz)}  {a['kind']}: {a['policy']} {a['action']} "
            f"{job} ({a['user'] or '-'}), {a['outcome']}"
        )
        if a.get("reason"):
            lines.append(f"      {a['reason']}")
    if len(s.actions) > ACTIONS_SHOWN:
        lines.append(f"  ... {len(s.actions) - ACTIONS_SHOWN} more in the controller-actions CSV.")
    lines += ["", "The figures per user and every action are in the attached CSV files."]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> Any:
    if not is_known(value):
        return ""
    return round(value, 6) if isinstance(value, float) else value


def statement_csv(s: Statement) -> str:
    """The users of the statement and a TOTAL row, as CSV."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(USER_COLUMNS)
    for r in [*s.users, {"user": "TOTAL", **s.total}]:
        writer.writerow([_cell(r.get(c)) for c in USER_COLUMNS])
    return buffer.getvalue()


def actions_csv(s: Statement) -> str:
    """The statement's controller actions, as CSV."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(ACTION_COLUMNS)
    for a in s.actions:
        writer.writerow([_cell(a.get(c)) for c in ACTION_COLUMNS])
    return buffer.getvalue()


def safe_name(text: str) -> str:
    """A name for a file: Slurm's account names are, anything else is replaced by '_'."""
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", text).lstrip(".") or "_"


def statement_files(s: Statement) -> dict[str, str]:
    """The statement's files: {file name: text} (the text, its CSV, its actions CSV)."""
    base = f"statement-{s.month}-{safe_name(s.account)}"
    return {
        f"{base}.txt": statement_text(s),
        f"{base}.csv": statement_csv(s),
        f"{base}-controller-actions.csv": actions_csv(s),
    }


def write_statements(statements: Mapping[str, Statement], folder: Path) -> list[Path]:
    """Each statement's files into `folder` (created); returns the files."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for s in statements.values():
        for name, text in statement_files(s).items():
            path = folder / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


# ---- the whole report, for the admins -----------------------------------------------


def empty_note(report: MonthlyReport) -> str | None:
    """The note a report of a month without GPU usage carries (None: there was usage)."""
    if report.overview.get("jobs"):
        return None
    return f"No GPU usage was recorded in {report.month} ({report.scope})."


def report_summary_text(
    report: MonthlyReport, page: Path, without_coordinator: Sequence[str] = ()
) -> str:
    """The admins' mail: the month's headline figures and where the report lies.

    Args:
        report: the monthly report.
        page: its index.html on the server.
        without_coordinator: accounts with usage and no coordinator (no statement mailed).
    """
    o, cur = report.overview, report.currency
    lines = [f"GPU usage report of cluster {report.cluster}, {report.month}", ""]
    note = empty_note(report)
    if note is not None:
        lines.append(note)
    else:
        lines += [
            f"GPU-hours:          {_num(o['gpu_hours'])}",
            f"Cost:               {_num(o['cost'])} {cur} (per {report.unit})",
            f"Idle GPU-hours:     {_num(o['idle_gpu_hours'])} ({_num(o['idle_percent'], 1)} %),"
            f" idle cost {_num(o['idle_cost'])} {cur}",
            f"Missing GPU-hours:  {_num(o['missing_gpu_hours'])} (held with no readings)",
            f"GPU jobs:           {o['jobs']:,} of {o['users']:,} users in "
            f"{o['accounts']:,} accounts",
            f"Jobs cancelled by the controller: {o['cancellations']:,} "
            f"({_num(o['gpu_hours_returned'])} GPU-hours returned)",
            "",
            f"{'Account':<20}{'GPU-hours':>12}{'Idle GPU-h':>12}{'Cost ' + cur:>14}",
        ]
        for a in report.accounts[:10]:
            lines.append(
                f"{a['key'][:19]:<20}{_num(a['gpu_hours']):>12}{_num(a['idle_gpu_hours']):>12}"
                f"{_num(a['cost']):>14}"
            )
        if len(report.accounts) > 10:
            lines.append(f"... {len(report.accounts) - 10} more accounts in accounts.csv")
    for n in report.notes:
        if n != note:
            lines += ["", n]
    if without_coordinator:
        lines += [
            "",
            "Accounts with usage and no coordinator (no statement mailed): "
            + ", ".join(without_coordinator),
        ]
    lines += ["", f"The whole report (attached): {page}", ""]
    return "\n".join(lines)
