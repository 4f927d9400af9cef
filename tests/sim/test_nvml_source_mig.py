"""slurm-gpu's NvmlSource over the simulated libnvidia-ml: MIG and per-process utilization (#14).

MIG devices are listed under their GPU with the ids, profile and slices Slurm's AutoDetect
gives them; each is measured by its memory, processes and (Hopper and newer) the GPM of its
GPU instance, an A100's by memory alone. A MIG-mode GPU has no utilization samples. Shared
GPUs are measured per process, by the newest per-process call the driver has. Each case runs
NvmlSource in a fresh process (tests/sim/nvml_source_mig_probe.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sim.conftest import BIN, NODE, REPO, Node, sim_gpu, uuid_of
from tests.sim.test_sim_gpm import make_h100_node
from tests.sim.test_sim_mig import start_mig_load, write_layout
from tests.sim.test_sim_process_util import driver, plan

PROBE = Path(__file__).with_name("nvml_source_mig_probe.py")
MIB = 2**20
NEW = "nvmlDeviceGetProcessesUtilizationInfo"
OLD = "nvmlDeviceGetProcessUtilization"


@pytest.fixture
def h100(tmp_path: Path, libdir: Path) -> Iterator[Node]:
    """4 simulated H100s (GPM), index == minor."""
    n = make_h100_node(tmp_path / "sim-h100", libdir)
    yield n
    n.stop_all()


@pytest.fixture
def sleepers() -> Iterator[list[int]]:
    """Pids of two live processes for per-process plans (the library checks they live)."""
    procs = [subprocess.Popen(["sleep", "300"]) for _ in range(2)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def probe(node: Node, **ask: Any) -> dict[str, Any]:
    """Runs the probe (devices, then rounds of snapshot, mig_snapshot, process_utilization)."""
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(node.libdir),
        "SIM_NVML_DIR": str(node.dir),
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, str(PROBE)],
        input=json.dumps({"reads": 2, "pause": 1.2, **ask}),
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def device(result: dict[str, Any], uuid: str) -> dict[str, Any]:
    return next(d for d in result["devices"] if d["uuid"] == uuid)


def read_of(result: dict[str, Any], n: int, kind: str, uuid: str) -> dict[str, Any]:
    """Round n's record of `uuid` in "snapshots", "migs" or "process_util"."""
    return next(r for r in result["rounds"][n][kind] if r["uuid"] == uuid)


def mig_rows(dev: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (m["mig_index"], m["gpu_instance_id"], m["compute_instance_id"], m["profile"],
         m["slices"], m["max_slices"], m["memory_total_bytes"], m["uuid"], m["parent_uuid"])
        for m in dev["mig_devices"]
    ]  # fmt: skip


# --- devices() --------------------------------------------------------------------------


def test_devices_list_each_layouts_mig_devices_with_slurms_profiles(h100: Node) -> None:
    """3g.40gb+4g.40gb on GPU 0, 1g.10gb x 7 on GPU 1, GPUs 2 and 3 whole."""
    halves = write_layout(h100, 0, ["3g.40gb", "4g.40gb"])
    sevenths = write_layout(h100, 1, ["1g.10gb"] * 7)
    gpu0, gpu1 = uuid_of(h100, 0), uuid_of(h100, 1)

    result = probe(h100, reads=0)

    assert [(d["minor"], d["mig_enabled"]) for d in result["devices"]] == [
        (0, True), (1, True), (2, False), (3, False)
    ]  # fmt: skip
    assert mig_rows(device(result, gpu0)) == [
        (0, 1, 0, "4g.40gb", 4, 7, 40192 * MIB, halves[0]["uuid"], gpu0),
        (1, 2, 0, "3g.40gb", 3, 7, 40192 * MIB, halves[1]["uuid"], gpu0),
    ]
    assert mig_rows(device(result, gpu1)) == [
        (k, 7 + k, 0, "1g.10gb", 1, 7, 9728 * MIB, sevenths[k]["uuid"], gpu1) for k in range(7)
    ]
    assert [d["mig_devices"] for d in result["devices"][2:]] == [[], []]
    assert result["logs"] == []


def test_a_gpu_that_cannot_do_mig_is_simply_not_in_mig_mode(tmp_path: Path, libdir: Path) -> None:
    """An L40S answers NOT_SUPPORTED to nvmlDeviceGetMigMode: mig_enabled False, no warning."""
    node = Node(root=tmp_path / "sim", libdir=libdir)
    sim_gpu(
        "create", "--dir", str(node.dir), "--node", NODE, "--model", "NVIDIA L40S",
        "--memory-mib", "46068", "--count", "2", "--created", str(time.time() - 60),
    )  # fmt: skip

    result = probe(node, reads=1)

    assert [(d["mig_enabled"], d["mig_devices"]) for d in result["devices"]] == [
        (False, []),
        (False, []),
    ]
    assert [len(s["samples"]) > 0 for s in result["rounds"][0]["snapshots"]] == [True, True]
    assert [text for level, text in result["logs"] if level != "INFO" or "MIG" in text] == []


# --- mig_snapshot() ---------------------------------------------------------------------


