"""NVML GPM on the simulated GPUs, read through the real pynvml as the agent reads it.

A100s have no GPM (as on real hardware), H100s do; the metrics between two samples are the
exact time-weighted mean of what the plans (or gpu-load) did between them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from tests.sim.conftest import NODE, Node, sim_gpu, uuid_of

H100 = "NVIDIA H100 80GB HBM3"
GR = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
SM = pynvml.NVML_GPM_METRIC_SM_UTIL
OCC = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
TENSOR = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
DRAM = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
FP64 = pynvml.NVML_GPM_METRIC_FP64_UTIL
FP32 = pynvml.NVML_GPM_METRIC_FP32_UTIL
FP16 = pynvml.NVML_GPM_METRIC_FP16_UTIL
PCIE_TX = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
PCIE_RX = pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC
NVLINK_RX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
NVLINK_TX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
ALL = [GR, SM, OCC, TENSOR, DRAM, FP64, FP32, FP16, PCIE_TX, PCIE_RX, NVLINK_RX, NVLINK_TX]
NOT_SUPPORTED = {"ret": pynvml.NVML_ERROR_NOT_SUPPORTED}
CREATED_AGO = 3000.0  # the H100s were made this long ago (old plans fit behind them)


def make_h100_node(root: Path, libdir: Path, *extra: str) -> Node:
    """4 simulated H100s on NODE, enumerated in minor order (index == minor)."""
    root.mkdir(parents=True, exist_ok=True)
    node = Node(root=root, libdir=libdir)
    sim_gpu(
        "create", "--dir", str(node.dir), "--node", NODE, "--model", H100,
        "--memory-mib", "81559", "--count", "4", "--created", str(time.time() - CREATED_AGO),
        *extra,
    )  # fmt: skip
    return node


@pytest.fixture
def h100(tmp_path: Path, libdir: Path) -> Iterator[Node]:
    """A fresh node with 4 simulated H100s."""
    n = make_h100_node(tmp_path / "sim-h100", libdir)
    yield n
    n.stop_all()


def write_plan(node: Node, minor: int, name: str, **keys: Any) -> None:
    """A plan file on that GPU (pid 0: no process; give `end` to end it)."""
    body = {"pid": 0, "pattern": "steady", "mem_mib": 0, "seconds": 0, **keys}
    path = node.dir / "gpus" / uuid_of(node, minor) / "plans" / f"{name}.plan"
    path.write_text("".join(f"{k}={v}\n" for k, v in body.items()))


def window(node: Node, minor: int, gap: float, ids: list[int] = ALL) -> dict[str, Any]:
    """Two GPM samples `gap` seconds apart on one GPU and the metrics between them."""
    a, _, b, metrics = node.nvml(
        [
            {"op": "gpm_sample", "index": minor, "name": "a"},
            {"op": "sleep", "seconds": gap},
            {"op": "gpm_sample", "index": minor, "name": "b"},
            {"op": "gpm_metrics", "s1": "a", "s2": "b", "ids": ids},
        ]
    )
    return {"t1": a["t"], "t2": b["t"], "metrics": metrics}


def rounded(metrics: dict[str, Any], digits: int = 3) -> dict[int, Any]:
    """Metric id -> value rounded (or the per-metric error as it came)."""
    return {int(k): round(v, digits) if isinstance(v, float) else v for k, v in metrics.items()}


def test_a100_has_no_gpm(node: Node) -> None:
    """A100: support query succeeds with isSupportedDevice 0; sampling is NOT_SUPPORTED."""
    results = node.nvml(
        [
            {"op": "call", "fn": "nvmlGpmQueryDeviceSupport", "index": 0},
            {"op": "gpm_sample", "index": 0, "name": "a"},
            {"op": "gpm_sample", "index": 0, "name": "a", "mig": 0},
            {"op": "call", "fn": "nvmlGpmQueryIfStreamingEnabled", "index": 0},
            {"op": "gpm_free", "name": "a"},
        ]
    )
    expected = [
        {"version": 1, "isSupportedDevice": 0},
        {"error": "NVMLError_NotSupported"},
        {"error": "NVMLError_NotSupported"},
        {"error": "NVMLError_NotSupported"},
        None,
    ]
    assert expected == results


def test_h100_supports_gpm(h100: Node) -> None:
    """H100: supported; streaming off until switched on; no MIG, so no MIG samples."""
    results = h100.nvml(
        [
            {"op": "call", "fn": "nvmlGpmQueryDeviceSupport", "index": 0},
            {"op": "call", "fn": "nvmlGpmQueryIfStreamingEnabled", "index": 0},
            {"op": "call", "fn": "nvmlGpmSetStreamingEnabled", "index": 0, "args": [1]},
            {"op": "call", "fn": "nvmlGpmQueryIfStreamingEnabled", "index": 0},
            {"op": "call", "fn": "nvmlGpmSetStreamingEnabled", "index": 0, "args": [2]},
            {"op": "gpm_sample", "index": 0, "name": "a", "mig": 0},
        ]
    )
    expected = [
        {"version": 1, "isSupportedDevice": 1},
        0,
        pynvml.NVML_SUCCESS,
        1,
        {"error": "NVMLError_InvalidArgument"},
        {"error": "NVMLError_NotSupported"},
    ]
    assert expected == results


def test_support_follows_model_and_flag(tmp_path: Path, libdir: Path) -> None:
    """create --gpm no turns it off; an info file without the key falls back to the model."""
    off = make_h100_node(tmp_path / "off", libdir, "--gpm", "no")
    derived = make_h100_node(tmp_path / "derived", libdir)
    info = derived.dir / "gpus" / uuid_of(derived, 0) / "info"
    info.write_text("".join(ln for ln in info.read_text().splitlines(True) if "gpm" not in ln))
    query = [{"op": "call", "fn": "nvmlGpmQueryDeviceSupport", "index": 0}]
    show = sim_gpu("show", "--dir", str(off.dir))
    expected = ([{"version": 1, "isSupportedDevice": 0}], [{"version": 1, "isSupportedDevice": 1}])
    assert expected == (off.nvml(query), derived.nvml(query))
    assert 4 == show.count(" gpm=no ")


def test_show_prints_gpm_support(node: Node, h100: Node) -> None:
    """sim-gpu show says gpm=no on every A100 and gpm=yes on every H100."""
    a100 = sim_gpu("show", "--dir", str(node.dir))
    hopper = sim_gpu("show", "--dir", str(h100.dir))
    expected = (4, 0, 4)
    assert expected == (a100.count(" gpm=no "), a100.count(" gpm=yes "), hopper.count(" gpm=yes "))


def test_steady_plan_metrics(h100: Node) -> None:
    """util 90 sm 30 tensor 60: each metric is its level; the defaults fill the rest."""
    now = time.time()
    write_plan(h100, 2, "job", start=now - 100, end=now + 1000, util=90, sm=30, tensor=60)
    metrics = window(h100, 2, 0.3, [*ALL, pynvml.NVML_GPM_METRIC_INTEGER_UTIL])["metrics"]
    expected = {
        GR: 90.0, SM: 30.0, OCC: 15.0, TENSOR: 60.0, DRAM: 10.0, FP64: 0.0, FP32: 15.0,
        FP16: 0.0, PCIE_TX: 100.0, PCIE_RX: 200.0, NVLINK_RX: 0.0, NVLINK_TX: 0.0,
        pynvml.NVML_GPM_METRIC_INTEGER_UTIL: NOT_SUPPORTED,
    }  # fmt: skip
    assert expected == rounded(metrics)


def test_plan_without_gpm_keys_gets_defaults_from_util(h100: Node) -> None:
    """An old plan (util 60 only): sm 60, occupancy 30, tensor 0, dram 20 and so on."""
    now = time.time()
    write_plan(h100, 1, "old", start=now - 100, end=now + 1000, util=60)
    expected = {
        GR: 60.0, SM: 60.0, OCC: 30.0, TENSOR: 0.0, DRAM: 20.0, FP64: 0.0, FP32: 30.0,
        FP16: 0.0, PCIE_TX: 200.0, PCIE_RX: 400.0, NVLINK_RX: 0.0, NVLINK_TX: 0.0,
    }  # fmt: skip
    assert expected == rounded(window(h100, 1, 0.3)["metrics"])


def test_overlapping_plans_clip_percentages_not_rates(h100: Node) -> None:
    """Two plans: percentages sum and clip at 100, PCIe rates just sum."""
    now = time.time()
    for name in ("x", "y"):
        write_plan(
            h100, 0, name, start=now - 100, end=now + 1000, util=60, sm=70, tensor=10, dram=60,
            pcie_tx=300,
        )  # fmt: skip
    metrics = rounded(window(h100, 0, 0.3, [GR, SM, TENSOR, DRAM, PCIE_TX])["metrics"])
    expected = {GR: 100.0, SM: 100.0, TENSOR: 20.0, DRAM: 100.0, PCIE_TX: 600.0}
    assert expected == metrics


def test_load_starting_and_stopping_between_samples(h100: Node) -> None:
    """A load running for part of the window counts by the share of the window it ran."""
    now = time.time()
    start, end = now + 1.2, now + 1.7
    write_plan(h100, 3, "always", start=now - 100, end=now + 1000, util=40, sm=20, tensor=5)
    write_plan(h100, 3, "burst", start=start, end=end, util=50, sm=60, tensor=80)
    a, _, b, metrics = h100.nvml(
        [
            {"op": "gpm_sample", "index": 3, "name": "a"},
            {"op": "sleep_until", "t": end + 0.3},
            {"op": "gpm_sample", "index": 3, "name": "b"},
            {"op": "gpm_metrics", "s1": "a", "s2": "b", "ids": [GR, SM, TENSOR]},
        ]
    )
    assert a["t"] < start and b["t"] > end, "the burst must fall between the samples"
    share = (end - start) / (b["t"] - a["t"])
    expected = {GR: 40 + 50 * share, SM: 20 + 60 * share, TENSOR: 5 + 80 * share}
    got = {int(k): v for k, v in metrics.items()}
    assert expected == pytest.approx(got, abs=0.05)


def test_ramp_metrics_follow_the_utilization_shape(h100: Node) -> None:
    """A ramp: SM activity is sm/util times the utilization at every instant."""
    now = time.time()
    start, seconds = now - 50, 100.0
    write_plan(
        h100, 0, "ramp", start=start, end=now + 1000, pattern="ramp", seconds=seconds,
        util=80, sm=40,
    )  # fmt: skip
    w = window(h100, 0, 0.5, [GR, SM])
    t1, t2 = w["t1"] - start, w["t2"] - start
    mean_sm = 40 * (t2 * t2 - t1 * t1) / (2 * seconds * (t2 - t1))
    got = {int(k): v for k, v in w["metrics"].items()}
    assert {GR: 2 * mean_sm, SM: mean_sm} == pytest.approx(got, abs=0.01)


def test_gpu_load_drives_gpm(h100: Node) -> None:
    """gpu-load --util 90 --sm 30 --tensor 60: SM 30, tensor 60, duty cycle 90."""
    h100.start_load("1", "--util", "90", "--sm", "30", "--tensor", "60", "--seconds", "30")
    metrics = rounded(window(h100, 1, 0.5, [GR, SM, OCC, TENSOR, DRAM])["metrics"])
    expected = {GR: 90.0, SM: 30.0, OCC: 15.0, TENSOR: 60.0, DRAM: 10.0}
    assert expected == metrics


def test_fake_busy_is_busy_but_idle_inside(h100: Node) -> None:
    """gpu-load --pattern fake-busy: duty cycle 100%, SM activity 1%, no tensor use."""
    h100.start_load("2", "--pattern", "fake-busy", "--seconds", "30")
    metrics = rounded(window(h100, 2, 0.5, [GR, SM, TENSOR])["metrics"])
    assert {GR: 100.0, SM: 1.0, TENSOR: 0.0} == metrics


def test_version_mismatch_is_rejected(h100: Node) -> None:
    """Metrics struct version 2 and support struct version 2: ARGUMENT_VERSION_MISMATCH."""
    results = h100.nvml(
        [
            {"op": "gpm_sample", "index": 0, "name": "a"},
            {"op": "gpm_sample", "index": 0, "name": "b"},
            {"op": "gpm_metrics", "s1": "a", "s2": "b", "ids": [SM], "version": 2},
            {"op": "gpm_support_raw", "index": 0, "version": 2},
        ]
    )
    expected = [
        {"error": "NVMLError_ArgumentVersionMismatch"},
        {"ret": pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "isSupportedDevice": 7},
    ]
    assert expected == results[2:]


def test_samples_misused_are_invalid_arguments(h100: Node) -> None:
    """Two GPUs, reversed order, an unread sample, a freed one: INVALID_ARGUMENT."""
    results = h100.nvml(
        [
            {"op": "gpm_sample", "index": 0, "name": "a"},
            {"op": "gpm_sample", "index": 1, "name": "other"},
            {"op": "gpm_sample", "index": 0, "name": "b"},
            {"op": "gpm_alloc", "name": "unread"},
            {"op": "gpm_metrics", "s1": "a", "s2": "other", "ids": [SM]},
            {"op": "gpm_metrics", "s1": "b", "s2": "a", "ids": [SM]},
            {"op": "gpm_metrics", "s1": "a", "s2": "unread", "ids": [SM]},
            {"op": "gpm_metrics", "s1": "a", "s2": "b", "ids": [SM]},
            {"op": "gpm_free", "name": "b"},
            {"op": "gpm_free", "name": "b"},
            {"op": "gpm_sample", "index": 0, "name": "b"},
        ]
    )
    invalid = {"error": "NVMLError_InvalidArgument"}
    expected = [invalid, invalid, invalid, {str(SM): 0.0}, None, invalid, invalid]
    assert expected == results[4:]


def test_fault_not_supported_gpm(h100: Node) -> None:
    """not-supported=gpm: that GPU's GPM calls answer NOT_SUPPORTED, the others work."""
    sim_gpu("fault", "--dir", str(h100.dir), "--gpu", "minor:1", "not-supported=gpm")
    results = h100.nvml(
        [
            {"op": "call", "fn": "nvmlGpmQueryDeviceSupport", "index": 1},
            {"op": "gpm_sample", "index": 1, "name": "a"},
            {"op": "call", "fn": "nvmlDeviceGetUtilizationRates", "index": 1},
            {"op": "call", "fn": "nvmlGpmQueryDeviceSupport", "index": 0},
        ]
    )
    expected = [
        {"error": "NVMLError_NotSupported"},
        {"error": "NVMLError_NotSupported"},
        {"gpu": 0, "memory": 0},
        {"version": 1, "isSupportedDevice": 1},
    ]
    assert expected == results


