"""The simulated NVML library seen through the real pynvml: devices, memory, faults, errors."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.sim.conftest import BIN, MODEL, NODE, ORDER, Node, make_node, sim_gpu, uuid_of

FIELD_KEYS = {
    "power": "power",
    "energy": "energy",
    "temperature": "temperature",
    "ecc": "ecc",
    "samples": "samples",
    "utilization": "util",
    "memory": "mem_used",
    "processes": "procs",
}
MIB = 1 << 20


def errors(device: dict[str, object]) -> dict[str, str]:
    """The fields of one device snapshot that came back as NVML errors."""
    return {k: v["error"] for k, v in device.items() if isinstance(v, dict) and "error" in v}


def test_enumeration_order_differs_from_minor_order(node: Node) -> None:
    """Devices enumerate in the order file's order, not by minor number."""
    expected = ORDER
    assert expected == [d["minor"] for d in node.devices()]


def test_device_identity(node: Node) -> None:
    """Name, UUID, index and PCI bus id of each device match what sim-gpu created."""
    expected = [
        {"name": MODEL, "uuid": uuid_of(node, m), "index": i, "pci_bus_id_len": 16}
        for i, m in enumerate(ORDER)
    ]
    actual = [
        {
            "name": d["name"],
            "uuid": d["uuid"],
            "index": d["index"],
            "pci_bus_id_len": len(d["pci_bus_id"]),
        }
        for d in node.devices()
    ]
    assert expected == actual


def test_handle_by_uuid_and_pci_bus_id(node: Node) -> None:
    """nvmlDeviceGetHandleByUUID / ByPciBusId find the same device as its index."""
    devices = node.devices()
    ops = [{"op": "index_by", "by": "uuid", "key": d["uuid"]} for d in devices]
    ops += [{"op": "index_by", "by": "pci", "key": d["pci_bus_id"]} for d in devices]
    expected = [0, 1, 2, 3, 0, 1, 2, 3]
    assert expected == node.nvml(ops)


def test_unknown_uuid_is_not_found(node: Node) -> None:
    """An unknown UUID raises NVMLError_NotFound."""
    expected = [{"error": "NVMLError_NotFound"}]
    assert expected == node.nvml(
        [{"op": "index_by", "by": "uuid", "key": "GPU-00000000-0000-0000-0000-000000000000"}]
    )


def test_system_versions(node: Node) -> None:
    """Driver, NVML and CUDA versions are reported like a 535 driver."""
    ops = [
        {"op": "call", "fn": "nvmlSystemGetDriverVersion"},
        {"op": "call", "fn": "nvmlSystemGetNVMLVersion"},
        {"op": "call", "fn": "nvmlSystemGetCudaDriverVersion_v2"},
    ]
    expected = ["535.183.01", "12.535.183.01", 12020]
    assert expected == node.nvml(ops)


def test_recreate_is_idempotent(node: Node) -> None:
    """Running sim-gpu create again keeps UUIDs and creation times (energy counters)."""
    before = {p.parent.name: p.read_text() for p in (node.dir / "gpus").glob("*/info")}
    make_node(node.root, node.libdir)
    after = {p.parent.name: p.read_text() for p in (node.dir / "gpus").glob("*/info")}
    assert before == after


def test_plans_dir_is_world_writable_and_sticky(node: Node) -> None:
    """Job users (not root) can add plan files; the sticky bit protects other users' files."""
    mode = (node.dir / "gpus" / uuid_of(node, 0) / "plans").stat().st_mode
    expected = 0o1777
    assert expected == stat.S_IMODE(mode)


def test_memory_v1_and_v2(node: Node) -> None:
    """Memory used is the live processes' memory; v2 adds a fixed reserved amount."""
    node.start_load("0", "--pattern", "memory-only", "--mem", "2048", "--seconds", "30")
    index = ORDER.index(0)
    v1, v2 = node.nvml(
        [
            {"op": "call", "fn": "nvmlDeviceGetMemoryInfo", "index": index},
            {"op": "call", "fn": "nvmlDeviceGetMemoryInfo", "index": index, "args": [0x02000028]},
        ]
    )
    total, used, reserved = 81920 * MIB, 2048 * MIB, 256 * MIB
    expected = {"total": total, "free": total - used - reserved, "used": used}
    assert expected == v1
    expected = {
        "version": 0x02000028,
        "total": total,
        "reserved": reserved,
        "free": total - used - reserved,
        "used": used,
    }
    assert expected == v2


