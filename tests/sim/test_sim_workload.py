"""gpu-load drives the simulated GPUs over time; pynvml reads it back."""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sim.conftest import ORDER, Node, make_node, uuid_of, wait_exit

MIB = 1 << 20
IDLE_MW, MAX_MW = 60000, 400000
# Device files whose minors are 3, 2, 0, 1: Slurm index i -> line i -> minor.
GRES_FILES = ["/dev/null", "/dev/ptmx", "/dev/tty", "/dev/console"]


def gres_files_available() -> bool:
    """Whether GRES_FILES exist here with the minors 3, 2, 0, 1 the tests rely on."""
    try:
        minors = [os.minor(os.stat(f).st_rdev) for f in GRES_FILES]
        return minors == [3, 2, 0, 1]
    except OSError:
        return False


def readings(node: Node) -> dict[int, tuple[int, list[list[int]], int]]:
    """minor -> (utilization %, [[pid, bytes]], memory used) for every GPU."""
    return {m: (d["util"], d["procs"], d["mem_used"]) for m, d in node.by_minor().items()}


IDLE: tuple[int, list[list[int]], int] = (0, [], 0)


@pytest.fixture(scope="module")
def steady(tmp_path_factory: pytest.TempPathFactory, libdir: Path) -> Iterator[dict[str, Any]]:
    """gpu-load --util 70 --mem 2048 on Slurm GPUs 0,1 (slurm-gres-files: minors 3,2)."""
    if not gres_files_available():
        pytest.skip("needs /dev/null, /dev/ptmx, /dev/tty, /dev/console with minors 3,2,0,1")
    node = make_node(tmp_path_factory.mktemp("steady"), libdir)
    (node.dir / "slurm-gres-files").write_text("\n".join(GRES_FILES) + "\n")
    proc = node.start_load("0,1", "--util", "70", "--mem", "2048", "--seconds", "60")
    time.sleep(1.2)  # a full second of load behind the utilization reading
    yield {"pid": proc.pid, "readings": readings(node), "node": node}
    node.stop_all()


def test_load_shows_on_exactly_its_gpus(steady: dict[str, Any]) -> None:
    """70% utilization, the pid and its memory appear on minors 3 and 2 only."""
    busy = (70, [[steady["pid"], 2048 * MIB]], 2048 * MIB)
    expected = {2: busy, 0: IDLE, 3: busy, 1: IDLE}
    assert expected == steady["readings"]


def test_load_raises_power_and_temperature(steady: dict[str, Any]) -> None:
    """At 70%: power = idle + 0.7 * (max - idle), temperature = 30 + 0.4 * 70."""
    device = steady["node"].by_minor()[3]
    expected = (IDLE_MW + 0.7 * (MAX_MW - IDLE_MW), 58)
    assert expected == (device["power"], device["temperature"])


def test_normal_exit_releases_gpus(node: Node) -> None:
    """After gpu-load finishes its --seconds, its GPUs read 0% with no processes."""
    proc = node.start_load("1,2", "--util", "70", "--seconds", "1")
    expected = 0
    assert expected == wait_exit(proc)
    assert {m: IDLE for m in ORDER} == readings(node)


def test_sigterm_releases_gpus(node: Node) -> None:
    """After SIGTERM, gpu-load writes its end; its GPUs read 0% with no processes."""
    proc = node.start_load("1,2", "--util", "70", "--seconds", "60")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    expected = 128 + signal.SIGTERM
    assert expected == wait_exit(proc)
    assert {m: IDLE for m in ORDER} == readings(node)


def test_sigkill_releases_gpus(node: Node) -> None:
    """After SIGKILL (no chance to clean up), the dead pid's GPUs read 0% with no processes."""
    proc = node.start_load("1,2", "--util", "70", "--seconds", "60")
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    expected = -signal.SIGKILL
    assert expected == wait_exit(proc)
    assert {m: IDLE for m in ORDER} == readings(node)


def test_index_is_minor_without_gres_files(node: Node) -> None:
    """Without slurm-gres-files, Slurm GPU index i drives the GPU with minor i."""
    proc = node.start_load("1", "--util", "40", "--seconds", "30")
    time.sleep(1.1)
    busy = (40, [[proc.pid, 1024 * MIB]], 1024 * MIB)
    expected = {2: IDLE, 0: IDLE, 3: IDLE, 1: busy}
    assert expected == readings(node)


@pytest.mark.parametrize(
    "step_env",
    [{"CUDA_VISIBLE_DEVICES": "2", "SLURM_STEP_GPUS": "2"}, {"SLURM_STEP_GPUS": "2"}],
    ids=["cuda-visible-devices", "step-gpus"],
)
def test_a_het_step_drives_its_own_gpu_not_the_leaders(
    node: Node, step_env: dict[str, str]
) -> None:
    """A het job step's task: SLURM_JOB_GPUS is the leader's (0), the task's own is 2.

    gpu-load drives what a CUDA program would see: CUDA_VISIBLE_DEVICES, else the step's
    SLURM_STEP_GPUS, never the leader's GPU.
    """
    proc = node.start_load("0", "--util", "40", "--seconds", "30", step_env=step_env)
    time.sleep(1.1)
    busy = (40, [[proc.pid, 1024 * MIB]], 1024 * MIB)
    assert {2: busy, 0: IDLE, 3: IDLE, 1: IDLE} == readings(node)


# ---- a sampler over a spiky load: 80% for 2 s, 0% for 2 s ----------------------------
PERIOD, DUTY, UTIL, WINDOW = 4.0, 0.5, 80.0, 12


