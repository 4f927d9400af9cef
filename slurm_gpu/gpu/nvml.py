"""NVML through pynvml: every call goes through one funnel that turns errors into values.

A field NVML does not support becomes None for that GPU; a lost GPU becomes a snapshot
with `error` set. Neither stops the other GPUs from being read (the nvitop approach).
Each distinct problem is logged once per GPU and field, not every interval.

GPM (GPU Performance Monitoring, Hopper and newer; issue #13): each snapshot of a GPU that
supports it takes one GPM sample, and the metrics are computed between it and the
previous snapshot's sample, so the windows tile time and nothing between reads is lost
(https://docs.nvidia.com/deploy/nvml-api/group__nvmlGpmFunctions.html). Two samples per GPU
are allocated once and used in turn. A GPU without GPM (Ampere and older answer
NVML_ERROR_NOT_SUPPORTED) gets `gpm=None`: unknown, never 0%.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import struct
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from slurm_gpu.errors import GpuError
from slurm_gpu.gpu import GpmMetrics, GpuSnapshot, UtilSample
from slurm_gpu.models import GpuDevice, GpuProcess

log = logging.getLogger(__name__)
T = TypeVar("T")

# Errors that mean "this GPU is gone", not "this field is unsupported".
_GPU_GONE = (
    pynvml.NVML_ERROR_GPU_IS_LOST,
    getattr(pynvml, "NVML_ERROR_GPU_NOT_FOUND", 28),
)


# The GPM metrics read, in nvmlGpmMetricsGet_t.metrics order, and the GpmMetrics field
# each fills (ids: nvml.h nvmlGpmMetricId_t).
_GPM_METRICS: tuple[tuple[int, str], ...] = (
    (pynvml.NVML_GPM_METRIC_SM_UTIL, "sm_active_percent"),
    (pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, "sm_occupancy_percent"),
    (pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "tensor_active_percent"),
    (pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, "dram_bw_percent"),
    (pynvml.NVML_GPM_METRIC_FP64_UTIL, "fp64_active_percent"),
    (pynvml.NVML_GPM_METRIC_FP32_UTIL, "fp32_active_percent"),
    (pynvml.NVML_GPM_METRIC_FP16_UTIL, "fp16_active_percent"),
    (pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, "pcie_tx_mib_per_s"),
    (pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, "pcie_rx_mib_per_s"),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, "nvlink_tx_mib_per_s"),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, "nvlink_rx_mib_per_s"),
)
_GPM_FIELDS = tuple(name for _, name in _GPM_METRICS)
_GPM_ALL_MEASURED = (pynvml.NVML_SUCCESS,) * len(_GPM_METRICS)  # each metric's nvmlReturn


def _gpm_layout() -> tuple[struct.Struct, int, struct.Struct, int]:
    """How to write the two sample pointers and read (nvmlReturn, value) of each metric.

    Straight from and into the request's memory, at the offsets pynvml's ctypes layout
    gives: a ctypes attribute access costs a Python call per field, every tick on every
    GPU (bench/agent).
    """
    request, metric = pynvml.c_nvmlGpmMetricsGet_t, pynvml.c_nvmlGpmMetric_t
    pointer = ctypes.sizeof(ctypes.c_void_p)
    if (request.sample2.offset - request.sample1.offset, request.sample1.size) != (
        pointer,
        pointer,
    ):
        raise ImportError("pynvml's nvmlGpmMetricsGet_t layout is not the one NVML documents")
    size, ret, value = ctypes.sizeof(metric), metric.nvmlReturn.offset, metric.value.offset
    one = f"{ret}x i {value - ret - 4}x d {size - value - 8}x"
    metrics = struct.Struct("=" + " ".join([one] * len(_GPM_METRICS)))
    return struct.Struct("@PP"), request.sample1.offset, metrics, request.metrics.offset


_GPM_SAMPLES, _GPM_SAMPLES_AT, _GPM_VALUES, _GPM_VALUES_AT = _gpm_layout()


class _GpuLost(Exception):
    """Raised inside a snapshot when the GPU stopped answering altogether."""


class _Gpm:
    """One GPU's two GPM samples, used in turn, and the request that compares them.

    The samples are NVML's memory (nvmlGpmSampleAlloc); the pointer objects are kept here
    for as long as NVML may write through them, and freed at close().
    """

    def __init__(self, samples: tuple[Any, Any]) -> None:
        self.samples = samples
        self.addresses = tuple(ctypes.cast(s, ctypes.c_void_p).value or 0 for s in samples)
        self.newest: int | None = None  # which sample holds the newest reading
        self.newest_time = 0.0  # when it was taken (the snapshot's time)
        # Built once: the struct holds NVML_GPM_METRIC_MAX entries (~19 KiB). NVML reads
        # version, numMetrics and each metricId, and writes nvmlReturn and value.
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        for i, (metric, _) in enumerate(_GPM_METRICS):
            request.metrics[i].metricId = metric
        self.request = request


class NvmlSource:
    """The production GpuSource: pynvml over libnvidia-ml.so.1.

    Args:
        clock: POSIX time source, injectable for tests.
        gpm: read GPM metrics where the GPU supports them (`[node] gpm`); False makes no
            GPM call at all.
    """

    def __init__(self, clock: Callable[[], float] = time.time, gpm: bool = True) -> None:
        self._clock = clock
        self._use_gpm = gpm
        self._logged: set[tuple[str, str, int]] = set()
        self._handles: dict[str, Any] = {}
        self._gpm: dict[str, _Gpm] = {}  # uuid -> its GPM samples (GPUs with GPM only)
        self._per_field: set[str] = set()  # uuids read field by field (_all_fields)
        self._closed = False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuError(f"NVML could not be initialised: {exc}") from exc

    def close(self) -> None:
        """Frees the GPM samples, then nvmlShutdown; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for gpm in self._gpm.values():
            for sample in gpm.samples:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlGpmSampleFree(sample)
        self._gpm.clear()
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    def driver_version(self) -> str:
        """`nvidia-smi --query-gpu=driver_version`."""
        return str(pynvml.nvmlSystemGetDriverVersion())

    def devices(self) -> list[GpuDevice]:
        """Every GPU NVML enumerates; a GPU that fails to describe itself is skipped."""
        found: list[GpuDevice] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = str(pynvml.nvmlDeviceGetUUID(handle))
                memory = self._memory(uuid, handle)
                gpm = self._gpm_setup(uuid, handle)
                found.append(
                    GpuDevice(
                        uuid=uuid,
                        name=str(pynvml.nvmlDeviceGetName(handle)),
                        minor=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
                        nvml_index=index,
                        pci_bus_id=str(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                        memory_total_bytes=None if memory is None else int(memory.total),
                        gpm_supported=gpm,
                    )
                )
                self._handles[uuid] = handle
            except (pynvml.NVMLError, _GpuLost) as exc:
                self._log_once(f"index {index}", "describe", exc)
        return found

    def snapshot(self, device: GpuDevice, samples_since: float) -> GpuSnapshot:
        """Reads one GPU (`nvidia-smi -q -d UTILIZATION,MEMORY,POWER,TEMPERATURE,ECC,PIDS`).

        Args:
            device: the GPU, as devices() returned it.
            samples_since: POSIX time of the newest utilization sample already seen.
        """
        now = self._clock()
        try:
            handle = self._handles.get(device.uuid) or pynvml.nvmlDeviceGetHandleByUUID(device.uuid)
            self._handles[device.uuid] = handle
            uuid = device.uuid
            memory, power_mw, energy_mj, temperature, ecc, processes = (
                self._fields(uuid, handle)
                if uuid in self._per_field
                else self._all_fields(uuid, handle)
            )
            samples = self._samples(uuid, handle, samples_since)
            gpm = self._gpm_read(uuid, handle, now) if uuid in self._gpm else None
        except (pynvml.NVMLError, _GpuLost) as exc:
            self._log_once(device.uuid, "snapshot", exc)
            if device.uuid in self._gpm:  # a lost GPU's counters start again when it returns
                self._gpm[device.uuid].newest = None
            return GpuSnapshot(uuid=device.uuid, time=now, error=str(exc))
        return GpuSnapshot(
            uuid=device.uuid,
            time=now,
            samples=samples,
            mem_used_bytes=None if memory is None else int(memory.used),
            mem_total_bytes=None if memory is None else int(memory.total),
            power_watts=None if power_mw is None else power_mw / 1000.0,
            energy_joules=None if energy_mj is None else energy_mj / 1000.0,
            temperature_celsius=None if temperature is None else float(temperature),
            ecc_errors_total=None if ecc is None else int(ecc),
            processes=None
            if processes is None
            else tuple(
                GpuProcess(pid=int(p.pid), used_memory_bytes=_memory_or_none(p.usedGpuMemory))
                for p in processes
            ),
            gpm=gpm,
        )

    def _all_fields(self, uuid: str, handle: Any) -> tuple[Any, ...]:
        """The point readings of a GPU that answers them all: one call each, as a bare loop.

        The first field it does not answer sends the GPU to `_fields`, field by field,
        from then on (this read is made again there: reads only); a lost GPU raises.
        """
        try:
            return (
                pynvml.nvmlDeviceGetMemoryInfo(handle),
                pynvml.nvmlDeviceGetPowerUsage(handle),
                pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
                pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                ),
                pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
            )
        except pynvml.NVMLError as exc:
            if exc.value in _GPU_GONE:
                raise _GpuLost(str(exc)) from exc
            self._per_field.add(uuid)
            return self._fields(uuid, handle)

    def _fields(self, uuid: str, handle: Any) -> tuple[Any, ...]:
        """The point readings one by one: None for each the GPU does not answer (logged once)."""
        return (
            self._memory(uuid, handle),
            self._field(uuid, "power", lambda: pynvml.nvmlDeviceGetPowerUsage(handle)),
            self._field(uuid, "energy", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
            self._field(
                uuid,
                "temperature",
                lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            ),
            self._field(
                uuid,
                "ecc",
                lambda: pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                ),
            ),
            self._field(
                uuid, "processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            ),
        )

    def _memory(self, uuid: str, handle: Any) -> Any:
        """`nvidia-smi --query-gpu=memory.used,memory.total` (None when unsupported)."""
        return self._field(uuid, "memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))

    def _samples(self, uuid: str, handle: Any, since: float) -> tuple[UtilSample, ...]:
        """`nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)` newer than `since`."""
        try:
            _kind, raw = pynvml.nvmlDeviceGetSamples(
                handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, int(since * 1e6)
            )
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:  # no sample newer than `since`
                return ()
            if exc.value in _GPU_GONE:
                raise _GpuLost(str(exc)) from exc
            self._log_once(uuid, "samples", exc)
            return ()
        return tuple(
            UtilSample(time=s.timeStamp / 1e6, util_percent=float(s.sampleValue.uiVal))
            for s in raw
            if s.timeStamp / 1e6 > since
        )

    def _gpm_setup(self, uuid: str, handle: Any) -> bool:
        """Whether the GPU has GPM (`nvmlGpmQueryDeviceSupport`); if so, its two samples.

        Called once per GPU (devices()). NOT_SUPPORTED (Ampere and older), an older driver
        without the call, or any other error: no GPM on this GPU, logged once.
        """
        if not self._use_gpm:
            return False
        if uuid in self._gpm:
            return True
        try:
            if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                self._log_gpm_off(uuid, "the GPU says it has none")
                return False
        except pynvml.NVMLError as exc:
            if exc.value in _GPU_GONE:
                raise _GpuLost(str(exc)) from exc
            self._log_gpm_off(uuid, str(exc))
            return False
        samples: list[Any] = []
        try:
            for _ in range(2):
                samples.append(pynvml.nvmlGpmSampleAlloc())
        except pynvml.NVMLError as exc:
            for sample in samples:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlGpmSampleFree(sample)
            self._log_gpm_off(uuid, f"nvmlGpmSampleAlloc: {exc}")
            return False
        self._gpm[uuid] = _Gpm((samples[0], samples[1]))
        return True

    def _log_gpm_off(self, uuid: str, why: str) -> None:
        if (uuid, "gpm-support", 0) not in self._logged:
            self._logged.add((uuid, "gpm-support", 0))
            log.info(
                "GPU %s: no NVML GPM (%s); its SM activity, occupancy, tensor and DRAM"
                " figures stay unknown",
                uuid,
                why,
            )

    def _gpm_read(self, uuid: str, handle: Any, now: float) -> GpmMetrics | None:
        """One GPM sample (`nvmlGpmSampleGet`), and the metrics since the previous one.

        None for the first sample, and when a call fails (logged once); after a failed
        sample the previous one is kept, so the next window spans both reads.
        """
        gpm = self._gpm[uuid]
        target = 1 if gpm.newest == 0 else 0
        sample = gpm.samples[target]
        try:
            pynvml.nvmlGpmSampleGet(handle, sample)
        except pynvml.NVMLError as exc:
            self._unanswered(uuid, "gpm-sample", exc)
            return None
        previous, previous_time = gpm.newest, gpm.newest_time
        gpm.newest, gpm.newest_time = target, now
        if previous is None or now <= previous_time:
            return None
        request = gpm.request
        # request.sample1, request.sample2 = the previous sample, this one
        _GPM_SAMPLES.pack_into(
            request, _GPM_SAMPLES_AT, gpm.addresses[previous], gpm.addresses[target]
        )
        try:
            pynvml.nvmlGpmMetricsGet(request)
        except pynvml.NVMLError as exc:
            self._unanswered(uuid, "gpm-metrics", exc)
            return None
        read = _GPM_VALUES.unpack_from(request, _GPM_VALUES_AT)  # (nvmlReturn, value) each
        codes, values = read[::2], read[1::2]
        if codes != _GPM_ALL_MEASURED:
            # a metric NVML did not measure is None (logged once); the others stand
            values = tuple(
                value if code == pynvml.NVML_SUCCESS else None
                for code, value in zip(codes, values, strict=True)
            )
            for name, code in zip(_GPM_FIELDS, codes, strict=True):
                if code != pynvml.NVML_SUCCESS:
                    self._log_once(uuid, f"GPM {name}", pynvml.NVMLError(code))
        return GpmMetrics(previous_time, now, *values)  # in _GPM_METRICS order

    def _field(self, uuid: str, name: str, read: Callable[[], T]) -> T | None:
        """One NVML call: unsupported -> None (logged once); lost GPU -> _GpuLost."""
        try:
            return read()
        except pynvml.NVMLError as exc:
            self._unanswered(uuid, name, exc)
            return None

    def _unanswered(self, uuid: str, name: str, exc: pynvml.NVMLError) -> None:
        """A call that failed: a lost GPU raises _GpuLost, anything else is logged once."""
        if exc.value in _GPU_GONE:
            raise _GpuLost(str(exc)) from exc
        self._log_once(uuid, name, exc)

    def _log_once(self, where: str, what: str, exc: Exception) -> None:
        code = int(getattr(exc, "value", -1))
        if (where, what, code) not in self._logged:
            self._logged.add((where, what, code))
            log.warning("NVML %s on GPU %s: %s (further occurrences not logged)", what, where, exc)


def _memory_or_none(value: int) -> int | None:
    """NVML reports NVML_VALUE_NOT_AVAILABLE (2**64-1) when a process's memory is unknown."""
    return None if value is None or value >= 2**63 else int(value)
