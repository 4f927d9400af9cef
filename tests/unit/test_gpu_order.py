"""slurmd's GPU numbering on one node: gres.conf File= order, AutoDetect=nvml/nvidia/full.

The rule is Slurm's own (slurm_gpu/slurm/gpu_order.py cites the source); every case here
uses a node whose NVML order, minor order and gres.conf order all differ, so a mapping
that followed the wrong one fails.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from slurm_gpu.errors import ConfigError
from slurm_gpu.models import GpuDevice
from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.spool import Spool
from slurm_gpu.slurm.gpu_order import GpuOrder, parse_slurmd_gres, slurm_gpu_order
from slurm_gpu.slurm.gres import GresNode, parse_gres_node
from slurm_gpu.testing import FakeGpuSource, FixedClock

NVML_MINORS = (2, 0, 3, 1)  # NVML index n is /dev/nvidia{NVML_MINORS[n]}
DEVICES = [
    GpuDevice(f"GPU-minor{m}", "NVIDIA A100-SXM4-80GB", m, n, f"0000:{0x17 + n:02X}:00.0", None)
    for n, m in enumerate(NVML_MINORS)
]


class DeviceStat:
    def __init__(self, rdev: int) -> None:
        self.st_rdev = rdev


def stat_dev(path: str) -> os.stat_result:
    """/dev/nvidiaN is a device with minor N; anything else does not exist."""
    if "/dev/nvidia" not in path:
        raise FileNotFoundError(path)
    return DeviceStat(os.makedev(195, int(path.rsplit("nvidia", 1)[1])))  # type: ignore[return-value]


def order(text: str, node: str = "gpu1", devices: list[GpuDevice] | None = DEVICES) -> GpuOrder:
    return slurm_gpu_order(parse_gres_node(text, node), devices, stat_dev)


def minors(result: GpuOrder) -> list[int | None]:
    """The minor of each Slurm index, in index order (what SLURM_JOB_GPUS=i means)."""
    return [g.minor for g in result.gpus]


def test_file_lines_without_autodetect_follow_the_listing() -> None:
    result = order("NodeName=gpu1 Name=gpu Type=a100 File=/dev/nvidia3,/dev/nvidia1\n"
                   "NodeName=gpu1 Name=gpu Type=a100 File=/dev/nvidia[0,2]\n")  # fmt: skip
    assert minors(result) == [3, 1, 0, 2]
    assert result.index_uuid() == {
        0: "GPU-minor3",
        1: "GPU-minor1",
        2: "GPU-minor0",
        3: "GPU-minor2",
    }
    assert result.problems == ()


def test_autodetect_nvml_numbers_gpus_in_nvml_order() -> None:
    result = order("AutoDetect=nvml\nNodeName=gpu1 Name=gpu Type=a100 Count=4\n")
    assert minors(result) == [2, 0, 3, 1]
    assert result.rule.startswith("AutoDetect=nvml")
    assert result.problems == ()


def test_autodetect_nvidia_numbers_gpus_by_minor() -> None:
    result = order("NodeName=gpu1 AutoDetect=nvidia Name=gpu Type=a100 Count=4 Flags=env_uuid\n")
    assert minors(result) == [0, 1, 2, 3]
    assert result.index_uuid()[0] == "GPU-minor0"
    assert parse_gres_node(
        "NodeName=gpu1 AutoDetect=nvidia Name=gpu Flags=env_uuid", "gpu1"
    ).env_uuid


def test_autodetect_nvml_ignores_the_file_listing_order() -> None:
    """slurmd re-sorts File= GPUs by their Links under nvml: the listing order is lost."""
    result = order("AutoDetect=nvml\nName=gpu Type=a100 File=/dev/nvidia[3,1,0,2]\n")
    assert minors(result) == [2, 0, 3, 1]


def test_autodetect_with_only_an_autodetect_line_takes_every_gpu() -> None:
    """Count from slurm.conf (no Name=gpu line here): every detected GPU, by minor."""
    assert minors(order("AutoDetect=nvidia\n")) == [0, 1, 2, 3]


def test_node_specific_autodetect_trumps_the_global_one() -> None:
    text = "AutoDetect=nvml\nNodeName=gpu1 AutoDetect=off Name=gpu File=/dev/nvidia[1,0,3,2]\n"
    assert minors(order(text)) == [1, 0, 3, 2]
    assert minors(order(text.replace("gpu1", "gpu2"), node="gpu1")) == [2, 0, 3, 1]


def test_a_smaller_count_takes_the_lowest_minors_and_says_so() -> None:
    result = order("AutoDetect=nvml\nName=gpu Type=a100 Count=2\n")
    assert minors(result) == [0, 1]  # minors 0 and 1, in NVML order (index 1 before 3)
    assert [g.uuid for g in result.gpus] == ["GPU-minor0", "GPU-minor1"]
    assert "declares 2 GPU(s) and NVML lists 4" in result.problems[0]


def test_a_listed_gpu_nvml_does_not_show_keeps_its_place_without_a_uuid() -> None:
    result = order("AutoDetect=nvidia\nName=gpu File=/dev/nvidia[0-4]\n")
    assert minors(result) == [0, 1, 2, 3, 4]
    assert result.gpus[4].uuid is None and 4 not in result.index_uuid()
    assert "lists /dev/nvidia4 (minor 4), which NVML does not list" in result.problems[0]


def test_full_is_refused_where_nvml_and_minor_order_differ() -> None:
    result = order("AutoDetect=full\n")
    assert result.gpus == () and result.index_uuid() == {}
    assert "set AutoDetect=nvml or AutoDetect=nvidia" in result.problems[0]
    in_order = [GpuDevice(f"GPU-{m}", "A100", m, m, "", None) for m in range(3)]
    agreed = order("AutoDetect=full\n", devices=in_order)
    assert agreed.problems == () and minors(agreed) == [0, 1, 2]


@pytest.mark.parametrize("detector", ["rsmi", "oneapi", "nrt", "generic"])
def test_a_non_nvidia_detector_numbers_nothing(detector: str) -> None:
    result = order(f"NodeName=gpu1 AutoDetect={detector}\n")
    assert result.gpus == ()
    assert f"AutoDetect={detector} (line 1) does not detect NVIDIA GPUs" in result.problems[0]


def test_gpus_without_file_and_without_autodetect_are_a_problem() -> None:
    result = order("Name=gpu Type=a100 Count=4\n")
    assert result.gpus == ()
    assert "4 GPU(s) declared without File= and no AutoDetect" in result.problems[0]


def test_mig_lines_without_mig_minors_keep_their_index_unbound() -> None:
    """Mapped through mig-minors (tests/unit/test_gpu_order_mig.py); without it: unbound."""
    files = "/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22"
    text = f"AutoDetect=off\nName=gpu Type=1g.10gb MultipleFiles={files}\n"
    result = order(text)
    assert [(g.index, g.path, g.minor, g.uuid) for g in result.gpus] == [(0, files, 0, None)]
    assert result.problems == (
        f"gres.conf: gpu1: Slurm GPU 0 (line 2) MultipleFiles={files}: mig-minors was not"
        " read ([node] mig_minors): not bound",
    )


def test_without_nvml_only_what_gres_conf_shows_is_checked() -> None:
    assert order("AutoDetect=nvml\n", devices=None) == GpuOrder("AutoDetect=nvml")
    assert order("NodeName=gpu1 AutoDetect=rsmi\n", devices=None).problems


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("AutoDetect=nvlm\n", "gres.conf: line 1: AutoDetect=nvlm: not one of full,"),
        ("NodeName=gpu1 AutoDetect=nvml\nNodeName=gpu[1-2] AutoDetect=nvidia\n",
         "gres.conf: line 2: AutoDetect=nvidia for gpu1, but line 1 set AutoDetect=nvml"),
        ("Name=gpu Count=four\n", "gres.conf: line 1: Count=four: not a number"),
    ],
)  # fmt: skip
def test_malformed_autodetect_lines_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_gres_node(text, "gpu1")
    assert caught.value.problems[0].startswith(message)


def test_slurmd_g_lines_give_the_files_in_slurm_index_order() -> None:
    text = (
        "slurmd: Gres Name=gpu Type=a100 Count=1 Index=2 ID=7696487 File=/dev/nvidia2"
        " Cores=0-7 CoreCnt=8 Links=-1,0 Flags=HAS_FILE,HAS_TYPE,ENV_NVML\n"
        "slurmd: Gres Name=gpu Type=a100 Count=1 Index=0 ID=7696487 File=/dev/nvidia0"
        " Links=0,-1 Flags=HAS_FILE,HAS_TYPE,ENV_NVML\n"
        "slurmd: Gres Name=shard Count=8 Index=0 ID=1 File=/dev/nvidia0 Links=(null)\n"
    )
    assert parse_slurmd_gres(text) == ["/dev/nvidia2", "/dev/nvidia0"]


def test_the_agent_binds_slurm_indices_by_autodetect_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FixedClock(1_800_000_000.0)
    spool = Spool(tmp_path / "spool.db")
    gres = parse_gres_node("NodeName=gpu1 AutoDetect=nvidia Name=gpu Count=4\n", "gpu1")
    agent = NodeAgent("gpu1", tmp_path / "gpu1", FakeGpuSource(DEVICES, clock), spool, gres,
                      clock=clock, stat=stat_dev)  # fmt: skip
    assert agent.index_uuid == {i: f"GPU-minor{i}" for i in range(4)}
    with caplog.at_level(logging.ERROR, logger="slurm_gpu.node.agent"):
        full = GresNode(node="gpu1", autodetect="full", autodetect_where="line 1")
        refused = NodeAgent("gpu1", tmp_path / "gpu1", FakeGpuSource(DEVICES, clock), spool,
                            full, clock=clock, stat=stat_dev)  # fmt: skip
    assert refused.index_uuid == {}
    assert "AutoDetect=full (line 1): this node's NVML order and device minor order differ" in (
        caplog.text
    )


# --- against slurmd itself: `slurmd -G` captured on each release's test bed -----------------

DATA = Path(__file__).resolve().parents[1] / "data"
BED_GPU1 = {  # gpu1's gres.conf line on each release's test bed (templates/gres.conf.in)
    "22.05": "NodeName=gpu1 Name=gpu Type=a100 File=/var/tmp/slurm-gpu-cluster/dev/nvidia[0-3]",
    "24.11": "NodeName=gpu1 AutoDetect=nvidia Name=gpu Type=a100 Count=4",
    "26.05": "NodeName=gpu1 AutoDetect=nvidia Name=gpu Type=a100 Count=4 Flags=env_uuid",
}


def captured_gpus(release: str) -> tuple[list[GpuDevice], list[str]]:
    """The sim GPUs behind a capture, and the CUDA_VISIBLE_DEVICES a 4-GPU step saw."""
    devices, visible = [], []
    for line in (DATA / release / "slurmd-G-gpu1.gpus").read_text().splitlines():
        if "CUDA_VISIBLE_DEVICES=" in line:
            visible = line.split("CUDA_VISIBLE_DEVICES=", 1)[1].split(",")
        elif line and not line.startswith("#"):
            index, minor, uuid, bus = line.split()
            devices.append(
                GpuDevice(uuid, "NVIDIA A100-SXM4-80GB", int(minor), int(index), bus, None)
            )
    return devices, visible


@pytest.mark.parametrize("release", sorted(BED_GPU1))
def test_the_derived_numbering_is_slurmds_own(release: str) -> None:
    """The agent's numbering of gpu1 equals slurmd -G's list (NVML order is 2, 0, 3, 1)."""
    devices, visible = captured_gpus(release)
    assert [d.minor for d in devices] == [2, 0, 3, 1]
    slurmd_files = parse_slurmd_gres((DATA / release / "slurmd-G-gpu1.txt").read_text())
    derived = slurm_gpu_order(parse_gres_node(BED_GPU1[release], "gpu1"), devices, stat_dev)
    assert [f"nvidia{g.minor}" for g in derived.gpus] == [f.rsplit("/", 1)[1] for f in slurmd_files]
    assert derived.problems == ()
    if release == "26.05":  # env_uuid: slurmd's own UUIDs, in Slurm index order
        assert visible == [g.uuid for g in derived.gpus]
