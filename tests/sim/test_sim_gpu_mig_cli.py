"""`sim-gpu mig`: MIG layouts set with the real tool, read back through pynvml.

The tool validates a layout against its model's profile table (7 compute slices, the
placements of the 8 memory slices), writes `<gpu>/mig` and the instances' plan dirs, and
`<node dir>/nvidia-caps/mig-minors` as the driver writes /proc/driver/nvidia-caps/mig-minors.
"""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.sim.conftest import BIN, NODE, Node, sim_gpu, uuid_of, wait_exit
from tests.sim.test_sim_mig import run_py, start_mig_load

SIM_GPU = BIN / "sim-gpu"
A100 = "NVIDIA A100-SXM4-80GB"


def tool() -> ModuleType:
    """sim-gpu as a module (no bytecode written next to it), for its mig_uuid."""
    module = ModuleType("sim_gpu_tool")
    exec(compile(SIM_GPU.read_text(), str(SIM_GPU), "exec"), module.__dict__)
    return module


def mig(node: Node, gpu: str, layout: str) -> subprocess.CompletedProcess[str]:
    """Runs `sim-gpu mig` (exit status not checked)."""
    return subprocess.run(
        [sys.executable, str(SIM_GPU), "mig", "--dir", str(node.dir), "--gpu", gpu,
         "--layout", layout],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def make_model_node(root: Path, libdir: Path, model: str, memory_mib: int) -> Node:
    """One GPU of `model` on NODE."""
    root.mkdir(parents=True, exist_ok=True)
    node = Node(root=root, libdir=libdir)
    sim_gpu("create", "--dir", str(node.dir), "--node", NODE, "--model", model,
            "--memory-mib", str(memory_mib), "--count", "1",
            "--created", str(time.time() - 10))  # fmt: skip
    return node


READ_MIGS = """
g = by_minor[MINOR]
migs = []
for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(g)):
    try:
        m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(g, k)
    except pynvml.NVMLError_NotFound:
        continue
    migs.append([pynvml.nvmlDeviceGetGpuInstanceId(m), pynvml.nvmlDeviceGetComputeInstanceId(m),
                 s(pynvml.nvmlDeviceGetName(m)), pynvml.nvmlDeviceGetMemoryInfo(m).total >> 20,
                 s(pynvml.nvmlDeviceGetUUID(m))])
result = {"mode": pynvml.nvmlDeviceGetMigMode(g), "migs": migs}
"""


def read_migs(node: Node, minor: int) -> dict[str, Any]:
    """MIG mode and [gi, ci, name, memory MiB, UUID] per MIG device, through pynvml."""
    result: dict[str, Any] = run_py(node, READ_MIGS.replace("MINOR", str(minor)))
    return result


def test_layout_through_pynvml(node: Node) -> None:
    """3g.40gb+4g.40gb: the 4g at slice 0 (GI 1), the 3g at 4 (GI 2), each as NVML lists it."""
    done = mig(node, "minor:0", "3g.40gb+4g.40gb")
    parent = uuid_of(node, 0)
    uuids = [tool().mig_uuid(parent, gi, 0) for gi in (1, 2)]
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"minor=0 {parent} mig[0] gi=1 ci=0 4g.40gb slices=4 mem=40192MiB {uuids[0]}",
        f"minor=0 {parent} mig[1] gi=2 ci=0 3g.40gb slices=3 mem=40192MiB {uuids[1]}",
    ]
    assert read_migs(node, 0) == {
        "mode": [1, 1],
        "migs": [
            [1, 0, f"{A100} MIG 4g.40gb", 40192, uuids[0]],
            [2, 0, f"{A100} MIG 3g.40gb", 40192, uuids[1]],
        ],
    }
    gdir = node.dir / "gpus" / parent
    for gi in (1, 2):
        assert stat.S_IMODE((gdir / f"gi{gi}" / "plans").stat().st_mode) == 0o1777
    # the same layout again: the same UUIDs (derived from the parent and the ids)
    assert mig(node, "minor:0", "4g.40gb+3g.40gb").stdout == done.stdout
    assert read_migs(node, 1)["mode"] == [0, 0]  # the other GPUs are untouched