def test_memory_v2_checks_struct_version(node: Node) -> None:
    """A wrong nvmlMemory_v2_t version raises NVMLError_ArgumentVersionMismatch."""
    expected = [{"error": "NVMLError_ArgumentVersionMismatch"}]
    assert expected == node.nvml(
        [{"op": "call", "fn": "nvmlDeviceGetMemoryInfo", "index": 0, "args": [0x01000028]}]
    )


def test_process_count_query_with_null_buffer(node: Node) -> None:
    """NULL buffer with one process: INSUFFICIENT_SIZE and the needed count, as NVML does."""
    node.start_load("0", "--pattern", "idle", "--seconds", "30")
    index = ORDER.index(0)
    expected = [{"ret": 7, "count": 1}, {"ret": 0, "count": 0}, {"ret": 0, "count": 1}]
    assert expected == node.nvml(
        [
            {"op": "raw_procs", "index": index, "capacity": 0},
            {"op": "raw_procs", "index": ORDER.index(1), "capacity": 0},
            {"op": "raw_procs", "index": index, "capacity": 1},
        ]
    )


def test_graphics_processes_are_empty(node: Node) -> None:
    """The simulated GPUs run no graphics contexts."""
    expected: list[list[object]] = [[]]
    assert expected == node.nvml(
        [{"op": "call", "fn": "nvmlDeviceGetGraphicsRunningProcesses", "index": 0}]
    )


def test_mig_mode_disabled(node: Node) -> None:
    """MIG is disabled, current and pending."""
    expected = [[0, 0]]
    assert expected == node.nvml([{"op": "call", "fn": "nvmlDeviceGetMigMode", "index": 0}])


def test_idle_gpu_readings(node: Node) -> None:
    """An idle GPU reads 0% utilization, idle power, 30 C, no processes, no ECC errors."""
    device = node.devices()[0]
    expected = {"util": 0, "power": 60000, "temperature": 30, "procs": [], "ecc": 0, "mem_used": 0}
    assert expected == {k: device[k] for k in expected}


def test_samples_start_at_creation(tmp_path: Path, libdir: Path) -> None:
    """No sample is older than the GPU: one per whole second since it was created."""
    node = Node(root=tmp_path, libdir=libdir)
    created = time.time() - 5
    sim_gpu(
        "create", "--dir", str(node.dir), "--node", NODE, "--count", "1", "--created", str(created)
    )
    ((value_type, samples),) = node.nvml(
        [{"op": "call", "fn": "nvmlDeviceGetSamples", "index": 0, "args": [1, 0]}]
    )
    # The subprocesses take a moment: at most one sample per second up to now.
    age = time.time() - created
    expected = (1, True, True)
    assert expected == (
        value_type,
        4 <= len(samples) <= int(age) + 1,
        min(s[0] for s in samples) > created * 1e6,
    )


def test_ecc_errors_are_added(node: Node) -> None:
    """sim-gpu ecc --add 3 shows as 3 uncorrected errors on that GPU only."""
    sim_gpu("ecc", "--dir", str(node.dir), "--gpu", "minor:0", "--add", "3")
    expected = {2: 0, 0: 3, 3: 0, 1: 0}
    assert expected == {m: d["ecc"] for m, d in node.by_minor().items()}


def test_lost_gpu_fails_alone(node: Node) -> None:
    """A lost GPU raises NVMLError_GpuIsLost on every call; the other GPUs read normally."""
    sim_gpu("fault", "--dir", str(node.dir), "--gpu", "minor:1", "lost")
    devices = node.devices()
    lost = {k: "NVMLError_GpuIsLost" for k in devices[0]}
    expected = [{}, {}, {}, lost]
    assert expected == [errors(d) for d in devices]


