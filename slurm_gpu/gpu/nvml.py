"""NVML through pynvml: every call goes through one funnel that turns errors into values.

A field NVML does not support becomes None for that GPU; a lost GPU becomes a snapshot
with `error` set. Neither stops the other GPUs from being read (the nvitop approach).
Each distinct problem is logged once per GPU and field, not every interval.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from slurm_gpu.errors import GpuError
from slurm_gpu.gpu import GpuSnapshot, UtilSample
from slurm_gpu.models import GpuDevice, GpuProcess

log = logging.getLogger(__name__)
T = TypeVar("T")

# Errors that mean "this GPU is gone", not "this field is unsupported".
_GPU_GONE = (
    pynvml.NVML_ERROR_GPU_IS_LOST,
    getattr(pynvml, "NVML_ERROR_GPU_NOT_FOUND", 28),
)


class _GpuLost(Exception):
    """Raised inside a snapshot when the GPU stopped answering altogether."""


class NvmlSource:
    """The production GpuSource: pynvml over libnvidia-ml.so.1.

    Args:
        clock: POSIX time source, injectable for tests.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._logged: set[tuple[str, str, int]] = set()
        self._handles: dict[str, Any] = {}
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuError(f"NVML could not be initialised: {exc}") from exc

    def close(self) -> None:
        """nvmlShutdown; safe to call twice."""
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
                found.append(
                    GpuDevice(
                        uuid=uuid,
                        name=str(pynvml.nvmlDeviceGetName(handle)),
                        minor=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
                        nvml_index=index,
                        pci_bus_id=str(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                        memory_total_bytes=None if memory is None else int(memory.total),
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
            memory = self._memory(uuid, handle)
            power_mw = self._field(uuid, "power", lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
            energy_mj = self._field(
                uuid, "energy", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            )
            temperature = self._field(
                uuid,
                "temperature",
                lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            )
            ecc = self._field(
                uuid,
                "ecc",
                lambda: pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                ),
            )
            processes = self._field(
                uuid, "processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            )
            samples = self._samples(uuid, handle, samples_since)
        except (pynvml.NVMLError, _GpuLost) as exc:
            self._log_once(device.uuid, "snapshot", exc)
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

    def _field(self, uuid: str, name: str, read: Callable[[], T]) -> T | None:
        """One NVML call: unsupported -> None (logged once); lost GPU -> _GpuLost."""
        try:
            return read()
        except pynvml.NVMLError as exc:
            if exc.value in _GPU_GONE:
                raise _GpuLost(str(exc)) from exc
            self._log_once(uuid, name, exc)
            return None

    def _log_once(self, where: str, what: str, exc: Exception) -> None:
        code = int(getattr(exc, "value", -1))
        if (where, what, code) not in self._logged:
            self._logged.add((where, what, code))
            log.warning("NVML %s on GPU %s: %s (further occurrences not logged)", what, where, exc)


def _memory_or_none(value: int) -> int | None:
    """NVML reports NVML_VALUE_NOT_AVAILABLE (2**64-1) when a process's memory is unknown."""
    return None if value is None or value >= 2**63 else int(value)
