"""FakeGpuSource's MIG devices and per-process utilization answer as NvmlSource does (#14)."""

from __future__ import annotations

from collections.abc import Callable

from slurm_gpu.gpu import GpmMetrics, MigSnapshot, ProcessUtil, ProcessUtilization
from slurm_gpu.models import GpuDevice, GpuProcess, MigDevice
from slurm_gpu.testing import FakeGpuSource, FixedClock

T0 = 1_800_000_000.0
GIB = 2**30
H100 = GpuDevice("GPU-h", "NVIDIA H100 80GB HBM3", 0, 0, "00:17", 80 * GIB)
WHOLE = GpuDevice("GPU-w", "NVIDIA H100 80GB HBM3", 1, 1, "00:31", 80 * GIB)
FOUR = MigDevice("MIG-4", "GPU-h", 0, 1, 0, "4g.40gb", 4, 7, 40 * GIB)
THREE = MigDevice("MIG-3", "GPU-h", 1, 2, 0, "3g.40gb", 3, 7, 40 * GIB)
NEW = "nvmlDeviceGetProcessesUtilizationInfo"


def mig_source(
    clock: FixedClock,
    process_util: dict[str, dict[int, Callable[[float], float | None]]] | None = None,
) -> FakeGpuSource:
    """GPU-h in MIG mode (4g + 3g), GPU-w whole; the 3g slice with GPM at 60% SM active."""
    return FakeGpuSource(
        [H100, WHOLE],
        clock,
        util={"GPU-h": lambda t: 50.0, "GPU-w": lambda t: 40.0},
        mig={"GPU-h": [FOUR, THREE]},
        gpm={"MIG-3": lambda t: {"sm_active_percent": 60.0, "graphics_active_percent": 80.0}},
        process_util=process_util,
    )


def test_devices_list_the_mig_layout_of_a_gpu_in_mig_mode() -> None:
    """GPU-h: MIG mode with its two devices; GPU-w as given."""
    devices = mig_source(FixedClock(T0)).devices()

    assert [(d.uuid, d.mig_enabled, d.mig_devices, d.gpm_supported) for d in devices] == [
        ("GPU-h", True, (FOUR, THREE), False),
        ("GPU-w", False, (), False),
    ]


def test_a_mig_mode_gpu_has_no_utilization_samples_and_all_slices_processes() -> None:
    """In MIG mode NVML has no utilization: samples empty (unknown); processes of every slice."""
    clock = FixedClock(T0)
    source = mig_source(clock)
    source.processes = {"MIG-3": (GpuProcess(31, GIB),), "MIG-4": (GpuProcess(41, 2 * GIB),)}
    parent, whole = source.devices()
    clock.advance(5)

    snaps = [source.snapshot(parent, T0), source.snapshot(whole, T0)]

    assert [(s.samples, s.processes) for s in snaps] == [
        ((), (GpuProcess(41, 2 * GIB), GpuProcess(31, GIB))),
        (tuple((T0 + k, 40.0) for k in range(1, 6)), ()),
    ]


def test_mig_snapshot_reads_memory_processes_and_gpm_from_the_second_read() -> None:
    """The 3g slice: 1 GiB in use by its process, GPM window from the previous read on."""
    clock = FixedClock(T0)
    source = mig_source(clock)
    source.processes = {"MIG-3": (GpuProcess(31, GIB),)}
    parent = source.devices()[0]

    reads = [source.mig_snapshot(parent, THREE)]
    clock.advance(10)
    reads.append(source.mig_snapshot(parent, THREE))
    reads.append(source.mig_snapshot(parent, FOUR))

    assert reads == [
        MigSnapshot("MIG-3", T0, GIB, 40 * GIB, (GpuProcess(31, GIB),), None),
        MigSnapshot(
            "MIG-3",
            T0 + 10,
            GIB,
            40 * GIB,
            (GpuProcess(31, GIB),),
            GpmMetrics(T0, T0 + 10, sm_active_percent=60.0, graphics_active_percent=80.0),
        ),
        MigSnapshot("MIG-4", T0 + 10, 0, 40 * GIB, (), None),  # not in gpm: memory only
    ]
    assert (source.mig_reads, source.gpm_samples) == (["MIG-3", "MIG-3", "MIG-4"], {"MIG-3": 2})


def test_mig_gpm_is_the_time_weighted_mean_of_its_function() -> None:
    """A slice at 20% for 4 s then 90% for 6 s: 62% over the 10 s window."""
    clock = FixedClock(T0)
    source = FakeGpuSource(
        [H100],
        clock,
        mig={"GPU-h": [THREE]},
        gpm={"MIG-3": lambda t: {"sm_active_percent": 20.0 if t <= T0 + 4 else 90.0}},
    )
    parent = source.devices()[0]
    source.mig_snapshot(parent, THREE)
    clock.advance(10)

    gpm = source.mig_snapshot(parent, THREE).gpm

    assert gpm is not None and gpm.sm_active_percent == 62.0


