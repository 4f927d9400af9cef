"""GPU access: the only package that imports pynvml (see nvml.py).

`GpuSource` is the interface the node agent uses; tests pass their own source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from slurm_gpu.models import GpuDevice, GpuProcess


@dataclass(frozen=True)
class UtilSample:
    """One NVML utilization sample: when (POSIX seconds) and how busy (percent)."""

    time: float
    util_percent: float


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything read from one GPU at one moment; None where NVML could not say.

    `samples` are NVML's own utilization samples newer than the caller's last one.
    `error` names why the GPU could not be read at all (e.g. "GPU is lost").
    """

    uuid: str
    time: float
    samples: tuple[UtilSample, ...] = ()
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    temperature_celsius: float | None = None
    ecc_errors_total: int | None = None
    processes: tuple[GpuProcess, ...] | None = None
    error: str | None = None


class GpuSource(Protocol):
    """What the agent needs from the GPUs of its node."""

    def devices(self) -> list[GpuDevice]:
        """Every GPU on the node (`nvidia-smi -L`)."""
        ...

    def snapshot(self, device: GpuDevice, samples_since: float) -> GpuSnapshot:
        """Reads one GPU; never raises for a per-GPU fault (it sets `error` instead)."""
        ...

    def close(self) -> None:
        """Releases the library (nvmlShutdown)."""
        ...