def test_layouts_place_largest_first(node: Node) -> None:
    """GPU instance ids follow the placement, largest instance first.

    1g*7 -> 7..13, 2g*3+1g -> 3,4,5 and 13, 3g+1g*4 -> the 3g at slice 4 (GI 2) so the four
    1g fit at 0-3 (GI 7-10), 1g.20gb*2 -> GI 3 and 4.
    """
    layouts = ["1g.10gb*7", "1g.10gb+2g.20gb*3", "3g.40gb+1g.10gb*4", "1g.20gb*2"]
    for minor, layout in enumerate(layouts):
        done = mig(node, f"minor:{minor}", layout)
        assert done.returncode == 0, done.stderr
    got = {minor: read_migs(node, minor)["migs"] for minor in range(4)}
    assert [m[0] for m in got[0]] == [7, 8, 9, 10, 11, 12, 13]
    assert [[m[0], m[3]] for m in got[1]] == [[3, 19968], [4, 19968], [5, 19968], [13, 9728]]
    assert [[m[0], m[2].rsplit(" ", 1)[1]] for m in got[2]] == [
        [2, "3g.40gb"], [7, "1g.10gb"], [8, "1g.10gb"], [9, "1g.10gb"], [10, "1g.10gb"]
    ]  # fmt: skip
    assert [[m[0], m[2].rsplit(" ", 1)[1], m[3]] for m in got[3]] == [
        [3, "1g.20gb", 19968], [4, "1g.20gb", 19968]
    ]  # fmt: skip


def test_h200_profiles(tmp_path: Path, libdir: Path) -> None:
    """An H200 has its own table: 3g.71gb+2g.35gb+1g.35gb with its sizes; 80 GB names refused."""
    node = make_model_node(tmp_path / "h200", libdir, "NVIDIA H200", 143771)
    done = mig(node, "minor:0", "1g.35gb+3g.71gb+2g.35gb")
    assert done.returncode == 0, done.stderr
    assert [m[:4] for m in read_migs(node, 0)["migs"]] == [
        [1, 0, "NVIDIA H200 MIG 3g.71gb", 71168],
        [5, 0, "NVIDIA H200 MIG 2g.35gb", 33024],
        [6, 0, "NVIDIA H200 MIG 1g.35gb", 33024],
    ]
    assert mig(node, "minor:0", "1g.18gb*7").returncode == 0
    assert [m[3] for m in read_migs(node, 0)["migs"]] == [16384] * 7
    assert mig(node, "minor:0", "7g.141gb").returncode == 0
    assert [m[:4] for m in read_migs(node, 0)["migs"]] == [
        [0, 0, "NVIDIA H200 MIG 7g.141gb", 143104]
    ]
    wrong = mig(node, "minor:0", "3g.40gb")
    assert wrong.returncode == 1
    assert (
        "unknown MIG profile(s) 3g.40gb; this model has 1g.18gb, 1g.35gb, 2g.35gb" in wrong.stderr
    )


def test_refusals_name_the_gpu_and_why(node: Node, tmp_path: Path, libdir: Path) -> None:
    """A layout that cannot be, or a GPU without MIG: exit 1 naming the GPU and why.

    Too many slices, an unknown profile, no placement, a bad layout, a model without MIG or
    without a table; the GPU keeps the layout it had.
    """
    assert mig(node, "minor:2", "7g.80gb").returncode == 0
    before = read_migs(node, 2)
    who = f"sim-gpu: GPU minor:2 ({uuid_of(node, 2)}, {A100}): "
    cases = {
        "4g.40gb+4g.40gb": "layout 4g.40gb+4g.40gb needs 8 compute slices, the GPU has 7",
        "1g.10gb*8": "layout 1g.10gb*8 needs 8 compute slices, the GPU has 7",
        "2g.20gb+5g.50gb+1g.18gb": "unknown MIG profile(s) 1g.18gb, 5g.50gb; this model has "
        "1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        "1g.20gb*4+3g.40gb": "layout 1g.20gb*4+3g.40gb does not fit the GPU's placements",
        "3g.40gb*x": "bad layout part '3g.40gb*x' (PROFILE or PROFILE*N)",
    }
    for layout, why in cases.items():
        done = mig(node, "minor:2", layout)
        assert (done.returncode, done.stdout) == (1, ""), layout
        assert done.stderr.startswith(who + why), done.stderr
    assert read_migs(node, 2) == before

    l40 = make_model_node(tmp_path / "l40s", libdir, "NVIDIA L40S", 46068)
    done = mig(l40, "minor:0", "1g.10gb")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"sim-gpu: GPU minor:0 ({uuid_of(l40, 0)}, NVIDIA L40S): this model has no MIG"
    )
    assert not (l40.dir / "gpus" / uuid_of(l40, 0) / "mig").exists()
    a100_40 = make_model_node(tmp_path / "a100-40", libdir, "NVIDIA A100-SXM4-40GB", 40960)
    done = mig(a100_40, "minor:0", "1g.5gb")
    assert done.returncode == 1
    assert "with 40960 MiB: no MIG profile table for this model" in done.stderr
    assert (
        mig(node, "minor:9", "1g.10gb").stderr.strip() == f"sim-gpu: no GPU 'minor:9' in {node.dir}"
    )


