"""Per-process utilization on a shared simulated GPU (gres/shard, MPS), through pynvml.

Each process has its own plan: its smUtil is its own load, the GPU's utilization their sum
(capped at 100). The driver version (<node dir>/driver-version) decides which call answers:
nvmlDeviceGetProcessesUtilizationInfo exists from R550; from R580 the old
nvmlDeviceGetProcessUtilization answers 0, so a reader must prefer the new call.
"""

from __future__ import annotations

import subprocess
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.sim.conftest import Node, uuid_of
from tests.sim.test_sim_mig import run_py

# Starts just after a whole second, so every call of a test reads the same newest sample.
READ = """
time.sleep(1.05 - time.time() %% 1)
g = by_minor[%d]
def old(h, last=0):
    v = err(pynvml.nvmlDeviceGetProcessUtilization, h, last)
    if isinstance(v, str):
        return v
    return sorted([p.pid, p.smUtil, p.memUtil, p.encUtil, p.decUtil, p.timeStamp] for p in v)
def new(h, last=0):
    v = err(pynvml.nvmlDeviceGetProcessesUtilizationInfo, h, last)
    if isinstance(v, str):
        return v
    return sorted([p.pid, p.smUtil, p.memUtil, p.encUtil, p.decUtil, p.timeStamp] for p in v)
"""


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Three live processes whose pids the plans use (the library checks the pid is alive)."""
    procs = [subprocess.Popen(["sleep", "300"]) for _ in range(3)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def plan(node: Node, minor: int, pid: int, util: float, mem: int = 1024) -> None:
    """A steady plan of a live process on that GPU, started 20 s ago, open-ended."""
    path = node.dir / "gpus" / uuid_of(node, minor) / "plans" / f"{pid}.plan"
    path.write_text(
        f"pid={pid}\nstart={time.time() - 20}\npattern=steady\nutil={util}\nmem_mib={mem}\n"
        "seconds=0\n"
    )


def driver(node: Node, version: str) -> None:
    """The driver version the node's simulated library reports."""
    (node.dir / "driver-version").write_text(version + "\n")


def read(node: Node, minor: int, code: str) -> Any:
    """Runs READ for that GPU, then `code` (which sets result)."""
    return run_py(node, READ % minor + textwrap.dedent(code))


def test_each_process_has_its_own_util(node: Node, sleepers: list[subprocess.Popen[bytes]]) -> None:
    """Driver 550: both calls give each process its own load; the GPU the sum."""
    driver(node, "550.90.07")
    a, b = sleepers[0].pid, sleepers[1].pid
    plan(node, 0, a, 30)
    plan(node, 0, b, 50)
    result = read(
        node,
        0,
        """
        o, n = old(g), new(g)
        stamp = o[0][5]
        result = {"old": o, "new": n, "gpu": pynvml.nvmlDeviceGetUtilizationRates(g).gpu,
                  "stamp_ok": abs(stamp / 1e6 - time.time()) < 2 and stamp % 1000000 == 0,
                  "seen_old": old(g, stamp), "seen_new": new(g, stamp),
                  "version": s(pynvml.nvmlSystemGetDriverVersion()),
                  "procs": len(pynvml.nvmlDeviceGetComputeRunningProcesses(g))}
        """,
    )
    stamp = result["old"][0][5]
    expected = sorted([[a, 30, 15, 0, 0, stamp], [b, 50, 25, 0, 0, stamp]])
    assert result["old"] == expected
    assert result["new"] == expected
    assert result["gpu"] == 80
    assert result["stamp_ok"] is True
    assert result["seen_old"] == "NVMLError_NotFound"  # nothing newer than the last seen
    assert result["seen_new"] == "NVMLError_NotFound"
    assert result["version"] == "550.90.07"
    assert result["procs"] == 2


def test_gpu_util_is_capped_sum(node: Node, sleepers: list[subprocess.Popen[bytes]]) -> None:
    """60 + 50 + 20 on one GPU: each process keeps its own value, the GPU reads 100."""
    driver(node, "550.90.07")
    for proc, util in zip(sleepers, (60, 50, 20), strict=True):
        plan(node, 2, proc.pid, util)
    result = read(node, 2, "result = [new(g), pynvml.nvmlDeviceGetUtilizationRates(g).gpu]")
    assert [row[:3] for row in result[0]] == sorted(
        [[sleepers[0].pid, 60, 30], [sleepers[1].pid, 50, 25], [sleepers[2].pid, 20, 10]]
    )
    assert result[1] == 100


def test_driver_535_has_only_the_old_call(
    node: Node, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    """The default driver (535) predates nvmlDeviceGetProcessesUtilizationInfo."""
    plan(node, 1, sleepers[0].pid, 40)
    result = read(node, 1, "result = [[r[:3] for r in old(g)], new(g)]")
    assert result == [[[sleepers[0].pid, 40, 20]], "NVMLError_FunctionNotFound"]


def test_driver_580_answers_zero_from_the_old_call(
    node: Node, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    """R580: the old call lists the process with 0; the new call has its load."""
    driver(node, "580.95.05")
    plan(node, 1, sleepers[0].pid, 40)
    result = read(
        node,
        1,
        """
        result = [[r[:3] for r in old(g)], [r[:3] for r in new(g)],
                  s(pynvml.nvmlSystemGetNVMLVersion()), pynvml.nvmlSystemGetCudaDriverVersion()]
        """,
    )
    pid = sleepers[0].pid
    assert result == [[[pid, 0, 0]], [[pid, 40, 20]], "13.580.95.05", 13000]


def test_size_query_protocol(node: Node, sleepers: list[subprocess.Popen[bytes]]) -> None:
    """The C calls as pynvml makes them: NULL array -> INSUFFICIENT_SIZE with the count."""
    driver(node, "570.133.20")
    plan(node, 3, sleepers[0].pid, 10)
    plan(node, 3, sleepers[1].pid, 20)
    result = read(
        node,
        3,
        """
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
        count = ctypes.c_uint(0)
        r1 = fn(g, None, ctypes.byref(count), ctypes.c_ulonglong(0))
        c1 = count.value
        count.value = 1
        buf = (pynvml.c_nvmlProcessUtilizationSample_t * 1)()
        r2 = fn(g, buf, ctypes.byref(count), ctypes.c_ulonglong(0))
        c2 = count.value
        fn2 = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessesUtilizationInfo")
        info = pynvml.c_nvmlProcessesUtilizationInfo_v1_t()
        info.version = pynvml.ProcessesUtilizationInfo_v1
        r3 = fn2(g, ctypes.byref(info))
        c3 = info.processSamplesCount
        info.version = 2 << 24 | ctypes.sizeof(info)
        r4 = fn2(g, ctypes.byref(info))
        result = [r1, c1, r2, c2, r3, c3, r4]
        """,
    )
    assert result == [7, 2, 7, 2, 7, 2, 25]


def test_no_process_is_not_found(node: Node) -> None:
    """No process on the GPU: NOT_FOUND from both calls (pynvml raises it)."""
    driver(node, "550.90.07")
    assert read(node, 0, "result = [old(g), new(g)]") == ["NVMLError_NotFound"] * 2
