"""The test bed itself: a real Slurm with simulated GPUs that follow the jobs' workloads."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, cast

from slurm_gpu.config import load_config
from slurm_gpu.store import Store
from tests.integration.testbed import LAUNCHER, TestBed, wait_summaries

# All GPUs of a node as pynvml sees them: minor, utilization, memory, process pids.
READ_ALL_GPUS = """
result = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    result.append({
        "index": i,
        "minor": pynvml.nvmlDeviceGetMinorNumber(h),
        "uuid": pynvml.nvmlDeviceGetUUID(h),
        "util": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
        "mem_used_mib": pynvml.nvmlDeviceGetMemoryInfo(h).used // 2**20,
        "pids": [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)],
    })
"""


def read_node_gpus(testbed: TestBed, node: str) -> list[dict[str, Any]]:
    """Every GPU of `node`: one READ_ALL_GPUS dict each, in NVML order."""
    # testbed.nvml returns whatever JSON the snippet made; READ_ALL_GPUS makes this shape.
    return cast("list[dict[str, Any]]", testbed.nvml(node, READ_ALL_GPUS))


def read_gpus(testbed: TestBed) -> dict[str, list[dict[str, Any]]]:
    """Every GPU of both nodes, by node name."""
    return {node: read_node_gpus(testbed, node) for node in ("gpu1", "gpu2")}


def wait_for_load(testbed: TestBed, node: str, minors: set[int], timeout: float = 30) -> None:
    """Waits until gpu-load has registered a process on every GPU in `minors`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gpus = read_node_gpus(testbed, node)
        if all(g["pids"] for g in gpus if g["minor"] in minors):
            return
        time.sleep(0.5)
    raise AssertionError(f"gpu-load never registered on {node} GPUs {sorted(minors)}")


def job_id_of_pid(pid: int) -> int | None:
    """The SLURM_JOB_ID in a process's environment (root can read any /proc/PID/environ)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"SLURM_JOB_ID="):
            return int(item.split(b"=", 1)[1])
    return None


def test_two_nodes_with_four_gpus_each(testbed: TestBed) -> None:
    """sinfo lists gpu1 with 4 a100 and gpu2 with 4 h100, in partitions gpu and debug."""
    out = testbed.run("sinfo", "-h", "-N", "-o", "%N|%P|%G").stdout.split()
    assert sorted(set(out)) == [
        f"gpu1|debug|{testbed.gpu1_gres}",
        f"gpu1|gpu*|{testbed.gpu1_gres}",
        "gpu2|debug|gpu:h100:4",
        "gpu2|gpu*|gpu:h100:4",
    ]


def test_nvml_sees_four_gpus_per_node_with_enumeration_order_unlike_minors(
    testbed: TestBed,
) -> None:
    """gpu1's NVML order differs from its minor numbers, so index == minor is caught."""
    gpus = read_gpus(testbed)
    assert [g["minor"] for g in gpus["gpu1"]] == [2, 0, 3, 1]
    assert [g["minor"] for g in gpus["gpu2"]] == [0, 1, 2, 3]
    names = testbed.nvml(
        "gpu2", "result = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))"
    )
    assert names == "NVIDIA H100 80GB HBM3"


def test_accounts_and_users_exist_in_slurmdbd(testbed: TestBed) -> None:
    """alice is in physics, bob in bio, carol in both; all are real Unix users."""
    out = testbed.run("sacctmgr", "-n", "-P", "show", "assoc", "format=Account,User").stdout
    pairs = {tuple(line.split("|")) for line in out.split() if line.split("|")[1]}
    assert {("physics", "alice"), ("bio", "bob"), ("physics", "carol"), ("bio", "carol")} <= pairs
    for user in ("alice", "bob", "carol"):
        assert testbed.run("id", "-u", user).stdout.strip().isdigit()


