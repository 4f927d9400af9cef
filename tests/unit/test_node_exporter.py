"""The node agent's /metrics (slurm_gpu/node/exporter.py): GPM gauges, one series per GPU.

A NodeMetrics on its own registry, updated with hand-made ticks; the text Prometheus
would scrape is parsed back.
"""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpu.gpu import GpmMetrics, GpuSnapshot, UtilSample
from slurm_gpu.models import GpuDevice
from slurm_gpu.node.agent import TickResult
from slurm_gpu.node.attribution import JobSpan
from slurm_gpu.node.exporter import NodeMetrics

T0 = 1_800_000_000.0
H100 = GpuDevice("GPU-h", "NVIDIA H100 80GB HBM3", 0, 0, "0:1", 80 * 2**30, gpm_supported=True)
A100 = GpuDevice("GPU-a", "NVIDIA A100-SXM4-80GB", 1, 1, "0:2", 80 * 2**30)
INDEX = {"GPU-h": 0, "GPU-a": 1}
GPM = GpmMetrics(
    start=T0 - 10,
    end=T0,
    sm_active_percent=1.5,
    sm_occupancy_percent=0.8,
    tensor_active_percent=0.0,
    dram_bw_percent=2.0,
    fp64_active_percent=None,  # a figure the GPU does not measure
    fp32_active_percent=1.0,
    fp16_active_percent=0.0,
    pcie_tx_mib_per_s=3.0,
    pcie_rx_mib_per_s=4.0,
    nvlink_tx_mib_per_s=0.0,
    nvlink_rx_mib_per_s=0.0,
)
Series = dict[str, float]


def snapshot(uuid: str, gpm: GpmMetrics | None) -> GpuSnapshot:
    return GpuSnapshot(
        uuid,
        T0,
        samples=(UtilSample(T0 - 5, 99.0), UtilSample(T0, 97.0)),
        mem_used_bytes=2**30,
        power_watts=300.0,
        temperature_celsius=50.0,
        gpm=gpm,
    )


def tick(metrics: NodeMetrics, job_of_h100: int, gpm: GpmMetrics | None = GPM) -> None:
    """One tick: the H100 held by `job_of_h100` (fake-busy), the A100 by job 9 (no GPM)."""
    spans = [
        JobSpan(job_of_h100, 0, T0 - 60, user="alice", account="physics"),
        JobSpan(9, 1, T0 - 60, user="bob", account="bio"),
    ]
    result = TickResult(
        T0, snapshots={"GPU-h": snapshot("GPU-h", gpm), "GPU-a": snapshot("GPU-a", None)}
    )
    metrics.update("gpu2", [H100, A100], INDEX, spans, result, backlog=0)


def scrape(metrics: NodeMetrics, name: str) -> Series:
    """The samples of one metric: "gpu/job_id" -> value."""
    text = generate_latest(metrics.registry).decode()
    return {
        f"{s.labels['gpu']}/{s.labels['job_id']}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_gpm_gauges_carry_the_job_holding_the_gpu() -> None:
    """SM activity, occupancy, DRAM and PCIe (in bytes/s) of the H100, labelled job 7."""
    metrics = NodeMetrics()
    tick(metrics, 7)
    expected = [{"GPU-h/7": 1.5}, {"GPU-h/7": 0.8}, {"GPU-h/7": 2.0}, {"GPU-h/7": 3.0 * 2**20}]
    names = (
        "slurm_gpu_sm_active_percent",
        "slurm_gpu_sm_occupancy_percent",
        "slurm_gpu_dram_bw_percent",
        "slurm_gpu_pcie_tx_bytes_per_second",
    )
    assert expected == [scrape(metrics, n) for n in names]


def test_gpu_without_gpm_has_no_sample_not_zero() -> None:
    """The A100 (no GPM) has utilization but no SM-activity series; nor a figure GPM lacks."""
    metrics = NodeMetrics()
    tick(metrics, 7)
    expected: tuple[Series, Series, Series] = (
        {"GPU-h/7": 98.0, "GPU-a/9": 98.0},
        {"GPU-h/7": 1.5},
        {},
    )
    assert expected == (
        scrape(metrics, "slurm_gpu_utilization_percent"),
        scrape(metrics, "slurm_gpu_sm_active_percent"),
        scrape(metrics, "slurm_gpu_fp64_active_percent"),
    )


def test_job_change_replaces_the_series() -> None:
    """Job 7 ends and job 8 takes the H100: one series, job 8's; job 7's label set is gone."""
    metrics = NodeMetrics()
    tick(metrics, 7)
    tick(metrics, 8)
    expected = ({"GPU-h/8": 1.5}, {"GPU-h/8": 98.0, "GPU-a/9": 98.0})
    assert expected == (
        scrape(metrics, "slurm_gpu_sm_active_percent"),
        scrape(metrics, "slurm_gpu_utilization_percent"),
    )


def test_tick_without_gpm_window_drops_the_old_sample() -> None:
    """A tick whose snapshot has no GPM window (first sample) leaves no stale SM figure."""
    metrics = NodeMetrics()
    tick(metrics, 7)
    tick(metrics, 7, gpm=None)
    expected: Series = {}
    assert expected == scrape(metrics, "slurm_gpu_sm_active_percent")