def test_lost_gpu(h100: Node) -> None:
    """A lost GPU answers GPU_IS_LOST to its GPM calls, as to every other call."""
    sim_gpu("fault", "--dir", str(h100.dir), "--gpu", "minor:2", "lost")
    results = h100.nvml(
        [
            {"op": "call", "fn": "nvmlGpmQueryDeviceSupport", "index": 2},
            {"op": "gpm_sample", "index": 2, "name": "a"},
            {"op": "call", "fn": "nvmlGpmQueryIfStreamingEnabled", "index": 2},
        ]
    )
    assert [{"error": "NVMLError_GpuIsLost"}] * 3 == results


def test_compaction_between_samples_changes_nothing(h100: Node) -> None:
    """Old plans folded into `base` between two samples leave the metrics between them exact."""
    now = time.time()
    for i in range(33):  # enough ended plans, long enough ago, to be compacted
        start = now - 2600 + 20 * i  # 10 s each, one after the other
        write_plan(h100, 0, f"old{i}", start=start, end=start + 10, util=50, sm=40, tensor=20)
    write_plan(h100, 0, "job", start=now - 100, end=now + 1000, util=80, sm=25, tensor=70)
    gpu_dir = h100.dir / "gpus" / uuid_of(h100, 0)
    lock = str(gpu_dir / "base.lock")
    results = h100.nvml(
        [
            {"op": "flock", "path": lock},  # no compaction while the first sample is taken
            {"op": "gpm_sample", "index": 0, "name": "a"},
            {"op": "unlock", "path": lock},
            {"op": "sleep", "seconds": 0.3},
            {"op": "gpm_sample", "index": 0, "name": "b"},  # this one compacts
            {"op": "gpm_metrics", "s1": "a", "s2": "b", "ids": [GR, SM, OCC, TENSOR, DRAM]},
        ]
    )
    base = dict(line.split("=", 1) for line in (gpu_dir / "base").read_text().splitlines())
    left = sorted(p.name for p in (gpu_dir / "plans").glob("*.plan"))
    folded_sm = 33 * 10 * 40.0  # percent-seconds of SM activity of the old plans
    assert (["job.plan"], round(folded_sm, 3)) == (left, round(float(base["sm_integral"]), 3))
    expected = {GR: 80.0, SM: 25.0, OCC: 12.5, TENSOR: 70.0, DRAM: 25 / 3}
    assert expected == pytest.approx({int(k): v for k, v in results[5].items()}, abs=1e-3)


def test_metrics_survive_a_reinit(h100: Node) -> None:
    """Samples outlive nvmlShutdown/nvmlInit (the agent re-inits to see new GPUs)."""
    now = time.time()
    write_plan(h100, 0, "job", start=now - 100, end=now + 1000, util=70, sm=35)
    results = h100.nvml(
        [
            {"op": "gpm_sample", "index": 0, "name": "a"},
            {"op": "shutdown"},
            {"op": "init"},
            {"op": "sleep", "seconds": 0.2},
            {"op": "gpm_sample", "index": 0, "name": "b"},
            {"op": "gpm_metrics", "s1": "a", "s2": "b", "ids": [SM]},
        ]
    )
    assert {SM: 35.0} == rounded(results[5])
