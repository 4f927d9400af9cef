"""Fixtures for the simulated NVML library (docker/slurm-cluster/sim-nvml).

The library is built once per session; pynvml runs in a subprocess (nvml_probe.py)
because LD_LIBRARY_PATH is only read when a process starts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SIM_SRC = REPO / "docker" / "slurm-cluster" / "sim-nvml"
BIN = REPO / "docker" / "slurm-cluster" / "bin"
PROBE = Path(__file__).with_name("nvml_probe.py")
NODE = "gpu1"
MODEL = "NVIDIA A100-SXM4-80GB"
ORDER = [2, 0, 3, 1]  # NVML enumeration order, deliberately not minor order


@pytest.fixture(scope="session")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory holding a freshly built libnvidia-ml.so.1."""
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.skip("needs make and gcc")
    out = tmp_path_factory.mktemp("sim-nvml-lib")
    subprocess.run(["make", "-s", "-C", str(SIM_SRC), f"OUT={out}"], check=True)
    return out


def sim_gpu(*args: str) -> str:
    """Runs the sim-gpu tool; returns stdout."""
    done = subprocess.run(
        [sys.executable, str(BIN / "sim-gpu"), *args], check=True, capture_output=True, text=True
    )
    return done.stdout


@dataclass
class Node:
    """One simulated node: its sim dir plus helpers to drive pynvml and gpu-load on it."""

    root: Path
    libdir: Path
    loads: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def dir(self) -> Path:
        """The node's sim-nvml directory."""
        return self.root / NODE

    def nvml(
        self, ops: list[dict[str, Any]], *, init: bool = True, env: dict[str, str] | None = None
    ) -> list[Any]:
        """Runs the ops in a fresh pynvml process; results exclude the implicit init."""
        full_env = {
            **os.environ,
            "LD_LIBRARY_PATH": str(self.libdir),
            "SIM_NVML_DIR": str(self.dir),
        }
        full_env.update(env or {})
        all_ops = ([{"op": "init"}] if init else []) + ops
        done = subprocess.run(
            [sys.executable, str(PROBE)],
            input=json.dumps(all_ops),
            env=full_env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        results: list[Any] = json.loads(done.stdout)
        if init:
            assert results[0] is None, f"nvmlInit failed: {results[0]}"
            return results[1:]
        return results

    def devices(self) -> list[dict[str, Any]]:
        """Every field of every device, in NVML enumeration order."""
        devices: list[dict[str, Any]] = self.nvml([{"op": "devices"}])[0]
        return devices

    def by_minor(self) -> dict[int, dict[str, Any]]:
        """Every device's fields, by the minor number of its device file."""
        return {d["minor"]: d for d in self.devices()}

    def start_load(
        self, slurm_gpus: str, *args: str, step_env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """Starts gpu-load as a Slurm job step would; waits until it has registered.

        `step_env`: the step's CUDA_VISIBLE_DEVICES / SLURM_STEP_GPUS (default: none).
        """
        env = {
            **os.environ,
            "SLURM_JOB_GPUS": slurm_gpus,
            "SLURMD_NODENAME": NODE,
            "SIM_NVML_ROOT": str(self.root),
            "SLURM_JOB_ID": "42",
        }
        for name in ("SIM_NVML_DIR", "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS"):
            env.pop(name, None)
        env.update(step_env or {})
        proc = subprocess.Popen(
            [sys.executable, str(BIN / "gpu-load"), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.loads.append(proc)
        assert proc.stdout is not None
        proc.stdout.readline()  # the "drives ..." line comes after the plans are written
        return proc

    def stop_all(self) -> None:
        """Kills the gpu-load processes still running and reaps them all."""
        for proc in self.loads:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()


def uuid_of(node: Node, minor: int) -> str:
    """UUID of the GPU with that minor, read from its info file."""
    for info in (node.dir / "gpus").glob("*/info"):
        kv = dict(line.split("=", 1) for line in info.read_text().splitlines())
        if kv["minor"] == str(minor):
            return kv["uuid"]
    raise KeyError(minor)


def make_node(root: Path, libdir: Path, created: float | None = None) -> Node:
    """Creates the GPUs of NODE under root; by default they were made 10 s ago."""
    root.mkdir(parents=True, exist_ok=True)
    node = Node(root=root, libdir=libdir)
    sim_gpu(
        "create", "--dir", str(node.dir), "--node", NODE, "--model", MODEL,
        "--memory-mib", "81920", "--count", "4", "--order", ",".join(map(str, ORDER)),
        "--power-idle-w", "60", "--power-max-w", "400",
        "--created", str(created or time.time() - 10),  # so every GPU already has samples
    )  # fmt: skip
    return node


@pytest.fixture
def node(tmp_path: Path, libdir: Path) -> Iterator[Node]:
    """A fresh node with 4 simulated A100s enumerated in ORDER."""
    n = make_node(tmp_path / "sim", libdir)
    yield n
    n.stop_all()


def wait_exit(proc: subprocess.Popen[str], timeout: float = 10) -> int:
    """Waits for a gpu-load to exit, then a second more; returns its exit status."""
    rc = proc.wait(timeout=timeout)
    time.sleep(1.1)  # utilization is the mean over the last second
    return rc
