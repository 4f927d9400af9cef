"""sacct / report / job / status on the test bed, against a workload of known jobs.

Ground truth comes from the workload itself (users, accounts, GPUs, target utilization)
and from Slurm's own sacct (Elapsed, Submit, Start). The test bed is shared: other jobs
of the same users may run at the same time, so per-job figures are checked on our job
ids, and report totals against the sum of `slurm-gpu sacct` over the same period.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.store import Store
from tests.integration.testbed import TestBed

INTERVAL = 5.0  # node.interval in the test bed's slurm-gpu.toml
PRICES = {"a100": 3.6, "h100": 7.2}  # per GPU-hour: a cent is 10 s of an A100
CLI = str(Path(os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin" / "slurm-gpu")
WORKLOAD = {
    # name: (user, account, gpus, gpu-load args, target utilization)
    "busy": ("alice", "physics", 2, ["--util", "70", "--mem", "20480", "--seconds", "30"], 70.0),
    "idle": ("bob", "bio", 1, ["--pattern", "idle", "--seconds", "25"], 0.0),
    "half": ("carol", "physics", 1, ["--util", "40", "--seconds", "20"], 40.0),
}


@pytest.fixture(scope="module")
def config_file(testbed: TestBed) -> Iterator[Path]:
    """The test bed's config plus [cost] prices, readable by alice and carol.

    In the test bed's world-readable jobs folder: pytest's own tmp folders are 0700.
    """
    base = Path(testbed.env["SLURM_GPU_CONFIG"]).read_text()
    path = testbed.jobs_dir / f"slurm-gpu-reports-{os.getpid()}.toml"
    prices = ", ".join(f"{k} = {v}" for k, v in PRICES.items())
    path.write_text(base + f'\n[cost]\ncurrency = "EUR"\nprices = {{ {prices} }}\n')
    path.chmod(0o644)
    yield path
    path.unlink(missing_ok=True)


def wait_summaries(store: Store, job_id: int, gpus: int, timeout: float = 120) -> None:
    """Polls until the job's per-GPU summaries have all arrived."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(store.job_summaries(job_id)) >= gpus:
            return
        time.sleep(1)
    raise AssertionError(f"job {job_id}: GPU summaries missing from the store")


@pytest.fixture(scope="module")
def workload(testbed: TestBed, store: Store) -> Iterator[dict[str, Any]]:
    """Submits the workload, waits for it to end and be recorded; yields ids and truth."""
    started = time.time() - 2
    jobs: dict[str, int] = {}
    try:
        for name, (user, account, gpus, args, _) in WORKLOAD.items():
            jobs[name] = testbed.submit(
                user,
                f"--gres=gpu:{gpus}",
                "-A",
                account,
                "-p",
                "gpu",
                f"--job-name=rep-{name}",
                wrap=testbed.gpu_load(*args),
            )
        for name, job_id in jobs.items():
            testbed.wait_done(job_id, timeout=600)
            wait_summaries(store, job_id, WORKLOAD[name][2])
        truth = {}
        for name, job_id in jobs.items():
            row = testbed.sacct(job_id, "Elapsed,Submit,Start,End,AllocTRES,State")
            truth[name] = row
        yield {"jobs": jobs, "truth": truth, "since": started, "until": time.time() + 1}
    finally:
        if jobs:
            testbed.run("scancel", *map(str, jobs.values()), check=False)


def cli(testbed: TestBed, config: Path, *args: str, user: str | None = None) -> str:
    """Runs slurm-gpu as `user` (root when None); returns stdout, fails on exit != 0."""
    argv = [CLI, "--config", str(config), *args]
    if user is not None:
        keep = "SLURM_CONF,PATH,LD_LIBRARY_PATH"
        argv = ["runuser", "-u", user, f"--whitelist-environment={keep}", "--", *argv]
    done = subprocess.run(argv, env=testbed.env, capture_output=True, text=True, timeout=120)
    assert 0 == done.returncode, done.stderr
    return done.stdout


