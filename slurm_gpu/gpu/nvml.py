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

MIG (issue #14, docs/design/gpu-slots.md): devices() lists each MIG-mode GPU's MIG devices
(UUID, GPU and compute instance ids, profile, slices). In MIG mode NVML answers
NOT_SUPPORTED to utilization, so a MIG-mode GPU's snapshot has no utilization samples
(unknown, never 0%), and a MIG device is measured by mig_snapshot(): its memory, its
processes and (Hopper and newer) the GPM metrics of its GPU instance, from two samples of
its own (`nvmlGpmMigSampleGet`) used in turn as for a whole GPU.

Per-process utilization (shards, MPS): process_utilization() asks
`nvmlDeviceGetProcessesUtilizationInfo` (R550+) and falls back to
`nvmlDeviceGetProcessUtilization` only where the new call does not exist: from R580 the old
one answers smUtil 0.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import re
import struct
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from slurm_gpu.errors import GpuError
from slurm_gpu.gpu import (
    GpmMetrics,
    GpuSnapshot,
    MigSnapshot,
    ProcessUtil,
    ProcessUtilization,
    UtilSample,
)
from slurm_gpu.models import GpuDevice, GpuProcess, MigDevice

log = logging.getLogger(__name__)
T = TypeVar("T")

# Errors that mean "this GPU is gone", not "this field is unsupported".
_GPU_GONE = (
    pynvml.NVML_ERROR_GPU_IS_LOST,
    getattr(pynvml, "NVML_ERROR_GPU_NOT_FOUND", 28),
)
# Errors that mean "this GPU (or driver) has no such feature": logged at info, once.
_ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

# The two per-process utilization calls, by the names ProcessUtilization.call reports.
_PROCESS_UTIL_NEW = "nvmlDeviceGetProcessesUtilizationInfo"  # R550+
_PROCESS_UTIL_OLD = "nvmlDeviceGetProcessUtilization"  # answers smUtil 0 from R580

# A MIG device's profile from its name, "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb"
# (Slurm's _handle_mig takes what follows "mig_" in the lower-cased, underscored name);
# its compute slices from the profile: "3g.40gb" -> 3, a compute instance's "1c.3g.40gb" -> 1.
_MIG_NAME = re.compile(r"(?:^|[\s_-])mig[\s_]+(\S+)\s*$", re.IGNORECASE)
_PROFILE_SLICES = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.")


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
    (pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, "graphics_active_percent"),
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
        # MIG uuid -> its GPU instance's GPM samples (allocated at its first mig_snapshot on
        # a GPU with GPM); MIG uuids whose GPU instance answered no GPM (never asked again)
        self._mig_gpm: dict[str, _Gpm] = {}
        self._mig_gpm_off: set[str] = set()
        self._process_util_old = False  # the driver lacks nvmlDeviceGetProcessesUtilizationInfo
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
        for gpm in (*self._gpm.values(), *self._mig_gpm.values()):
            _free(gpm.samples)
        self._gpm.clear()
        self._mig_gpm.clear()
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    def driver_version(self) -> str:
        """`nvidia-smi --query-gpu=driver_version`."""
        return str(pynvml.nvmlSystemGetDriverVersion())

    def devices(self) -> list[GpuDevice]:
        """Every GPU NVML enumerates; a GPU that fails to describe itself is skipped.

        A GPU in MIG mode lists its MIG devices (`mig_devices`); a MIG device that fails
        to describe itself is skipped as Slurm's AutoDetect skips it.
        """
        found: list[GpuDevice] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = str(pynvml.nvmlDeviceGetUUID(handle))
                memory = self._memory(uuid, handle)
                gpm = self._gpm_setup(uuid, handle)
                mig_enabled, migs = self._mig_devices(uuid, handle)
                found.append(
                    GpuDevice(
                        uuid=uuid,
                        name=str(pynvml.nvmlDeviceGetName(handle)),
                        minor=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
                        nvml_index=index,
                        pci_bus_id=str(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                        memory_total_bytes=None if memory is None else int(memory.total),
                        gpm_supported=gpm,
                        mig_enabled=mig_enabled,
                        mig_devices=migs,
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
            # In MIG mode NVML answers NOT_SUPPORTED to utilization: no samples, unknown.
            samples = () if device.mig_enabled else self._samples(uuid, handle, samples_since)
            gpm = (
                self._gpm_read(uuid, self._gpm[uuid], handle, None, now)
                if uuid in self._gpm
                else None
            )
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
            processes=None if processes is None else _processes(processes),
            gpm=gpm,
        )

    def mig_snapshot(self, device: GpuDevice, mig: MigDevice) -> MigSnapshot:
        """Reads one MIG device of `device` (`nvidia-smi -q -d MEMORY,PIDS` on it).

        Its memory and processes from its own handle; on a GPU with GPM (Hopper and newer)
        the GPM metrics of its GPU instance since its previous mig_snapshot (None at the
        first, and on a GPU without GPM: memory only). Never raises for a per-device fault.
        """
        now = self._clock()
        try:
            handle = self._handle(mig.uuid)
            memory = self._memory(mig.uuid, handle)
            processes = self._field(
                mig.uuid, "processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            )
            gpm = self._mig_gpm_read(device, mig, now)
        except (pynvml.NVMLError, _GpuLost) as exc:
            self._log_once(mig.uuid, "MIG snapshot", exc)
            if mig.uuid in self._mig_gpm:  # its counters start again when it returns
                self._mig_gpm[mig.uuid].newest = None
            return MigSnapshot(uuid=mig.uuid, time=now, error=str(exc))
        return MigSnapshot(
            uuid=mig.uuid,
            time=now,
            mem_used_bytes=None if memory is None else int(memory.used),
            mem_total_bytes=None if memory is None else int(memory.total),
            processes=None if processes is None else _processes(processes),
            gpm=gpm,
        )

    def process_utilization(self, device: GpuDevice, since: float) -> ProcessUtilization:
        """Per-process utilization of `device` sampled after `since` (POSIX seconds).

        `nvmlDeviceGetProcessesUtilizationInfo` (R550+); `nvmlDeviceGetProcessUtilization`
        only once the first answered FUNCTION_NOT_FOUND (an older driver), never where the
        new call exists (from R580 the old one answers smUtil 0). Each process's samples in
        the window are averaged. NOT_FOUND (no sample newer than `since`) is no process
        sampled, not an error; any other failure (NOT_SUPPORTED in MIG mode, a lost GPU)
        sets `error`: nothing is known of that GPU's processes.
        """
        now = self._clock()
        try:
            raw = self._process_samples(self._handle(device.uuid), int(since * 1e6))
        except pynvml.NVMLError as exc:
            call = _PROCESS_UTIL_OLD if self._process_util_old else _PROCESS_UTIL_NEW
            if exc.value in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS):
                # NOT_FOUND: nothing newer than `since`; pynvml raises SUCCESS when the size
                # query finds no sample at all
                return ProcessUtilization(device.uuid, now, last_seen=since, call=call)
            self._log_once(device.uuid, call, exc)
            return ProcessUtilization(device.uuid, now, last_seen=since, call=call, error=str(exc))
        call = _PROCESS_UTIL_OLD if self._process_util_old else _PROCESS_UTIL_NEW
        sm: dict[int, list[float]] = {}
        mem: dict[int, list[float]] = {}
        newest = since
        for sample in raw:
            stamp = sample.timeStamp / 1e6
            if stamp <= since:
                continue
            pid = int(sample.pid)
            sm.setdefault(pid, []).append(float(sample.smUtil))
            mem.setdefault(pid, []).append(float(sample.memUtil))
            newest = max(newest, stamp)
        return ProcessUtilization(
            device.uuid,
            now,
            processes=tuple(
                ProcessUtil(
                    pid, sum(sm[pid]) / len(sm[pid]), sum(mem[pid]) / len(mem[pid]), len(sm[pid])
                )
                for pid in sorted(sm)
            ),
            last_seen=newest,
            call=call,
        )

    def _process_samples(self, handle: Any, last_seen_us: int) -> list[Any]:
        """The per-process samples newer than `last_seen_us`, from the newest call there is."""
        if not self._process_util_old:
            try:
                return _sized(
                    lambda: pynvml.nvmlDeviceGetProcessesUtilizationInfo(handle, last_seen_us)
                )
            except pynvml.NVMLError as exc:
                if exc.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
                self._process_util_old = True
                log.info(
                    "NVML has no %s (a driver before R550): per-process utilization is read"
                    " with %s",
                    _PROCESS_UTIL_NEW,
                    _PROCESS_UTIL_OLD,
                )
        return _sized(lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us))

    def _handle(self, uuid: str) -> Any:
        """The NVML handle of a GPU or MIG device, looked up by UUID once."""
        handle = self._handles.get(uuid) or pynvml.nvmlDeviceGetHandleByUUID(uuid)
        self._handles[uuid] = handle
        return handle

    def _mig_devices(self, uuid: str, handle: Any) -> tuple[bool, tuple[MigDevice, ...]]:
        """Whether the GPU is in MIG mode (its current mode), and then its MIG devices.

        A GPU that cannot do MIG answers NOT_SUPPORTED (a driver without MIG,
        FUNCTION_NOT_FOUND): not in MIG mode, nothing logged. A pending mode is not the
        current one until the GPU is reset. Indexes without a MIG device (NOT_FOUND) are
        passed over; the rest are described as Slurm's `_handle_mig` does.
        """
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError as exc:
            if exc.value in _GPU_GONE:
                raise _GpuLost(str(exc)) from exc
            if exc.value not in _ABSENT:
                self._log_once(uuid, "MIG mode", exc)
            return False, ()
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return False, ()
        count = self._field(
            uuid, "MIG device count", lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        )
        # As many MIG devices as the GPU has compute slices at most (7 on A100/H100/H200)
        max_slices = int(count) if count else 7
        migs: list[MigDevice] = []
        for index in range(int(count or 0)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
                migs.append(self._describe_mig(uuid, mig, index, max_slices))
            except pynvml.NVMLError as exc:
                if exc.value in _GPU_GONE:
                    raise _GpuLost(str(exc)) from exc
                if exc.value != pynvml.NVML_ERROR_NOT_FOUND:
                    self._log_once(uuid, f"MIG device {index}", exc)
            except ValueError as exc:
                self._log_once(uuid, f"MIG device {index}", exc)
        if not migs and (uuid, "no MIG devices", 0) not in self._logged:
            self._logged.add((uuid, "no MIG devices", 0))
            log.warning("GPU %s is in MIG mode but has no MIG devices", uuid)
        return True, tuple(migs)

    def _describe_mig(self, parent: str, mig: Any, index: int, max_slices: int) -> MigDevice:
        """One MIG device: its UUID, GI and CI ids, profile, slices and memory."""
        uuid = str(pynvml.nvmlDeviceGetUUID(mig))
        gpu_instance = int(pynvml.nvmlDeviceGetGpuInstanceId(mig))
        compute_instance = int(pynvml.nvmlDeviceGetComputeInstanceId(mig))
        profile, slices = self._mig_profile(uuid, mig)
        memory = self._memory(uuid, mig)
        self._handles[uuid] = mig
        return MigDevice(
            uuid=uuid,
            parent_uuid=parent,
            mig_index=index,
            gpu_instance_id=gpu_instance,
            compute_instance_id=compute_instance,
            profile=profile,
            slices=slices,
            max_slices=max_slices,
            memory_total_bytes=None if memory is None else int(memory.total),
        )

    def _mig_profile(self, uuid: str, mig: Any) -> tuple[str, int]:
        """(profile, compute slices) of a MIG device, as Slurm's `_handle_mig` names it.

        From its name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb"); failing that,
        from its attributes (`nvmlDeviceGetAttributes`): "<g>g.<memory GB rounded up>gb",
        "<c>c." in front when the compute instance has fewer slices than its GPU instance.
        ValueError when neither says (the device is skipped).
        """
        name = self._field(uuid, "name", lambda: str(pynvml.nvmlDeviceGetName(mig))) or ""
        found = _MIG_NAME.search(name)
        if found and (slices := _profile_slices(found[1].lower())):
            return found[1].lower(), slices
        try:
            attributes = pynvml.nvmlDeviceGetAttributes(mig)
        except pynvml.NVMLError as exc:
            raise ValueError(f"no profile in its name {name!r}, no attributes ({exc})") from exc
        gi_slices = int(attributes.gpuInstanceSliceCount)
        ci_slices = int(attributes.computeInstanceSliceCount)
        if ci_slices <= 0:
            raise ValueError(f"no profile in its name {name!r}, no compute slices")
        profile = (f"{ci_slices}c." if ci_slices != gi_slices else "") + (
            f"{gi_slices}g.{math.ceil(int(attributes.memorySizeMB) / 1024)}gb"
        )
        return profile, ci_slices

    def _mig_gpm_read(self, device: GpuDevice, mig: MigDevice, now: float) -> GpmMetrics | None:
        """GPM of the MIG device's GPU instance since its previous read (Hopper and newer).

        Only on a GPU with GPM (devices() set it up). Its two samples are allocated at its
        first read and used in turn. NOT_SUPPORTED (or no such call) turns GPM off for this
        MIG device for good, logged once; other failures are logged once and retried.
        """
        if device.uuid not in self._gpm or mig.uuid in self._mig_gpm_off:
            return None
        gpm = self._mig_gpm.get(mig.uuid)
        if gpm is None:
            samples: list[Any] = []
            try:
                for _ in range(2):
                    samples.append(pynvml.nvmlGpmSampleAlloc())
            except pynvml.NVMLError as exc:
                _free(samples)
                self._mig_gpm_off.add(mig.uuid)
                self._log_gpm_off(mig.uuid, f"nvmlGpmSampleAlloc: {exc}")
                return None
            gpm = self._mig_gpm[mig.uuid] = _Gpm((samples[0], samples[1]))
        parent = self._handle(device.uuid)
        try:
            return self._gpm_read(mig.uuid, gpm, parent, mig.gpu_instance_id, now)
        except pynvml.NVMLError as exc:
            if exc.value in _GPU_GONE:
                raise _GpuLost(str(exc)) from exc
            if exc.value in _ABSENT:
                _free(self._mig_gpm.pop(mig.uuid).samples)
                self._mig_gpm_off.add(mig.uuid)
                self._log_gpm_off(mig.uuid, f"nvmlGpmMigSampleGet: {exc}")
            else:
                self._log_once(mig.uuid, "gpm-sample", exc)
            return None

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
            _free(samples)
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

    def _gpm_read(
        self, uuid: str, gpm: _Gpm, handle: Any, gpu_instance: int | None, now: float
    ) -> GpmMetrics | None:
        """One GPM sample, and the metrics since the previous one.

        `nvmlGpmSampleGet` of the GPU, or `nvmlGpmMigSampleGet` of one of its GPU
        instances when `gpu_instance` is given (on the parent's handle). None for the first
        sample, and when a call fails (logged once); after a failed sample the previous one
        is kept, so the next window spans both reads. Raises NVMLError for a failed
        instance sample (the caller decides), _GpuLost for a lost GPU.
        """
        target = 1 if gpm.newest == 0 else 0
        sample = gpm.samples[target]
        if gpu_instance is not None:
            pynvml.nvmlGpmMigSampleGet(handle, gpu_instance, sample)
        else:
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


def _processes(raw: Any) -> tuple[GpuProcess, ...]:
    """NVML's compute processes, as GpuProcess."""
    return tuple(
        GpuProcess(pid=int(p.pid), used_memory_bytes=_memory_or_none(p.usedGpuMemory)) for p in raw
    )


def _profile_slices(profile: str) -> int:
    """A MIG profile's compute slices: "3g.40gb" -> 3, "1c.3g.40gb" -> 1; 0 if none."""
    found = _PROFILE_SLICES.match(profile)
    return int(found[1] or found[2]) if found else 0


def _sized(read: Callable[[], list[Any]]) -> list[Any]:
    """A pynvml two-call read, once more when a process appeared between its two calls."""
    try:
        return read()
    except pynvml.NVMLError as exc:
        if exc.value != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            raise
        return read()


def _free(samples: Any) -> None:
    """nvmlGpmSampleFree of each sample (a failure frees nothing more to worry about)."""
    for sample in samples:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlGpmSampleFree(sample)


def _memory_or_none(value: int) -> int | None:
    """NVML reports NVML_VALUE_NOT_AVAILABLE (2**64-1) when a process's memory is unknown."""
    return None if value is None or value >= 2**63 else int(value)
