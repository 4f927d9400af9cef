"""Recording on the test bed: hooks + node agents -> accounting store, checked against sacct."""

from __future__ import annotations

import time

import pytest

from slurm_gpu.slurm.admin_comment import parse_token
from slurm_gpu.store import Store
from tests.integration.testbed import TestBed, wait_summaries

INTERVAL = 5.0  # node.interval in the test bed's slurm-gpu.toml


def elapsed_seconds(text: str) -> float:
    """sacct's Elapsed ([D-]HH:MM:SS) in seconds."""
    days, _, hms = text.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


@pytest.fixture(scope="module")
def workload(testbed: TestBed, store: Store) -> dict[str, int]:
    """Three jobs at once: busy 2-GPU at 70%, idle 1-GPU, and a 0->80% ramp on gpu1."""
    jobs = {
        "busy": testbed.submit(
            "alice",
            "--gres=gpu:2",
            "-A",
            "physics",
            wrap=testbed.gpu_load("--util", "70", "--mem", "20480", "--seconds", "90"),
        ),
        "idle": testbed.submit(
            "bob", "--gres=gpu:1", wrap=testbed.gpu_load("--pattern", "idle", "--seconds", "60")
        ),
        "ramp": testbed.submit(
            "carol",
            "--gres=gpu:1",
            "-A",
            "bio",
            "-w",
            "gpu1",
            wrap=testbed.gpu_load("--pattern", "ramp", "--util", "80", "--seconds", "60"),
        ),
    }
    for job in jobs.values():
        assert testbed.wait_done(job, timeout=300) == "COMPLETED"
    return jobs


def test_busy_job_gpu_seconds_match_sacct_and_mean_util_is_true(
    testbed: TestBed, store: Store, workload: dict[str, int]
) -> None:
    """GPU-seconds = sacct Elapsed x 2 within one interval; mean util 70 +- 3."""
    job = workload["busy"]
    rows = wait_summaries(store, job, 2)
    elapsed = elapsed_seconds(testbed.sacct(job, "Elapsed")["Elapsed"])
    assert abs(sum(r.gpu_seconds for r in rows) - 2 * elapsed) <= 2 * INTERVAL
    for row in rows:
        assert row.util_mean_percent is not None and abs(row.util_mean_percent - 70) <= 3, row
        assert (row.user, row.account, row.missing) == ("alice", "physics", False)
        assert row.mem_max_bytes is not None and row.mem_max_bytes >= 20480 * 2**20


def test_idle_job_has_zero_utilization(store: Store, workload: dict[str, int]) -> None:
    """A job that holds a GPU and never computes reads 0% and no active seconds."""
    (row,) = wait_summaries(store, workload["idle"], 1)
    assert (row.util_mean_percent, row.active_seconds) == (0.0, 0.0)


def test_ramp_job_shows_the_true_mean_not_a_point_sample(
    store: Store, workload: dict[str, int]
) -> None:
    """A 0->80% linear ramp averages 40%, though its last point sample is near 80%."""
    (row,) = wait_summaries(store, workload["ramp"], 1)
    assert row.util_mean_percent is not None and abs(row.util_mean_percent - 40) <= 3, row
    assert row.util_max_percent is not None and row.util_max_percent >= 75


def test_job_on_gpu1_is_attributed_to_the_gpus_slurm_gave_it_by_uuid(
    testbed: TestBed, store: Store, workload: dict[str, int]
) -> None:
    """gpu1's NVML order differs from minors; the summary names the UUID of Slurm's GPU."""
    job = workload["ramp"]
    (row,) = wait_summaries(store, job, 1)
    out = testbed.run("sacct", "-X", "-n", "-P", "-j", str(job), "-o", "NodeList").stdout.strip()
    assert out == "gpu1"
    gres_index = _slurm_gpu_index(store, job)
    # the sim's device with minor == Slurm index (gres.conf lists nvidia0..3 in order)
    uuid_of_minor = testbed.nvml(
        "gpu1",
        "result = {pynvml.nvmlDeviceGetMinorNumber(h): pynvml.nvmlDeviceGetUUID(h)"
        " for h in map(pynvml.nvmlDeviceGetHandleByIndex, range(4))}",
    )
    assert row.gpu_uuid == uuid_of_minor[str(gres_index)]  # type: ignore[index]


def _slurm_gpu_index(store: Store, job: int) -> int:
    (gpu,) = store.job_gpus(job)
    return int(gpu["slurm_index"])


def test_admin_comment_carries_the_summary_token(
    testbed: TestBed, store: Store, workload: dict[str, int]
) -> None:
    """sacct -o AdminComment shows slurm-gpu:v1 with the job's GPUs and GPU-seconds."""
    job = workload["busy"]
    rows = wait_summaries(store, job, 2)
    deadline = time.monotonic() + 30
    token: dict[str, str] = {}
    while time.monotonic() < deadline and not token:
        token = parse_token(testbed.sacct(job, "AdminComment").get("AdminComment", ""))
        time.sleep(1)
    assert token["gpus"] == "2"
    assert abs(float(token["gpu_s"]) - sum(r.gpu_seconds for r in rows)) <= 1
    assert abs(float(token["util_avg"]) - 70) <= 3
    assert token["missing"] == "0"


def test_no_node_was_drained(testbed: TestBed, workload: dict[str, int]) -> None:
    """Our hooks never drain a node: both stay usable after the workload."""
    out = testbed.run("sinfo", "-h", "-N", "-p", "gpu", "-o", "%N|%T").stdout.split()
    assert [line for line in out if "drain" in line or "down" in line] == []


def test_agent_metrics_label_gpus_with_their_job(testbed: TestBed) -> None:
    """gpu2's /metrics shows the running job's GPU with job id, user and account labels."""
    import urllib.request

    job = testbed.submit(
        "bob",
        "--gres=gpu:1",
        "-w",
        "gpu2",
        wrap=testbed.gpu_load("--util", "60", "--seconds", "40"),
    )
    try:
        testbed.wait_state(job, {"RUNNING"})
        # The gauge is the GPU's mean over the last interval; the first interval of the
        # job also holds idle seconds from before it started, so wait for a whole one.
        deadline = time.monotonic() + 40
        line = ""
        while time.monotonic() < deadline:
            time.sleep(2)
            url = testbed.metrics_url("gpu2")
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            series = [
                entry
                for entry in text.splitlines()
                if entry.startswith("slurm_gpu_utilization_percent{") and f'job_id="{job}"' in entry
            ]
            if len(series) == 1:
                line = series[0]
                if abs(float(line.rsplit(" ", 1)[1]) - 60) <= 3:
                    break
        assert 'user="bob"' in line and 'account="bio"' in line and 'node="gpu2"' in line
        assert abs(float(line.rsplit(" ", 1)[1]) - 60) <= 3, line
    finally:
        testbed.run("scancel", str(job), check=False)
