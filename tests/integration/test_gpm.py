"""GPM on the test bed (#13): SM activity, tensor use and the policies that read them.

gpu2's simulated H100s support NVML GPM and gpu1's A100s answer NOT_SUPPORTED, as real
ones do, so one job of each kind shows both paths end to end: the agent's GPM samples ->
spool -> store -> `slurm-gpu sacct` / `job` / the AdminComment token, and the controller
acting on SM activity rather than the duty cycle.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.config import load_config
from slurm_gpu.slurm.admin_comment import parse_token
from slurm_gpu.store import Store
from slurm_gpu.store.control import ControlStore
from tests.integration.controlbed import actions_of, audit_of, controllers, slurm_gpu, write_config
from tests.integration.testbed import TestBed, wait_summaries
from tests.receivers import smtp_receiver, webhook_receiver

pytestmark = pytest.mark.slurm

LOAD = ("--util", "90", "--sm", "30", "--tensor", "60", "--seconds", "60")


@pytest.fixture(scope="module")
def config_file(testbed: TestBed) -> Path:
    return Path(testbed.env["SLURM_GPU_CONFIG"])


@pytest.fixture(scope="module")
def measured(testbed: TestBed, store: Store) -> dict[str, int]:
    """The same load (90 % duty, 30 % SM, 60 % tensor, 60 s) on an H100 and on an A100."""
    jobs = {
        "h100": testbed.submit(
            "alice", "--gres=gpu:h100:1", "-w", "gpu2", wrap=testbed.gpu_load(*LOAD)
        ),
        "a100": testbed.submit(
            "alice", "--gres=gpu:a100:1", "-w", "gpu1", wrap=testbed.gpu_load(*LOAD)
        ),
    }
    for job in jobs.values():
        assert testbed.wait_done(job, timeout=300) == "COMPLETED"
    for job in jobs.values():
        wait_summaries(store, job, 1)
    return jobs


def test_h100_job_has_its_sm_and_tensor_activity_in_the_store(
    store: Store, measured: dict[str, int]
) -> None:
    """SMActiveAvg within 3 points of 30 and TensorActiveAvg within 3 of 60, over the job."""
    (row,) = wait_summaries(store, measured["h100"], 1)
    assert row.sm_active_mean_percent is not None and abs(row.sm_active_mean_percent - 30) <= 3
    assert row.tensor_active_mean_percent is not None
    assert abs(row.tensor_active_mean_percent - 60) <= 3
    assert row.util_mean_percent is not None and abs(row.util_mean_percent - 90) <= 3
    assert row.gpm_seconds >= row.gpu_seconds - 2 * 5.0  # within two agent intervals


def test_a100_job_has_no_gpm_figures_and_never_zero(store: Store, measured: dict[str, int]) -> None:
    """An A100 measures no SM activity: the fields are unknown, not 0 %."""
    (row,) = wait_summaries(store, measured["a100"], 1)
    assert row.util_mean_percent is not None and abs(row.util_mean_percent - 90) <= 3
    figures = (row.sm_active_mean_percent, row.tensor_active_mean_percent, row.gpm_seconds)
    assert figures == (None, None, 0.0)


def test_sacct_shows_the_gpm_fields_and_blanks_where_unmeasured(
    testbed: TestBed, config_file: Path, measured: dict[str, int]
) -> None:
    """`slurm-gpu sacct -o ...SMActiveAvg,TensorActiveAvg,EffectiveGPUHours -P`."""
    ids = f"{measured['h100']},{measured['a100']}"
    fields = "JobID,SMActiveAvg,TensorActiveAvg,EffectiveGPUHours"
    out = slurm_gpu(testbed, config_file, "sacct", "-a", "-j", ids, "-P", "-o", fields)
    rows = {line.split("|")[0]: line.split("|") for line in out.splitlines()[1:] if line}
    h100, a100 = rows[str(measured["h100"])], rows[str(measured["a100"])]
    assert abs(float(h100[1]) - 30) <= 3 and abs(float(h100[2]) - 60) <= 3, h100
    assert float(h100[3]) > 0
    assert a100[1:] == ["", "", ""], a100


def test_admin_comment_token_carries_sm_activity(
    testbed: TestBed, measured: dict[str, int]
) -> None:
    """The token Slurm keeps with the job: sm_avg on the H100 job, absent on the A100 one."""
    deadline, tokens = time.monotonic() + 60, {}
    while time.monotonic() < deadline:
        tokens = {
            name: parse_token(testbed.sacct(job, "AdminComment")["AdminComment"])
            for name, job in measured.items()
        }
        if all(tokens.values()):
            break
        time.sleep(2)
    assert tokens["h100"] is not None and tokens["a100"] is not None, tokens
    assert abs(float(tokens["h100"]["sm_avg"]) - 30) <= 3, tokens["h100"]
    assert "sm_avg" not in tokens["a100"], tokens["a100"]


def test_job_view_shows_sm_activity_or_says_it_is_not_measured(
    testbed: TestBed, config_file: Path, measured: dict[str, int]
) -> None:
    """`slurm-gpu job`: the H100's SM activity per GPU; the A100's note, never 0 %."""
    h100 = json.loads(slurm_gpu(testbed, config_file, "job", str(measured["h100"]), "--json"))
    (gpu,) = h100["gpus"]
    assert abs(gpu["sm_active_mean_percent"] - 30) <= 3, gpu
    text = slurm_gpu(testbed, config_file, "job", str(measured["a100"]))
    assert "SM activity is not measured" in text, text
    assert "SM active: 0" not in text


# --- the policies ----------------------------------------------------------------------

POLICY = """
[policy.low_efficiency]
enabled = true
min_util_percent = 80
max_sm_active_percent = 10
notice_after = "10s"
"""


@pytest.fixture(scope="module")
def control(testbed: TestBed) -> ControlStore:
    config = load_config(Path(testbed.env["SLURM_GPU_CONFIG"]))
    return ControlStore(Store(config.store.url, cluster=config.cluster.name))


@pytest.fixture(scope="module")
def sm_active_scenario(testbed: TestBed, control: ControlStore) -> Iterator[dict[str, Any]]:
    """`signal = "sm_active"`: a fake-busy job (duty ~100 %, SM ~1 %) beside a busy one."""
    with smtp_receiver() as (port, inbox), webhook_receiver() as (url, _hooks):
        config = write_config(testbed, "gpm", smtp_port=port, webhook_url=url, extra=POLICY)
        text = config.read_text().replace(
            "[policy.idle_gpu]\n", '[policy.idle_gpu]\nsignal = "sm_active"\n', 1
        )
        config.write_text(text)
        jobs = {
            "fake": testbed.submit(
                "alice",
                "--gres=gpu:h100:1",
                "-w",
                "gpu2",
                wrap=testbed.gpu_load("--pattern", "fake-busy", "--seconds", "300"),
            ),
            "busy": testbed.submit(
                "bob",
                "--gres=gpu:h100:1",
                "-w",
                "gpu2",
                wrap=testbed.gpu_load("--util", "90", "--sm", "60", "--seconds", "300"),
            ),
        }
        try:
            for job in jobs.values():
                testbed.wait_state(job, {"RUNNING"})
            with controllers(testbed, config):
                state = testbed.wait_state(jobs["fake"], {"CANCELLED"}, timeout=150)
                time.sleep(10)  # two more cycles: the busy job must stay untouched
                states = {name: testbed.job_state(job) for name, job in jobs.items()}
            yield {"jobs": jobs, "state": state, "states": states, "inbox": list(inbox)}
        finally:
            testbed.run("scancel", *map(str, jobs.values()), check=False)


def test_fake_busy_job_is_flagged_warned_then_cancelled(
    sm_active_scenario: dict[str, Any], control: ControlStore
) -> None:
    """Judged by SM activity, the job that only keeps the duty cycle up is idle."""
    job = sm_active_scenario["jobs"]["fake"]
    assert sm_active_scenario["state"] == "CANCELLED"
    actions = actions_of(control, job)
    assert set(actions) == {"warn", "notice", "cancel"}, actions
    assert actions.index("warn") < actions.index("cancel") and actions[-1] == "cancel", actions
    reasons = " ".join(e.reason for e in audit_of(control, job))
    assert "SM activity" in reasons, reasons
    notices = [e for e in audit_of(control, job) if e.policy == "low_efficiency"]
    assert notices, audit_of(control, job)


def test_genuinely_busy_job_beside_it_is_left_alone(
    sm_active_scenario: dict[str, Any], control: ControlStore
) -> None:
    """60 % SM activity: no warning, no notice, still running when the fake one is gone."""
    job = sm_active_scenario["jobs"]["busy"]
    assert sm_active_scenario["states"]["busy"] == "RUNNING"
    assert actions_of(control, job) == []


def test_the_user_was_told_why(sm_active_scenario: dict[str, Any]) -> None:
    """The mails about the fake-busy job name SM activity; none is about the busy one."""
    jobs, inbox = sm_active_scenario["jobs"], sm_active_scenario["inbox"]
    about = {
        name: [m for m in inbox if f"(job {job})" in m["Subject"]] for name, job in jobs.items()
    }
    assert any("SM activity" in str(m.get_payload()) for m in about["fake"]), about["fake"]
    assert about["busy"] == []
