"""scripts/gpu-node-check, the hardware check, run on a simulated GPU of the test bed.

On hardware it is run by hand (docs/hardware/ keeps an H200 run); here the same script
runs against gpu1's simulated GPUs, with the test bed's workload as the job's load, so
that what it prints stays true: the job's summary, its intervals and an empty spool.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.testbed import TestBed

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm


def run_check(testbed: TestBed, node: str, *load: str) -> subprocess.CompletedProcess[str]:
    """scripts/gpu-node-check on GPU 1 of a test-bed node: `load` for 10 s, then 5 s idle."""
    env = dict(
        testbed.env,
        SIM_NVML_DIR=str(testbed.state_dir / "sim-nvml" / node),
        DEV_GLOB=str(testbed.state_dir / "dev" / "nvidia[0-3]"),
        PYTHON=str(Path(testbed.env.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin/python"),
        LOAD_CMD=testbed.gpu_load(*load, "--seconds", "10"),
    )
    return subprocess.run(
        [str(REPO / "scripts" / "gpu-node-check"), "--busy", "10", "--idle", "5", "--gpu", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_gpu_node_check_records_the_job_it_simulates(testbed: TestBed) -> None:
    """80 % for 10 s, then 5 s idle: the summary says ~53 %, 15 s, nothing missing.

    An A100 has no GPM: its SM activity is "unknown" in the summary, never 0 %.
    """
    done = run_check(testbed, "gpu1", "--util", "80")
    out = done.stdout
    summary = re.search(
        r"summary: gpu=(.+?) uuid=\S+ gpu_seconds=([\d.]+) \(wall ([\d.]+)\) "
        r"util_mean=([\d.]+)%.* missing_s=([\d.]+)",
        out,
    )
    assert (done.returncode, summary is not None) == (0, True), out + done.stderr
    assert summary is not None
    model, gpu_seconds, wall, util, missing = summary.groups()
    assert model == "NVIDIA A100-SXM4-80GB"
    assert abs(float(gpu_seconds) - float(wall)) <= 1.0
    assert abs(float(util) - 80 * 10 / float(wall)) <= 6
    assert float(missing) == 0.0
    covered = re.search(r"intervals: \d+, covered ([\d.]+) s", out)
    assert covered is not None and abs(float(covered.group(1)) - float(gpu_seconds)) <= 1.0
    assert re.search(r'slurm_gpu_utilization_percent\{.*job_id="4242"', out)
    assert "spool empty" in out
    assert "GPM unsupported" in out
    assert re.search(r"summary: .* sm_active=unknown .* tensor=unknown .* gpm_s=0\.0", out), out


def test_gpu_node_check_shows_gpm_on_a_hopper_gpu(testbed: TestBed) -> None:
    """An H100 at 90 % duty cycle, 30 % SM activity and 60 % tensor use for 10 s of 15.

    The probe prints GPM windows while the job runs, and the job's summary holds the
    time-weighted truth: SM activity ~ 30 x 10/15 = 20 %, tensor ~ 40 % (over the seconds
    GPM measured).
    """
    done = run_check(testbed, "gpu2", "--util", "90", "--sm", "30", "--tensor", "60")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "GPM supported" in out
    assert re.search(r"gpm: +[-+\d.]+\.\. *[-+\d.]+ s  sm_active  30\.0", out), out
    summary = re.search(
        r"summary: gpu=NVIDIA H100.* gpu_seconds=([\d.]+) \(wall ([\d.]+)\).*"
        r" sm_active=([\d.]+)% .* tensor=([\d.]+)% .* gpm_s=([\d.]+)",
        out,
    )
    assert summary is not None, out
    gpu_seconds, wall, sm, tensor, gpm_s = (float(v) for v in summary.groups())
    assert abs(gpm_s - gpu_seconds) <= 5.0  # the agent's GPM windows cover the job
    # 10 s of load over the GPM-measured seconds (the job holds the GPU a little longer
    # than `wall`, from its prolog to its epilog).
    assert abs(sm - 30 * 10 / gpm_s) <= 3, (sm, gpm_s, wall)
    assert abs(tensor - 60 * 10 / gpm_s) <= 3, (tensor, gpm_s, wall)