def seconds(text: str) -> float:
    days, _, hms = text.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def sacct_json(
    testbed: TestBed, config: Path, workload: dict[str, Any], *extra: str, user: str | None = None
) -> dict[int, dict[str, Any]]:
    ids = ",".join(str(j) for j in workload["jobs"].values())
    out = cli(
        testbed,
        config,
        "sacct",
        "-a",
        "-j",
        ids,
        "--json",
        "-o",
        "JobIDRaw,User,Account,AllocGPUs,GPUModel,GPUHours,GPUUtilAvg,IdleGPUHours,"
        "GPUMemMax,GPUMemHours,EnergyKWh,Cost,QueueWaitRaw,ElapsedRaw,State",
        *extra,
        user=user,
    )
    return {int(r["JobIDRaw"]): r for r in json.loads(out)}


def price(model: str) -> float:
    return next(v for k, v in PRICES.items() if k in model.lower())


def test_sacct_matches_the_workload(
    testbed: TestBed, config_file: Path, workload: dict[str, Any]
) -> None:
    """Each job's figures agree with Slurm's and the simulated load's.

    GPU-hours within an agent interval, utilization within 3 points, cost to the cent,
    queue wait within a second of sacct's Start - Submit.
    """
    rows = sacct_json(testbed, config_file, workload)
    for name, job_id in workload["jobs"].items():
        user, account, gpus, _, util = WORKLOAD[name]
        row, truth = rows[job_id], workload["truth"][name]
        assert (user, account, gpus) == (row["User"], row["Account"], row["AllocGPUs"])
        truth_hours = gpus * seconds(truth["Elapsed"]) / 3600
        assert abs(row["GPUHours"] - truth_hours) <= gpus * INTERVAL / 3600, name
        assert abs(row["GPUUtilAvg"] - util) <= 3.0, name
        expected_cost = price(row["GPUModel"]) * truth_hours
        tolerance = 0.01 + price(row["GPUModel"]) * gpus * INTERVAL / 3600
        assert abs(row["Cost"] - expected_cost) <= tolerance, name
        submit = dt.datetime.fromisoformat(truth["Submit"]).timestamp()
        start = dt.datetime.fromisoformat(truth["Start"]).timestamp()
        assert abs(row["QueueWaitRaw"] - (start - submit)) <= 1.0, name
    assert rows[workload["jobs"]["idle"]]["IdleGPUHours"] == pytest.approx(
        rows[workload["jobs"]["idle"]]["GPUHours"], abs=INTERVAL / 3600
    )
    assert rows[workload["jobs"]["busy"]]["GPUMemMax"] == pytest.approx(20.0, abs=0.01)


def test_sacct_parsable_matches_slurm(
    testbed: TestBed, config_file: Path, workload: dict[str, Any]
) -> None:
    """-P for sacct's own fields is byte for byte what sacct -P prints."""
    ids = ",".join(str(j) for j in workload["jobs"].values())
    fields = "JobID,JobName,User,Account,Partition,State,Elapsed,Submit,Start,End"
    ours = cli(testbed, config_file, "sacct", "-a", "-j", ids, "-P", "-o", fields)
    theirs = testbed.run("sacct", "-a", "-X", "-j", ids, "-P", "-o", fields).stdout
    assert sorted(theirs.splitlines()) == sorted(ours.splitlines())


