"""slurm-gpu's NvmlSource over the simulated libnvidia-ml (issue #13: GPM).

The simulated A100s answer GPM "not supported" as real ones do, the H100s measure it; the
metrics between two samples are the exact time-weighted mean of what gpu-load drove. Each
case runs NvmlSource in a fresh process (tests/sim/nvml_source_probe.py), because the
library is found through LD_LIBRARY_PATH, read only when a process starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sim.conftest import BIN, NODE, REPO, Node, sim_gpu, uuid_of

PROBE = Path(__file__).with_name("nvml_source_probe.py")
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
GPM_FIELDS = (
    "sm_active_percent",
    "sm_occupancy_percent",
    "tensor_active_percent",
    "dram_bw_percent",
)


def make_gpus(root: Path, libdir: Path, model: str) -> Node:
    """Two GPUs of `model` on node NODE, created a minute ago."""
    node = Node(root=root, libdir=libdir)
    sim_gpu(
        "create", "--dir", str(node.dir), "--node", NODE, "--model", model,
        "--memory-mib", "81920", "--count", "2",
    )  # fmt: skip
    return node


@pytest.fixture
def h100(tmp_path: Path, libdir: Path) -> Iterator[Node]:
    node = make_gpus(tmp_path / "sim", libdir, H100)
    yield node
    node.stop_all()


@pytest.fixture
def a100(tmp_path: Path, libdir: Path) -> Iterator[Node]:
    node = make_gpus(tmp_path / "sim", libdir, A100)
    yield node
    node.stop_all()


def probe(node: Node, *, gpm: bool = True, reads: int = 2, **more: Any) -> dict[str, Any]:
    """NvmlSource(gpm=gpm): devices(), then `reads` snapshots 1.2 s apart, then close()."""
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(node.libdir),
        "SIM_NVML_DIR": str(node.dir),
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, str(PROBE)],
        input=json.dumps({"gpm": gpm, "reads": reads, "pause": 1.2, **more}),
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def by_uuid(snapshots: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["uuid"]: s for s in snapshots}


def test_h100_measures_the_time_weighted_gpm_metrics_of_its_load(h100: Node) -> None:
    """gpu-load --util 90 --sm 30 --tensor 60 on GPU 0: its metrics, the other GPU idle."""
    h100.start_load("0", "--util", "90", "--sm", "30", "--tensor", "60", "--seconds", "0")
    busy, idle = uuid_of(h100, 0), uuid_of(h100, 1)

    result = probe(h100)

    second = by_uuid(result["snapshots"][1])
    measured = {
        uuid: tuple(round(second[uuid]["gpm"][f], 3) for f in GPM_FIELDS) for uuid in (busy, idle)
    }
    # occupancy and DRAM default to sm / 2 and sm / 3 (gpu-load)
    assert {busy: (30.0, 15.0, 60.0, 10.0), idle: (0.0, 0.0, 0.0, 0.0)} == measured


def test_h100_gpm_window_runs_from_the_previous_read_to_this_one(h100: Node) -> None:
    """The first read has no window (one sample); the second's spans the two reads' times."""
    result = probe(h100)

    first, second = (by_uuid(reads)[uuid_of(h100, 0)] for reads in result["snapshots"])
    assert (None, first["time"], second["time"]) == (
        first["gpm"],
        second["gpm"]["start"],
        second["gpm"]["end"],
    )


def test_h100_devices_say_gpm_is_supported(h100: Node) -> None:
    """devices() asks nvmlGpmQueryDeviceSupport: both H100s support GPM."""
    assert [True, True] == [d["gpm_supported"] for d in probe(h100, reads=0)["devices"]]


def test_a100_has_no_gpm_and_its_other_fields_read(a100: Node) -> None:
    """An A100 answers GPM "not supported": gpm None on every read, memory and power read."""
    a100.start_load("0", "--util", "90", "--seconds", "0")

    result = probe(a100)

    reads = [s for snapshots in result["snapshots"] for s in snapshots]
    assert ([False, False], [None] * 4, 4) == (
        [d["gpm_supported"] for d in result["devices"]],
        [s["gpm"] for s in reads],
        sum(1 for s in reads if None not in (s["power_watts"], s["mem_used_bytes"])),
    )


def test_a100_allocates_no_gpm_sample(a100: Node) -> None:
    """Where GPM is not supported, NvmlSource asks for support and nothing more."""
    gpm_calls = [f for f in probe(a100)["looked_up"] if f.startswith("nvmlGpm")]

    assert ["nvmlGpmQueryDeviceSupport"] == gpm_calls


def test_gpm_off_makes_no_gpm_call(h100: Node) -> None:
    """[node] gpm = false: not even the support query; gpm None, gpm_supported False."""
    result = probe(h100, gpm=False)

    reads = [s for snapshots in result["snapshots"] for s in snapshots]
    assert ([], [False, False], [None] * 4) == (
        [f for f in result["looked_up"] if f.startswith("nvmlGpm")],
        [d["gpm_supported"] for d in result["devices"]],
        [s["gpm"] for s in reads],
    )


def test_h100_gpm_samples_are_freed_at_close(h100: Node) -> None:
    """Two samples per GPU are allocated once, freed at close (once, though closed twice)."""
    assert {"nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet"} <= set(
        probe(h100)["looked_up"]
    )


def test_gpm_failing_after_start_blanks_no_other_field(h100: Node) -> None:
    """GPM turns "not supported" on GPU 0 after devices(): gpm None there, the rest reads."""
    broken = uuid_of(h100, 0)
    fault = [sys.executable, str(BIN / "sim-gpu"), "fault", "--dir", str(h100.dir)]

    result = probe(h100, fault_after_devices=[*fault, "--gpu", "minor:0", "not-supported=gpm"])

    second = by_uuid(result["snapshots"][1])
    other = next(u for u in second if u != broken)
    assert (None, None, True, True) == (
        second[broken]["gpm"],
        second[broken]["error"],
        second[broken]["mem_used_bytes"] is not None and second[broken]["power_watts"] is not None,
        second[other]["gpm"] is not None,
    )
