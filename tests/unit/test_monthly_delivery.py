"""The monthly delivery: account statements (content, privacy), the mails, sent once.

reports/statements.py builds each account's statement; slurm_gpu/delivery.py mails the
whole report to the admins and each statement to its account's coordinators, once per
month and recipient (the store's report_deliveries), unless resent. The messages are
written by the real outbox transport and read back as a mail reader would.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import email
import email.policy
from collections.abc import Callable
from email.message import EmailMessage
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner, Result

from slurm_gpu.access import Caller, Scope
from slurm_gpu.app import App
from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.config import Config
from slurm_gpu.config.core import ClusterSettings
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.delivery import Mailing, OutboxTransport, deliver
from slurm_gpu.models import Action, JobGpuSummary, Verdict
from slurm_gpu.reports.monthly import (
    MonthlyReport,
    build_monthly_with_tables,
    write_monthly,
)
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.statements import (
    USER_COLUMNS,
    Statement,
    build_statements,
    empty_note,
    statement_files,
    statement_text,
)
from slurm_gpu.reports.usage import JobFilter
from slurm_gpu.store import Store
from slurm_gpu.testing import FakeSlurmClient, FixedClock
from tests.usage_sources import as_source

UTC = dt.UTC
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
H = 3600.0
ACCOUNT_USERS = {"physics": {"alice", "carol"}, "bio": {"bob", "carol"}}
COORDINATORS = {"physics": {"dana"}, "bio": {"erin"}, "chem": {"frank"}}


def summary(job: int, user: str, account: str, start: float, hours: float, gpu: str,
            util: float) -> JobGpuSummary:  # fmt: skip
    seconds = hours * H
    return JobGpuSummary(
        job_id=job, node="gpu1", gpu_uuid=gpu, gpu_model="NVIDIA A100", start=start,
        end=start + seconds, gpu_seconds=seconds, util_mean_percent=util,
        util_max_percent=util, active_seconds=seconds * (1.0 if util > 5 else 0.0),
        mem_max_bytes=2**30, mem_gib_seconds=seconds, energy_joules=1000.0,
        reading_count=10, missing_seconds=0.0, user=user, account=account, partition="gpu",
    )  # fmt: skip


@pytest.fixture
def store(store: Store, usage_source: str) -> Store:
    """November: alice (physics), bob (bio, idle), carol in both accounts; audit entries."""
    jobs = [
        (1, "alice", "physics", NOV + 10 * H, 2.0, ["G1", "G2"], 80.0),
        (2, "bob", "bio", NOV + 20 * H, 3.0, ["G3"], 0.0),
        (3, "carol", "physics", NOV + 30 * H, 1.0, ["G4"], 50.0),
        (4, "carol", "bio", NOV + 40 * H, 2.0, ["G1"], 60.0),
    ]
    store.upsert_jobs(
        [
            {"job_id": j, "user": u, "account": a, "partition": "gpu", "job_name": f"job{j}",
             "state": "COMPLETED", "submit_time": start - 60, "start_time": start,
             "end_time": start + hours * H, "nodes": "gpu1", "gpus": len(gpus)}
            for j, u, a, start, hours, gpus, _ in jobs
        ]
    )  # fmt: skip
    store.add_summaries(
        [summary(j, u, a, s, h, g, util) for j, u, a, s, h, gpus, util in jobs for g in gpus]
    )
    control = store.control
    at = NOV + 21 * H
    cancel = Verdict("idle_gpu", Action.CANCEL, "job:2", "GPUs idle for 2 h", job_id=2,
                     user="bob", account="bio")  # fmt: skip
    control.audit([cancel], time=at, cycle="x", controller="h", dry_run=False, outcome="done")
    hold = Verdict("gpu_quota", Action.HOLD, "job:1", "physics over its budget", job_id=1,
                   user="alice", account="physics")  # fmt: skip
    control.audit([hold], time=at + 60, cycle="y", controller="h", dry_run=False, outcome="done")
    # Audited before the job's owner was known: judged by the job's account in the store.
    warn = Verdict("idle_gpu", Action.WARN, "job:3", "GPU idle", job_id=3)
    control.audit([warn], time=at + 120, cycle="z", controller="h", dry_run=False,
                  outcome="recorded")  # fmt: skip
    return as_source(store, usage_source)


def env(store: Store) -> ReportEnv:
    config = dataclasses.replace(
        Config(), cluster=ClusterSettings(name="alpha"), cost=CostSettings(prices={"a100": 2.0})
    )
    now = dt.datetime(2026, 12, 1, 6, tzinfo=UTC)
    return ReportEnv(config, store, None, Scope(Caller(0, "root"), True, reason="root"), now, [])


def owner(store: Store) -> Callable[[int], str | None]:
    def account_of(job_id: int) -> str | None:
        job = store.job(job_id)
        return str(job["account"]) if job else None

    return account_of


def statements(store: Store, month: str = "2026-11") -> dict[str, Statement]:
    report, tables = build_monthly_with_tables(env(store), month)
    return build_statements(report, tables, COORDINATORS, owner=owner(store))


def read_mails(folder: Path) -> dict[str, EmailMessage]:
    """The outbox's messages by file name."""
    out = {}
    for path in sorted(folder.glob("*.eml")):
        parsed = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        out[path.name] = parsed
    return out