def spiky_util(start: float, t: float) -> float:
    """The workload's definition, evaluated independently of the library."""
    return UTIL if t >= start and (t - start) % PERIOD < DUTY * PERIOD else 0.0


@pytest.fixture(scope="module")
def spiky(tmp_path_factory: pytest.TempPathFactory, libdir: Path) -> Iterator[dict[str, Any]]:
    """Runs the probe's sampler for 12 s (3 periods) over a spiky load on minor 0."""
    node = make_node(tmp_path_factory.mktemp("spiky"), libdir)
    node.start_load(
        "0", "--pattern", "spiky", "--util", "80", "--period", "4", "--duty", "0.5",
        "--seconds", "40",
    )  # fmt: skip
    time.sleep(1.5)  # the sampler's first read must come after a whole second of load
    (result,) = node.nvml([{"op": "sampler", "index": ORDER.index(0), "seconds": WINDOW + 0.3}])
    plans = list((node.dir / "gpus" / uuid_of(node, 0) / "plans").glob("*.plan"))
    plan = dict(line.split("=", 1) for line in plans[0].read_text().splitlines())
    result["start"] = float(plan["start"])
    yield result
    node.stop_all()


def test_samples_average_to_true_mean(spiky: dict[str, Any]) -> None:
    """Samples newer than the last seen, over 3 whole periods, average 40% within 2 points."""
    window = spiky["samples"][:WINDOW]
    mean = sum(v for _, v in window) / len(window)
    expected = (WINDOW, True)
    assert expected == (len(window), abs(mean - 40.0) <= 2.0)


def test_samples_are_whole_seconds_after_last_seen(spiky: dict[str, Any]) -> None:
    """Sample timestamps are consecutive whole seconds (us), all after lastSeenTimeStamp."""
    stamps = [t for t, _ in spiky["samples"]]
    expected_stamps = [spiky["last_seen"] + (i + 1) * 1_000_000 for i in range(len(stamps))]
    expected = (1, expected_stamps)
    assert expected == (spiky["value_type"], stamps)


def test_each_sample_is_mean_of_its_second(spiky: dict[str, Any]) -> None:
    """Each sample is the mean utilization over the second before its timestamp (+-1)."""
    start, steps = spiky["start"], 1000
    expected = []
    for t_us, _ in spiky["samples"]:
        t = t_us / 1e6
        mean = sum(spiky_util(start, t - 1 + (k + 0.5) / steps) for k in range(steps)) / steps
        expected.append(round(mean))
    diffs = [abs(e - v) for e, (_, v) in zip(expected, spiky["samples"], strict=True)]
    assert [d <= 1 for d in diffs] == [True] * len(diffs)


def test_energy_is_integral_of_power(spiky: dict[str, Any]) -> None:
    """Energy between two reads equals the integral of idle + (max-idle)*util over that time."""
    t0, t1, start = spiky["t0"], spiky["t1"], spiky["start"]
    steps = 20000
    dt = (t1 - t0) / steps
    util_integral = sum(spiky_util(start, t0 + (k + 0.5) * dt) for k in range(steps)) * dt
    expected_mj = IDLE_MW * (t1 - t0) + (MAX_MW - IDLE_MW) * util_integral / 100
    actual_mj = spiky["e1"] - spiky["e0"]
    assert math.isclose(expected_mj, actual_mj, rel_tol=0.01), (expected_mj, actual_mj)


def test_overlapping_loads_clamp_at_100(node: Node) -> None:
    """Two 70% loads on one GPU read 100% utilization and maximum power, not 140%."""
    node.start_load("0", "--util", "70", "--seconds", "30")
    node.start_load("0", "--util", "70", "--seconds", "30")
    time.sleep(1.1)
    device = node.by_minor()[0]
    expected = (100, MAX_MW)
    assert expected == (device["util"], device["power"])


def write_ended_plans(node: Node, minor: int, created: float, count: int) -> None:
    """`count` finished 10 s loads at 50%, long ago, as gpu-load would have left them."""
    plans = node.dir / "gpus" / uuid_of(node, minor) / "plans"
    for i in range(count):
        start = created + 15 * i
        (plans / f"{100000 + i}-{int(start * 1e6)}.plan").write_text(
            f"pid={100000 + i}\nstart={start}\npattern=steady\nutil=50\nmem_mib=10\n"
            f"seconds=10\nperiod=60\nduty=0.5\nend={start + 10}\n"
        )


def busy_energy_mj(node: Node, minor: int, created: float) -> float:
    """Energy above idle: total energy minus idle power times age."""
    ((t, energy),) = node.nvml([{"op": "timed_energy", "index": ORDER.index(minor)}])
    busy: float = energy - IDLE_MW * (t - created)
    return busy


def test_old_history_is_compacted_without_changing_energy(tmp_path: Path, libdir: Path) -> None:
    """40 long-finished plans fold into <gpu>/base: files go, their energy stays."""
    created = time.time() - 1000
    node = make_node(tmp_path, libdir, created=created)
    info = node.dir / "gpus" / uuid_of(node, 0) / "info"
    write_ended_plans(node, 0, created, 40)
    expected_mj = (MAX_MW - IDLE_MW) * 40 * 10 * 50 / 100
    first = busy_energy_mj(node, 0, created)  # this read compacts
    plans_left = len(list((info.parent / "plans").glob("*.plan")))
    second = busy_energy_mj(node, 0, created)  # this one reads <gpu>/base
    expected = (0, True, True)
    assert expected == (
        plans_left,
        math.isclose(expected_mj, first, abs_tol=5000),
        math.isclose(expected_mj, second, abs_tol=5000),
    )
