"""Drives the real pynvml in a fresh process (LD_LIBRARY_PATH is read only at start).

Reads a JSON list of operations on stdin, prints a JSON list of results. An NVML error
becomes {"error": "NVMLError_..."} so tests can compare it like any other value.

Operations:
    {"op": "init"} / {"op": "shutdown"}
    {"op": "call", "fn": "nvmlDeviceGetName", "index": 0, "args": [...]}
        pynvml.<fn>(handle-of-index, *args); without "index", pynvml.<fn>(*args)
    {"op": "devices"}           every field of every device (see snapshot())
    {"op": "raw_procs", "index": 0, "capacity": 0}   the C call with a NULL/short buffer
    {"op": "index_by", "by": "uuid"|"pci", "key": K}   index of the device found by K
    {"op": "timed_energy", "index": 0}   [read time, energy mJ]
    {"op": "sampler", "index": 0, "seconds": S}   samples/energy before and after S seconds
    {"op": "time"} / {"op": "sleep", "seconds": S}
    {"op": "gpm_sample", "index": 0, "name": "a"[, "mig": GI]}   nvmlGpmSampleGet (or
        nvmlGpmMigSampleGet) into the sample called "a" (allocated on first use);
        {"t": time of the call} or {"error": ...}
    {"op": "gpm_alloc", "name": "a"} / {"op": "gpm_free", "name": "a"}   nvmlGpmSampleAlloc/Free
    {"op": "gpm_metrics", "s1": "a", "s2": "b", "ids": [2, 5][, "version": 1]}
        nvmlGpmMetricsGet as an agent builds it; {"2": value, "4": {"ret": 3}, ...}
    {"op": "gpm_support_raw", "index": 0, "version": V}   the C call with any struct version
    {"op": "sleep_until", "t": T}   sleeps until epoch time T
    {"op": "flock", "path": P} / {"op": "unlock", "path": P}   holds / drops flock(P) (its
        own open file, so the library's flock on P from this process fails meanwhile)
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import sys
import time
from typing import Any

import pynvml

DEVICE_FIELDS = {
    "name": lambda h: pynvml.nvmlDeviceGetName(h),
    "uuid": lambda h: pynvml.nvmlDeviceGetUUID(h),
    "serial": lambda h: pynvml.nvmlDeviceGetSerial(h),
    "minor": lambda h: pynvml.nvmlDeviceGetMinorNumber(h),
    "index": lambda h: pynvml.nvmlDeviceGetIndex(h),
    "pci_bus_id": lambda h: pynvml.nvmlDeviceGetPciInfo(h).busId,
    "util": lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
    "mem_used": lambda h: pynvml.nvmlDeviceGetMemoryInfo(h).used,
    "procs": lambda h: [
        [p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    ],
    "power": lambda h: pynvml.nvmlDeviceGetPowerUsage(h),
    "energy": lambda h: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
    "temperature": lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
    "ecc": lambda h: pynvml.nvmlDeviceGetTotalEccErrors(
        h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
    ),
    "samples": lambda h: len(pynvml.nvmlDeviceGetSamples(h, 1, 0)[1]),
}


def to_json(value: Any) -> Any:
    """ctypes structs, friendly objects and samples -> plain JSON values."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, pynvml.c_nvmlSample_t):
        return [value.timeStamp, value.sampleValue.uiVal]
    if isinstance(value, ctypes.Structure):
        return {name: to_json(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, pynvml.nvmlFriendlyObject):
        return {k: to_json(v) for k, v in vars(value).items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def guarded(fn: Any, *args: Any) -> Any:
    """fn(*args) as JSON, or {"error": NVMLError subclass name} when NVML raises."""
    try:
        return to_json(fn(*args))
    except pynvml.NVMLError as exc:
        return {"error": type(exc).__name__}


def snapshot() -> list[dict[str, Any]]:
    """Every field of DEVICE_FIELDS for every device, in enumeration order."""
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    return [{key: guarded(fn, h) for key, fn in DEVICE_FIELDS.items()} for h in handles]


def raw_procs(index: int, capacity: int) -> dict[str, int]:
    """nvmlDeviceGetComputeRunningProcesses_v3 with a NULL (or short) buffer, as C sees it."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    count = ctypes.c_uint(capacity)
    buf = (pynvml.c_nvmlProcessInfo_v3_t * capacity)() if capacity else None
    ret = fn(handle, ctypes.byref(count), buf)
    return {"ret": ret, "count": count.value}


def index_by(by: str, key: str) -> Any:
    """NVML index of the device found by UUID or PCI bus id."""
    find = {
        "uuid": pynvml.nvmlDeviceGetHandleByUUID,
        "pci": pynvml.nvmlDeviceGetHandleByPciBusId,
    }[by]
    return guarded(lambda: pynvml.nvmlDeviceGetIndex(find(key)))


def timed_energy(handle: Any) -> tuple[float, int]:
    """Energy counter and the time it was read (midpoint of the call)."""
    before = time.time()
    energy = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    return (before + time.time()) / 2, energy


def sampler(index: int, seconds: float) -> dict[str, Any]:
    """What an agent does: read samples, wait, read the samples newer than the last seen."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    _, first = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    last_seen = max(s.timeStamp for s in first)
    t0, e0 = timed_energy(handle)
    time.sleep(seconds)
    t1, e1 = timed_energy(handle)
    value_type, new = pynvml.nvmlDeviceGetSamples(
        handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last_seen
    )
    return {
        "last_seen": last_seen,
        "value_type": value_type,
        "samples": to_json(new),
        "t0": t0,
        "e0": e0,
        "t1": t1,
        "e1": e1,
    }


SAMPLES: dict[str, Any] = {}  # GPM samples by the name the ops give them
LOCKS: dict[str, int] = {}  # held flock file descriptors by path


def gpm_sample(index: int, name: str, mig: int | None) -> Any:
    """Allocates sample `name` on first use, then reads it from device `index`."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    if name not in SAMPLES:
        SAMPLES[name] = pynvml.nvmlGpmSampleAlloc()
    before = time.time()
    if mig is None:
        result = guarded(pynvml.nvmlGpmSampleGet, handle, SAMPLES[name])
    else:
        result = guarded(pynvml.nvmlGpmMigSampleGet, handle, mig, SAMPLES[name])
    if isinstance(result, dict) and "error" in result:
        return result
    return {"t": (before + time.time()) / 2}


def gpm_metrics(s1: str, s2: str, ids: list[int], version: int) -> Any:
    """nvmlGpmMetricsGet between two named samples: id -> value, or {"ret": code}."""
    query = pynvml.c_nvmlGpmMetricsGet_t()
    query.version = version
    query.numMetrics = len(ids)
    query.sample1 = SAMPLES[s1]
    query.sample2 = SAMPLES[s2]
    for i, metric_id in enumerate(ids):
        query.metrics[i].metricId = metric_id
    try:
        pynvml.nvmlGpmMetricsGet(query)
    except pynvml.NVMLError as exc:
        return {"error": type(exc).__name__}
    out: dict[str, Any] = {}
    for i, metric_id in enumerate(ids):
        m = query.metrics[i]
        out[str(metric_id)] = (
            m.value if m.nvmlReturn == pynvml.NVML_SUCCESS else {"ret": m.nvmlReturn}
        )
    return out


def gpm_support_raw(index: int, version: int) -> dict[str, int]:
    """nvmlGpmQueryDeviceSupport with a struct of any version, as C sees it."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    fn = pynvml._nvmlGetFunctionPointer("nvmlGpmQueryDeviceSupport")
    support = pynvml.c_nvmlGpmSupport_t()
    support.version = version
    support.isSupportedDevice = 7  # so an untouched field shows
    ret = fn(handle, ctypes.byref(support))
    return {"ret": ret, "isSupportedDevice": support.isSupportedDevice}


def run(op: dict[str, Any]) -> Any:
    """The JSON result of one op ({"op": "devices"}, {"op": "call", "fn": ...}, ...)."""
    kind = op["op"]
    if kind == "init":
        return guarded(pynvml.nvmlInit)
    if kind == "shutdown":
        return guarded(pynvml.nvmlShutdown)
    if kind == "time":
        return time.time()
    if kind == "sleep":
        time.sleep(op["seconds"])
        return None
    if kind == "devices":
        return snapshot()
    if kind == "raw_procs":
        return raw_procs(op["index"], op.get("capacity", 0))
    if kind == "index_by":
        return index_by(op["by"], op["key"])
    if kind == "timed_energy":
        return timed_energy(pynvml.nvmlDeviceGetHandleByIndex(op["index"]))
    if kind == "sampler":
        return sampler(op["index"], op["seconds"])
    if kind == "gpm_sample":
        return gpm_sample(op["index"], op["name"], op.get("mig"))
    if kind == "gpm_alloc":
        SAMPLES[op["name"]] = pynvml.nvmlGpmSampleAlloc()
        return None
    if kind == "sleep_until":
        time.sleep(max(0.0, op["t"] - time.time()))
        return None
    if kind == "flock":
        LOCKS[op["path"]] = os.open(op["path"], os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(LOCKS[op["path"]], fcntl.LOCK_EX)
        return None
    if kind == "unlock":
        os.close(LOCKS.pop(op["path"]))
        return None
    if kind == "gpm_free":
        return guarded(pynvml.nvmlGpmSampleFree, SAMPLES[op["name"]])
    if kind == "gpm_metrics":
        version = op.get("version", pynvml.NVML_GPM_METRICS_GET_VERSION)
        return gpm_metrics(op["s1"], op["s2"], op["ids"], version)
    if kind == "gpm_support_raw":
        return gpm_support_raw(op["index"], op["version"])
    if kind == "call":
        fn = getattr(pynvml, op["fn"])
        args = op.get("args", [])
        if "index" in op:
            return guarded(lambda: fn(pynvml.nvmlDeviceGetHandleByIndex(op["index"]), *args))
        return guarded(fn, *args)
    raise ValueError(f"unknown op {kind!r}")


def main() -> None:
    """Runs the JSON list of ops on stdin and prints their results as one JSON list."""
    ops = json.load(sys.stdin)
    print(json.dumps([run(op) for op in ops]))


if __name__ == "__main__":
    main()