def body(mail: EmailMessage) -> str:
    part = mail.get_body(("plain",))
    assert part is not None
    return str(part.get_content())


def attachments(mail: EmailMessage) -> dict[str, str]:
    return {str(a.get_filename()): str(a.get_content()) for a in mail.iter_attachments()}


# ---------------------------------------------------------------------- statements


def test_statement_has_its_accounts_users_with_that_accounts_part_only(store: Store) -> None:
    """bio: bob's 3 idle hours and carol's 2 bio hours (not her physics hour), at 2 EUR/h."""
    bio = statements(store)["bio"]
    assert ["bob", "carol"] == [u["user"] for u in bio.users]
    bob, carol = bio.users
    assert (3.0, 3.0, 6.0, 6.0) == pytest.approx(
        (bob["gpu_hours"], bob["idle_gpu_hours"], bob["cost"], bob["idle_cost"])
    )
    assert (2.0, 0.0, 4.0) == pytest.approx(
        (carol["gpu_hours"], carol["idle_gpu_hours"], carol["cost"])
    )
    assert 2 == bio.total["jobs"]
    assert (5.0, 10.0) == pytest.approx((bio.total["gpu_hours"], bio.total["cost"]))


@pytest.mark.parametrize("account", ["physics", "bio"])
def test_a_statement_never_names_another_accounts_users(store: Store, account: str) -> None:
    """No user outside the account appears in its text or CSV files, nor their jobs' actions."""
    statement = statements(store)[account]
    others = set().union(*ACCOUNT_USERS.values()) - ACCOUNT_USERS[account]
    files = statement_files(statement)
    for name, text in files.items():
        for user in others:
            assert user not in text, f"{user} in {name}"
    assert ACCOUNT_USERS[account] == {u["user"] for u in statement.users}


def test_statement_lists_the_controllers_actions_on_its_jobs(store: Store) -> None:
    """bio gets the cancellation of job 2; physics the hold of job 1 and job 3's warning."""
    s = statements(store)
    assert [(2, "cancel")] == [(a["job_id"], a["action"]) for a in s["bio"].actions]
    assert [(1, "hold"), (3, "warn")] == [(a["job_id"], a["action"]) for a in s["physics"].actions]
    text = statement_text(s["bio"], UTC)
    assert "2026-11-01 21:00  cancellation: idle_gpu cancel job 2 (bob), done" in text
    assert "GPUs idle for 2 h" in text


def test_an_account_without_usage_gets_a_statement_saying_so(store: Store) -> None:
    """chem ran nothing: its statement says so and lists no action."""
    chem = statements(store)["chem"]
    assert (True, [], []) == (chem.empty, chem.users, chem.actions)
    text = statement_text(chem)
    assert "No GPU usage was recorded for account chem in 2026-11." in text
    assert "What the controller did on this account's jobs:\n  nothing." in text


# ---------------------------------------------------------------------- delivery


