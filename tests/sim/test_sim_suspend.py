"""A suspended job's simulated GPUs go quiet (scontrol suspend: SIGSTOP; resume: SIGCONT).

While gpu-load is stopped its GPUs show no utilization, GPM activity, per-process
utilization or busy power, but keep its memory and list the process; on SIGCONT gpu-load
records the pause in its plans (`pauses=`) and runs its --seconds of unpaused time, so its
end moves later by the pause and no work is lost. Hand-written plans pin the closed form.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sim.conftest import Node, uuid_of
from tests.sim.test_sim_gpm import GR, SM, make_h100_node, write_plan

MIB = 1 << 20
IDLE_MW, MAX_MW = 60000, 400000


@pytest.fixture
def h100(tmp_path: Path, libdir: Path) -> Iterator[Node]:
    """4 simulated H100s (GPM), 60 W idle, 400 W at full load, index == minor."""
    n = make_h100_node(tmp_path / "sim", libdir, "--power-idle-w", "60", "--power-max-w", "400")
    yield n
    n.stop_all()


def proc_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (the command may hold spaces and ')')."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2]


def wait_for(check: Any, timeout: float = 2.0) -> None:
    """Polls check() until it is true; fails after `timeout` seconds."""
    give_up = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.02)


def kv(path: Path) -> dict[str, str]:
    """The key=value lines of a plan or info file."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


def plan_of(node: Node, minor: int) -> tuple[Path, dict[str, str]]:
    """The one plan on that GPU: its path and contents."""
    (path,) = (node.dir / "gpus" / uuid_of(node, minor) / "plans").glob("*.plan")
    return path, kv(path)


def created_of(node: Node, minor: int) -> float:
    """When that GPU was created (energy counts from here)."""
    return float(kv(node.dir / "gpus" / uuid_of(node, minor) / "info")["created"])


def test_a_stopped_load_goes_quiet_keeps_memory_and_resumes_later(h100: Node) -> None:
    """A stopped gpu-load's GPU is quiet but keeps its memory; resumed, it finishes later.

    SIGSTOP: 0 utilization, GPM and process utilization, idle power, memory and process kept.
    SIGCONT: busy again, `pauses` recorded, the end later by the pause, all --seconds done.
    """
    proc = h100.start_load("0", "--util", "80", "--mem", "2048", "--seconds", "2")
    path, plan = plan_of(h100, 0)
    start = float(plan["start"])
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(proc.pid) in "Tt")
    stopped = h100.nvml(
        [
            {"op": "gpm_sample", "index": 0, "name": "a"},
            {"op": "timed_energy", "index": 0},
            {"op": "sleep", "seconds": 1.2},
            # a whole second after the start, so the process has a per-process sample
            {"op": "sleep_until", "t": start + 2.1},
            {"op": "gpm_sample", "index": 0, "name": "b"},
            {"op": "timed_energy", "index": 0},
            {"op": "gpm_metrics", "s1": "a", "s2": "b", "ids": [GR, SM]},
            {"op": "call", "fn": "nvmlDeviceGetProcessUtilization", "index": 0, "args": [0]},
            {"op": "devices"},
        ]
    )
    _, (t1, e1), _, _, _, (t2, e2), metrics, proc_util, devices = stopped
    os.kill(proc.pid, signal.SIGCONT)
    wait_for(lambda: "pauses=" in path.read_text())
    resumed = h100.nvml(
        [
            {"op": "gpm_sample", "index": 0, "name": "c"},
            {"op": "sleep", "seconds": 0.3},
            {"op": "gpm_sample", "index": 0, "name": "d"},
            {"op": "gpm_metrics", "s1": "c", "s2": "d", "ids": [GR, SM]},
            {"op": "devices"},
        ]
    )
    rc = proc.wait(timeout=10)
    _, plan = plan_of(h100, 0)
    ((lo, hi),) = [tuple(map(float, p.split(":"))) for p in plan["pauses"].split(",")]
    end = float(plan["end"])
    (t_now, energy) = h100.nvml([{"op": "timed_energy", "index": 0}])[0]
    busy_mj = energy - IDLE_MW * (t_now - created_of(h100, 0))
    gpu, after = devices[0], resumed[4][0]
    expected = {
        "stopped": {
            "gpm": {str(GR): 0.0, str(SM): 0.0},
            "energy is idle": True,
            "proc util": [(proc.pid, 0)],
            "util, power, memory, processes": (0, IDLE_MW, 2048 * MIB, [[proc.pid, 2048 * MIB]]),
        },
        "resumed": {
            "gpm": {str(GR): 80.0, str(SM): 80.0},
            "power, processes": (IDLE_MW + (MAX_MW - IDLE_MW) * 8 // 10, [[proc.pid, 2048 * MIB]]),
        },
        "exit": 0,
        "pause from the last heartbeat (the plan's write) over the stop": (True, True),
        "end = start + 2 s + the pause": True,
        "all 2 s at 80% done": True,
    }
    assert expected == {
        "stopped": {
            "gpm": {k: round(v, 3) for k, v in metrics.items()},
            "energy is idle": math.isclose(e2 - e1, IDLE_MW * (t2 - t1), abs_tol=20),
            "proc util": [(s["pid"], s["smUtil"]) for s in proc_util],
            "util, power, memory, processes": (
                gpu["util"],
                gpu["power"],
                gpu["mem_used"],
                gpu["procs"],
            ),
        },
        "resumed": {
            "gpm": {k: round(v, 3) for k, v in resumed[3].items()},
            "power, processes": (after["power"], after["procs"]),
        },
        "exit": rc,
        "pause from the last heartbeat (the plan's write) over the stop": (
            abs(lo - start) < 0.2,
            lo < t1 and hi > t2,
        ),
        "end = start + 2 s + the pause": abs(end - (start + 2 + (hi - lo))) < 0.2,
        "all 2 s at 80% done": math.isclose(busy_mj, (MAX_MW - IDLE_MW) * 0.8 * 2, rel_tol=0.01),
    }


def test_a_sigcont_without_a_stop_records_no_pause(h100: Node) -> None:
    """Slurm sends SIGCONT before SIGTERM when it cancels a running job: no pause from it."""
    proc = h100.start_load("0", "--util", "80", "--seconds", "1")
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGCONT)
    rc = proc.wait(timeout=10)
    _, plan = plan_of(h100, 0)
    expected = (0, None, True)
    assert expected == (
        rc,
        plan.get("pauses"),
        abs(float(plan["end"]) - float(plan["start"]) - 1) < 0.2,
    )