def test_cleared_fault_reads_normally(node: Node) -> None:
    """After `fault ... clear` the GPU reads normally again."""
    sim_gpu("fault", "--dir", str(node.dir), "--gpu", "minor:1", "lost")
    sim_gpu("fault", "--dir", str(node.dir), "--gpu", "minor:1", "clear")
    expected: list[dict[str, str]] = [{}, {}, {}, {}]
    assert expected == [errors(d) for d in node.devices()]


@pytest.mark.parametrize("field", sorted(FIELD_KEYS))
def test_not_supported_field(node: Node, field: str) -> None:
    """not-supported=FIELD raises NVMLError_NotSupported for that field on that GPU only."""
    sim_gpu("fault", "--dir", str(node.dir), "--gpu", "minor:2", f"not-supported={field}")
    expected = [{FIELD_KEYS[field]: "NVMLError_NotSupported"}, {}, {}, {}]
    assert expected == [errors(d) for d in node.devices()]


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("driver-not-loaded", "NVMLError_DriverNotLoaded"),
        ("lib-rm-version-mismatch", "NVMLError_LibRmVersionMismatch"),
    ],
)
def test_init_fault(node: Node, kind: str, error: str) -> None:
    """An init fault makes nvmlInit raise the matching NVMLError subclass."""
    sim_gpu("fault", "--dir", str(node.dir), "--init", kind)
    expected = [{"error": error}]
    assert expected == node.nvml([{"op": "init"}], init=False)


def test_missing_sim_dir_is_driver_not_loaded(node: Node) -> None:
    """Without SIM_NVML_DIR (or with a missing one) nvmlInit raises NVMLError_DriverNotLoaded."""
    results = [
        node.nvml([{"op": "init"}], init=False, env={"SIM_NVML_DIR": ""}),
        node.nvml([{"op": "init"}], init=False, env={"SIM_NVML_DIR": str(node.root / "nope")}),
    ]
    expected = [[{"error": "NVMLError_DriverNotLoaded"}]] * 2
    assert expected == results


def test_calls_before_init_are_uninitialized(node: Node) -> None:
    """Calls before nvmlInit, and after nvmlShutdown, raise NVMLError_Uninitialized."""
    before = node.nvml([{"op": "call", "fn": "nvmlDeviceGetCount"}], init=False)
    after = node.nvml(
        [
            {"op": "shutdown"},
            {"op": "call", "fn": "nvmlDeviceGetCount"},
            {"op": "call", "fn": "nvmlSystemGetDriverVersion"},
        ]
    )
    uninitialized = {"error": "NVMLError_Uninitialized"}
    expected = [[uninitialized], [None, uninitialized, uninitialized]]
    assert expected == [before, after]


def test_unimplemented_function_is_function_not_found(node: Node) -> None:
    """A function the library does not export raises NVMLError_FunctionNotFound."""
    expected = [{"error": "NVMLError_FunctionNotFound"}]
    assert expected == node.nvml([{"op": "call", "fn": "nvmlDeviceGetFanSpeed", "index": 0}])


def test_gpu_load_without_gpus_exits_2(node: Node) -> None:
    """gpu-load with no GPUs in SLURM_JOB_GPUS/CUDA_VISIBLE_DEVICES exits 2 with a message."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")
    }
    env.update({"SLURMD_NODENAME": NODE, "SIM_NVML_ROOT": str(node.root)})
    done = subprocess.run(
        [sys.executable, str(BIN / "gpu-load"), "--seconds", "1"],
        env=env,
        capture_output=True,
        text=True,
    )
    expected = (2, True)
    assert expected == (done.returncode, "no GPUs found" in done.stderr)


def test_sim_gpu_show_lists_gpus(node: Node) -> None:
    """sim-gpu show prints one line per GPU in enumeration order."""
    out = sim_gpu("show", "--dir", str(node.dir))
    minors = [line.split()[1] for line in out.splitlines() if line.startswith("[")]
    assert [f"minor={m}" for m in ORDER] == minors
