"""/proc/driver/nvidia-caps/mig-minors: capability minor <-> (GPU minor, GI, CI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu.errors import ConfigError
from slurm_gpu.slurm.mig_minors import (
    MigCapability,
    capability_file_minor,
    load_mig_minors,
    parse_mig_minors,
)


def driver_text(gpus: int = 4, gis: int = 15, cis: int = 8) -> str:
    """The driver's file: gpu{g}/gi{gi}/access = 3+135g+9gi, ci{ci} = that+1+ci."""
    lines = ["config 1", "monitor 2"]
    for g in range(gpus):
        for gi in range(gis):
            base = 3 + 135 * g + 9 * gi
            lines.append(f"gpu{g}/gi{gi}/access {base}")
            lines += [f"gpu{g}/gi{gi}/ci{ci}/access {base + 1 + ci}" for ci in range(cis)]
    return "\n".join(lines) + "\n"


def test_capability_minors_map_both_ways() -> None:
    minors = parse_mig_minors(driver_text(), "mig-minors")
    assert (minors.config, minors.monitor) == (1, 2)
    assert minors.capability(439) == MigCapability(3, 3, 3)  # gpu3/gi3/ci3
    assert minors.capability(435) == MigCapability(3, 3, None)  # gpu3/gi3/access
    assert minors.capability(21) == MigCapability(0, 2, None)
    assert minors.capability(22) == MigCapability(0, 2, 0)
    assert minors.capability(1) is None and minors.capability(9999) is None
    assert minors.instance_minors(0, 2, 0) == (21, 22)
    assert minors.instance_minors(1, 7, 0) == (201, 202)
    assert minors.instance_minors(3, 3, 3) == (435, 439)
    assert minors.instance_minors(4, 0, 0) is None  # no GPU minor 4 in this file
    assert len(minors.capabilities) == 4 * 15 * 9


def test_an_instance_needs_both_its_lines() -> None:
    minors = parse_mig_minors("gpu0/gi1/access 12\ngpu0/gi2/ci0/access 22\n")
    assert minors.instance_minors(0, 1, 0) is None  # no compute instance line
    assert minors.instance_minors(0, 2, 0) is None  # no GPU instance line
    assert (minors.config, minors.monitor) == (None, None)


def test_names_slurmd_does_not_look_for_are_ignored() -> None:
    minors = parse_mig_minors("config 1\nfabric-imex 7\n\n  gpu0/gi0/access 3\n")
    assert minors.capabilities == {3: MigCapability(0, 0, None)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("config 1\nmonitor\n", "mm: line 2: expected NAME MINOR, got 'monitor'"),
        ("config 1 2\n", "mm: line 1: expected NAME MINOR, got 'config 1 2'"),
        ("config 1\ngpu0/gi0/access x3\n",
         "mm: line 2: gpu0/gi0/access: minor 'x3' is not a number"),
        ("gpu0/gi0/acess 3\n", "mm: line 1: 'gpu0/gi0/acess' is not gpuG/giI/access or"),
        ("gpu0/ci0/access 3\n", "mm: line 1: 'gpu0/ci0/access' is not gpuG/giI/access or"),
        ("config 1\nmonitor 2\ngpu0/gi0/access 2\n",
         "mm: line 3: gpu0/gi0/access: minor 2 is already line 2's"),
    ],
)  # fmt: skip
def test_malformed_lines_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_mig_minors(text, "mm")
    assert caught.value.problems[0].startswith(message)


def test_load_reads_a_file_and_names_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "mig-minors"
    path.write_text(driver_text(gpus=1))
    minors = load_mig_minors(path)
    assert minors.source == str(path) and minors.instance_minors(0, 14, 7) == (129, 137)
    with pytest.raises(ConfigError) as caught:
        load_mig_minors(tmp_path / "absent")
    assert caught.value.problems == [f"{tmp_path / 'absent'}: No such file or directory"]
    path.write_text("gpu0/gi0/access\n")
    with pytest.raises(ConfigError) as caught:
        load_mig_minors(path)
    assert caught.value.problems[0].startswith(f"{path}: line 1: expected NAME MINOR")


def test_cap_file_minors_come_from_the_name_as_slurmd_writes_it() -> None:
    assert capability_file_minor("/dev/nvidia-caps/nvidia-cap21") == 21
    assert capability_file_minor("/var/tmp/bed/dev/nvidia-caps/nvidia-cap439") == 439
    assert capability_file_minor("/dev/nvidia0") is None
    assert capability_file_minor("/dev/nvidia-cap21") is None  # not under nvidia-caps/
