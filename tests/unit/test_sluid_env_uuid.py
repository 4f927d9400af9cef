# The project writes `expected == actual` (DESIGN.md); ruff calls that a Yoda condition.
"""Slurm 25.11+ SLUIDs and gres.conf Flags=env_uuid (26.05), from the hooks to the store.

The hooks record SLURM_JOB_SLUID and, when CUDA_VISIBLE_DEVICES names the GPUs by UUID,
each GPU's UUID beside its Slurm index; the agent binds such a job to the GPUs slurmd
named, attributes processes through a SLUID-named cgroup, and the store keeps the SLUID
with the job for `sacct --json` and `slurm-gpu job`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.models import GpuDevice, JobEvent, JobEventKind
from slurm_gpu.node.agent import NodeAgent, job_of_pid
from slurm_gpu.node.hookfiles import (
    UNKNOWN_INDEX,
    parse_binding_file,
    parse_event_file,
    read_binding_files,
)
from slurm_gpu.node.outbox import decode_summary
from slurm_gpu.node.spool import Spool
from slurm_gpu.slurm.gres import GresGpuFile
from slurm_gpu.store import Store
from slurm_gpu.testing import FakeGpuSource, FixedClock

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0
SLUID = "s3WHM8RV2YXQ00"  # as Slurm 26.05 printed one (tests/data/26.05/squeue.json)
# Four GPUs whose Slurm index (gres.conf order), minor and NVML index all differ.
UUIDS = {
    minor: f"GPU-{minor}{minor}{minor}{minor}aaaa-b081-6ba9-b160-fb8f31c3819{minor}"
    for minor in range(4)
}
DEVICES = [  # NVML order: minors 2, 0, 3, 1
    GpuDevice(UUIDS[m], "Fake A100", m, n, f"00:0{m}", 80 * 2**30)
    for n, m in enumerate((2, 0, 3, 1))
]
GRES_MINORS = (3, 1, 0, 2)  # Slurm index i is /dev/nvidia{GRES_MINORS[i]}


# --- hooks ------------------------------------------------------------------------------


def run_prolog(tmp_path: Path, env: dict[str, str]) -> Path:
    """Runs the real prolog with `env` (as slurmd does); returns the node's state dir."""
    d = tmp_path / "hooks"
    d.mkdir(exist_ok=True)
    for name in ("slurm-gpu-prolog", "slurm-gpu-epilog", "slurm-gpu-hooks.sh"):
        shutil.copy2(ROOT / "hooks" / name, d)
    (d / "slurm-gpu-hooks.conf").write_text(
        f"STATE_DIR={tmp_path / 'state'}\nLOG_FILE={tmp_path / 'hooks.log'}\nSYSLOG=no\n"
    )
    base = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "gpu1", "SLURM_JOB_ID": "77"}
    done = subprocess.run(
        ["/bin/sh", str(d / "slurm-gpu-prolog")], env={**base, **env}, timeout=10, check=False
    )
    assert 0 == done.returncode
    return tmp_path / "state" / "gpu1"


def hook_log(tmp_path: Path) -> str:
    path = tmp_path / "hooks.log"
    return path.read_text() if path.exists() else ""


def test_prolog_records_the_sluid_and_each_gpus_uuid_beside_its_index(tmp_path: Path) -> None:
    """SLURM_JOB_GPUS=1,3 with CUDA_VISIBLE_DEVICES=<uuid of 1>,<uuid of 3>: paired in order."""
    env = {
        "SLURM_JOB_GPUS": "1,3",
        "CUDA_VISIBLE_DEVICES": f"{UUIDS[0]},{UUIDS[2]}",
        "SLURM_JOB_SLUID": SLUID,
    }
    node = run_prolog(tmp_path, env)

    [event_path] = (node / "events").iterdir()
    item = parse_event_file(event_path, "gpu1")
    assert ((1, 3), (UUIDS[0], UUIDS[2]), SLUID) == (
        item.event.gpu_indices,
        item.gpu_uuids,
        item.event.sluid,
    )
    bindings = {b.binding.slurm_index: (b.gpu_uuid, b.sluid) for b in read_binding_files(node)}
    assert {1: (UUIDS[0], SLUID), 3: (UUIDS[2], SLUID)} == bindings
    assert "" == hook_log(tmp_path)


def test_prolog_without_slurm_job_gpus_binds_by_uuid_alone(tmp_path: Path) -> None:
    node = run_prolog(tmp_path, {"CUDA_VISIBLE_DEVICES": UUIDS[3]})

    [path] = (node / "bindings").iterdir()
    assert f"77.{UUIDS[3]}" == path.name
    binding = parse_binding_file(path)
    assert (UNKNOWN_INDEX, UUIDS[3]) == (binding.binding.slurm_index, binding.gpu_uuid)