def test_a_lost_gpus_slices_are_lost_and_start_their_gpm_again() -> None:
    """Parent lost: each slice read is an error; back, its first read has no window."""
    clock = FixedClock(T0)
    source = mig_source(clock)
    parent = source.devices()[0]
    source.mig_snapshot(parent, THREE)
    source.lost.add("GPU-h")
    clock.advance(5)
    lost = source.mig_snapshot(parent, THREE)
    source.lost.clear()
    clock.advance(5)
    back = source.mig_snapshot(parent, THREE)

    assert (lost, back.gpm, back.error) == (
        MigSnapshot("MIG-3", T0 + 5, error="GPU is lost"),
        None,
        None,
    )


def test_a_mig_device_no_longer_in_the_layout_is_not_found() -> None:
    """A MIG device of a layout since changed: an error, never a reading."""
    source = mig_source(FixedClock(T0))
    parent = source.devices()[0]
    source.mig["GPU-h"] = (FOUR,)

    assert source.mig_snapshot(parent, THREE).error == "Not Found"


def test_unsupported_mig_fields_are_none() -> None:
    """`unsupported` applies to MIG reads as to GPU reads."""
    source = mig_source(FixedClock(T0))
    source.unsupported = {"mem_used_bytes", "processes"}
    parent = source.devices()[0]

    read = source.mig_snapshot(parent, FOUR)

    assert (read.mem_used_bytes, read.mem_total_bytes, read.processes) == (None, 40 * GIB, None)


def test_process_utilization_means_each_process_over_the_window() -> None:
    """Two shard jobs' processes: 30% steady, and one that starts at T0+3 at 80%."""
    clock = FixedClock(T0 + 6)
    source = FakeGpuSource(
        [WHOLE],
        clock,
        process_util={"GPU-w": {200: lambda t: 30.0, 100: lambda t: 80.0 if t >= T0 + 3 else None}},
    )

    read = source.process_utilization(WHOLE, T0)

    assert read == ProcessUtilization(
        "GPU-w",
        T0 + 6,
        (ProcessUtil(100, 80.0, None, 4), ProcessUtil(200, 30.0, None, 6)),
        last_seen=T0 + 6,
        call=NEW,
    )
    assert source.process_reads == [("GPU-w", T0)]


def test_process_utilization_since_the_last_read_has_only_newer_samples() -> None:
    """Passing back last_seen: the next read has only the seconds after it."""
    clock = FixedClock(T0 + 3)
    source = FakeGpuSource([WHOLE], clock, process_util={"GPU-w": {7: lambda t: 10.0 * (t - T0)}})
    first = source.process_utilization(WHOLE, T0)
    clock.advance(2)

    second = source.process_utilization(WHOLE, first.last_seen)

    assert (first.processes, second.processes, second.last_seen) == (
        (ProcessUtil(7, 20.0, None, 3),),  # 10, 20, 30
        (ProcessUtil(7, 45.0, None, 2),),  # 40, 50
        T0 + 5,
    )


def test_no_process_sampled_is_an_empty_read_not_an_error() -> None:
    """A GPU without processes, or nothing after `since`: none sampled, last_seen kept."""
    clock = FixedClock(T0 + 2)
    source = FakeGpuSource([WHOLE], clock, process_util={"GPU-w": {7: lambda t: None}})

    assert source.process_utilization(WHOLE, T0) == ProcessUtilization(
        "GPU-w", T0 + 2, (), last_seen=T0, call=NEW
    )


def test_process_utilization_fails_in_mig_mode_lost_or_unsupported() -> None:
    """NOT_SUPPORTED in MIG mode, a lost GPU, "process_utilization" unsupported: errors."""
    clock = FixedClock(T0 + 2)
    source = mig_source(clock, {"GPU-h": {7: lambda t: 50.0}})
    parent, whole = source.devices()
    in_mig = source.process_utilization(parent, T0)
    source.lost.add("GPU-w")
    lost = source.process_utilization(whole, T0)
    source.lost.clear()
    source.unsupported.add("process_utilization")
    unsupported = source.process_utilization(whole, T0)

    assert [(r.error, r.processes, r.last_seen) for r in (in_mig, lost, unsupported)] == [
        ("Not Supported", (), T0),
        ("GPU is lost", (), T0),
        ("Not Supported", (), T0),
    ]


def test_the_call_named_can_be_the_old_one() -> None:
    """A driver before R550: the fake says the old call answered."""
    source = FakeGpuSource([WHOLE], FixedClock(T0 + 1))
    source.process_util_call = "nvmlDeviceGetProcessUtilization"

    assert source.process_utilization(WHOLE, T0).call == "nvmlDeviceGetProcessUtilization"


def test_whole_gpu_behaviour_is_unchanged_without_mig() -> None:
    """No `mig`: samples once a second and GPM exactly as before."""
    clock = FixedClock(T0)
    source = FakeGpuSource(
        [WHOLE],
        clock,
        util={"GPU-w": lambda t: 25.0},
        gpm={"GPU-w": lambda t: {"sm_active_percent": 5.0}},
    )
    device = source.devices()[0]
    source.snapshot(device, T0)
    clock.advance(2)

    snap = source.snapshot(device, T0)

    assert (device.gpm_supported, device.mig_enabled, snap.samples, snap.gpm) == (
        True,
        False,
        ((T0 + 1, 25.0), (T0 + 2, 25.0)),
        GpmMetrics(T0, T0 + 2, sm_active_percent=5.0),
    )
