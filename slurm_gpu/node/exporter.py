"""Optional /metrics for Prometheus: the latest reading of every GPU on this node.

Labels: node, gpu (uuid), model, job_id, user, account ("" when no job holds the GPU).
Every gauge has one series per GPU, labelled with the job that holds it now: each tick
replaces the series, so a job change removes the old job's label set instead of leaving
a series per job behind.

The GPM gauges (issue #13: SM activity, occupancy, tensor, DRAM bandwidth, FP64/32/16,
PCIe and NVLink traffic; `GpuSnapshot.gpm`) are the metrics between the GPU's last two
GPM samples. A GPU without GPM (an A100), or a figure it does not measure, has no sample
at all, never 0: unknown is not idle.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from slurm_gpu.gpu import GpmMetrics
from slurm_gpu.models import GpuDevice
from slurm_gpu.node.agent import TickResult
from slurm_gpu.node.attribution import JobSpan

_LABELS = ("node", "gpu", "model", "job_id", "user", "account")
_MIB = 1024 * 1024
# (metric name, help, GpmMetrics field, factor to the metric's unit)
_GPM_GAUGES = (
    (
        "slurm_gpu_sm_active_percent",
        "Share of SMs at work between the last two GPM samples (NVML GPM SM activity)",
        "sm_active_percent",
        1.0,
    ),
    (
        "slurm_gpu_sm_occupancy_percent",
        "Resident warps per SM against the maximum (NVML GPM SM occupancy)",
        "sm_occupancy_percent",
        1.0,
    ),
    (
        "slurm_gpu_tensor_active_percent",
        "Share of time the tensor pipes were active (NVML GPM any tensor)",
        "tensor_active_percent",
        1.0,
    ),
    (
        "slurm_gpu_dram_bw_percent",
        "DRAM bandwidth used against the peak (NVML GPM DRAM BW)",
        "dram_bw_percent",
        1.0,
    ),
    ("slurm_gpu_fp64_active_percent", "FP64 pipe activity (NVML GPM)", "fp64_active_percent", 1.0),
    ("slurm_gpu_fp32_active_percent", "FP32 pipe activity (NVML GPM)", "fp32_active_percent", 1.0),
    ("slurm_gpu_fp16_active_percent", "FP16 pipe activity (NVML GPM)", "fp16_active_percent", 1.0),
    (
        "slurm_gpu_pcie_tx_bytes_per_second",
        "PCIe bytes sent per second (NVML GPM)",
        "pcie_tx_mib_per_s",
        _MIB,
    ),
    (
        "slurm_gpu_pcie_rx_bytes_per_second",
        "PCIe bytes received per second (NVML GPM)",
        "pcie_rx_mib_per_s",
        _MIB,
    ),
    (
        "slurm_gpu_nvlink_tx_bytes_per_second",
        "NVLink bytes sent per second, all links (NVML GPM)",
        "nvlink_tx_mib_per_s",
        _MIB,
    ),
    (
        "slurm_gpu_nvlink_rx_bytes_per_second",
        "NVLink bytes received per second, all links (NVML GPM)",
        "nvlink_rx_mib_per_s",
        _MIB,
    ),
)


class NodeMetrics:
    """Gauges refreshed every tick; a job's labels vanish with the job."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.util = Gauge(
            "slurm_gpu_utilization_percent",
            "Mean GPU utilization over the last interval",
            _LABELS,
            registry=r,
        )
        self.mem = Gauge("slurm_gpu_memory_used_bytes", "GPU memory in use", _LABELS, registry=r)
        self.power = Gauge("slurm_gpu_power_watts", "GPU power draw", _LABELS, registry=r)
        self.temp = Gauge("slurm_gpu_temperature_celsius", "GPU temperature", _LABELS, registry=r)
        self.up = Gauge(
            "slurm_gpu_device_up", "1 when the GPU answered NVML this interval", _LABELS, registry=r
        )
        self.unallocated = Gauge(
            "slurm_gpu_unallocated_processes",
            "Processes on the GPU that belong to no job holding it",
            _LABELS,
            registry=r,
        )
        self.gpm = [
            (Gauge(name, text, _LABELS, registry=r), attribute, factor)
            for name, text, attribute, factor in _GPM_GAUGES
        ]
        self.ticks = Counter(
            "slurm_gpu_agent_ticks_total", "Sampling rounds done", ["node"], registry=r
        )
        self.backlog = Gauge(
            "slurm_gpu_agent_spool_backlog_rows",
            "Rows waiting in the spool for the store",
            ["node"],
            registry=r,
        )

    def serve(self, address: str) -> None:
        """Starts the HTTP endpoint on "host:port"."""
        host, _, port = address.rpartition(":")
        start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)

    def update(
        self,
        node: str,
        devices: list[GpuDevice],
        index_of: dict[str, int],
        spans: list[JobSpan],
        result: TickResult,
        backlog: int,
    ) -> None:
        """Replaces every GPU's series with this tick's values."""
        for gauge in (self.util, self.mem, self.power, self.temp, self.up, self.unallocated):
            gauge.clear()
        for gauge, _, _ in self.gpm:
            gauge.clear()
        for device in devices:
            span = next(
                (s for s in spans if s.slurm_index == index_of.get(device.uuid) and s.end is None),
                None,
            )
            labels = (
                node,
                device.uuid,
                device.name,
                str(span.job_id) if span else "",
                span.user if span else "",
                span.account if span else "",
            )
            snap = result.snapshots.get(device.uuid)
            self.up.labels(*labels).set(0 if snap is None or snap.error else 1)
            if snap is None or snap.error:
                continue
            if snap.samples:
                self.util.labels(*labels).set(
                    sum(s.util_percent for s in snap.samples) / len(snap.samples)
                )
            if snap.mem_used_bytes is not None:
                self.mem.labels(*labels).set(snap.mem_used_bytes)
            if snap.power_watts is not None:
                self.power.labels(*labels).set(snap.power_watts)
            if snap.temperature_celsius is not None:
                self.temp.labels(*labels).set(snap.temperature_celsius)
            self.unallocated.labels(*labels).set(len(result.unallocated.get(device.uuid, ())))
            if snap.gpm is not None:
                self._set_gpm(labels, snap.gpm)
        self.ticks.labels(node).inc()
        self.backlog.labels(node).set(backlog)

    def _set_gpm(self, labels: tuple[str, ...], gpm: GpmMetrics) -> None:
        """One sample per GPM figure the GPU measured; none for one it did not."""
        for gauge, attribute, factor in self.gpm:
            value: float | None = getattr(gpm, attribute)
            if value is not None:
                gauge.labels(*labels).set(value * factor)