@pytest.mark.parametrize(
    ("visible", "said"),
    [
        (f"{UUIDS[0]},1", "mixes GPU UUIDs with other values"),
        (f"MIG-{UUIDS[0][4:]}/1/0", "mixes GPU UUIDs with other values"),
        (f"{UUIDS[0]},{UUIDS[1]}", "lists 2 GPU UUIDs but SLURM_JOB_GPUS=2 1 indices"),
    ],
)
def test_an_odd_uuid_list_is_logged_and_the_job_bound_by_slurm_job_gpus(
    tmp_path: Path, visible: str, said: str
) -> None:
    node = run_prolog(tmp_path, {"SLURM_JOB_GPUS": "2", "CUDA_VISIBLE_DEVICES": visible})

    assert said in hook_log(tmp_path)
    [binding] = read_binding_files(node)
    assert (2, "") == (binding.binding.slurm_index, binding.gpu_uuid)


def test_odd_values_without_slurm_job_gpus_bind_nothing(tmp_path: Path) -> None:
    node = run_prolog(tmp_path, {"CUDA_VISIBLE_DEVICES": f"{UUIDS[0]},x"})

    assert [] == read_binding_files(node)
    said = hook_log(tmp_path)
    assert "mixes GPU UUIDs with other values" in said
    assert said.endswith("not bound by UUID\n")


# --- the agent: cgroups named by SLUID ------------------------------------------------------


def fake_proc(tmp_path: Path, pid: int, cgroup: str, environ: dict[str, str]) -> Path:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(cgroup)
    (proc / str(pid) / "environ").write_bytes(
        b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items())
    )
    return proc


# Slurm 26.05's cgroup/v2 path of a task (cgroup_v2.c, cgroup_p_step_create)
SLUID_CGROUP = f"0::/system.slice/gpu1_slurmstepd.scope/{SLUID}/step_0/user/task_0\n"


def test_a_sluid_named_cgroup_gives_the_job_of_that_sluid(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 4321, SLUID_CGROUP, {"SLURM_JOB_ID": "99"})

    assert 77 == job_of_pid(4321, proc, sluids={SLUID: 77})


def test_a_sluid_no_binding_names_is_no_job_whatever_the_environment(tmp_path: Path) -> None:
    """The environment is the process's own to set; its cgroup is Slurm's."""
    proc = fake_proc(tmp_path, 4321, SLUID_CGROUP, {"SLURM_JOB_ID": "77"})

    assert job_of_pid(4321, proc, sluids={"s3WHM8RV2YYJ00": 78}) is None


def test_job_id_cgroups_and_the_environment_still_name_the_job(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 1, "0::/slurm/uid_1000/job_42/step_0/user/task_0\n", {})
    assert 42 == job_of_pid(1, proc)
    other = fake_proc(tmp_path / "b", 2, "0::/user.slice/session-3.scope\n", {"SLURM_JOB_ID": "9"})
    assert 9 == job_of_pid(2, other)


# --- the agent: GPUs named by UUID --------------------------------------------------------


class DeviceStat:
    def __init__(self, rdev: int) -> None:
        self.st_rdev = rdev


def stat_by_minor(path: str) -> os.stat_result:
    return DeviceStat(os.makedev(195, int(path.rsplit("nvidia", 1)[1])))  # type: ignore[return-value]


def make_agent(
    tmp_path: Path, gres_minors: tuple[int, ...] = GRES_MINORS
) -> tuple[NodeAgent, FixedClock, FakeGpuSource, Path]:
    clock = FixedClock(T0)
    gpus = FakeGpuSource(DEVICES, clock)
    node_dir = tmp_path / "gpu1"
    gres = [GresGpuFile(i, f"/dev/nvidia{m}", "a100") for i, m in enumerate(gres_minors)]
    agent = NodeAgent(
        "gpu1", node_dir, gpus, Spool(tmp_path / "spool.db"), gres,
        interval=10, period=60, clock=clock, stat=stat_by_minor,
    )  # fmt: skip
    return agent, clock, gpus, node_dir


def write_hook_file(path: Path, fields: dict[str, str], mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in fields.items()) + "end=1\n")
    os.utime(path, (mtime, mtime))


