"""Optional /metrics for Prometheus: the latest reading of every GPU on this node.

Labels: node, gpu (uuid), model, job_id, user, account ("" when no job holds the GPU).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from slurm_gpu.models import GpuDevice
from slurm_gpu.node.agent import TickResult
from slurm_gpu.node.attribution import JobSpan

_LABELS = ("node", "gpu", "model", "job_id", "user", "account")


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
        self.ticks.labels(node).inc()
        self.backlog.labels(node).set(backlog)