def test_report_totals(testbed: TestBed, config_file: Path, workload: dict[str, Any]) -> None:
    """report users/accounts/cluster sum what sacct lists for the same finished period."""
    since = dt.datetime.fromtimestamp(workload["since"]).strftime("%Y-%m-%dT%H:%M:%S")
    until = dt.datetime.fromtimestamp(workload["until"]).strftime("%Y-%m-%dT%H:%M:%S")
    ours = sacct_json(testbed, config_file, workload)
    report = json.loads(
        cli(testbed, config_file, "report", "users", "-S", since, "-E", until, "--json")
    )
    by_user = {r["User"]: r for r in report["rows"]}
    for name, job_id in workload["jobs"].items():
        user = WORKLOAD[name][0]
        # Our job lies wholly inside the period: its user's total holds all of it.
        assert by_user[user]["GPUHours"] >= ours[job_id]["GPUHours"] - 1e-4
        assert by_user[user]["Cost"] >= ours[job_id]["Cost"] - 0.01
    total = report["total"]
    assert sum(r["GPUHours"] for r in report["rows"]) == pytest.approx(total["GPUHours"], abs=1e-3)
    assert sum(r["Cost"] for r in report["rows"]) == pytest.approx(total["Cost"], abs=0.02)
    cluster = json.loads(
        cli(testbed, config_file, "report", "cluster", "-S", since, "-E", until, "--json")
    )
    # Other developers' running jobs may grow between two calls: compare with our jobs.
    our_hours = sum(ours[j]["GPUHours"] for j in workload["jobs"].values())
    assert cluster["total"]["GPUHours"] >= our_hours - 1e-4
    accounts = json.loads(
        cli(testbed, config_file, "report", "accounts", "-S", since, "-E", until, "--json")
    )
    physics = {r["Account"]: r for r in accounts["rows"]}["physics"]
    jobs = workload["jobs"]
    assert (
        physics["GPUHours"]
        >= ours[jobs["busy"]]["GPUHours"] + ours[jobs["half"]]["GPUHours"] - 1e-4
    )
    assert [w["User"] for w in cluster["top_waste"]]  # bob's idle job is waste
    nodes = json.loads(
        cli(testbed, config_file, "report", "nodes", "-S", since, "-E", until, "--json")
    )
    assert {"gpu1", "gpu2"} <= {r["Node"] for r in nodes["rows"]}


def test_job_view(testbed: TestBed, config_file: Path, workload: dict[str, Any]) -> None:
    """`slurm-gpu job` shows every GPU and says the idle job wasted its GPU."""
    busy = cli(testbed, config_file, "job", str(workload["jobs"]["busy"]))
    assert 2 == busy.count("20.0/80 GiB")
    idle = json.loads(cli(testbed, config_file, "job", str(workload["jobs"]["idle"]), "--json"))
    assert any("idle" in n for n in idle["notes"])
    assert abs(idle["job"]["util_mean_percent"]) <= 3.0


def test_status_runs(testbed: TestBed, config_file: Path) -> None:
    """status adds up: allocated + free = total, per node and overall."""
    status = json.loads(cli(testbed, config_file, "status", "--json"))
    assert 8 == status["gpus"]
    assert status["gpus"] == status["alloc"] + status["free"]


def test_privacy(testbed: TestBed, config_file: Path, workload: dict[str, Any]) -> None:
    """alice sees only alice's jobs; carol as physics coordinator sees physics; root all."""
    jobs = workload["jobs"]
    as_alice = sacct_json(testbed, config_file, workload, user="alice")
    assert {jobs["busy"]} == set(as_alice)
    report = json.loads(
        cli(testbed, config_file, "report", "users", "--json", "-S", "now-1days", user="alice")
    )
    assert {"alice"} >= {r["User"] for r in report["rows"]}
    as_carol = sacct_json(testbed, config_file, workload, user="carol")
    assert {jobs["half"]} == set(as_carol)
    testbed.run("sacctmgr", "-i", "add", "coordinator", "account=physics", "names=carol")
    try:
        as_coordinator = sacct_json(testbed, config_file, workload, user="carol")
        assert {jobs["busy"], jobs["half"]} == set(as_coordinator)
    finally:
        testbed.run("sacctmgr", "-i", "remove", "coordinator", "account=physics", "names=carol")
    assert set(jobs.values()) == set(sacct_json(testbed, config_file, workload))
    denied = subprocess.run(
        [
            "runuser",
            "-u",
            "alice",
            "--",
            CLI,
            "--config",
            str(config_file),
            "job",
            str(jobs["idle"]),
        ],
        env=testbed.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert 1 == denied.returncode
    assert "that you may see" in denied.stderr
