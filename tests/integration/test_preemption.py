"""Preemption in REQUEUE, CANCEL and SUSPEND modes, on the test bed (issue 25 item 2).

The bed preempts by QOS only (templates/slurm.conf.in, lib.sh bootstrap_preempt_qos):
jobs of QOS preempt-requeue, preempt-cancel and preempt-suspend are preempted, each in its
own mode, by jobs of QOS urgent; nothing preempts QOS normal. Side by side:

- gpu2: a busy 2-GPU job that Slurm may requeue and a busy 2-GPU job that it cancels; an
  urgent 4-GPU job on gpu2 preempts both at once. The requeued job runs again once
  Slurm's hold on it (BeginTime, about 2 minutes on 22.05) is over, shorter this time.
- gpu1: a busy 2-GPU job holding all of gpu1's free CPUs, suspended by an urgent 1-GPU job
  of partition debug (a higher PriorityTier: in the same partition preempt/qos does not
  suspend). A suspended job keeps its GRES (slurm.conf(5) PreemptMode: "Suspended jobs
  will not release GRES"), so a job short of GPUs cannot suspend a GPU job: only one short
  of CPUs can. The gang scheduler resumes the job when its preemptor ends. A controller
  with a short idle policy runs meanwhile: the suspended job's GPUs sit idle (its
  processes are stopped), and it must be neither warned nor cancelled.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa

from slurm_gpu.models import JobGpuSummary
from slurm_gpu.slurm.admin_comment import parse_token
from slurm_gpu.slurm.squeue import parse_slurm_time
from slurm_gpu.store import Store
from slurm_gpu.store.schema import gpu_intervals
from tests.integration.controlbed import audit_of, controllers, slurm_gpu, write_config
from tests.integration.testbed import TestBed, wait_for, wait_summaries
from tests.receivers import smtp_receiver

pytestmark = pytest.mark.slurm

# The requeued job's first run is long (it is preempted); its second, short.
RERUN = '$([ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && echo 10 || echo 300)'
SPIKY = ("--pattern", "spiky", "--util", "70", "--period", "20", "--duty", "0.75")
SUSPENDED_FOR = 45  # the SUSPEND preemptor's run: longer than the idle policy's cancel_after


def free_cpus(testbed: TestBed, node: str) -> int:
    """CPUs of `node` no job holds (a suspended job's are free: scontrol(1) resume)."""
    fields = dict(
        token.split("=", 1)
        for token in testbed.run("scontrol", "-o", "show", "node", node).stdout.split()
        if "=" in token
    )
    return int(fields["CPUTot"]) - int(fields["CPUAlloc"])


def intervals(store: Store, job: int) -> list[tuple[str, float, float, float | None]]:
    """(gpu_uuid, period_start, covered_seconds, util_mean_percent) of the job, in time order."""
    t = gpu_intervals.c
    query = (
        sa.select(t.gpu_uuid, t.period_start, t.covered_seconds, t.util_mean_percent)
        .where(t.job_id == job)
        .order_by(t.period_start, t.gpu_uuid)
    )
    with store.reading("test") as conn:
        return [(r[0], r[1], r[2], r[3]) for r in conn.execute(query)]


def covered_between(store: Store, job: int, since: float, until: float) -> float:
    """The job's covered GPU-seconds in intervals that begin in [since, until)."""
    return sum(c for _u, start, c, _m in intervals(store, job) if since <= start < until)


def slurm_records(testbed: TestBed, job: int) -> list[dict[str, str]]:
    """Every run of the job as `sacct -D -X` keeps it, oldest first."""
    fields = ["Start", "End", "State", "Suspended", "Elapsed"]
    out = testbed.run(
        "sacct", "-D", "-X", "-n", "-P", "-j", str(job), "-o", ",".join(fields)
    ).stdout
    return [dict(zip(fields, line.split("|"), strict=True)) for line in out.split()]


def seconds(duration: str) -> int:
    """sacct's [D-]HH:MM:SS as seconds."""
    days, _, clock = duration.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def times(record: dict[str, str]) -> tuple[float, float]:
    start, end = parse_slurm_time(record["Start"]), parse_slurm_time(record["End"])
    assert start is not None and end is not None, record
    return start, end


def run_rows(rows: list[JobGpuSummary], restart: int) -> list[JobGpuSummary]:
    return [r for r in rows if r.restart == restart]


@pytest.fixture(scope="module")
def preemption(testbed: TestBed, store: Store) -> Any:
    busy = testbed.gpu_load
    low: dict[str, int] = {}
    urgent: dict[str, int] = {}
    seen: dict[str, set[str]] = {"suspend": set(), "urgent_suspend": set()}
    with smtp_receiver() as (port, _inbox):
        config = write_config(testbed, "preemption", smtp_port=port)
        # Only the jobs of this module: a job of QOS normal on the bed is none of its business.
        text = config.read_text().replace(
            'exempt_partitions = ["debug"]',
            'exempt_partitions = ["debug"]\nexempt_qos = ["normal"]',
        )
        config.write_text(text)
        try:
            low["requeue"] = testbed.submit(
                "alice",
                *("-w", "gpu2", "--gres=gpu:2", "--requeue", "--qos=preempt-requeue"),
                wrap=busy("--util", "90", "--seconds", RERUN),
            )
            low["cancel"] = testbed.submit(
                "bob",
                *("-w", "gpu2", "--gres=gpu:2", "--qos=preempt-cancel"),
                wrap=busy("--util", "80", "--seconds", "300"),
            )
            low["suspend"] = testbed.submit(
                "carol",
                *("-A", "physics", "-w", "gpu1", "--gres=gpu:2", "--qos=preempt-suspend"),
                f"--cpus-per-task={free_cpus(testbed, 'gpu1')}",
                # --seconds counts unpaused time: about 13 s before, 22 s after the pause.
                # Busy 15 s of every 20: idle 5 s at most of its own, suspension left out;
                # with the agent's tick and shipping (up to some 7 s) still under warn_after.
                wrap=busy(*SPIKY, "--seconds", "35"),
            )
            for job in low.values():
                testbed.wait_state(job, {"RUNNING"}, timeout=60)
            gpus = {name: testbed.job_gpus(job) for name, job in low.items()}
            time.sleep(11)  # two ticks of readings
            with controllers(testbed, config):
                urgent["suspend"] = testbed.submit(
                    "bob",
                    *("-p", "debug", "-w", "gpu1", "--gres=gpu:1", "--qos=urgent"),
                    wrap=busy("--util", "40", "--seconds", str(SUSPENDED_FOR)),
                )
                urgent["gpu2"] = testbed.submit(
                    "bob",
                    *("-w", "gpu2", "--gres=gpu:4", "--qos=urgent"),
                    wrap=busy("--util", "50", "--seconds", "20"),
                )
                testbed.wait_state(urgent["gpu2"], {"RUNNING"}, timeout=60)
                urgent_gpus = testbed.job_gpus(urgent["gpu2"])

                def resumed() -> bool:
                    state = testbed.job_state(low["suspend"])
                    seen["suspend"].add(state)
                    seen["urgent_suspend"].add(testbed.job_state(urgent["suspend"]))
                    return "SUSPENDED" in seen["suspend"] and state in ("RUNNING", "COMPLETED")

                wait_for(resumed, SUSPENDED_FOR + 40, "the suspended job to be resumed")
                suspend_state = testbed.wait_done(low["suspend"], timeout=60)
                time.sleep(6)  # the controller's cycle after the end
            cancel_state = testbed.wait_done(low["cancel"], timeout=30)
            # The requeued job's second run: Slurm holds it back about 2 minutes.
            testbed.wait_state(low["requeue"], {"COMPLETED"}, timeout=200)
            rows = {
                "requeue": wait_summaries(store, low["requeue"], 4),
                "cancel": wait_summaries(store, low["cancel"], 2),
                "suspend": wait_summaries(store, low["suspend"], 2),
                "urgent_gpu2": wait_summaries(store, urgent["gpu2"], 4),
                "urgent_suspend": wait_summaries(store, urgent["suspend"], 1),
            }
            # The hooks know no Slurm state but by exit code: `sync` stores sacct's.
            synced = slurm_gpu(testbed, config, "sync", "-S", "now-1hours")
            yield {
                "low": low,
                "urgent": urgent,
                "gpus": gpus,
                "urgent_gpus": urgent_gpus,
                "seen": seen,
                "states": {"cancel": cancel_state, "suspend": suspend_state},
                "rows": rows,
                "records": {name: slurm_records(testbed, job) for name, job in low.items()},
                "urgent_records": {n: slurm_records(testbed, j) for n, j in urgent.items()},
                "synced": synced,
                "config": config,
            }
        finally:
            testbed.run("scancel", *map(str, [*low.values(), *urgent.values()]), check=False)


# --- REQUEUE ------------------------------------------------------------------------


def test_a_requeued_job_has_each_run_recorded_the_first_closed_at_the_preemption(
    preemption: dict[str, Any], store: Store
) -> None:
    """Run 0 ends where Slurm preempted it; run 1 is its own; nothing between is theirs."""
    job = preemption["low"]["requeue"]
    first, second = preemption["records"]["requeue"][-2:]
    assert first["State"] == "PREEMPTED", first
    assert second["State"] == "COMPLETED", second
    rows = preemption["rows"]["requeue"]
    assert sorted(r.restart for r in rows) == [0, 0, 1, 1], rows
    start0, end0 = times(first)
    start1, end1 = times(second)
    for row in run_rows(rows, 0):
        assert row.end == pytest.approx(end0, abs=2), (row, first)
        # Held from its prolog (a second or so after Start) to the preemption.
        assert end0 - start0 - 4 <= row.gpu_seconds <= end0 - start0 + 1, (row, first)
        assert row.util_mean_percent == pytest.approx(90, abs=15), row
    for row in run_rows(rows, 1):
        assert row.start >= end0, row
        assert end1 - start1 - 4 <= row.gpu_seconds <= end1 - start1 + 1, (row, second)
        assert row.util_mean_percent == pytest.approx(90, abs=15), row
    # Pending between the runs (the urgent job held its GPUs): nothing is the job's.
    assert covered_between(store, job, end0 + 1, start1 - 1) == 0.0
    stored = store.job(job)
    assert stored is not None
    assert (stored["restart"], stored["state"]) == (1, "COMPLETED")


def test_the_preemptor_on_gpu2_is_recorded_with_its_own_readings(
    preemption: dict[str, Any],
) -> None:
    """The urgent job got the preempted jobs' four GPUs; its rows are its own (50%)."""
    node, indices = preemption["urgent_gpus"]
    assert node == "gpu2"
    preempted = preemption["gpus"]["requeue"][1] + preemption["gpus"]["cancel"][1]
    assert sorted(indices) == sorted(preempted)
    (record,) = preemption["urgent_records"]["gpu2"]
    start, end = times(record)
    _s0, end0 = times(preemption["records"]["requeue"][-2])
    assert start >= end0 - 1
    rows = preemption["rows"]["urgent_gpu2"]
    assert len(rows) == 4
    for row in rows:
        assert row.util_mean_percent == pytest.approx(50, abs=10), row
        assert row.missing_seconds <= 6, row
        assert end - start - 4 <= row.gpu_seconds <= end - start + 1, (row, record)


# --- CANCEL -------------------------------------------------------------------------


def test_a_cancelled_preempted_job_is_closed_at_its_end_with_its_summary(
    testbed: TestBed, preemption: dict[str, Any], store: Store
) -> None:
    """PREEMPTED in sacct and (after `sync`) in the store; nothing after its end is its."""
    job = preemption["low"]["cancel"]
    assert preemption["states"]["cancel"] == "PREEMPTED"
    (record,) = preemption["records"]["cancel"]
    assert record["State"] == "PREEMPTED"
    start, end = times(record)
    rows = preemption["rows"]["cancel"]
    assert len(rows) == 2
    for row in rows:
        assert row.end == pytest.approx(end, abs=2), (row, record)
        assert end - start - 4 <= row.gpu_seconds <= end - start + 1, (row, record)
        assert row.util_mean_percent == pytest.approx(80, abs=15), row
    assert covered_between(store, job, end + 1, time.time()) == 0.0
    stored = store.job(job)
    assert stored is not None
    assert stored["state"] == "PREEMPTED", preemption["synced"]
    assert stored["end_time"] == pytest.approx(end, abs=2)
    token = wait_for(
        lambda: parse_token(testbed.sacct(job, "AdminComment").get("AdminComment", "")),
        30,
        "the AdminComment token",
    )
    assert token["gpus"] == "2"
    assert abs(float(token["gpu_s"]) - sum(r.gpu_seconds for r in rows)) <= 1


# --- SUSPEND ------------------------------------------------------------------------


def test_a_suspended_job_is_resumed_when_its_preemptor_ends(preemption: dict[str, Any]) -> None:
    """SUSPENDED while the urgent job ran (its GPUs kept), then RUNNING, then COMPLETED."""
    assert "SUSPENDED" in preemption["seen"]["suspend"]
    assert "RUNNING" in preemption["seen"]["urgent_suspend"]
    assert preemption["states"]["suspend"] == "COMPLETED"
    (record,) = preemption["records"]["suspend"]
    (urgent,) = preemption["urgent_records"]["suspend"]
    # Suspended about as long as the preemptor ran (the gang scheduler resumes it then).
    us, ue = times(urgent)
    assert ue - us - 3 <= seconds(record["Suspended"]) <= ue - us + 8, (record, urgent)
    # The preemptor got a GPU of gpu1 that the suspended job does not hold (it keeps its own).
    (urgent_row,) = preemption["rows"]["urgent_suspend"]
    assert urgent_row.node == "gpu1"
    assert urgent_row.gpu_uuid not in {r.gpu_uuid for r in preemption["rows"]["suspend"]}


def test_a_suspended_job_is_neither_warned_nor_cancelled_for_idle_gpus(
    preemption: dict[str, Any], store: Store
) -> None:
    """Its GPUs read idle while it is stopped (longer than cancel_after): no warn, no cancel.

    Never idle for more than 5 s of its own (warn_after: 15 s, the readings' lag included):
    only a policy that counts the suspension as idle time warns it, right after it resumed.
    """
    job = preemption["low"]["suspend"]
    (record,) = preemption["records"]["suspend"]
    suspended = seconds(record["Suspended"])
    # What the agent read: the stopped job's GPUs at 0% (it holds them, does no work).
    idle = [i for i in intervals(store, job) if i[3] is not None and i[2] >= 4.9 and i[3] <= 1.0]
    assert len(idle) >= 2 * (suspended // 5 - 3), intervals(store, job)
    actions = {e.action for e in audit_of(store.control, job)}
    assert not actions & {"warn", "cancel"}, audit_of(store.control, job)


def test_a_suspended_job_has_its_summary_after_it_ends(preemption: dict[str, Any]) -> None:
    """Its summary lands after its end: GPUs held from start to end, suspension included."""
    (record,) = preemption["records"]["suspend"]
    start, end = times(record)
    rows = preemption["rows"]["suspend"]
    assert len(rows) == 2
    for row in rows:
        assert row.end == pytest.approx(end, abs=2), (row, record)
        # Slurm's Elapsed leaves the suspension out; the GPUs were held all along.
        assert end - start - 4 <= row.gpu_seconds <= end - start + 1, (row, record)
    (urgent,) = preemption["rows"]["urgent_suspend"]
    assert urgent.util_mean_percent == pytest.approx(40, abs=10), urgent


def test_the_suspended_time_is_in_the_ledger(
    testbed: TestBed, preemption: dict[str, Any], store: Store
) -> None:
    """jobs.suspended_seconds (from sacct's Suspended, by `sync`) and `slurm-gpu sacct`."""
    job = preemption["low"]["suspend"]
    (record,) = preemption["records"]["suspend"]
    suspended = seconds(record["Suspended"])
    assert suspended > 0
    stored = store.job(job)
    assert stored is not None
    assert stored["suspended_seconds"] == pytest.approx(suspended, abs=1)
    out = slurm_gpu(
        testbed,
        preemption["config"],
        "sacct",
        "-j",
        str(job),
        "-P",
        "-n",
        "-o",
        "JobID,Suspended,SuspendedGPUHours",
    )
    line = next(ln for ln in out.splitlines() if ln.startswith(f"{job}|"))
    _job, shown, gpu_hours = line.split("|")[:3]
    assert seconds(shown) == suspended
    assert float(gpu_hours) == pytest.approx(2 * suspended / 3600, abs=0.01)