def run_delivery(
    store: Store, tmp_path: Path, month: str = "2026-11", *, resend: bool = False,
    domain: str = "example.org",
) -> tuple[list[str], MonthlyReport]:  # fmt: skip
    e = env(store)
    report, tables = build_monthly_with_tables(e, month)
    note = empty_note(report)
    if note:
        report.notes.insert(0, note)
    files = write_monthly(report, tmp_path / "reports" / month)
    stated = build_statements(report, tables, COORDINATORS, owner=owner(store))
    mailing = Mailing(["admin@example.org"], COORDINATORS, domain, "slurm-gpu@example.org")
    outcomes = deliver(report, files, stated, mailing, store.deliveries,
                       OutboxTransport(tmp_path / "outbox"), resend=resend,
                       clock=FixedClock(NOV + 31 * 24 * H))  # fmt: skip
    return [f"{o.kind} {o.account} {o.recipient} {o.status}" for o in outcomes], report


def test_admins_get_the_whole_report_and_each_coordinator_their_statement(
    store: Store, tmp_path: Path
) -> None:
    """One message each: the admin's with index.html and the CSVs, dana's of physics only."""
    outcomes, _ = run_delivery(store, tmp_path)
    assert [
        "report  admin@example.org sent",
        "statement bio erin@example.org sent",
        "statement chem frank@example.org sent",
        "statement physics dana@example.org sent",
    ] == outcomes
    mails = read_mails(tmp_path / "outbox")
    by_to = {str(m["To"]): m for m in mails.values()}
    assert {"admin@example.org", "dana@example.org", "erin@example.org",
            "frank@example.org"} == set(by_to)  # fmt: skip
    admin = by_to["admin@example.org"]
    assert "[slurm-gpu alpha] GPU usage report 2026-11" == admin["Subject"]
    assert {"index.html", "accounts.csv", "users.csv"} <= set(attachments(admin))
    assert "GPU-hours:          10.00" in body(admin)
    dana = by_to["dana@example.org"]
    assert "[slurm-gpu alpha] GPU usage statement 2026-11: account physics" == dana["Subject"]
    csv_text = attachments(dana)["statement-2026-11-physics.csv"]
    assert ["user", "alice", "carol", "TOTAL"] == [line.split(",")[0] for line in
                                                    csv_text.splitlines()]  # fmt: skip
    assert "bob" not in body(dana) + "".join(attachments(dana).values())


def test_a_second_run_sends_nothing_and_resend_sends_again(store: Store, tmp_path: Path) -> None:
    """Twice: the second run finds everything sent; --resend sends every message again."""
    run_delivery(store, tmp_path)
    first = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "outbox").iterdir()}
    second, _ = run_delivery(store, tmp_path)
    assert 4 == len(second)
    assert all(o.endswith("already sent") for o in second)
    assert first == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "outbox").iterdir()}
    again, _ = run_delivery(store, tmp_path, resend=True)
    assert all(o.endswith(" sent") and "already" not in o for o in again)
    assert 4 == len(store.deliveries.sent("2026-11"))


def test_a_failed_message_is_sent_by_the_next_run(store: Store, tmp_path: Path) -> None:
    """The outbox cannot be written: nothing is recorded as sent, and the next run sends all."""
    (tmp_path / "outbox").write_text("a file where the folder should be")
    failed, _ = run_delivery(store, tmp_path)
    assert all(o.endswith("failed") for o in failed)
    assert [] == store.deliveries.sent("2026-11")
    (tmp_path / "outbox").unlink()
    sent, _ = run_delivery(store, tmp_path)
    assert all(o.endswith(" sent") for o in sent)


def test_each_month_is_delivered_on_its_own(store: Store, tmp_path: Path) -> None:
    """What went out for November does not stop October's mails."""
    run_delivery(store, tmp_path, "2026-11")
    october, _ = run_delivery(store, tmp_path, "2026-10")
    assert all(o.endswith(" sent") for o in october)


def test_a_month_without_usage_says_so_in_the_report_and_the_mails(
    store: Store, tmp_path: Path
) -> None:
    """September: the page carries the note, the admin's and coordinators' mails say so."""
    _, report = run_delivery(store, tmp_path, "2026-09")
    note = "No GPU usage was recorded in 2026-09 (all users (root))."
    assert note == empty_note(report)
    assert note in (tmp_path / "reports" / "2026-09" / "index.html").read_text()
    mails = {str(m["To"]): m for m in read_mails(tmp_path / "outbox").values()}
    assert note in body(mails["admin@example.org"])
    assert "No GPU usage was recorded for account physics in 2026-09." in body(
        mails["dana@example.org"]
    )


