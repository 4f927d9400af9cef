"""`slurm-gpu db check`: the store's invariants, as an admin reads them (issue 25 item 3).

A real SQLite store (the `store` fixture, cluster "c") and Slurm's sacct as a script in
[slurm] bin_dir that prints sacct's own record format and notes how it was called, as
tests/unit/test_cli_sacct_text.py does: the command runs the real Slurm runner and parser.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from slurm_gpu.access import Caller
from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.models import GpuInterval, JobGpuSummary
from slurm_gpu.slurm.sacct import DELIMITER, FIELDS
from slurm_gpu.slurm.timespec import format_sacct_time as at
from slurm_gpu.store import Store

T0 = 1_790_000_000.0


def interval(slot: str, start: float, end: float, job_id: int | None) -> GpuInterval:
    """A whole-GPU interval of gpu1's `slot` (its UUID) for `job_id`."""
    return GpuInterval(
        node="gpu1",
        gpu_uuid=slot,
        period_start=start,
        period_end=end,
        job_id=job_id,
        util_mean_percent=50.0,
        util_max_percent=60.0,
        util_min_percent=40.0,
        util_sample_count=6,
        active_seconds=30.0,
        covered_seconds=60.0,
        mem_used_max_bytes=1 << 30,
        mem_total_bytes=80 << 30,
        power_mean_watts=100.0,
        energy_joules=6000.0,
        temperature_max_celsius=60.0,
        ecc_errors_total=0,
    )


def summary(job_id: int, start: float, end: float) -> JobGpuSummary:
    """A finished job's summary of gpu1's GPU-1."""
    return JobGpuSummary(
        job_id=job_id,
        node="gpu1",
        gpu_uuid="GPU-1",
        gpu_model="A100",
        start=start,
        end=end,
        gpu_seconds=end - start,
        util_mean_percent=50.0,
        util_max_percent=60.0,
        active_seconds=(end - start) / 2,
        mem_max_bytes=1 << 30,
        mem_gib_seconds=end - start,
        energy_joules=6000.0,
        reading_count=6,
        missing_seconds=0.0,
        user="alice",
        account="physics",
        partition="gpu",
    )


def sacct_record(job_id: int, state: str, start: float, end: float | None) -> str:
    """One `sacct -P -X -o <FIELDS>` record, as Slurm prints it."""
    values = {name: "" for name in FIELDS}
    values.update(
        JobID=str(job_id),
        JobIDRaw=str(job_id),
        User="alice",
        Account="physics",
        Partition="gpu",
        QOS="normal",
        State=state,
        Submit=at(start),
        Start=at(start),
        End="Unknown" if end is None else at(end),
        Elapsed="00:10:00",
        Timelimit="1-00:00:00",
        NodeList="gpu1",
        AllocTRES="cpu=1,gres/gpu=1",
        ExitCode="0:0",
        JobName="train",
    )
    return DELIMITER.join(values[name] for name in FIELDS)


@pytest.fixture
def store(store: Store) -> Store:
    """A clean store: job 11 ended, job 12 running.

    Job 11 has two intervals back to back and its summary; job 12 one interval so far,
    on another GPU.
    """
    store.upsert_jobs(
        [
            {"job_id": 11, "state": "COMPLETED", "start_time": T0, "end_time": T0 + 120},
            {"job_id": 12, "state": "RUNNING", "start_time": T0},
        ]
    )
    store.add_intervals(
        [
            interval("GPU-1", T0, T0 + 60, 11),
            interval("GPU-1", T0 + 60, T0 + 120, 11),
            interval("GPU-2", T0, T0 + 60, 12),
        ]
    )
    store.add_summaries([summary(11, T0, T0 + 120)])
    return store


def broken(store: Store) -> None:
    """Add one of each finding to the clean store.

    Job 13 ships an interval on GPU-1 that starts 30 s before job 11's second one ends;
    job 12 ships one that ends a minute before it starts; job 14 is RUNNING in the store
    and COMPLETED in Slurm; job 99 has a summary and no jobs row.
    """
    store.upsert_jobs([{"job_id": 14, "state": "RUNNING", "start_time": T0 + 100}])
    store.add_intervals(
        [interval("GPU-1", T0 + 90, T0 + 150, 13), interval("GPU-2", T0 + 300, T0 + 240, 12)]
    )
    store.add_summaries([summary(99, T0 + 1000, T0 + 1600)])