def test_gpu_load_drives_exactly_the_gpus_slurm_gave_the_job(
    testbed: TestBed, cancel_after: list[int]
) -> None:
    """A 2-GPU job at 70% shows 70%, its pid and its memory on its GPUs only."""
    job = testbed.submit(
        "alice",
        "--gres=gpu:2",
        "-p",
        "gpu",
        wrap=testbed.gpu_load("--util", "70", "--mem", "20480", "--seconds", "60"),
    )
    cancel_after.append(job)
    testbed.wait_state(job, {"RUNNING"})
    node, indices = testbed.job_gpus(job)
    # gres.conf lists nvidia0-3 in order, so Slurm's index i is the device with minor i.
    minors = set(indices)
    assert len(minors) == 2
    wait_for_load(testbed, node, minors)
    time.sleep(1.5)  # one whole second of load, so the last-second utilization is steady

    for name, gpus in read_gpus(testbed).items():
        for gpu in gpus:
            if name == node and gpu["minor"] in minors:
                assert 68 <= gpu["util"] <= 72, gpu
                assert 20480 <= gpu["mem_used_mib"] <= 20480 + 1024, gpu
                assert [job_id_of_pid(p) for p in gpu["pids"]] == [job], gpu
            else:
                assert (gpu["util"], gpu["pids"]) == (0, []), (name, gpu)

    testbed.run("scancel", str(job))
    testbed.wait_done(job)
    deadline = time.monotonic() + 20
    while True:
        busy = [
            (name, g)
            for name, gpus in read_gpus(testbed).items()
            for g in gpus
            if g["util"] or g["pids"]
        ]
        if not busy or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert busy == []


def test_gpus_are_released_when_the_job_ends_by_itself(testbed: TestBed) -> None:
    """After a short job completes, every GPU reads 0% with no process."""
    job = testbed.submit(
        "bob", "--gres=gpu:4", wrap=testbed.gpu_load("--util", "50", "--seconds", "3")
    )
    assert testbed.wait_done(job) == "COMPLETED"
    time.sleep(1.5)  # the last second's utilization must cover only idle time
    gpus = read_gpus(testbed)
    assert [(g["util"], g["pids"]) for n in gpus for g in gpus[n]] == [(0, [])] * 8


def test_sacct_records_the_gpus_and_account(testbed: TestBed) -> None:
    """sacct shows gres/gpu=2 in AllocTRES under account physics for alice's job."""
    job = testbed.submit("alice", "--gres=gpu:2", "-A", "physics", wrap="true")
    testbed.wait_done(job)
    deadline = time.monotonic() + 30
    row: dict[str, str] = {}
    while time.monotonic() < deadline:
        row = testbed.sacct(job, "User,Account,State,AllocTRES")
        if row.get("State") == "COMPLETED":
            break
        time.sleep(0.5)
    assert (row["User"], row["Account"], row["State"]) == ("alice", "physics", "COMPLETED")
    assert "gres/gpu=2" in row["AllocTRES"].split(",")