def test_without_a_mail_domain_coordinators_are_not_mailed(store: Store, tmp_path: Path) -> None:
    """No [notify] user_email_domain: the admins get the report, the statements say why not."""
    outcomes, _ = run_delivery(store, tmp_path, domain="")
    assert ["report  admin@example.org sent", "statement bio  not sent",
            "statement chem  not sent", "statement physics  not sent"] == outcomes  # fmt: skip


# ---------------------------------------------------------------------- the command


def run_cli(tmp_path: Path, store: Store, *args: str, user: str = "root") -> Result:
    """`slurm-gpu report monthly ARGS` over the test's store, as `user`, no Slurm."""
    toml = tmp_path / "slurm-gpu.toml"
    toml.write_text(
        f'[cluster]\nname = "c"\n[store]\nurl = "{store.engine.url}"\n'
        f'[reports]\nlive_sacct = false\nmonthly_dir = "{tmp_path / "reports"}"\n'
        "[access]\nslurm_roles = false\n"
    )
    caller = Caller(0 if user == "root" else 1000, user)
    app = AppContext(env={}, default_path=toml, caller=caller)
    return CliRunner().invoke(cli, ["report", "monthly", *args], obj=app)


def test_the_command_writes_an_empty_month_under_monthly_dir_and_says_so(
    store: Store, tmp_path: Path
) -> None:
    """No --out: <monthly_dir>/<YYYY-MM>/; a month without usage is said to be one."""
    result = run_cli(tmp_path, store, "--month", "2026-09")
    assert 0 == result.exit_code, result.output
    assert "No GPU usage was recorded in 2026-09 (all users (root))." in result.output
    assert (tmp_path / "reports" / "2026-09" / "index.html").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--resend"], "--resend and --outbox go with --deliver"),
        (["--deliver"], "--deliver has nowhere to send: set [notify] smtp_host"),
        (["--month", "November"], "expected YYYY-MM, got 'November'"),
    ],
)
def test_the_commands_usage_errors(
    store: Store, tmp_path: Path, args: list[str], message: str
) -> None:
    """--resend without --deliver, --deliver with nowhere to send, a bad --month: exit 2."""
    result = run_cli(tmp_path, store, *args)
    assert (2, True) == (result.exit_code, message in result.output), result.output


def test_only_admins_deliver(store: Store, tmp_path: Path) -> None:
    """A user who is no admin may write the report of what she sees, not mail everyone's."""
    result = run_cli(tmp_path, store, "--deliver", "--outbox", str(tmp_path / "out"),
                     user="alice")  # fmt: skip
    assert 0 != result.exit_code
    assert "report monthly --deliver" in result.output
    assert not (tmp_path / "out").exists()


def test_a_long_list_of_actions_is_cut_in_the_text_and_whole_in_the_csv(store: Store) -> None:
    """A busy month: the text lists the first 30 actions and says how many more the CSV has."""
    report, tables = build_monthly_with_tables(env(store), "2026-11")
    many = [{**report.actions[0], "time": NOV + i, "job_id": 2} for i in range(45)]
    (bio,) = build_statements(report, tables, ["bio"], many).values()
    text = statement_text(bio)
    assert 30 == text.count("cancellation: idle_gpu cancel job 2")
    assert "  ... 15 more in the controller-actions CSV." in text
    csv_name = "statement-2026-11-bio-controller-actions.csv"
    assert 46 == len(statement_files(bio)[csv_name].splitlines())


# ------------------------------------------------- statement = the report's account row


