"""GPU access: the only package that imports pynvml (see nvml.py).

`GpuSource` is the interface the node agent uses; tests pass their own source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from slurm_gpu.models import GpuDevice, GpuProcess, MigDevice


class UtilSample(NamedTuple):
    """One NVML utilization sample: when (POSIX seconds) and how busy (percent).

    A named tuple, like GpmMetrics: the agent builds several per GPU per tick, and a
    tuple is built several times faster than a frozen dataclass (bench/agent).
    """

    time: float
    util_percent: float


class GpmMetrics(NamedTuple):
    """NVML GPM metrics between two GPM samples of one GPU (`nvmlGpmMetricsGet`).

    Each figure is the time-weighted mean over (start, end], the span between the two
    samples' timestamps; None where the GPU did not measure it. Percentages are 0-100.
    """

    start: float
    end: float
    sm_active_percent: float | None = None  # NVML_GPM_METRIC_SM_UTIL
    sm_occupancy_percent: float | None = None  # NVML_GPM_METRIC_SM_OCCUPANCY
    tensor_active_percent: float | None = None  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    dram_bw_percent: float | None = None  # NVML_GPM_METRIC_DRAM_BW_UTIL
    fp64_active_percent: float | None = None  # NVML_GPM_METRIC_FP64_UTIL
    fp32_active_percent: float | None = None  # NVML_GPM_METRIC_FP32_UTIL
    fp16_active_percent: float | None = None  # NVML_GPM_METRIC_FP16_UTIL
    pcie_tx_mib_per_s: float | None = None  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
    pcie_rx_mib_per_s: float | None = None  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
    nvlink_tx_mib_per_s: float | None = None  # NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
    nvlink_rx_mib_per_s: float | None = None  # NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
    # NVML_GPM_METRIC_GRAPHICS_UTIL: the share of time any kernel ran (a MIG slice's
    # utilization, where NVML's utilization calls answer NOT_SUPPORTED; issue #14)
    graphics_active_percent: float | None = None

    @property
    def seconds(self) -> float:
        """How long the two samples lie apart."""
        return self.end - self.start


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything read from one GPU at one moment; None where NVML could not say.

    `samples` are NVML's own utilization samples newer than the caller's last one.
    `error` names why the GPU could not be read at all (e.g. "GPU is lost").
    `gpm` holds the GPM metrics since the previous snapshot's GPM sample; None when the
    GPU has no GPM or this is its first sample.
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
    gpm: GpmMetrics | None = None


@dataclass(frozen=True)
class MigSnapshot:
    """One MIG device read at one moment; None where NVML could not say.

    `gpm` holds its GPU instance's GPM metrics since the previous MIG snapshot of that
    instance (`nvmlGpmMigSampleGet`, Hopper+); None on Ampere (NOT_SUPPORTED) or at the
    first sample. `error` names why it could not be read at all.
    """

    uuid: str
    time: float
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    processes: tuple[GpuProcess, ...] | None = None
    gpm: GpmMetrics | None = None
    error: str | None = None


class ProcessUtil(NamedTuple):
    """One process's share of a GPU over a window (per-process utilization)."""

    pid: int
    sm_util_percent: float  # mean over the window's samples of this process
    mem_util_percent: float | None
    sample_count: int


@dataclass(frozen=True)
class ProcessUtilization:
    """Per-process utilization of one GPU since the caller's last read.

    `processes` are the processes NVML sampled in (since, time]; `last_seen` is the
    newest sample's timestamp, to pass back next time. `error` names why it could not be
    read (NOT_SUPPORTED in MIG mode, FUNCTION_NOT_FOUND...): then nothing is known of
    any process on that GPU, which is unknown, never idle. `call` names the NVML call
    that answered ("nvmlDeviceGetProcessesUtilizationInfo" or the older
    "nvmlDeviceGetProcessUtilization").
    """

    uuid: str
    time: float
    processes: tuple[ProcessUtil, ...] = ()
    last_seen: float = 0.0
    call: str = ""
    error: str | None = None


class GpuSource(Protocol):
    """What the agent needs from the GPUs of its node."""

    def devices(self) -> list[GpuDevice]:
        """Every GPU on the node (`nvidia-smi -L`)."""
        ...

    def snapshot(self, device: GpuDevice, samples_since: float) -> GpuSnapshot:
        """Reads one GPU; never raises for a per-GPU fault (it sets `error` instead)."""
        ...

    def mig_snapshot(self, device: GpuDevice, mig: MigDevice) -> MigSnapshot:
        """Reads one MIG device of `device`; never raises for a per-device fault."""
        ...

    def process_utilization(self, device: GpuDevice, since: float) -> ProcessUtilization:
        """Per-process utilization of `device` newer than `since` (a POSIX time)."""
        ...

    def close(self) -> None:
        """Releases the library (nvmlShutdown)."""
        ...