def test_h100_mig_snapshot_measures_the_gpm_of_its_own_gpu_instance(h100: Node) -> None:
    """gpu-load --util 60 on the 3g slice, nothing on the 4g: each slice's own figures."""
    four, three = write_layout(h100, 0, ["3g.40gb", "4g.40gb"])
    _, pid = start_mig_load(h100, three["uuid"], "--util", "60", "--seconds", "0")

    result = probe(h100)

    first = [read_of(result, 0, "migs", m["uuid"]) for m in (three, four)]
    second = [read_of(result, 1, "migs", m["uuid"]) for m in (three, four)]
    assert [m["gpm"] for m in first] == [None, None]  # one sample: no window yet
    measured = [
        (
            m["mem_used_bytes"],
            m["mem_total_bytes"],
            [p["pid"] for p in m["processes"]],
            {k: round(v, 3) for k, v in m["gpm"].items() if k.endswith("_percent")},
            m["error"],
        )
        for m in second
    ]
    busy = {
        "sm_active_percent": 60.0, "sm_occupancy_percent": 30.0, "tensor_active_percent": 0.0,
        "dram_bw_percent": 20.0, "fp64_active_percent": 0.0, "fp32_active_percent": 30.0,
        "fp16_active_percent": 0.0, "graphics_active_percent": 60.0,
    }  # fmt: skip
    assert measured == [
        (1024 * MIB, 40192 * MIB, [pid], busy, None),
        (0, 40192 * MIB, [], dict.fromkeys(busy, 0.0), None),
    ]


def test_mig_gpm_windows_tile_time(h100: Node) -> None:
    """Three reads: each window runs from the previous mig_snapshot to this one."""
    (only,) = write_layout(h100, 0, ["7g.80gb"])

    result = probe(h100, reads=3)

    reads = [read_of(result, n, "migs", only["uuid"]) for n in range(3)]
    assert [(r["gpm"] or {}).get("start") for r in reads] == [
        None,
        reads[0]["time"],
        reads[1]["time"],
    ]
    assert [(r["gpm"] or {}).get("end") for r in reads] == [
        None,
        reads[1]["time"],
        reads[2]["time"],
    ]


def test_a_mig_mode_gpu_presents_no_utilization(h100: Node) -> None:
    """In MIG mode a GPU has no utilization samples (unknown), a whole GPU beside it has."""
    _, three = write_layout(h100, 0, ["3g.40gb", "4g.40gb"])
    _, pid = start_mig_load(h100, three["uuid"], "--util", "60", "--seconds", "0")
    h100.start_load("2", "--util", "40", "--seconds", "0")
    parent, whole = uuid_of(h100, 0), uuid_of(h100, 2)

    result = probe(h100)

    snaps = [read_of(result, 1, "snapshots", u) for u in (parent, whole)]
    assert snaps[0]["samples"] == []
    assert len(snaps[1]["samples"]) > 0
    # the physical GPU's own readings stand: its memory, processes and (weighted) GPM
    assert (snaps[0]["mem_used_bytes"], [p["pid"] for p in snaps[0]["processes"]]) == (
        1024 * MIB,
        [pid],
    )
    assert round(snaps[0]["gpm"]["sm_active_percent"], 3) == round(60 * 3 / 7, 3)
    assert snaps[0]["error"] is None
    assert [m for m in result["logs"] if "samples" in m[1]] == []


def test_a100_mig_is_measured_by_memory_alone(node: Node) -> None:
    """An A100 has no GPM: its slices get gpm None, no GPM sample is taken or allocated."""
    four, three = write_layout(node, 0, ["3g.40gb", "4g.40gb"])
    _, pid = start_mig_load(node, three["uuid"], "--util", "60", "--seconds", "0")

    result = probe(node)

    reads = [read_of(result, n, "migs", m["uuid"]) for n in (0, 1) for m in (three, four)]
    assert [(r["gpm"], r["mem_used_bytes"], [p["pid"] for p in r["processes"]]) for r in reads] == [
        (None, 1024 * MIB, [pid]),
        (None, 0, []),
    ] * 2
    gpm_calls = [f for f in result["looked_up"] if f.startswith("nvmlGpm")]
    assert gpm_calls == ["nvmlGpmQueryDeviceSupport"]


