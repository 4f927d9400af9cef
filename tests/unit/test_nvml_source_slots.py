"""NvmlSource's per-process aggregation and MIG profile fallback, over a stubbed pynvml (#14).

What the simulated library cannot show: several samples of one process in one window (it
answers the newest second only), a MIG device whose name carries no profile (Slurm then
builds it from nvmlDeviceGetAttributes), and a process appearing between pynvml's two calls.
tests/sim/test_nvml_source_mig.py covers the rest against the library itself.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from slurm_gpu.gpu import ProcessUtil
from slurm_gpu.gpu.nvml import NvmlSource
from slurm_gpu.models import GpuDevice

T0 = 1_800_000_000
GPU = GpuDevice("GPU-s", "NVIDIA A100-SXM4-80GB", 0, 0, "00:17", 80 * 2**30)
NEW = "nvmlDeviceGetProcessesUtilizationInfo"


def sample(second: float, pid: int, sm: int, mem: int = 0) -> SimpleNamespace:
    """One per-process sample, its timestamp in microseconds as NVML gives it."""
    return SimpleNamespace(timeStamp=int(second * 1e6), pid=pid, smUtil=sm, memUtil=mem)


@pytest.fixture
def source(monkeypatch: pytest.MonkeyPatch) -> NvmlSource:
    """An NvmlSource whose pynvml init and handle lookups do nothing."""
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", lambda uuid: object())
    return NvmlSource(clock=lambda: T0 + 10.0)


def test_each_process_is_averaged_over_its_samples_in_the_window(
    source: NvmlSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Samples at or before `since` are dropped; the rest averaged per pid, sorted by pid."""
    asked: list[int] = []

    def new(handle: Any, last_seen_us: int) -> list[SimpleNamespace]:
        asked.append(last_seen_us)
        return [
            sample(T0 + 2, 9, 99),  # == since: already seen
            sample(T0 + 3, 9, 20, 10),
            sample(T0 + 3, 4, 70, 30),
            sample(T0 + 4, 9, 40, 20),
            sample(T0 + 5, 9, 90, 30),
        ]

    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessesUtilizationInfo", new)

    read = source.process_utilization(GPU, T0 + 2.0)

    assert (read.processes, read.last_seen, read.call, read.error, asked) == (
        (ProcessUtil(4, 70.0, 30.0, 1), ProcessUtil(9, 50.0, 20.0, 3)),
        T0 + 5.0,
        NEW,
        None,
        [(T0 + 2) * 1_000_000],
    )


def test_a_process_appearing_between_the_two_calls_is_read_again(
    source: NvmlSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pynvml's second call answers INSUFFICIENT_SIZE once: asked once more, not an error."""
    answers: list[Any] = [
        pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE),
        [sample(T0 + 9, 5, 60)],
    ]

    def new(handle: Any, last_seen_us: int) -> list[SimpleNamespace]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return list(answer)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessesUtilizationInfo", new)

    read = source.process_utilization(GPU, T0)

    assert (read.processes, read.error) == ((ProcessUtil(5, 60.0, 0.0, 1),), None)


def test_the_old_call_only_after_the_new_one_is_not_found(
    source: NvmlSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FUNCTION_NOT_FOUND once: the old call from then on, the new one not asked again."""
    calls: list[str] = []

    def new(handle: Any, last_seen_us: int) -> list[SimpleNamespace]:
        calls.append("new")
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def old(handle: Any, last_seen_us: int) -> list[SimpleNamespace]:
        calls.append("old")
        return [sample(T0 + 9, 5, 35, 10)]

    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessesUtilizationInfo", new)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", old)

    reads = [source.process_utilization(GPU, T0), source.process_utilization(GPU, T0)]

    assert [(r.call, r.processes) for r in reads] == [
        ("nvmlDeviceGetProcessUtilization", (ProcessUtil(5, 35.0, 10.0, 1),))
    ] * 2
    assert calls == ["new", "old", "old"]


def test_a_failure_other_than_not_found_is_an_error(
    source: NvmlSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOT_SUPPORTED (MIG mode) is an error; NOT_FOUND is none sampled."""
    codes = [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NOT_FOUND]

    def new(handle: Any, last_seen_us: int) -> list[SimpleNamespace]:
        raise pynvml.NVMLError(codes.pop(0))

    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessesUtilizationInfo", new)

    reads = [source.process_utilization(GPU, T0 + 1.5) for _ in range(2)]

    assert [(r.error, r.processes, r.last_seen, r.call) for r in reads] == [
        ("Not Supported", (), T0 + 1.5, NEW),
        (None, (), T0 + 1.5, NEW),
    ]


@pytest.mark.parametrize(
    ("name", "attributes", "expected"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None, ("1g.10gb", 1)),
        ("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb", None, ("1c.3g.40gb", 1)),
        ("NVIDIA A100-SXM4-40GB", (3, 3, 20096), ("3g.20gb", 3)),  # 20096 MB -> 20 GB up
        ("NVIDIA A100-SXM4-40GB", (3, 1, 20224), ("1c.3g.20gb", 1)),
        ("NVIDIA H100 80GB HBM3 MIG", (2, 2, 20480), ("2g.20gb", 2)),
    ],
)
def test_mig_profile_from_its_name_or_else_its_attributes(
    source: NvmlSource,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    attributes: tuple[int, int, int] | None,
    expected: tuple[str, int],
) -> None:
    """As Slurm's _handle_mig: the name's profile, else "[Cc.]Gg.<GB rounded up>gb"."""

    def get_attributes(handle: Any) -> SimpleNamespace:
        if attributes is None:
            raise AssertionError("the name has the profile: no attributes asked")
        gi, ci, mb = attributes
        return SimpleNamespace(
            gpuInstanceSliceCount=gi, computeInstanceSliceCount=ci, memorySizeMB=mb
        )

    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda handle: name)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetAttributes", get_attributes)

    assert source._mig_profile("MIG-x", object()) == expected


def test_a_mig_device_without_name_profile_or_attributes_is_refused(
    source: NvmlSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither says: ValueError, and devices() skips that MIG device as Slurm does."""

    def no_attributes(handle: Any) -> SimpleNamespace:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda handle: "NVIDIA A100-SXM4-40GB")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetAttributes", no_attributes)

    with pytest.raises(ValueError, match="no profile in its name 'NVIDIA A100-SXM4-40GB'"):
        source._mig_profile("MIG-x", object())