def test_off(node: Node) -> None:
    """off: mode=0 without instance lines, the instance dirs gone, NVML sees MIG disabled."""
    old = [m[4] for m in read_migs(node, 0)["migs"]]
    assert old == []
    mig(node, "minor:0", "2g.20gb*3")
    old = [m[4] for m in read_migs(node, 0)["migs"]]
    done = mig(node, "minor:0", "off")
    gdir = node.dir / "gpus" / uuid_of(node, 0)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"minor=0 {uuid_of(node, 0)} mig=off\n"
    assert (gdir / "mig").read_text() == "mode=0\n"
    assert sorted(p.name for p in gdir.iterdir() if p.name.startswith("gi")) == []
    result = run_py(
        node,
        f"""
        g = by_minor[0]
        result = [pynvml.nvmlDeviceGetMigMode(g), pynvml.nvmlDeviceGetMaxMigDeviceCount(g),
                  err(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, g, 0),
                  err(pynvml.nvmlDeviceGetHandleByUUID, {old[0]!r}),
                  pynvml.nvmlDeviceGetUtilizationRates(g).gpu]
        """,
    )
    assert result == [[0, 0], 0, "NVMLError_InvalidArgument", "NVMLError_NotFound", 0]


def test_instance_in_use_is_not_destroyed(node: Node) -> None:
    """A GPU instance with a live process is not destroyed, as the driver refuses it.

    show lists the job under its instance; off, or a layout without that instance, is
    refused naming the pid; a layout that keeps it is applied.
    """
    mig(node, "minor:1", "4g.40gb+3g.40gb")
    small = read_migs(node, 1)["migs"][1]  # gi 2, 3g.40gb
    proc, pid = start_mig_load(node, small[4], "--util", "40", "--mem", "2048", "--seconds", "0")
    show = sim_gpu("show", "--dir", str(node.dir))
    lines = show.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("[") and " minor=1 " in line)
    assert "util=N/A mem=2048/81920MiB" in lines[at] and lines[at].endswith(" mig=on")
    assert lines[at + 1].startswith("    mig[0] gi=1 ci=0 4g.40gb slices=4 ")
    assert lines[at + 1].endswith(" util=0% mem=0/40192MiB")
    assert lines[at + 2].startswith(f"    mig[1] gi=2 ci=0 3g.40gb slices=3 {small[4]} ")
    assert lines[at + 2].endswith(" mem=2048/40192MiB")
    assert lines[at + 3].startswith(f"        pid={pid} ")
    assert " minor=0 " in show and show.count(" mig=off") == 3
    busy = f"GPU instance 2 (3g.40gb) is in use by pid {pid}"
    for layout in ("off", "7g.80gb"):
        done = mig(node, "minor:1", layout)
        assert done.returncode == 1 and busy in done.stderr, done.stderr
    assert read_migs(node, 1)["migs"][1] == small
    # the 3g cannot start at 0 beside two 2g, so it stays at 4: GI 2, with its process
    assert mig(node, "minor:1", "2g.20gb*2+3g.40gb").returncode == 0
    assert [m[0] for m in read_migs(node, 1)["migs"]] == [2, 3, 4]
    assert read_migs(node, 1)["migs"][0] == small
    proc.terminate()
    wait_exit(proc)
    assert mig(node, "minor:1", "off").returncode == 0


def test_mig_minors(node: Node) -> None:
    """nvidia-caps/mig-minors has the driver's lines, minors and order.

    config 1, monitor 2, then per GPU (32), GPU instance (15) and compute instance (8) the
    consecutive minors; read-only, like the procfs file.
    """
    mig(node, "minor:0", "7g.80gb")
    path = node.dir / "nvidia-caps" / "mig-minors"
    lines = path.read_text().splitlines()
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    by_name = dict(line.split() for line in lines)
    known = {"gpu3/gi3/ci3/access": "439", "gpu6/gi11/ci7/access": "920",
             "gpu31/gi14/ci7/access": "4322", "gpu1/gi0/access": "138"}  # fmt: skip
    assert {k: by_name[k] for k in known} == known
    assert len(lines) == 2 + 32 * 15 * 9
    assert [int(line.split()[1]) for line in lines] == list(range(1, len(lines) + 1))
    assert lines[-1] == "gpu31/gi14/ci7/access 4322"
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    mig(node, "minor:0", "off")
    assert path.read_text().splitlines() == lines  # the same table whatever the layouts
    assert not any(p.name.startswith(".") for p in path.parent.iterdir())  # no temp left