def add_awkward_jobs(store: Store) -> None:
    """Add jobs whose figures depend on the road.

    Across the month's end, with missing time, on two GPU models at two prices.
    """
    end = dt.datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    store.upsert_jobs(
        [
            {"job_id": 7, "user": "alice", "account": "physics", "partition": "gpu",
             "job_name": "across", "state": "COMPLETED", "submit_time": end - 7 * H - 333,
             "start_time": end - 7 * H / 3, "end_time": end + 5 * H / 7, "nodes": "gpu1",
             "gpus": 2},
            {"job_id": 8, "user": "carol", "account": "bio", "partition": "gpu",
             "job_name": "h100", "state": "COMPLETED", "submit_time": NOV + 50 * H,
             "start_time": NOV + 50 * H + 17, "end_time": NOV + 53.3 * H, "nodes": "gpu2",
             "gpus": 1},
        ]
    )  # fmt: skip
    seven = summary(7, "alice", "physics", end - 7 * H / 3, 7 / 3 + 5 / 7, "G1", 33.3)
    h100 = summary(8, "carol", "bio", NOV + 50 * H + 17, 3.3 - 17 / H, "G9", 12.5)
    store.add_summaries(
        [
            dataclasses.replace(seven, missing_seconds=1234.5, active_seconds=2222.2),
            dataclasses.replace(seven, gpu_uuid="G2", util_mean_percent=71.7, mem_gib_seconds=9e4),
            dataclasses.replace(h100, node="gpu2", gpu_model="NVIDIA H100", missing_seconds=77.7),
        ]
    )


@pytest.mark.parametrize("unit", ["gpu_hour", "gpu_mem_hour", "job_hour"])
@pytest.mark.parametrize("charge", ["held", "effective"])
def test_each_statement_total_is_its_accounts_row_of_the_report(
    store: Store, unit: str, charge: str
) -> None:
    """A statement's total is its account's row of the report, under every unit and charge.

    Figure for figure, as the monthly report mailed beside it shows it (issue 24).
    """
    add_awkward_jobs(store)
    cost = CostSettings(
        prices={"a100": 2.0, "h100": 3.7}, unit=cast(Any, unit), charge=cast(Any, charge)
    )
    e = dataclasses.replace(env(store), config=dataclasses.replace(env(store).config, cost=cost))
    report, tables = build_monthly_with_tables(e, "2026-11")
    mailed = build_statements(report, tables, ("physics", "bio"))
    figures = [k for k in USER_COLUMNS if k != "user"]
    for row in report.accounts:
        stated = mailed[str(row["key"])]
        assert {k: row[k] for k in figures} == {k: stated.total[k] for k in figures}
        assert {
            r["key"]: r["gpu_hours"] for r in report.users if row["key"] in r["account"]
        }.keys() >= {u["user"] for u in stated.users}


def test_statements_take_only_their_reports_whole_tables(store: Store) -> None:
    """The tables of another report, or of a report selected by -A, make no statement."""
    report, _ = build_monthly_with_tables(env(store), "2026-11")
    other, other_tables = build_monthly_with_tables(env(store), "2026-11")
    with pytest.raises(ValueError, match="tables their monthly report was built from"):
        build_statements(report, other_tables, ["bio"])
    selected = JobFilter(accounts=("physics",))
    physics = build_monthly_with_tables(env(store), "2026-11", filters=selected)
    with pytest.raises(ValueError, match="whole month"):
        build_statements(*physics, ["physics"])
    assert build_statements(other, other_tables, ["bio"])["bio"].total["jobs"] == 2


def test_the_command_delivers_statements_of_the_reports_rows(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report monthly --deliver`: the statements it writes are those of its report's tables."""
    slurm = FakeSlurmClient(coordinators=COORDINATORS)
    monkeypatch.setattr(App, "slurm", property(lambda _app: slurm))
    out = tmp_path / "reports" / "2026-11"
    result = run_cli(tmp_path, store, "--month", "2026-11", "--deliver", "--outbox",
                     str(tmp_path / "outbox"))  # fmt: skip
    assert 0 == result.exit_code, result.output
    written = {p.name: p.read_bytes().decode() for p in (out / "statements").iterdir()}
    as_cli = dataclasses.replace(env(store), config=Config(cluster=ClusterSettings(name="c")))
    report, tables = build_monthly_with_tables(as_cli, "2026-11")
    expected = build_statements(report, tables, COORDINATORS, owner=owner(store))
    assert 10.0 == sum(s.total["gpu_hours"] for s in expected.values())
    wanted = {n: t for s in expected.values() for n, t in statement_files(s).items()}
    assert wanted == written
