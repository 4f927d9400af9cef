"""NvmlSource's point readings when a GPU does not answer one of them (pynvml stubbed).

A GPU that answers every field is read in one go; the first field it does not answer
(NVML_ERROR_NOT_SUPPORTED, as ECC on a GPU without it) makes that field None and the GPU
read field by field from then on, every other field still read; a lost GPU is an error.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from slurm_gpu.gpu.nvml import NvmlSource


class FakeNvml:
    """The pynvml calls NvmlSource makes with gpm=False, over one GPU; counts the calls."""

    def __init__(self) -> None:
        self.fail: dict[str, int] = {}  # call name -> NVML error code it answers
        self.calls: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        answers: dict[str, Any] = {
            "nvmlInit": None,
            "nvmlShutdown": None,
            "nvmlDeviceGetCount": 1,
            "nvmlDeviceGetHandleByIndex": "handle",
            "nvmlDeviceGetUUID": "GPU-1",
            "nvmlDeviceGetName": "Fake",
            "nvmlDeviceGetMinorNumber": 0,
            "nvmlDeviceGetPciInfo": SimpleNamespace(busId="00:01"),
            "nvmlDeviceGetMemoryInfo": SimpleNamespace(used=2**30, total=2**34),
            "nvmlDeviceGetPowerUsage": 150_000,
            "nvmlDeviceGetTotalEnergyConsumption": 9_000_000,
            "nvmlDeviceGetTemperature": 41,
            "nvmlDeviceGetTotalEccErrors": 3,
            "nvmlDeviceGetComputeRunningProcesses": [],
        }
        for name, answer in answers.items():
            monkeypatch.setattr(pynvml, name, self._call(name, answer))

        def no_samples(*_: Any) -> Any:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

        monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", no_samples)

    def _call(self, name: str, answer: Any) -> Any:
        def call(*_: Any) -> Any:
            self.calls.append(name)
            if name in self.fail:
                raise pynvml.NVMLError(self.fail[name])
            return answer

        return call


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    fake.install(monkeypatch)
    return fake


def readings_of(snap: Any) -> tuple[Any, ...]:
    return (
        snap.error,
        snap.mem_used_bytes,
        snap.power_watts,
        snap.energy_joules,
        snap.temperature_celsius,
        snap.ecc_errors_total,
        snap.processes,
    )


def test_a_gpu_answering_every_field_reads_each_once(nvml: FakeNvml) -> None:
    source = NvmlSource(clock=lambda: 100.0, gpm=False)
    (device,) = source.devices()
    nvml.calls.clear()

    snap = source.snapshot(device, 0.0)

    assert (None, 2**30, 150.0, 9000.0, 41.0, 3, ()) == readings_of(snap)
    assert 6 == len(nvml.calls) == len(set(nvml.calls))


def test_a_field_not_supported_is_none_and_the_others_still_read(nvml: FakeNvml) -> None:
    nvml.fail["nvmlDeviceGetTotalEccErrors"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source = NvmlSource(clock=lambda: 100.0, gpm=False)
    (device,) = source.devices()

    first = readings_of(source.snapshot(device, 0.0))
    nvml.calls.clear()
    second = readings_of(source.snapshot(device, 0.0))

    assert [(None, 2**30, 150.0, 9000.0, 41.0, None, ())] * 2 == [first, second]
    assert 6 == len(nvml.calls) == len(set(nvml.calls))  # field by field: still one call each


def test_a_lost_gpu_is_an_error_not_a_blank_field(nvml: FakeNvml) -> None:
    nvml.fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_GPU_IS_LOST
    source = NvmlSource(clock=lambda: 100.0, gpm=False)
    (device,) = source.devices()

    snap = source.snapshot(device, 0.0)

    assert snap.error is not None and "lost" in snap.error.lower()
    assert snap.mem_used_bytes is None