def test_cancelling_a_suspended_load_keeps_its_pause(h100: Node) -> None:
    """scancel of a suspended job: SIGCONT then SIGTERM; the pause and the end are written."""
    proc = h100.start_load("0", "--util", "80", "--seconds", "0")
    os.kill(proc.pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(proc.pid) in "Tt")
    time.sleep(0.8)
    os.kill(proc.pid, signal.SIGCONT)
    os.kill(proc.pid, signal.SIGTERM)
    rc = proc.wait(timeout=10)
    _, plan = plan_of(h100, 0)
    ((lo, hi),) = [tuple(map(float, p.split(":"))) for p in plan["pauses"].split(",")]
    expected = (128 + signal.SIGTERM, True, True)
    assert expected == (rc, hi - lo >= 0.8, hi <= float(plan["end"]))


def samples(node: Node, minor: int, base: int, seconds: int) -> list[int]:
    """The utilization samples of seconds base+1 .. base+seconds (each the mean of (T-1, T])."""
    ((_, got),) = node.nvml(
        [{"op": "call", "fn": "nvmlDeviceGetSamples", "index": minor, "args": [1, 0]}]
    )
    by_second = {ts // 1_000_000: value for ts, value in got}
    return [by_second[base + k] for k in range(1, seconds + 1)]


def test_pauses_in_plans_are_quiet_and_the_shape_resumes(h100: Node) -> None:
    """Recorded pauses, integrated in closed form: steady, --seconds, ramp, spiky, clipping."""
    base = int(time.time()) - 30

    def pauses(*spans: tuple[float, float]) -> str:
        return ",".join(f"{base + lo}:{base + hi}" for lo, hi in spans)

    write_plan(h100, 0, "a", start=base, util=60, end=base + 12, pauses=pauses((3, 6), (8.5, 9.5)))
    # --seconds 5 is active time: the 2 s pause moves its end from base+5 to base+7
    write_plan(h100, 1, "a", start=base, util=50, seconds=5, end=base + 20, pauses=pauses((2, 4)))
    write_plan(h100, 1, "b", start=base, util=70, end=base + 3)  # 50 + 70 clips at 100
    # a ramp 0 -> 80 over 4 active seconds resumes at 40 after its pause
    write_plan(
        h100, 2, "a", start=base, util=80, seconds=4, end=base + 20, pattern="ramp",
        pauses=pauses((2, 5)),
    )  # fmt: skip
    # spikes of 2 s every 4 active seconds: the pause shifts the train by 2 s
    write_plan(
        h100, 3, "a", start=base, util=100, period=4, duty=0.5, end=base + 14, pattern="spiky",
        pauses=pauses((1, 3)),
    )  # fmt: skip
    expected = {
        0: [60, 60, 60, 0, 0, 0, 60, 60, 30, 30, 60, 60, 0, 0, 0, 0],
        1: [100, 100, 70, 0, 50, 50, 50, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        2: [10, 30, 0, 0, 0, 50, 70, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        3: [100, 0, 0, 100, 0, 0, 100, 100, 0, 0, 100, 100, 0, 0, 0, 0],
    }
    assert expected == {minor: samples(h100, minor, base, 16) for minor in range(4)}