SACCT = [
    sacct_record(12, "RUNNING", T0, None),
    sacct_record(14, "COMPLETED", T0 + 100, T0 + 600),
]


def db_check(tmp_path: Path, *args: str, sacct: list[str] | None = SACCT) -> Result:
    """`slurm-gpu db check ARGS` as root; sacct prints `sacct` (None: no sacct at all)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if sacct is not None:
        (tmp_path / "sacct.out").write_text("".join(f"{line}\n" for line in sacct))
        script = bin_dir / "sacct"
        script.write_text(
            f"#!/bin/sh\necho \"$*\" >> '{tmp_path / 'sacct.calls'}'\n"
            f"exec cat '{tmp_path / 'sacct.out'}'\n"
        )
        script.chmod(0o755)
    config = tmp_path / "slurm-gpu.toml"
    config.write_text(
        f'[cluster]\nname = "c"\n[store]\nurl = "sqlite:///{tmp_path / "store.db"}"\n'
        f'[slurm]\nbin_dir = "{bin_dir}"\n'
    )
    app = AppContext(config_path=config, env={}, caller=Caller(0, "root"))
    return CliRunner().invoke(cli, ["db", "check", *args], obj=app)


def test_a_clean_store_prints_none_per_check_and_exits_0(tmp_path: Path, store: Store) -> None:
    """Every check says `none`, the last line `clean`; exit 0."""
    result = db_check(tmp_path)
    expected = (
        "overlapping-intervals: none\n"
        "negative-intervals: none\n"
        "ended-in-slurm: none of 1 open job of cluster c ended in Slurm\n"
        "summaries-without-job: none\n"
        f"{store.where}: clean\n"
    )
    assert (0, expected) == (result.exit_code, result.output)


def test_each_finding_is_one_line_and_the_check_exits_1(tmp_path: Path, store: Store) -> None:
    """Overlap, negative interval, job ended in Slurm, orphan summary: a line each."""
    broken(store)
    result = db_check(tmp_path)
    expected = (
        "overlapping-intervals: node gpu1 slot GPU-1: job 13 from "
        f"{at(T0 + 90)} to {at(T0 + 150)} overlaps job 11 from {at(T0 + 60)} to "
        f"{at(T0 + 120)} by 30s\n"
        "overlapping-intervals: node gpu1 slot GPU-1: 1 interval overlaps an earlier one\n"
        "overlapping-intervals: 1 interval on 1 slot overlaps an earlier one of the same"
        " slot: that time is counted twice\n"
        f"negative-intervals: node gpu1 slot GPU-2: job 12 from {at(T0 + 300)} to "
        f"{at(T0 + 240)} ends 60s before it starts\n"
        "negative-intervals: 1 interval ends before it starts\n"
        f"ended-in-slurm: job 14: store RUNNING since {at(T0 + 100)}, Slurm COMPLETED at "
        f"{at(T0 + 600)}\n"
        "ended-in-slurm: 1 of 2 open jobs of cluster c ended in Slurm: "
        f"`slurm-gpu sync -S {at(T0 + 600)}` closes them\n"
        f"summaries-without-job: job 99 (cluster c): 1 GPU summary from {at(T0 + 1000)} to "
        f"{at(T0 + 1600)}, no jobs row\n"
        "summaries-without-job: 1 job with GPU summaries but no jobs row: reports never"
        f" count them; `slurm-gpu sync -S {at(T0 + 1000)}` adds the ones sacct still knows\n"
        f"{store.where}: 4 findings in 4 checks\n"
    )
    assert (1, expected) == (result.exit_code, result.output)


def test_sacct_is_asked_about_the_open_jobs_only(tmp_path: Path, store: Store) -> None:
    """One `sacct -j` names the jobs with no end time (12, 14), not the ended job 11."""
    broken(store)
    db_check(tmp_path)
    calls = (tmp_path / "sacct.calls").read_text().splitlines()
    assert 1 == len(calls)
    assert "-j 12,14" in calls[0]


def test_without_sacct_the_slurm_check_is_not_checked_never_clean(
    tmp_path: Path, store: Store
) -> None:
    """No sacct in bin_dir: `not checked: <why>`, the summary says so, exit 1."""
    result = db_check(tmp_path, sacct=None)
    lines = result.output.splitlines()
    assert 1 == result.exit_code
    missing = f"cannot run {tmp_path / 'bin' / 'sacct'}: No such file or directory"
    assert f"ended-in-slurm: not checked: {missing}" == lines[2]
    assert f"{store.where}: not checked: ended-in-slurm" == lines[-1]


def test_no_slurm_skips_the_sacct_check_without_failing(tmp_path: Path, store: Store) -> None:
    """--no-slurm: the check says it was skipped, the others ran clean: exit 0."""
    result = db_check(tmp_path, "--no-slurm", sacct=None)
    lines = result.output.splitlines()
    assert (0, "ended-in-slurm: not checked: skipped (--no-slurm)") == (result.exit_code, lines[2])
    assert f"{store.where}: clean (3 of 4 checks ran)" == lines[-1]


def test_limit_lists_the_first_findings_and_counts_the_rest(tmp_path: Path, store: Store) -> None:
    """--limit 1 with three overlaps on GPU-1: one listed, three counted."""
    store.add_intervals(
        [interval("GPU-1", T0 + 30, T0 + 40, 13), interval("GPU-1", T0 + 100, T0 + 110, 13)]
    )
    broken(store)
    result = db_check(tmp_path, "--limit", "1")
    overlap_lines = [line for line in result.output.splitlines() if "overlap" in line]
    assert 3 == len(overlap_lines)  # one overlap, one slot, the check's own line
    assert overlap_lines[-1] == (
        "overlapping-intervals: 3 intervals on 1 slot overlap an earlier one of the same"
        " slot (first 1 listed): that time is counted twice"
    )


def test_json_gives_every_check_with_its_findings(tmp_path: Path, store: Store) -> None:
    """--json: one object per check, times as POSIX seconds; exit 1 as in text."""
    broken(store)
    result = db_check(tmp_path, "--json")
    document = json.loads(result.output)
    checks = {c["check"]: c for c in document["checks"]}
    assert (1, False, store.where) == (result.exit_code, document["clean"], document["store"])
    assert {
        "overlapping-intervals": 1,
        "negative-intervals": 1,
        "ended-in-slurm": 1,
        "summaries-without-job": 1,
    } == {name: c["found"] for name, c in checks.items()}
    overlap = checks["overlapping-intervals"]["findings"][0]
    assert (13, T0 + 90, 11, 30.0) == (
        overlap["interval"]["job_id"],
        overlap["interval"]["period_start"],
        overlap["previous"]["job_id"],
        overlap["overlap_seconds"],
    )
    ended = checks["ended-in-slurm"]
    assert (14, "RUNNING", "COMPLETED", T0 + 600) == tuple(
        ended["findings"][0][k] for k in ("job_id", "store_state", "slurm_state", "slurm_end_time")
    )
    assert f"slurm-gpu sync -S {at(T0 + 600)}" == ended["fix"]


def test_a_job_still_running_in_slurm_is_no_finding(tmp_path: Path, store: Store) -> None:
    """Job 14 open in the store and RUNNING in sacct (End Unknown): nothing to report."""
    store.upsert_jobs([{"job_id": 14, "state": "RUNNING", "start_time": T0 + 100}])
    running = [sacct_record(12, "RUNNING", T0, None), sacct_record(14, "RUNNING", T0, None)]
    result = db_check(tmp_path, sacct=running)
    assert (0, "ended-in-slurm: none of 2 open jobs of cluster c ended in Slurm") == (
        result.exit_code,
        result.output.splitlines()[2],
    )


def test_a_negative_limit_is_a_usage_error(tmp_path: Path, store: Store) -> None:
    """`--limit -1` exits 2 naming the option."""
    result = db_check(tmp_path, "--limit", "-1")
    assert (2, True) == (result.exit_code, "--limit" in result.output)
