"""Who may see and do what through the CLI (#11 item 10).

`audit` and `policy backtest` show a user the rows of their own jobs, like `sacct`; the
commands that act (`exempt`, `controller`, `db`, `sync`) are refused to anyone but an
admin before any store is opened, whatever the file modes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from slurm_gpu.access import Caller
from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.models import Action, JobEvent, JobEventKind, Verdict
from slurm_gpu.store import Store

ALICE = Caller(1001, "alice")
ROOT = Caller(0, "root")
T0 = 1_790_000_000.0


def config_file(tmp_path: Path, extra: str = "") -> Path:
    """A config whose store is a SQLite file under tmp_path; Slurm is never asked."""
    path = tmp_path / "slurm-gpu.toml"
    path.write_text(
        f'[cluster]\nname = "alpha"\n[store]\nurl = "sqlite:///{tmp_path}/s.db"\n'
        f"[access]\nslurm_roles = false\n{extra}"
    )
    return path


def run(tmp_path: Path, caller: Caller, *args: str) -> Result:
    """The CLI as `caller`, on the config under tmp_path."""
    app = AppContext(config_path=tmp_path / "slurm-gpu.toml", env={}, caller=caller)
    return CliRunner().invoke(cli, list(args), obj=app)


def verdict(job_id: int, user: str, account: str, action: Action = Action.WARN) -> Verdict:
    """An idle_gpu verdict about one job."""
    return Verdict("idle_gpu", action, f"job:{job_id}", f"idle {job_id}", job_id, user, account)


@pytest.fixture
def audited(tmp_path: Path) -> Path:
    """A store whose audit log holds rows about alice's, bob's and no one's jobs.

    Job 3's row carries no user (written before the job was known): its owner, alice,
    comes from the jobs table.
    """
    config_file(tmp_path)
    with Store(f"sqlite:///{tmp_path}/s.db", cluster="alpha") as store:
        store.upgrade()
        store.upsert_jobs([{"job_id": 3, "user": "alice", "account": "physics"}])
        node = Verdict("hot_node", Action.DRAIN, "node:gpu1", "too hot", node="gpu1")
        rows = [verdict(1, "alice", "physics"), verdict(2, "bob", "bio"), verdict(3, "", ""), node]
        store.control.audit(rows, time=T0, cycle="c1", controller="h", dry_run=False, outcome="ok")
    return tmp_path


def targets(result: Result) -> list[str]:
    """The Target column of `audit --json`."""
    assert 0 == result.exit_code, result.output
    return [row["Target"] for row in json.loads(result.output)]


def test_a_user_sees_the_audit_rows_of_their_own_jobs_only(audited: Path) -> None:
    """alice reads the decisions about her jobs (3 by its owner), not bob's nor a node's."""
    assert ["job:1", "job:3"] == targets(run(audited, ALICE, "audit", "--json"))


def test_asking_for_another_users_rows_shows_nothing(audited: Path) -> None:
    """`audit -u bob` as alice: the filter narrows her scope, it never widens it."""
    assert [] == targets(run(audited, ALICE, "audit", "-u", "bob", "--json"))


def test_an_admin_sees_every_audit_row(audited: Path) -> None:
    """root and [access] admins see all rows, the node's included."""
    every = ["job:1", "job:2", "job:3", "node:gpu1"]
    assert every == targets(run(audited, ROOT, "audit", "--json"))
    config_file(audited, 'admins = ["alice"]\n')
    assert every == targets(run(audited, ALICE, "audit", "--json"))


def test_backtest_replays_only_the_callers_jobs(tmp_path: Path) -> None:
    """Two jobs past max_runtime: alice's backtest lists hers; root's lists both."""
    config_file(tmp_path, '[policy.max_runtime]\ndefault = "1h"\nwarn_before = "10m"\n')
    with Store(f"sqlite:///{tmp_path}/s.db", cluster="alpha") as store:
        store.upgrade()
        for job_id, user in ((11, "alice"), (12, "bob")):
            started = JobEventKind.STARTED
            store.add_events(
                [
                    JobEvent("gpu1", job_id, started, T0, user, 1, "phys", "gpu", (job_id - 11,)),
                    JobEvent("gpu1", job_id, JobEventKind.ENDED, T0 + 7200, exit_code=0),
                ]
            )
    since, until = (time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) for t in (T0, T0 + 9000))
    period = ["policy", "backtest", "-S", since, "-E", until, "--json"]

    def cancelled(caller: Caller) -> list[int]:
        result = run(tmp_path, caller, *period)
        assert 0 == result.exit_code, result.output
        return sorted(json.loads(result.output)["policies"]["max_runtime"]["cancelled"])

    assert ([11], [11, 12]) == (cancelled(ALICE), cancelled(ROOT))


@pytest.mark.parametrize(
    "args",
    [
        ["exempt", "2", "--for", "1h", "--reason", "mine now"],
        ["db", "upgrade"],
        ["db", "current"],
        ["controller", "run", "--once", "--dry-run"],
        ["sync"],
    ],
)
def test_acting_commands_are_refused_to_a_user_before_the_store_is_opened(
    tmp_path: Path, args: list[str]
) -> None:
    """Exit 2, "for administrators"; the store alice could write is never opened."""
    config_file(tmp_path)
    result = run(tmp_path, ALICE, *args)
    assert (2, False) == (result.exit_code, (tmp_path / "s.db").exists())
    assert f"slurm-gpu: {args[0]}: for administrators (" in result.stderr
    assert "alice (uid 1001) is none of them" in result.stderr


def test_db_with_an_explicit_url_is_refused_too(tmp_path: Path) -> None:
    """`db upgrade --url` names a store alice could write: still refused, never created."""
    config_file(tmp_path)
    url = f"sqlite:///{tmp_path / 'mine.db'}"
    result = run(tmp_path, ALICE, "db", "upgrade", "--url", url)
    assert (2, False) == (result.exit_code, (tmp_path / "mine.db").exists())


def test_an_admin_may_exempt(tmp_path: Path) -> None:
    """root's `exempt` writes the exemption; so does a user named in [access] admins."""
    config_file(tmp_path, 'admins = ["alice"]\n')
    assert 0 == run(tmp_path, ROOT, "db", "upgrade").exit_code
    result = run(tmp_path, ALICE, "exempt", "2", "--for", "1h", "--reason", "ok")
    with Store(f"sqlite:///{tmp_path}/s.db", cluster="alpha") as store:
        assert (0, ["2"]) == (result.exit_code, [e.target for e in store.control.exemptions()])


def test_help_of_an_acting_command_needs_no_admin(tmp_path: Path) -> None:
    """`exempt --help` is shown to anyone: the check comes when the command runs."""
    result = run(tmp_path, ALICE, "exempt", "--help")
    assert (0, True) == (result.exit_code, "Exempt a job" in result.output)
