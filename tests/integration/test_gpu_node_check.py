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


def test_gpu_node_check_records_the_job_it_simulates(testbed: TestBed) -> None:
    """80 % for 10 s, then 5 s idle: the summary says ~53 %, 15 s, nothing missing."""
    env = dict(
        testbed.env,
        SIM_NVML_DIR=str(testbed.state_dir / "sim-nvml" / "gpu1"),
        DEV_GLOB=str(testbed.state_dir / "dev" / "nvidia[0-3]"),
        PYTHON=str(Path(testbed.env.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin/python"),
        LOAD_CMD=testbed.gpu_load("--util", "80", "--seconds", "10"),
    )
    done = subprocess.run(
        [str(REPO / "scripts" / "gpu-node-check"), "--busy", "10", "--idle", "5", "--gpu", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
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