def run_job(
    agent: NodeAgent, clock: FixedClock, node_dir: Path, indices: str, uuids: str
) -> list[tuple[str, float, float]]:
    """Job 77 from T0+10 to T0+130 as the hooks write it; its summaries (uuid, GPU-s, util)."""
    common = {"job_id": "77", "user": "alice", "sluid": SLUID}
    gpu_fields = {"gpu_indices": indices} | ({"gpu_uuids": uuids} if uuids else {})
    agent.tick()
    for index, uuid in zip(indices.split(",") if indices else [], uuids.split(","), strict=False):
        write_hook_file(
            node_dir / "bindings" / f"77.{index}",
            {**common, "gpu_index": index, "gpu_uuid": uuid},
            T0 + 10,
        )
    if not indices:
        for uuid in uuids.split(","):
            write_hook_file(
                node_dir / "bindings" / f"77.{uuid}", {**common, "gpu_uuid": uuid}, T0 + 10
            )
    write_hook_file(node_dir / "events" / "77.started.1", {**common, **gpu_fields}, T0 + 10)
    while clock.now < T0 + 140:
        clock.now += 10
        if clock.now == T0 + 140:
            for path in (node_dir / "bindings").glob("77.*"):
                path.unlink()
            write_hook_file(
                node_dir / "events" / "77.ended.2",
                {**common, **gpu_fields, "exit_code": "0"},
                T0 + 130,
            )
        agent.tick()
    summaries = [decode_summary(p) for _, k, _, p in agent.spool.pending(10**6) if k == "summary"]
    return sorted((s.gpu_uuid, s.gpu_seconds, s.util_mean_percent or 0.0) for s in summaries)


def test_uuids_from_slurmd_bind_the_job_to_those_gpus_over_a_wrong_gres_map(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """slurmd's UUID wins over gres.conf's device files, in a permuted layout.

    Slurm index, minor and NVML index all differ; gres.conf's files say index 1 is minor
    1, but slurmd named index 1 by minor 0's UUID: the job's GPU is minor 0's.
    """
    agent, clock, gpus, node_dir = make_agent(tmp_path, gres_minors=(3, 1, 2, 0))
    gpus.util[UUIDS[0]] = lambda t: 70.0  # the GPU the job's CUDA programs see
    gpus.util[UUIDS[1]] = lambda t: 5.0

    with caplog.at_level(logging.ERROR):
        summaries = run_job(agent, clock, node_dir, "1", UUIDS[0])

    assert [(UUIDS[0], 120.0, 70.0)] == summaries
    assert "following slurmd" in caplog.text


def test_uuids_alone_bind_through_the_gres_map(tmp_path: Path) -> None:
    agent, clock, gpus, node_dir = make_agent(tmp_path)
    gpus.util[UUIDS[2]] = lambda t: 40.0

    summaries = run_job(agent, clock, node_dir, "", UUIDS[2])

    assert [(UUIDS[2], 120.0, 40.0)] == summaries
    assert 3 == agent.uuid_index[UUIDS[2]]  # gres.conf: Slurm index 3 is /dev/nvidia2


def test_a_uuid_nvml_does_not_list_binds_nothing_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent, clock, _gpus, node_dir = make_agent(tmp_path)
    stranger = "GPU-99999999-b081-6ba9-b160-fb8f31c38199"

    with caplog.at_level(logging.ERROR):
        summaries = run_job(agent, clock, node_dir, "", stranger)

    assert [] == summaries
    assert f"GPU {stranger} (CUDA_VISIBLE_DEVICES, no SLURM_JOB_GPUS)" in caplog.text


def test_the_sluids_of_bound_jobs_attribute_their_processes(tmp_path: Path) -> None:
    agent, _clock, _gpus, node_dir = make_agent(tmp_path)
    write_hook_file(
        node_dir / "bindings" / "77.0", {"job_id": "77", "gpu_index": "0", "sluid": SLUID}, T0
    )
    agent.tick()
    assert {SLUID: 77} == agent.binding.sluid_jobs


# --- the store, sacct --json and slurm-gpu job ---------------------------------------------


def test_the_sluid_is_stored_with_the_job_and_shown(tmp_path: Path) -> None:
    config = tmp_path / "slurm-gpu.toml"
    config.write_text(
        f'[cluster]\nname = "alpha"\n[store]\nurl = "sqlite:///{tmp_path}/s.db"\n'
        "[reports]\nlive_sacct = false\n"
    )
    with Store(f"sqlite:///{tmp_path}/s.db", cluster="alpha") as store:
        store.upgrade()
        store.add_events(
            [
                JobEvent("gpu1", 5, JobEventKind.ENDED, T0 + 60, "alice", exit_code=0),
                JobEvent(
                    "gpu1", 5, JobEventKind.STARTED, T0, "alice", gpu_indices=(0,), sluid=SLUID
                ),
                JobEvent("gpu1", 6, JobEventKind.STARTED, T0, "alice", gpu_indices=(1,)),
            ]
        )
        assert SLUID == (store.job(5) or {})["sluid"]
        assert {5: SLUID} == store.sluids([5, 6])
    app = AppContext(env={}, default_path=tmp_path / "absent.toml")

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, ["--config", str(config), *args], obj=app)
        assert 0 == result.exit_code, result.output
        return result.output

    listed = json.loads(run("sacct", "-a", "-j", "5,6", "--json"))
    assert {"5": SLUID, "6": None} == {j["JobID"]: j["sluid"] for j in listed}
    assert f"  SLUID {SLUID}\n" in run("job", "5")
    assert "SLUID" not in run("job", "6")
    assert SLUID == json.loads(run("job", "5", "--json"))["job"]["sluid"]