def _netns() -> set[str]:
    """The network namespaces `ip netns` names (the beds' nodes: sgpu-<ctld port>-<node>)."""
    root = Path("/run/netns")
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def test_launcher_lifecycle_on_a_fresh_state_dir() -> None:
    """up brings up 2 idle nodes; a second up changes nothing; down leaves no daemon.

    An up in another layout restarts the bed in it: the demo's, then the tests' again.
    """
    state = Path("/var/tmp/slurm-gpu-cluster-lifecycle-test")
    shutil.rmtree(state, ignore_errors=True)
    ports = {
        "SLURM_GPU_CTLD_PORT": "17817",
        "SLURM_GPU_DBD_PORT": "17819",
        "SLURM_GPU_DB_PORT": "14306",
        "SLURM_GPU_PG_PORT": "16432",
        "SLURM_GPU_NODE1_PORT": "17901",
        "SLURM_GPU_NODE2_PORT": "17902",
        "SLURM_GPU_CLUSTER_NAME": "lifecycle",
        "SLURM_GPU_METRICS_PORT_BASE": "19950",
        "SLURM_GPU_PROM_PORT": "19190",
    }
    pids: dict[str, str] = {}
    try:
        bed = TestBed.up(state, ports)
        out = bed.run("sinfo", "-h", "-N", "-p", "gpu", "-o", "%N|%T|%G").stdout.split()
        assert out == [f"gpu1|idle|{bed.gpu1_gres}", "gpu2|idle|gpu:h100:4"]

        pids = {p.name: p.read_text() for p in (state / "run").glob("*.pid")}
        mtimes = {p: p.stat().st_mtime_ns for p in (state / "etc").iterdir()}
        second = bed.launcher("up")
        assert "nothing to do" in second.stderr
        assert {p.name: p.read_text() for p in (state / "run").glob("*.pid")} == pids
        assert {p: p.stat().st_mtime_ns for p in (state / "etc").iterdir()} == mtimes

        # The README's two commands in a row (issue 25 item 5): the demo brings the bed up
        # in its layout (agents write SQLite), then tests/run in the tests' (collector).
        demo = bed.launcher("up", extra_env={"SLURM_GPU_BED_STORE": "sqlite"})
        assert "restarting it with sqlite" in demo.stderr, demo.stderr
        assert "sqlite" == (state / "etc" / "bed-store").read_text().strip()
        tests = bed.launcher("up")
        assert "restarting it with collector" in tests.stderr, tests.stderr
        assert "collector" == (state / "etc" / "bed-store").read_text().strip()
        pids = {p.name: p.read_text() for p in (state / "run").glob("*.pid")}
        job = bed.submit(
            "alice", "--gres=gpu:1", wrap=bed.gpu_load("--util", "50", "--seconds", "3")
        )
        assert "COMPLETED" == bed.wait_done(job)
        config = load_config(Path(bed.env["SLURM_GPU_CONFIG"]))
        store = Store(config.store.url, cluster=config.cluster.name)
        try:
            assert 1 == len(wait_summaries(store, job, 1))  # through the collector again
        finally:
            store.dispose()
    finally:
        others = {n for n in _netns() if not n.startswith("sgpu-17817-")}
        # Only the state dir, as a user would: `down` must find the bed's own network from
        # it, not from ports its environment lacks (once it removed the default bed's).
        env = dict(os.environ, SLURM_GPU_CLUSTER_DIR=str(state))
        subprocess.run([str(LAUNCHER), "down"], env=env, check=False)
    assert others <= _netns(), "down removed another bed's network namespaces"
    assert not [n for n in _netns() if n.startswith("sgpu-17817-")]
    ours = [int(text) for name, text in pids.items() if name != "munge.pid"]
    alive = []
    for pid in ours:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    assert alive == []
    leftovers = [
        d.name
        for d in Path("/proc").iterdir()
        if d.name.isdigit() and str(state).encode() in _cmdline(d)
    ]
    assert leftovers == []
    shutil.rmtree(state, ignore_errors=True)


def _cmdline(proc_dir: Path) -> bytes:
    try:
        return (proc_dir / "cmdline").read_bytes()
    except OSError:
        return b""


def test_gpu_load_pid_gone_releases_gpus(testbed: TestBed, cancel_after: list[int]) -> None:
    """A workload killed with SIGKILL stops showing as a process on its GPUs."""
    job = testbed.submit(
        "carol",
        "-A",
        "bio",
        "--gres=gpu:1",
        wrap=testbed.gpu_load("--util", "40", "--seconds", "120"),
    )
    cancel_after.append(job)
    testbed.wait_state(job, {"RUNNING"})
    node, indices = testbed.job_gpus(job)
    wait_for_load(testbed, node, set(indices))
    gpus = read_node_gpus(testbed, node)
    (pid,) = next(g["pids"] for g in gpus if g["minor"] == indices[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        gpus = read_node_gpus(testbed, node)
        if not any(g["pids"] for g in gpus):
            break
        time.sleep(0.5)
    assert [g["pids"] for g in gpus] == [[]] * 4
