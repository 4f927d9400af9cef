"""Who may see and do what, as alice, through the venv's plain console script (#11 item 10).

The store here is a SQLite file that alice owns and may write: file modes are on her
side, so only slurm-gpu's own rules stand between her and other users' records. Its
audit log and job history hold rows about alice's and bob's jobs (made-up ids: neither
command asks Slurm about them); Slurm's roles come from the test bed's sacctmgr.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.models import Action, JobEvent, JobEventKind, Verdict
from slurm_gpu.store import Store
from tests.integration.testbed import TestBed

pytestmark = pytest.mark.slurm
CLI = str(Path(os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin" / "slurm-gpu")
ALICE_JOB, BOB_JOB = 990_000_001, 990_000_002  # far above the test bed's job ids
T0 = time.time() - 3 * 3600


@pytest.fixture(scope="module")
def alices_store(testbed: TestBed) -> Iterator[dict[str, Any]]:
    """A config (readable by alice) over a SQLite store in a folder alice owns."""
    base = testbed.jobs_dir / f"caller-rules-{os.getpid()}"
    base.mkdir(mode=0o755)
    url = f"sqlite:///{base / 'store.db'}"
    text = Path(testbed.env["SLURM_GPU_CONFIG"]).read_text()
    config = base / "slurm-gpu.toml"
    config.write_text(
        text.replace(text.split("[store]")[1].split("\n")[1], f'url = "{url}"')
        + '\n[policy.max_runtime]\ndefault = "1h"\nwarn_before = "10m"\n'
    )
    with Store(url, cluster="testbed") as store:
        store.upgrade()
        for job_id, user, account in ((ALICE_JOB, "alice", "physics"), (BOB_JOB, "bob", "bio")):
            store.add_events(
                [
                    JobEvent("gpu1", job_id, JobEventKind.STARTED, T0, user, None, account, "gpu",
                             (0,)),
                    JobEvent("gpu1", job_id, JobEventKind.ENDED, T0 + 7200, exit_code=0),
                ]
            )  # fmt: skip
            verdict = Verdict(
                "max_runtime", Action.CANCEL, f"job:{job_id}", "ran past 1h", job_id, user, account
            )
            store.control.audit(
                [verdict], time=T0 + 3600, cycle="c", controller="t", dry_run=False, outcome="done"
            )
    for path in (base, *base.iterdir()):
        os.chown(path, 1001, 1001)  # alice's, uid and gid as the test bed makes them
    try:
        yield {"base": base, "config": config, "url": url}
    finally:
        shutil.rmtree(base)


def as_alice(testbed: TestBed, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The venv's console script as alice, on `config`."""
    keep = "SLURM_CONF,PATH,LD_LIBRARY_PATH"
    argv = ["runuser", "-u", "alice", f"--whitelist-environment={keep}", "--", CLI]
    return subprocess.run(
        [*argv, "--config", str(config), *args],
        env=testbed.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_audit_shows_alice_the_rows_of_her_jobs_only(
    testbed: TestBed, alices_store: dict[str, Any]
) -> None:
    """`audit` as alice: the cancellation of her job, not bob's."""
    done = as_alice(testbed, alices_store["config"], "audit", "--json")
    assert 0 == done.returncode, done.stderr
    rows = json.loads(done.stdout)
    assert [(f"job:{ALICE_JOB}", "alice")] == [(r["Target"], r["User"]) for r in rows]


def test_backtest_replays_alices_jobs_only(testbed: TestBed, alices_store: dict[str, Any]) -> None:
    """`policy backtest` as alice: her 2-hour job passes max_runtime, bob's is not listed."""
    since, until = (time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) for t in (T0, T0 + 9000))
    done = as_alice(
        testbed, alices_store["config"], "policy", "backtest", "-S", since, "-E", until, "--json"
    )
    assert 0 == done.returncode, done.stderr
    result = json.loads(done.stdout)
    assert (1, [ALICE_JOB]) == (result["jobs"], result["policies"]["max_runtime"]["cancelled"])


@pytest.mark.parametrize(
    "args",
    [
        ["exempt", str(BOB_JOB), "--for", "1d", "--reason", "mine now"],
        ["db", "upgrade", "--url", "sqlite:///{base}/new.db"],
        ["sync", "-S", "now-1hours"],
        ["controller", "run", "--once", "--dry-run"],
    ],
)
def test_acting_commands_are_refused_to_alice_whatever_the_file_modes(
    testbed: TestBed, alices_store: dict[str, Any], args: list[str]
) -> None:
    """exit 2 "for administrators", before any store is opened: nothing changes in it."""
    store_file = alices_store["base"] / "store.db"
    before = store_file.stat().st_mtime_ns
    argv = [a.format(base=alices_store["base"]) for a in args]
    done = as_alice(testbed, alices_store["config"], *argv)
    assert (2, True) == (done.returncode, f"{args[0]}: for administrators" in done.stderr), (
        done.stdout + done.stderr
    )
    assert not (alices_store["base"] / "new.db").exists()
    assert before == store_file.stat().st_mtime_ns
    with Store(alices_store["url"], cluster="testbed") as store:
        assert [] == store.control.exemptions()
