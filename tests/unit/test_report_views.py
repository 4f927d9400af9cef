"""`slurm-gpu job` notes and bars (reports/jobview.py); `status` (reports/status.py)."""

from __future__ import annotations

from typing import Any

from slurm_gpu.access import Caller, Scope
from slurm_gpu.reports.jobview import Thresholds, bar, notes, render_job
from slurm_gpu.reports.status import build_status
from slurm_gpu.slurm.scontrol import parse_node_gpus
from slurm_gpu.slurm.squeue import parse_running_owners

GIB = 2**30
LIMITS = Thresholds(idle_percent=5.0)


def gpu(uuid: str, util: float | None, mem_gib: float = 10.0, node: str = "gpu1") -> dict[str, Any]:
    return {
        "node": node,
        "gpu_uuid": uuid,
        "gpu_model": "A100",
        "gpu_seconds": 3600.0,
        "active_seconds": 3600.0 if (util or 0) > 5 else 0.0,
        "util_mean_percent": util,
        "util_max_percent": util,
        "mem_max_bytes": int(mem_gib * GIB),
        "mem_gib_seconds": 0.0,
        "energy_joules": 1000.0,
        "missing_seconds": 0.0,
        "cost": 1.0,
        "data_until": 0.0,
    }


JOB = {
    "job_id": 5,
    "job_id_text": "5",
    "name": "train",
    "user": "alice",
    "account": "physics",
    "partition": "gpu",
    "state": "COMPLETED",
    "submit_time": 1.8e9,
    "start_time": 1.8e9,
    "end_time": 1.8e9 + 3600,
    "elapsed_seconds": 3600.0,
    "time_limit_seconds": 86400.0,
    "nodes": "gpu1",
    "alloc_gpus": 2,
    "util_mean_percent": 40.0,
    "queue_wait_seconds": 0.0,
}


def test_bar() -> None:
    """Bars fill by the fraction; unknown is question marks."""
    assert "[##########----------]" == bar(0.5)
    assert "[" + "?" * 20 + "]" == bar(None)


def test_idle_gpu_note() -> None:
    """One idle GPU of two: ask for one."""
    text = notes(JOB, [gpu("GPU-a", 80.0), gpu("GPU-b", 0.0, mem_gib=0.2)], LIMITS)
    assert any("1 of 2 GPUs stayed idle" in n and "ask for 1 GPU(s)" in n for n in text)


def test_time_limit_far_too_long() -> None:
    """A 24 h limit for a 1 h job is flagged; a running job is not."""
    assert any("Time limit far too long" in n for n in notes(JOB, [gpu("GPU-a", 90.0)], LIMITS))
    running = {**JOB, "state": "RUNNING"}
    assert not any("Time limit" in n for n in notes(running, [gpu("GPU-a", 90.0)], LIMITS))


def test_memory_only_use() -> None:
    """Memory held without compute is memory-only use, not plain idle."""
    text = notes(JOB, [gpu("GPU-a", 1.0, mem_gib=30.0)], LIMITS)
    assert any("Memory-only use" in n for n in text)
    assert not any("stayed idle" in n for n in text)


def test_render_job_has_header_and_gpus() -> None:
    """The view names the job, each GPU with bars, and the notes."""
    text = render_job(
        JOB, [gpu("GPU-a", 80.0)], memory_total={"GPU-a": 80 * GIB}, limits=LIMITS, currency="EUR"
    )
    assert "Job 5 (5) train" in text
    assert "10.0/80 GiB" in text
    assert "Notes:" in text


SCONTROL = (
    "NodeName=gpu1 Arch=x86_64 CoresPerSocket=1 CfgTRES=cpu=8,mem=4000M,billing=8,gres/gpu=4,"
    "gres/gpu:a100=4 AllocTRES=cpu=2,gres/gpu=2,gres/gpu:a100=2 State=MIXED ThreadsPerCore=1\n"
    "NodeName=gpu2 CfgTRES=cpu=8,gres/gpu=4 AllocTRES= State=IDLE\n"
)


def interval(uuid: str, job: int | None, util: float, pids: str = "") -> dict[str, Any]:
    return {
        "node": "gpu1",
        "gpu_uuid": uuid,
        "period_start": 0.0,
        "period_end": 60.0,
        "job_id": job,
        "util_mean_percent": util,
        "mem_used_max_bytes": GIB,
        "unallocated_pids": pids,
    }


def test_status_counts() -> None:
    """Total/allocated/free from Slurm; idle-while-allocated and utilization from intervals."""
    nodes, _ = parse_node_gpus(SCONTROL)
    owners, _ = parse_running_owners("7|alice|physics\n8|bob|bio\n")
    rows = [interval("a", 7, 90.0), interval("b", 8, 0.0), interval("c", None, 0.0, "4242")]
    root = Scope(Caller(0, "root"), True)
    status = build_status(
        nodes, rows, {"gpu1": ["a", "b", "c", "d"]}, owners, root, idle_percent=5.0
    )
    assert (8, 2, 6, 1) == (status.gpus, status.alloc, status.free, status.idle_alloc)
    assert 45.0 == status.util_mean_percent
    assert [("gpu1", "c", "4242")] == [
        (u["node"], u["gpu_uuid"], u["pids"]) for u in status.unallocated
    ]


def test_status_private_for_users() -> None:
    """A user's utilization figures cover their jobs only; no unallocated-use list."""
    nodes, _ = parse_node_gpus(SCONTROL)
    owners, _ = parse_running_owners("7|alice|physics\n8|bob|bio\n")
    rows = [interval("a", 7, 90.0), interval("b", 8, 0.0), interval("c", None, 0.0, "4242")]
    alice = Scope(Caller(1001, "alice"), False)
    status = build_status(nodes, rows, {}, owners, alice, idle_percent=5.0)
    assert (2, 0, 90.0, []) == (
        status.alloc,
        status.idle_alloc,
        status.util_mean_percent,
        status.unallocated,
    )
