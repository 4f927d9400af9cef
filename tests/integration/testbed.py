"""Driving the local test-bed cluster from tests: submit as a user, wait, read sacct.

The cluster itself is docker/slurm-cluster/local-cluster; this module only talks to it
through the same commands an admin would type (sbatch, squeue, sacct, scontrol).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_gpu.models import JobGpuSummary
from slurm_gpu.store import Store

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = REPO_ROOT / "docker" / "slurm-cluster" / "local-cluster"
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


def launcher_env(launcher_env_text: str) -> dict[str, str]:
    """Turns `local-cluster env` output into an environment, expanding ${VAR:+...}."""
    script = launcher_env_text + "\nenv -0\n"
    out = subprocess.run(
        ["bash", "-c", script], check=True, capture_output=True, env=dict(os.environ)
    ).stdout
    pairs = (item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    return dict(pairs)


@dataclass
class TestBed:
    """A running test-bed cluster and the environment that reaches it."""

    __test__ = False  # not a test class, despite the name

    state_dir: Path
    env: dict[str, str] = field(repr=False)

    @classmethod
    def up(cls, state_dir: Path | None = None, extra_env: dict[str, str] | None = None) -> TestBed:
        """Brings the cluster up (a no-op when it already is) and returns a handle."""
        env = dict(os.environ)
        if state_dir is not None:
            env["SLURM_GPU_CLUSTER_DIR"] = str(state_dir)
        env.update(extra_env or {})
        subprocess.run([str(LAUNCHER), "up"], check=True, env=env, timeout=600)
        text = subprocess.run(
            [str(LAUNCHER), "env"], check=True, env=env, capture_output=True, text=True
        ).stdout
        full = launcher_env(text)
        full.update(extra_env or {})
        return cls(state_dir=Path(full["SLURM_GPU_CLUSTER_DIR"]), env=full)

    def launcher(
        self, *args: str, check: bool = True, extra_env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Runs local-cluster with this bed's environment (plus `extra_env`)."""
        return subprocess.run(
            [str(LAUNCHER), *args],
            check=check,
            env={**self.env, **(extra_env or {})},
            capture_output=True,
            text=True,
        )

    def run(
        self, *argv: str, user: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Runs a command against the cluster, as `user` when given (like `su user -c`)."""
        cmd = list(argv)
        if user is not None:
            keep = ",".join(k for k in ("SLURM_CONF", "SIM_NVML_ROOT", "PATH", "SLURM_GPU_CONFIG"))
            cmd = ["runuser", "-u", user, f"--whitelist-environment={keep}", "--", *cmd]
        return subprocess.run(
            cmd, check=check, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    @property
    def slurm_release(self) -> str:
        """The Slurm release this bed runs (local-cluster --slurm, SLURM_GPU_SLURM_RELEASE)."""
        return self.env.get("SLURM_GPU_SLURM_RELEASE", "22.05")

    @property
    def gpu1_gres(self) -> str:
        """gpu1's Gres as sinfo prints it.

        Autodetected GPUs (gpu1 on the 24.11+ beds) carry their CPU affinity, as on hardware.
        """
        return "gpu:a100:4" + ("" if self.slurm_release == "22.05" else "(S:0-7)")

    def metrics_address(self, node: str) -> str:
        """host:port of `node`'s agent /metrics: each release's bed has its own ports.

        An agent in its node's network namespace serves on the node's address
        (docker/slurm-cluster/collector.sh); one on the host's network on 127.0.0.1.
        """
        base = int(self.env.get("SLURM_GPU_METRICS_PORT_BASE", "19900"))
        hosts = dict(
            item.split("=", 1) for item in self.env.get("SLURM_GPU_AGENT_HOSTS", "").split()
        )
        return f"{hosts.get(node, '127.0.0.1')}:{base + int(node.removeprefix('gpu'))}"

    @property
    def through_collector(self) -> bool:
        """Whether the agents ship through the bed's collector (SLURM_GPU_BED_STORE)."""
        return self.env.get("SLURM_GPU_BED_STORE", "collector") == "collector"

    @property
    def collector_url(self) -> str:
        """The bed's collector, "http://HEAD_ADDR:PORT" (through_collector only)."""
        return self.env["SLURM_GPU_COLLECTOR_URL"]

    @property
    def collector_log(self) -> Path:
        """What the bed's collector logs (refusals among it)."""
        return self.state_dir / "log" / "slurm-gpu-collector.out"

    def munge_socket(self, node: str) -> Path:
        """The socket of `node`'s own munged (its credentials carry the node's address)."""
        return self.state_dir / f"munge-{node}" / "munge.socket.2"

    def pid(self, daemon: str) -> int:
        """The pid of a daemon the launcher started ("slurm-gpu-collector", ...)."""
        return int((self.state_dir / "run" / f"{daemon}.pid").read_text())

    def metrics_url(self, node: str) -> str:
        """/metrics of `node`'s agent: each release's bed has its own ports."""
        return f"http://{self.metrics_address(node)}/metrics"

    @property
    def bin_dir(self) -> Path:
        """Test-bed tools (gpu-load, sim-gpu)."""
        return self.state_dir / "bin"

    @property
    def jobs_dir(self) -> Path:
        """World-writable working directory for test jobs."""
        return self.state_dir / "jobs"

    def submit(self, user: str, *sbatch_args: str, wrap: str) -> int:
        """Submits a batch job as `user` and returns its job id."""
        out = self.run(
            "sbatch",
            "--parsable",
            f"--chdir={self.jobs_dir}",
            f"--output={self.jobs_dir}/%j.out",
            *sbatch_args,
            f"--wrap={wrap}",
            user=user,
        ).stdout
        return int(out.strip().split(";")[0])

    def gpu_load(self, *args: str) -> str:
        """A shell command line running the test-bed workload with these arguments."""
        return " ".join([str(self.bin_dir / "gpu-load"), *args])

    def job_state(self, job_id: int) -> str:
        """The job's state as slurmctld sees it, falling back to sacct once it is gone."""
        out = self.run("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False).stdout
        if out.strip():
            return out.strip()
        row = self.sacct(job_id, "State")
        return row["State"].split()[0] if row else "UNKNOWN"

    def wait_state(self, job_id: int, states: set[str], timeout: float = 120) -> str:
        """Polls until the job reaches one of `states`; fails with its last state."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            if state in TERMINAL_STATES and not states & TERMINAL_STATES:
                break
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} is {state}, expected one of {sorted(states)}")

    def wait_done(self, job_id: int, timeout: float = 180) -> str:
        """Waits until the job finished and sacct recorded its end."""
        return self.wait_state(job_id, set(TERMINAL_STATES), timeout)

    def wait_gres_ready(self, timeout: float = 60) -> None:
        """After a slurmctld restart: waits until a GPU job really gets its GPUs.

        Slurm 22.05 can start a job without its GRES in the seconds after slurmctld
        recovers its state, before the nodes re-register (seen on this test bed).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.submit("root", "--gres=gpu:1", wrap='test -n "$SLURM_JOB_GPUS"')
            if self.wait_done(job) == "COMPLETED":
                return
            time.sleep(2)
        raise AssertionError("GPU jobs still start without GPUs after the restart")

    def sacct(self, job_id: int, fields: str) -> dict[str, str]:
        """The job's allocation row from `sacct -P -X`, as {field: value}."""
        out = self.run(
            "sacct", "-P", "-X", "-n", "-j", str(job_id), "-o", fields, check=False
        ).stdout
        lines = [line for line in out.splitlines() if line.strip()]
        if not lines:
            return {}
        return dict(zip(fields.split(","), lines[0].split("|"), strict=True))

    def job_gpus(self, job_id: int) -> tuple[str, list[int]]:
        """(node, Slurm GPU indices) of a running single-node job, from scontrol -d."""
        out = self.run("scontrol", "-d", "show", "job", str(job_id)).stdout
        node = ""
        indices: list[int] = []
        for token in out.split():
            if token.startswith("Nodes="):
                node = token.split("=", 1)[1]
            if token.startswith("GRES=") and "IDX:" in token:
                idx = token.split("IDX:", 1)[1].rstrip(")")
                for part in idx.split(","):
                    lo, _, hi = part.partition("-")
                    indices.extend(range(int(lo), int(hi or lo) + 1))
        return node, indices

    def nvml(self, node: str, script: str) -> object:
        """Runs a Python snippet that uses pynvml on `node`'s simulated GPUs.

        The snippet gets `pynvml` imported and initialised and assigns `result`; the
        result comes back through JSON. A subprocess, because the NVML library is chosen
        by LD_LIBRARY_PATH when the process starts.
        """
        program = (
            "import json, pynvml\npynvml.nvmlInit()\nresult = None\n"
            + script
            + "\nprint(json.dumps(result))\n"
        )
        env = dict(self.env, SIM_NVML_DIR=str(self.state_dir / "sim-nvml" / node))
        venv_python = Path(self.env.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin/python"
        out = subprocess.run(
            [str(venv_python), "-c", program],
            check=True,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        return json.loads(out)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Polls `predicate` every 0.5 s until it returns something true, and returns that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_summaries(
    store: Store, job_id: int, gpus: int, timeout: float = 120
) -> list[JobGpuSummary]:
    """Polls the store until the job's per-GPU summaries have all arrived."""
    deadline = time.monotonic() + timeout
    rows: list[JobGpuSummary] = []
    while time.monotonic() < deadline:
        rows = store.job_summaries(job_id)
        if len(rows) >= gpus:
            return rows
        time.sleep(1)
    raise AssertionError(f"job {job_id}: {len(rows)} of {gpus} GPU summaries in the store")