def test_mig_gpm_not_supported_is_logged_once_and_not_asked_again(h100: Node) -> None:
    """GPM turns NOT_SUPPORTED after the first read: gpm None, one log line, no retries."""
    four, three = write_layout(h100, 0, ["3g.40gb", "4g.40gb"])
    fault = [sys.executable, str(BIN / "sim-gpu"), "fault", "--dir", str(h100.dir)]

    result = probe(
        h100,
        reads=4,
        pause=0.3,
        between=[*fault, "--gpu", "minor:0", "not-supported=gpm"],
        count=["nvmlGpmMigSampleGet", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree"],
    )

    reads = [read_of(result, n, "migs", m["uuid"]) for n in range(1, 4) for m in (three, four)]
    assert [(r["gpm"], r["mem_total_bytes"], r["error"]) for r in reads] == [
        (None, 40192 * MIB, None)
    ] * 6
    # two slices: one sample each at the first read, one refused each at the second
    assert result["calls"] == {
        "nvmlGpmMigSampleGet": 4,
        "nvmlGpmSampleAlloc": 4 * 2 + 2 * 2,  # 4 GPUs, then 2 slices
        "nvmlGpmSampleFree": 12,  # the slices' at the refusal, the GPUs' at close
    }
    off = [(level, text.split()[1]) for level, text in result["logs"] if "MigSample" in text]
    assert off == [("INFO", four["uuid"] + ":"), ("INFO", three["uuid"] + ":")]


def test_mig_snapshot_of_a_lost_gpu_sets_error(h100: Node) -> None:
    """The parent turns lost after the first read: the slices' reads carry the error."""
    four, three = write_layout(h100, 0, ["3g.40gb", "4g.40gb"])
    fault = [sys.executable, str(BIN / "sim-gpu"), "fault", "--dir", str(h100.dir)]

    result = probe(h100, between=[*fault, "--gpu", "minor:0", "lost"])

    second = [read_of(result, 1, "migs", m["uuid"]) for m in (three, four)]
    assert [(m["error"], m["mem_used_bytes"], m["gpm"]) for m in second] == [
        ("GPU is lost", None, None)
    ] * 2
    assert read_of(result, 1, "snapshots", uuid_of(h100, 1))["error"] is None


# --- process_utilization() --------------------------------------------------------------


def test_driver_550_reads_each_process_with_the_new_call(node: Node, sleepers: list[int]) -> None:
    """Two processes on one GPU at 30 and 50%: their own figures, from the R550 call."""
    driver(node, "550.90.07")
    a, b = sleepers
    plan(node, 0, a, 30)
    plan(node, 0, b, 50)

    result = probe(node, reads=1, align=True)

    read = read_of(result, 0, "process_util", uuid_of(node, 0))
    assert (read["call"], read["error"], read["processes"]) == (
        NEW,
        None,
        sorted(
            [
                {"pid": a, "sm_util_percent": 30.0, "mem_util_percent": 15.0, "sample_count": 1},
                {"pid": b, "sm_util_percent": 50.0, "mem_util_percent": 25.0, "sample_count": 1},
            ],
            key=lambda p: p["pid"],
        ),
    )
    assert read["last_seen"] == float(int(read["time"]))  # the newest whole second
    assert OLD not in result["looked_up"]


def test_driver_580_never_asks_the_old_call(node: Node, sleepers: list[int]) -> None:
    """R580's old call would answer 0: the new one gives 40%, the old one is never looked up."""
    driver(node, "580.95.05")
    plan(node, 1, sleepers[0], 40)

    result = probe(node, reads=2, align=True)

    reads = [read_of(result, n, "process_util", uuid_of(node, 1)) for n in (0, 1)]
    assert [
        (r["call"], [(p["pid"], p["sm_util_percent"]) for p in r["processes"]]) for r in reads
    ] == [(NEW, [(sleepers[0], 40.0)])] * 2
    assert reads[1]["last_seen"] > reads[0]["last_seen"]  # the window moved on
    assert OLD not in result["looked_up"]


def test_driver_535_falls_back_to_the_old_call_once(node: Node, sleepers: list[int]) -> None:
    """Before R550 the new call is FUNCTION_NOT_FOUND: the old one answers, said once at info."""
    plan(node, 2, sleepers[0], 70)

    result = probe(node, reads=2, align=True)

    reads = [read_of(result, n, "process_util", uuid_of(node, 2)) for n in (0, 1)]
    assert [
        (r["call"], r["error"], [(p["pid"], p["sm_util_percent"]) for p in r["processes"]])
        for r in reads
    ] == [(OLD, None, [(sleepers[0], 70.0)])] * 2
    assert [level for level, text in result["logs"] if NEW in text] == ["INFO"]


def test_no_sample_newer_than_since_is_no_process_not_an_error(
    node: Node, sleepers: list[int]
) -> None:
    """NOT_FOUND (an idle GPU, or nothing after `since`) reads as no process sampled."""
    driver(node, "550.90.07")
    plan(node, 0, sleepers[0], 30)
    later = time.time() + 3600

    result = probe(node, reads=1, since=later)

    reads = [read_of(result, 0, "process_util", uuid_of(node, m)) for m in (0, 1)]
    assert [(r["processes"], r["error"], r["call"], r["last_seen"]) for r in reads] == [
        ([], None, NEW, later)
    ] * 2


def test_a_mig_mode_gpu_has_no_per_process_utilization(h100: Node) -> None:
    """NOT_SUPPORTED in MIG mode: error set (unknown, never idle); a whole GPU reads."""
    driver(h100, "550.90.07")
    write_layout(h100, 0, ["7g.80gb"])

    result = probe(h100, reads=1)

    reads = [read_of(result, 0, "process_util", uuid_of(h100, m)) for m in (0, 1)]
    assert [(r["error"], r["processes"], r["call"]) for r in reads] == [
        ("Not Supported", [], NEW),
        (None, [], NEW),
    ]
