"""slurmd's GPU numbering on gpu1, whose NVML order (minors 2, 0, 3, 1) is not its minor order.

On 22.05 gpu1's gres.conf lists File= device files; on 24.11 and 26.05 it lists none and
says AutoDetect=nvidia, so slurmd detects the simulated GPUs itself (from the
/proc/driver/nvidia files the test bed gives slurmd's namespace), and on 26.05
Flags=env_uuid puts their UUIDs in CUDA_VISIBLE_DEVICES. Two jobs on gpu1 at 25% and 80%
must each be measured on the GPUs slurmd gave them, as `slurmd -G` numbers them: an agent
that numbered by NVML order (or by anything but slurmd's rule) reads the wrong GPU's load.
"""

from __future__ import annotations

import re

import pytest

from slurm_gpu.slurm.gpu_order import parse_slurmd_gres
from slurm_gpu.slurm.gres import parse_gres_node
from slurm_gpu.store import Store
from tests.integration.test_recording import INTERVAL, elapsed_seconds
from tests.integration.testbed import TestBed, wait_summaries

pytestmark = pytest.mark.slurm

AUTODETECT_RELEASES = ("24.11", "26.05")  # gpu_nvidia.so: AutoDetect=nvidia (24.11+)
LOADS = {"low": (25, 1), "high": (80, 2)}  # name: (utilization %, GPUs)
_CVD = re.compile(r"^CVD=(\S*) GPUS=(\S*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def jobs(testbed: TestBed) -> dict[str, int]:
    """Two jobs at once on gpu1, each printing the GPU list slurmd gave it."""
    submitted = {
        name: testbed.submit(
            "alice",
            "-w",
            "gpu1",
            f"--gres=gpu:{count}",
            wrap='echo "CVD=$CUDA_VISIBLE_DEVICES GPUS=$SLURM_JOB_GPUS"; '
            + testbed.gpu_load("--util", str(util), "--seconds", "45"),
        )
        for name, (util, count) in LOADS.items()
    }
    for job in submitted.values():
        assert testbed.wait_done(job, timeout=300) == "COMPLETED"
    return submitted


@pytest.fixture(scope="module")
def uuid_of_minor(testbed: TestBed) -> dict[int, str]:
    """gpu1's simulated GPUs as NVML lists them: {minor: UUID}."""
    found = testbed.nvml(
        "gpu1",
        "result = {pynvml.nvmlDeviceGetMinorNumber(h): pynvml.nvmlDeviceGetUUID(h)"
        " for h in map(pynvml.nvmlDeviceGetHandleByIndex, range(4))}",
    )
    assert isinstance(found, dict)
    return {int(minor): str(uuid) for minor, uuid in found.items()}


@pytest.fixture(scope="module")
def slurmd_order(testbed: TestBed, uuid_of_minor: dict[int, str]) -> list[str]:
    """The UUID of each Slurm GPU index of gpu1, by slurmd's own `slurmd -G` list."""
    files = parse_slurmd_gres(testbed.launcher("gres", "gpu1").stderr)
    assert len(files) == 4, files
    return [uuid_of_minor[int(path.rsplit("nvidia", 1)[1])] for path in files]


def test_gpu1_is_declared_as_this_release_declares_it(testbed: TestBed) -> None:
    """So that the test below checks AutoDetect where the release has it."""
    gres = parse_gres_node((testbed.state_dir / "etc" / "gres.conf").read_text(), "gpu1")
    if testbed.slurm_release in AUTODETECT_RELEASES:
        assert (gres.autodetect, gres.files, gres.counted) == ("nvidia", (), 4)
    else:
        assert (gres.autodetect, len(gres.files)) == (None, 4)
    assert gres.env_uuid == (testbed.slurm_release == "26.05")


def test_each_job_is_measured_on_the_gpus_slurmd_gave_it(
    testbed: TestBed, store: Store, jobs: dict[str, int], slurmd_order: list[str]
) -> None:
    """Per GPU: the job's load within 3 points, GPU-seconds within one interval."""
    seen: set[str] = set()
    for name, (util, count) in LOADS.items():
        job = jobs[name]
        rows = wait_summaries(store, job, count)
        indices = [int(g["slurm_index"]) for g in store.job_gpus(job)]
        assert {r.gpu_uuid for r in rows} == {slurmd_order[i] for i in indices}, (name, indices)
        elapsed = elapsed_seconds(testbed.sacct(job, "Elapsed")["Elapsed"])
        for row in rows:
            assert row.util_mean_percent is not None, row
            assert abs(row.util_mean_percent - util) <= 3, row
            assert abs(row.gpu_seconds - elapsed) <= INTERVAL, row
        seen |= {r.gpu_uuid for r in rows}
    assert len(seen) == 3  # three different GPUs: no job was given another's


def test_cuda_visible_devices_names_the_same_gpus(
    testbed: TestBed, jobs: dict[str, int], slurmd_order: list[str]
) -> None:
    """UUIDs under env_uuid (26.05), Slurm indices before it: the GPUs of slurmd -G."""
    for job in jobs.values():
        match = _CVD.search((testbed.jobs_dir / f"{job}.out").read_text())
        assert match is not None
        visible, indices = match.group(1).split(","), [int(i) for i in match.group(2).split(",")]
        if testbed.slurm_release == "26.05":
            assert visible == [slurmd_order[i] for i in indices]
        else:
            # No device cgroup on the bed: CUDA numbers the node's GPUs as Slurm does.
            assert visible == [str(i) for i in indices]


def test_config_check_prints_slurmds_numbering(testbed: TestBed, slurmd_order: list[str]) -> None:
    """`slurm-gpu config check --node gpu1`, on gpu1's GPUs, agrees with slurmd -G."""
    done = testbed.run(
        "env",
        f"SIM_NVML_DIR={testbed.state_dir / 'sim-nvml' / 'gpu1'}",
        "slurm-gpu",
        "config",
        "check",
        "--node",
        "gpu1",
    )
    rule = (
        "AutoDetect=nvidia: device minor order"
        if testbed.slurm_release in AUTODETECT_RELEASES
        else "gres.conf File= order"
    )
    assert f"node gpu1: {rule}\n" in done.stdout
    for index, uuid in enumerate(slurmd_order):
        assert re.search(rf"^#   Slurm GPU {index} = \S+nvidia\d {uuid}$", done.stdout, re.M)
