"""MIG on the simulated GPUs, read through the real pynvml as the product would read it.

A GPU of a MIG-capable model (A100, H100, H200, B200, ...) in MIG mode holds MIG devices:
their own handles, UUIDs (MIG-...), names, memory, processes and (Hopper or newer) GPM
samples per GPU instance. Utilization answers NOT_SUPPORTED in MIG mode, as on hardware.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sim.conftest import BIN, NODE, Node, sim_gpu, uuid_of
from tests.sim.test_sim_gpm import make_h100_node


def write_layout(node: Node, minor: int, profiles: list[str]) -> list[dict[str, Any]]:
    """Sets the GPU's MIG layout with `sim-gpu mig`; its instances as the mig file lists them.

    The tool places the instances largest first at the first free start slice and writes
    them in MIG device index order (by GPU instance id), with their plan dirs.
    """
    sim_gpu(
        "mig", "--dir", str(node.dir), "--gpu", f"minor:{minor}", "--layout", "+".join(profiles)
    )
    text = (node.dir / "gpus" / uuid_of(node, minor) / "mig").read_text()
    instances: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith("instance="):
            gi, ci, profile, slices, mib, uuid = line.split("=", 1)[1].split()
            instances.append(
                {"gi": int(gi), "ci": int(ci), "profile": profile, "slices": int(slices),
                 "mib": int(mib), "uuid": uuid}
            )  # fmt: skip
    return instances


def run_py(node: Node, code: str, env: dict[str, str] | None = None) -> Any:
    """Runs `code` (which sets `result`) in a fresh process on the simulated library."""
    prelude = textwrap.dedent(
        """
        import ctypes, json, os, time
        import pynvml

        def err(fn, *args):
            try:
                return fn(*args)
            except pynvml.NVMLError as exc:
                return type(exc).__name__

        def s(v):
            return v.decode() if isinstance(v, bytes) else v

        pynvml.nvmlInit()
        by_minor = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            by_minor[pynvml.nvmlDeviceGetMinorNumber(h)] = h
        """
    )
    full_env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(node.libdir),
        "SIM_NVML_DIR": str(node.dir),
        **(env or {}),
    }
    script = prelude + textwrap.dedent(code) + "\nprint(json.dumps(result))\n"
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=full_env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout)


def start_mig_load(node: Node, visible: str, *args: str) -> tuple[subprocess.Popen[str], int]:
    """gpu-load as a job step whose CUDA_VISIBLE_DEVICES names MIG devices; (process, pid)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible, "SIM_NVML_DIR": str(node.dir)}
    env.pop("SLURM_JOB_GPUS", None)
    proc = subprocess.Popen(
        [sys.executable, str(BIN / "gpu-load"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    node.loads.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert " drives " in line, proc.stderr.read() if proc.stderr else line
    return proc, proc.pid


@pytest.fixture
def h100(tmp_path: Path, libdir: Path) -> Iterator[Node]:
    """4 simulated H100s (GPM) on NODE, index == minor."""
    n = make_h100_node(tmp_path / "sim-h100", libdir)
    yield n
    n.stop_all()


def test_mig_devices_of_a_layout(node: Node) -> None:
    """3g.40gb+4g.40gb on one A100: two MIG devices with ids, UUIDs, names and memory."""
    instances = write_layout(node, 0, ["3g.40gb", "4g.40gb"])
    assert [(i["gi"], i["profile"]) for i in instances] == [(1, "4g.40gb"), (2, "3g.40gb")]
    result = run_py(
        node,
        """
        g = by_minor[0]
        migs = []
        for k in range(2):
            m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(g, k)
            mem = pynvml.nvmlDeviceGetMemoryInfo(m)
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
            migs.append({
                "uuid": s(pynvml.nvmlDeviceGetUUID(m)),
                "name": s(pynvml.nvmlDeviceGetName(m)),
                "is_mig": pynvml.nvmlDeviceIsMigDeviceHandle(m).value,
                "gi": pynvml.nvmlDeviceGetGpuInstanceId(m),
                "ci": pynvml.nvmlDeviceGetComputeInstanceId(m),
                "total": mem.total, "used": mem.used,
                "parent": s(pynvml.nvmlDeviceGetUUID(parent)),
                "by_uuid_gi": pynvml.nvmlDeviceGetGpuInstanceId(
                    pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(m))),
            })
        result = {
            "mode": pynvml.nvmlDeviceGetMigMode(g),
            "other_mode": pynvml.nvmlDeviceGetMigMode(by_minor[1]),
            "max": pynvml.nvmlDeviceGetMaxMigDeviceCount(g),
            "other_max": pynvml.nvmlDeviceGetMaxMigDeviceCount(by_minor[1]),
            "count": pynvml.nvmlDeviceGetCount(),
            "migs": migs,
            "index2": err(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, g, 2),
            "index7": err(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, g, 7),
            "other_index0": err(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, by_minor[1], 0),
            "gpu_is_mig": pynvml.nvmlDeviceIsMigDeviceHandle(g).value,
            "gpu_gi": err(pynvml.nvmlDeviceGetGpuInstanceId, g),
            "gpu_parent": err(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, g),
            "mig_serial": err(pynvml.nvmlDeviceGetSerial,
                              pynvml.nvmlDeviceGetMigDeviceHandleByIndex(g, 0)),
        }
        """,
    )
    parent = uuid_of(node, 0)
    assert result["mode"] == [1, 1]
    assert result["other_mode"] == [0, 0]
    assert (result["max"], result["other_max"], result["count"]) == (7, 0, 4)
    assert result["migs"] == [
        {
            "uuid": inst["uuid"],
            "name": f"NVIDIA A100-SXM4-80GB MIG {inst['profile']}",
            "is_mig": 1,
            "gi": inst["gi"],
            "ci": 0,
            "total": inst["mib"] << 20,
            "used": 0,
            "parent": parent,
            "by_uuid_gi": inst["gi"],
        }
        for inst in instances
    ]
    for inst in instances:
        assert len(inst["uuid"]) == 40 and inst["uuid"].startswith("MIG-")
    assert result["index2"] == "NVMLError_NotFound"
    assert result["index7"] == "NVMLError_InvalidArgument"
    assert result["other_index0"] == "NVMLError_InvalidArgument"  # MIG off: max count 0
    assert result["gpu_is_mig"] == 0
    assert result["gpu_gi"] == "NVMLError_NotSupported"
    assert result["gpu_parent"] == "NVMLError_NotSupported"
    assert result["mig_serial"] == "NVMLError_NotSupported"


def test_model_without_mig_answers_not_supported(tmp_path: Path, libdir: Path) -> None:
    """An L40S has no MIG: mode, count and handles are NOT_SUPPORTED; a mig file is ignored."""
    root = tmp_path / "sim-l40"
    root.mkdir()
    node = Node(root=root, libdir=libdir)
    sim_gpu("create", "--dir", str(node.dir), "--node", NODE, "--model", "NVIDIA L40S",
            "--memory-mib", "46068", "--count", "1")  # fmt: skip
    (node.dir / "gpus" / uuid_of(node, 0) / "mig").write_text(
        "mode=1\ninstance=7 0 1g.10gb 1 9728 MIG-00000000-0000-0000-0000-000000000000\n"
    )
    result = run_py(
        node,
        """
        g = by_minor[0]
        result = [
            err(pynvml.nvmlDeviceGetMigMode, g),
            err(pynvml.nvmlDeviceGetMaxMigDeviceCount, g),
            err(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, g, 0),
            pynvml.nvmlDeviceIsMigDeviceHandle(g).value,
            err(pynvml.nvmlDeviceGetHandleByUUID, "MIG-00000000-0000-0000-0000-000000000000"),
            pynvml.nvmlDeviceGetUtilizationRates(g).gpu,
        ]
        """,
    )
    ns = "NVMLError_NotSupported"
    assert result == [ns, ns, ns, 0, "NVMLError_NotFound", 0]


def test_utilization_not_supported_in_mig_mode(node: Node) -> None:
    """MIG mode: utilization, samples, process utilization NOT_SUPPORTED, power per GPU.

    On the parent and on a MIG device alike; a GPU not in MIG mode is unaffected.
    """
    write_layout(node, 0, ["1g.10gb"] * 7)
    result = run_py(
        node,
        """
        g, m = by_minor[0], None
        m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(g, 0)
        result = {
            "gpu": [
                err(lambda: pynvml.nvmlDeviceGetUtilizationRates(g).gpu),
                err(lambda: len(pynvml.nvmlDeviceGetSamples(g, 1, 0)[1])),
                err(pynvml.nvmlDeviceGetProcessUtilization, g, 0),
                err(lambda: pynvml.nvmlDeviceGetPowerUsage(g) > 0),
            ],
            "mig": [
                err(lambda: pynvml.nvmlDeviceGetUtilizationRates(m).gpu),
                err(lambda: len(pynvml.nvmlDeviceGetSamples(m, 1, 0)[1])),
                err(pynvml.nvmlDeviceGetProcessUtilization, m, 0),
                err(pynvml.nvmlDeviceGetPowerUsage, m),
            ],
            "other": pynvml.nvmlDeviceGetUtilizationRates(by_minor[1]).gpu,
            "gis": [pynvml.nvmlDeviceGetGpuInstanceId(
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex(g, k)) for k in range(7)],
        }
        """,
    )
    ns = "NVMLError_NotSupported"
    assert result["gpu"] == [ns, ns, ns, True]
    assert result["mig"] == [ns, ns, ns, ns]
    assert result["other"] == 0
    assert result["gis"] == [7, 8, 9, 10, 11, 12, 13]


def test_gpu_load_drives_a_mig_slice(h100: Node) -> None:
    """CUDA_VISIBLE_DEVICES=MIG-...: the instance's memory, processes and GPM follow the plan."""
    instances = write_layout(h100, 1, ["3g.40gb", "4g.40gb"])
    small = instances[1]  # gi 2, 3g.40gb
    _, pid = start_mig_load(h100, small["uuid"], "--util", "60", "--sm", "45", "--mem",
                            "4096", "--seconds", "60")  # fmt: skip
    time.sleep(0.2)
    result = run_py(
        h100,
        """
        g = by_minor[1]
        m_big = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(g, 0)
        m = pynvml.nvmlDeviceGetHandleByUUID(os.environ["MIG_UUID"])
        a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        w1, w2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmMigSampleGet(g, 2, a)
        pynvml.nvmlGpmSampleGet(g, w1)
        time.sleep(1.0)
        pynvml.nvmlGpmMigSampleGet(g, 2, b)
        pynvml.nvmlGpmSampleGet(g, w2)

        def metrics(s1, s2):
            q = pynvml.c_nvmlGpmMetricsGet_t()
            q.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            ids = [pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, pynvml.NVML_GPM_METRIC_SM_UTIL]
            q.numMetrics, q.sample1, q.sample2 = len(ids), s1, s2
            for i, k in enumerate(ids):
                q.metrics[i].metricId = k
            pynvml.nvmlGpmMetricsGet(q)
            return [round(q.metrics[i].value, 6) for i in range(len(ids))]

        def procs(h):
            return [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId]
                    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]

        result = {
            "mig_used": pynvml.nvmlDeviceGetMemoryInfo(m).used,
            "big_used": pynvml.nvmlDeviceGetMemoryInfo(m_big).used,
            "gpu_used": pynvml.nvmlDeviceGetMemoryInfo(g).used,
            "mig_procs": procs(m),
            "big_procs": procs(m_big),
            "gpu_procs": procs(g),
            "mig_gpm": metrics(a, b),
            "gpu_gpm": metrics(w1, w2),
            "mixed": err(metrics, a, w2),
            "unknown_gi": err(pynvml.nvmlGpmMigSampleGet, g, 5, a),
            "mig_handle_sample": err(pynvml.nvmlGpmSampleGet, m, a),
        }
        """,
        env={"MIG_UUID": small["uuid"]},
    )
    mem = 4096 << 20
    assert result["mig_used"] == mem
    assert result["big_used"] == 0
    assert result["gpu_used"] == mem
    assert result["mig_procs"] == [[pid, mem, 2, 0]]
    assert result["big_procs"] == []
    assert result["gpu_procs"] == [[pid, mem, 2, 0]]
    assert result["mig_gpm"] == [60.0, 45.0]  # the instance's own activity, exactly
    # on the whole GPU a 3-slice instance is 3/7 of the compute
    assert result["gpu_gpm"] == [round(60 * 3 / 7, 6), round(45 * 3 / 7, 6)]
    assert result["mixed"] == "NVMLError_InvalidArgument"  # samples of two different devices
    assert result["unknown_gi"] == "NVMLError_InvalidArgument"
    assert result["mig_handle_sample"] == "NVMLError_NotSupported"


def test_mig_gpm_of_two_instances_from_plans(h100: Node) -> None:
    """Plans in two instances: each instance's GPM is its plan's; the GPU's their weighted sum."""
    instances = write_layout(h100, 0, ["3g.40gb", "4g.40gb"])
    start = time.time() - 30
    for inst, util, sm in ((instances[0], 80, 60), (instances[1], 50, 30)):
        plan = h100.dir / "gpus" / uuid_of(h100, 0) / f"gi{inst['gi']}" / "plans" / "t.plan"
        plan.write_text(
            f"pid={os.getpid()}\nstart={start}\npattern=steady\nutil={util}\nsm={sm}\n"
            "mem_mib=0\nseconds=0\n"
        )
    result = run_py(
        h100,
        """
        g = by_minor[0]
        names = ["gi1a", "gi1b", "gi2a", "gi2b", "ga", "gb"]
        S = {n: pynvml.nvmlGpmSampleAlloc() for n in names}
        pynvml.nvmlGpmMigSampleGet(g, 1, S["gi1a"]); pynvml.nvmlGpmMigSampleGet(g, 2, S["gi2a"])
        pynvml.nvmlGpmSampleGet(g, S["ga"])
        time.sleep(0.5)
        pynvml.nvmlGpmMigSampleGet(g, 1, S["gi1b"]); pynvml.nvmlGpmMigSampleGet(g, 2, S["gi2b"])
        pynvml.nvmlGpmSampleGet(g, S["gb"])

        def metrics(s1, s2):
            q = pynvml.c_nvmlGpmMetricsGet_t()
            q.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            ids = [pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, pynvml.NVML_GPM_METRIC_SM_UTIL]
            q.numMetrics, q.sample1, q.sample2 = len(ids), S[s1], S[s2]
            for i, k in enumerate(ids):
                q.metrics[i].metricId = k
            pynvml.nvmlGpmMetricsGet(q)
            return [round(q.metrics[i].value, 6) for i in range(len(ids))]

        result = [metrics("gi1a", "gi1b"), metrics("gi2a", "gi2b"), metrics("ga", "gb")]
        """,
    )
    assert result == [
        [80.0, 60.0],
        [50.0, 30.0],
        [round((80 * 4 + 50 * 3) / 7, 6), round((60 * 4 + 30 * 3) / 7, 6)],
    ]


def test_a100_has_no_mig_gpm(node: Node) -> None:
    """A100 in MIG mode: nvmlGpmMigSampleGet is NOT_SUPPORTED (GPM is Hopper or newer)."""
    write_layout(node, 0, ["7g.80gb"])
    result = run_py(
        node,
        """
        g = by_minor[0]
        m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(g, 0)
        result = [err(pynvml.nvmlGpmMigSampleGet, g, 0, pynvml.nvmlGpmSampleAlloc()),
                  pynvml.nvmlDeviceGetGpuInstanceId(m)]
        """,
    )
    assert result == ["NVMLError_NotSupported", 0]
