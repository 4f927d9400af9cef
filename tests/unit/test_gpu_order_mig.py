"""MIG slots and shares in slurmd's GPU numbering (slurm_gpu/slurm/gpu_order.py cites Slurm).

The node: two H100s in MIG mode and two whole A100s. NVML order, minor order and MIG index
order all differ, and the 1g slices' cap minors (66..120) sort differently as text and as
numbers, so a mapping that followed the wrong order fails.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from slurm_gpu.cli import config_cmd
from slurm_gpu.config import Config
from slurm_gpu.config.core import NodeSettings
from slurm_gpu.errors import ConfigError
from slurm_gpu.models import GpuDevice, GpuSlot, MigDevice, SlotKind
from slurm_gpu.slurm.gpu_order import GpuOrder, ShareCapacity, natural_compare, slurm_gpu_order
from slurm_gpu.slurm.gres import GresMigFile, GresShare, parse_gres_node
from slurm_gpu.slurm.mig_minors import MigMinors, parse_mig_minors


def mig_minors_text(gpus: int = 4) -> str:
    lines = ["config 1", "monitor 2"]
    for g in range(gpus):
        for gi in range(15):
            base = 3 + 135 * g + 9 * gi
            lines.append(f"gpu{g}/gi{gi}/access {base}")
            lines += [f"gpu{g}/gi{gi}/ci{ci}/access {base + 1 + ci}" for ci in range(8)]
    return "\n".join(lines) + "\n"


MINORS = parse_mig_minors(mig_minors_text(), "mig-minors")
SEVEN = "GPU-h100-seven"  # minor 0, NVML index 1: seven 1g.10gb, GI 7..13
TWO = "GPU-h100-two"  # minor 1, NVML index 0: 4g.40gb (GI 1) + 3g.40gb (GI 2)
ONE_G = [  # MIG index order is not GI order: GI 13 first
    MigDevice(f"MIG-seven-{gi}", SEVEN, 13 - gi, gi, 0, "1g.10gb", 1) for gi in range(13, 6, -1)
]
H100_SEVEN = GpuDevice(SEVEN, "NVIDIA H100 80GB HBM3", 0, 1, "0000:18:00.0", None, True, True,
                       tuple(ONE_G))  # fmt: skip
H100_TWO = GpuDevice(TWO, "NVIDIA H100 80GB HBM3", 1, 0, "0000:17:00.0", None, True, True, (
    MigDevice("MIG-two-4g", TWO, 0, 1, 0, "4g.40gb", 4),
    MigDevice("MIG-two-3g", TWO, 1, 2, 0, "3g.40gb", 3),
))  # fmt: skip
A100_3 = GpuDevice("GPU-a100-minor3", "NVIDIA A100-SXM4-80GB", 3, 2, "0000:19:00.0", None)
A100_2 = GpuDevice("GPU-a100-minor2", "NVIDIA A100-SXM4-80GB", 2, 3, "0000:1A:00.0", None)
DEVICES = [H100_TWO, H100_SEVEN, A100_3, A100_2]


def caps(g: int, gi: int, ci: int = 0) -> str:
    base = 3 + 135 * g + 9 * gi
    cap = "/dev/nvidia-caps/nvidia-cap"
    return f"/dev/nvidia{g},{cap}{base},{cap}{base + 1 + ci}"


def stat_dev(path: str) -> os.stat_result:
    """/dev/nvidiaN is a device with minor N; anything else does not exist."""
    name = path.rsplit("/", 1)[1]
    if not name.startswith("nvidia") or not name[6:].isdigit():
        raise FileNotFoundError(path)
    return _Dev(os.makedev(195, int(name[6:])))  # type: ignore[return-value]


class _Dev:
    def __init__(self, rdev: int) -> None:
        self.st_rdev = rdev


def order(
    text: str, devices: list[GpuDevice] | None = DEVICES, minors: MigMinors | None = MINORS
) -> GpuOrder:
    return slurm_gpu_order(parse_gres_node(text, "gpu3"), devices, stat_dev, minors)


def bound(result: GpuOrder) -> list[tuple[int, str | None]]:
    return [(g.index, g.uuid) for g in result.gpus]


LISTED = (  # AutoDetect off: the A100s whole, then each H100's slices, grouped by type
    "NodeName=gpu3 Name=gpu Type=a100 File=/dev/nvidia[3,2]\n"
    f"NodeName=gpu3 Name=gpu Type=4g.40gb MultipleFiles={caps(1, 1)}\n"
    f"NodeName=gpu3 Name=gpu Type=3g.40gb MultipleFiles={caps(1, 2)}\n"
    + "".join(f"NodeName=gpu3 Name=gpu Type=1g.10gb MultipleFiles={caps(0, gi)}\n"
              for gi in (9, 7, 8, 10, 11, 12, 13))
)  # fmt: skip


def test_gres_conf_keeps_mig_lines_in_order_with_file_lines() -> None:
    gres = parse_gres_node(LISTED + "Name=shard Count=8 File=/dev/nvidia3\n", "gpu3")
    assert [f.slurm_index for f in gres.files] == [0, 1]
    assert gres.mig[0] == GresMigFile(2, caps(1, 1), tuple(caps(1, 1).split(",")), "4g.40gb", 2)
    assert [m.slurm_index for m in gres.mig] == list(range(2, 11))
    assert gres.mig_lines == tuple(range(2, 11))
    assert [e.slurm_index for e in gres.entries()] == list(range(11))
    assert gres.shares == (GresShare("shard", 8, "/dev/nvidia3", 11),)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("Name=gpu File=/dev/nvidia0 MultipleFiles=/dev/nvidia0,/dev/nvidia1",
         "gres.conf: line 1: File= and MultipleFiles= on one line"),
        ("Name=gpu MultipleFiles=/dev/nvidia0",
         "gres.conf: line 1: MultipleFiles= names one file: use File="),
        ("Name=shard File=/dev/nvidia0", "gres.conf: line 1: Name=shard without Count="),
    ],
)  # fmt: skip
def test_malformed_mig_and_share_lines_name_the_line(line: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_gres_node(line + "\n", "gpu3")
    assert caught.value.problems == [message]


def test_without_autodetect_mig_lines_are_numbered_in_listing_order() -> None:
    result = order(LISTED)
    assert result.problems == ()
    assert result.rule == "gres.conf File= and MultipleFiles= order"
    assert bound(result) == [
        (0, "GPU-a100-minor3"), (1, "GPU-a100-minor2"), (2, "MIG-two-4g"), (3, "MIG-two-3g"),
        (4, "MIG-seven-9"), (5, "MIG-seven-7"), (6, "MIG-seven-8"), (7, "MIG-seven-10"),
        (8, "MIG-seven-11"), (9, "MIG-seven-12"), (10, "MIG-seven-13"),
    ]  # fmt: skip
    assert result.gpus[0].slot == GpuSlot.whole("GPU-a100-minor3")
    assert result.gpus[2].slot == GpuSlot(SlotKind.MIG, "MIG-two-4g", TWO, 4 / 7, "4g.40gb", 1, 0)
    assert result.gpus[4].slot == GpuSlot(
        SlotKind.MIG, "MIG-seven-9", SEVEN, 1 / 7, "1g.10gb", 9, 0
    )
    assert (result.gpus[2].path, result.gpus[2].minor) == (caps(1, 1), 1)
    assert result.index_slot()[3].mig_profile == "3g.40gb"


def test_a_whole_gpu_in_mig_mode_is_not_bound() -> None:
    result = order("Name=gpu Type=h100 File=/dev/nvidia[0-1]\n")
    assert bound(result) == [(0, None), (1, None)]
    assert result.problems[0] == (
        "gres.conf: gpu3: Slurm GPU 0 /dev/nvidia0 is GPU GPU-h100-seven (minor 0), which is"
        " in MIG mode: a whole GPU in MIG mode runs no job, so it is not bound; list its MIG"
        " devices with MultipleFiles= (or AutoDetect=nvml)"
    )


def test_mig_lines_that_cannot_be_tied_to_an_instance_are_not_bound() -> None:
    unknown_cap = "/dev/nvidia0,/dev/nvidia-caps/nvidia-cap66,/dev/nvidia-caps/nvidia-cap9999"
    text = (
        "Name=gpu Type=1g.10gb MultipleFiles=" + caps(0, 7) + "\n"
        "Name=gpu Type=1g.10gb MultipleFiles=" + caps(0, 14) + "\n"  # GI 14: NVML lists none
        "Name=gpu Type=1g.10gb MultipleFiles=" + unknown_cap + "\n"
        "Name=gpu Type=1g.10gb MultipleFiles=" + caps(2, 7) + "\n"  # an A100, not in MIG mode
        "Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia1," + caps(0, 8).split(",", 1)[1] + "\n"
        "Name=gpu Type=1g.10gb MultipleFiles=" + caps(0, 9).rsplit(",", 1)[0] + "\n"  # GI only
    )
    result = order(text)
    assert bound(result) == [(0, "MIG-seven-7")] + [(i, None) for i in range(1, 6)]
    where = "gres.conf: gpu3: Slurm GPU"
    assert result.problems == (
        f"{where} 1 (line 2) MultipleFiles={caps(0, 14)}: NVML lists no MIG device GI 14 CI 0"
        " on GPU GPU-h100-seven (minor 0): not bound",
        f"{where} 2 (line 3) MultipleFiles={unknown_cap}: /dev/nvidia-caps/nvidia-cap9999 is"
        " not in mig-minors: not bound",
        f"{where} 3 (line 4) MultipleFiles={caps(2, 7)}: GPU GPU-a100-minor2 (minor 2) is not"
        " in MIG mode",
        f"{where} 4 (line 5) MultipleFiles=/dev/nvidia1,{caps(0, 8).split(',', 1)[1]}: its cap"
        " files are GPU minor 0's, but /dev/nvidia1 is minor 1: not bound",
        f"{where} 5 (line 6) MultipleFiles={caps(0, 9).rsplit(',', 1)[0]}: its cap files do not"
        " name one GPU instance and one of its compute instances (mig-minors): not bound",
    )
    assert "not bound" in order(text, minors=None).problems[0]


def test_interleaved_types_are_not_numbered() -> None:
    text = (
        f"Name=gpu Type=1g.10gb MultipleFiles={caps(0, 7)}\n"
        f"Name=gpu Type=3g.40gb MultipleFiles={caps(1, 2)}\n"
        f"Name=gpu Type=1G.10gb MultipleFiles={caps(0, 8)}\n"
    )
    result = order(text)
    assert result.gpus == ()
    assert result.problems[0].startswith(
        "gres.conf: gpu3: GPU lines of Type=1G.10gb are not listed together: slurmd numbers"
    )


NVML_ORDER = [  # whole GPUs by NVML index, then MIG slots by their files, naturally
    (0, "GPU-a100-minor3"), (1, "GPU-a100-minor2"),
    (2, "MIG-seven-7"), (3, "MIG-seven-8"), (4, "MIG-seven-9"), (5, "MIG-seven-10"),
    (6, "MIG-seven-11"), (7, "MIG-seven-12"), (8, "MIG-seven-13"),
    (9, "MIG-two-4g"), (10, "MIG-two-3g"),
]  # fmt: skip


def test_autodetect_nvml_puts_mig_slots_after_whole_gpus_in_file_order() -> None:
    result = order("AutoDetect=nvml\n")
    assert result.problems == ()
    assert (
        result.rule
        == "AutoDetect=nvml: NVML enumeration (PCI bus) order, then MIG slots by device files"
    )
    assert bound(result) == NVML_ORDER
    assert result.gpus[2].path == caps(0, 7)  # nvidia-cap66: before cap102 (GI 11)
    assert result.gpus[9].slot == GpuSlot(SlotKind.MIG, "MIG-two-4g", TWO, 4 / 7, "4g.40gb", 1, 0)
    # gres.conf MultipleFiles= lines take slurmd's records by their file string, in any order
    listed = "AutoDetect=nvml\n" + LISTED.replace(
        "Type=a100 File=/dev/nvidia[3,2]", "File=/dev/nvidia[2-3]"
    )
    assert bound(order(listed)) == NVML_ORDER and order(listed).problems == ()


def test_autodetect_nvml_with_a_mig_line_slurmd_does_not_detect() -> None:
    text = (
        f"AutoDetect=nvml\nName=gpu File=/dev/nvidia[2-3]\nName=gpu MultipleFiles={caps(0, 14)}\n"
    )
    result = order(text)
    assert bound(result) == [(0, "GPU-a100-minor3"), (1, "GPU-a100-minor2"), (2, None)]
    assert result.problems[0] == (
        f"gres.conf: gpu3: gres.conf line 3 MultipleFiles={caps(0, 14)} is not a MIG device"
        " slurmd detects: slurmd keeps it as a GPU nobody can read"
    )


def test_autodetect_nvml_skips_mig_devices_mig_minors_does_not_list() -> None:
    only_gpu0 = parse_mig_minors(mig_minors_text(gpus=1), "mm")
    result = order("AutoDetect=nvml\n", minors=only_gpu0)
    # GPU minor 1's slices are skipped: slurmd then numbers that GPU whole, by its Links
    assert bound(result) == [(0, None), (1, "GPU-a100-minor3"), (2, "GPU-a100-minor2")] + [
        (3 + i, f"MIG-seven-{gi}") for i, gi in enumerate(range(7, 14))
    ]
    assert result.problems == (
        "gres.conf: gpu3: MIG device MIG-two-4g (GPU /dev/nvidia1, GI 1 CI 0) is not in mm:"
        " slurmd skips it",
        "gres.conf: gpu3: MIG device MIG-two-3g (GPU /dev/nvidia1, GI 2 CI 0) is not in mm:"
        " slurmd skips it",
        "gres.conf: gpu3: GPU /dev/nvidia1 (GPU-h100-two) is in MIG mode without MIG devices"
        " slurmd can use: slurmd numbers it as a whole GPU, which is not bound",
    )
    unread = order("AutoDetect=nvml\n", minors=None)
    assert unread.gpus == ()
    assert "mig-minors was not read ([node] mig_minors)" in unread.problems[0]


def test_autodetect_nvidia_and_full_do_not_number_mig() -> None:
    result = order("AutoDetect=nvidia\n")
    assert bound(result) == [(0, None), (1, None), (2, "GPU-a100-minor2"), (3, "GPU-a100-minor3")]
    assert result.problems == (
        "gres.conf: gpu3: AutoDetect=nvidia (line 1) does not detect MIG devices (gres.conf(5):"
        ' "doesn\'t detect MIGs"), and /dev/nvidia1 (GPU-h100-two), /dev/nvidia0'
        " (GPU-h100-seven) are in MIG mode: slurmd numbers them as whole GPUs, which are not"
        " bound; set AutoDetect=nvml",
    )
    in_order = [H100_SEVEN, A100_2]  # NVML and minor order agree: full is judged on MIG
    full = order("AutoDetect=full\n", devices=[
        GpuDevice(d.uuid, d.name, m, m, "", None, True, d.mig_enabled, d.mig_devices)
        for m, d in enumerate(in_order)
    ])  # fmt: skip
    assert full.gpus == ()
    assert "AutoDetect=full (line 1) on GPUs in MIG mode" in full.problems[0]


def test_shards_and_mps_give_each_gpu_its_capacity() -> None:
    text = (
        "Name=gpu Type=a100 File=/dev/nvidia[3,2]\n"
        "Name=shard Count=8 File=/dev/nvidia2\n"
        "Name=shard Count=4 File=/dev/nvidia7\n"
    )
    result = order(text)
    assert result.shares == (ShareCapacity("shard", 1, "GPU-a100-minor2", 8),)
    assert result.shares[0].share(2) == 0.25
    assert result.problems == (
        "gres.conf: gpu3: line 3 Name=shard File=/dev/nvidia7 names no GPU slurm-gpu"
        " numbered: its shares are not recorded",
    )
    spread = order("AutoDetect=nvidia\nName=mps Count=10\n", devices=[A100_3, A100_2])
    assert spread.shares == (  # `_distribute_count`: Count/remaining, GPU by GPU
        ShareCapacity("mps", 0, "GPU-a100-minor2", 5),
        ShareCapacity("mps", 1, "GPU-a100-minor3", 5),
    )
    odd = order("Name=gpu File=/dev/nvidia[2-3]\nName=mps Count=7\n", devices=[A100_3, A100_2])
    assert [s.count for s in odd.shares] == [3, 4]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("/dev/nvidia2", "/dev/nvidia10", -1),
        ("nvidia-cap66", "nvidia-cap102", -1),
        ("nvidia-cap120", "nvidia-cap102", 1),
        ("x01", "x1", -1),  # a leading zero: digit by digit, as a fraction
        ("x010", "x01", 1),
        ("a 1", "a1", 0),  # white space is skipped
        ("/dev/nvidia0", "/dev/nvidia0,/dev/x", -1),
        ("same", "same", 0),
        ("B", "a", -1),  # case counts (strnatcmp, not strnatcasecmp)
    ],
)
def test_natural_compare_is_strnatcmp(a: str, b: str, expected: int) -> None:
    assert natural_compare(a, b) == expected
    assert natural_compare(b, a) == -expected


def test_natural_order_sorts_file_lists_by_number() -> None:
    files = [caps(0, gi) for gi in (11, 7, 13, 9)] + ["/dev/nvidia10", "/dev/nvidia9"]
    ranked = sorted(files, key=functools.cmp_to_key(natural_compare))
    assert ranked == [
        caps(0, 7),
        caps(0, 9),
        caps(0, 11),
        caps(0, 13),
        "/dev/nvidia9",
        "/dev/nvidia10",
    ]


def test_config_check_prints_mig_slots_and_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gres = tmp_path / "gres.conf"
    gres.write_text(
        f"NodeName=gpu3 Name=gpu Type=3g.40gb MultipleFiles={caps(1, 2)}\n"
        "NodeName=gpu3 Name=gpu Type=a100 File=/dev/nvidia2\n"
        "NodeName=gpu3 Name=shard Count=8 File=/dev/nvidia2\n"
    )
    minors = tmp_path / "mig-minors"
    minors.write_text(mig_minors_text())
    monkeypatch.setattr(config_cmd, "nvml_devices", lambda: DEVICES)
    monkeypatch.setattr(config_cmd, "slurm_gpu_order", functools.partial(
        slurm_gpu_order, stat=stat_dev))  # fmt: skip
    config = Config(node=NodeSettings(gres_conf=gres, mig_minors=minors))
    lines, result = config_cmd.gpu_order_lines(config, "gpu3")
    assert lines == [
        f"# gres.conf {gres}, node gpu3: gres.conf File= and MultipleFiles= order",
        f"#   Slurm GPU 0 = MIG 3g.40gb MIG-two-3g ({TWO}, GI 2 CI 0)",
        "#   Slurm GPU 1 = /dev/nvidia2 GPU-a100-minor2",
        "#   Slurm GPU 1: 8 shard (GPU-a100-minor2), one is 1/8 of the GPU",
    ]
    assert result is not None and result.problems == ()
    missing = Config(node=NodeSettings(gres_conf=gres, mig_minors=tmp_path / "absent"))
    lines, result = config_cmd.gpu_order_lines(missing, "gpu3")
    assert lines[1] == "#   Slurm GPU 0 = " + caps(1, 2) + " (not bound to a device)"
    assert result is not None and "mig-minors was not read" in result.problems[0]
