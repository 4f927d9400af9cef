"""The collector writes finished jobs' AdminComment (an agent shipping to it reads no store)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from slurm_gpu.collector.admin_comments import AdminComments
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.models import JobGpuSummary
from slurm_gpu.store import Store

T0 = 1_800_000_000.0


def summary(job_id: int, node: str) -> JobGpuSummary:
    return JobGpuSummary(
        job_id=job_id, node=node, gpu_uuid=f"GPU-{node}", gpu_model="NVIDIA H100", start=T0,
        end=T0 + 3600, gpu_seconds=3600.0, util_mean_percent=80.0, util_max_percent=99.0,
        active_seconds=3000.0, mem_max_bytes=2**34, mem_gib_seconds=57600.0,
        energy_joules=1.0e6, reading_count=60, missing_seconds=0.0,
    )  # fmt: skip


class Slurm:
    """sacct answers job 8 with an AdminComment of the site's; sacctmgr is recorded."""

    def __init__(self, failing: set[int]) -> None:
        self.failing = failing
        self.modified: dict[int, str] = {}

    def __call__(self, argv: Sequence[str]) -> str:
        job = int(argv[argv.index("-j") + 1]) if "-j" in argv else int(argv[5].split("=")[1])
        if job in self.failing:
            raise SlurmGpuError(f"sacctmgr: job {job}: slurmdbd is not answering")
        if argv[0] == "sacct":
            return "site-note\n" if job == 8 else ""
        self.modified[job] = argv[-1].removeprefix("AdminComment=")
        return ""


def test_each_committed_jobs_token_merges_every_nodes_summaries(tmp_path: Path) -> None:
    """Jobs 7 (two nodes) and 8: one token each, over the site's own AdminComment text.

    A job Slurm refuses (9) is logged and does not stop the others.
    """
    with Store(f"sqlite:///{tmp_path / 's.db'}", cluster="c1") as store:
        store.upgrade()
        store.add_summaries([summary(7, "gpu1"), summary(7, "gpu2"), summary(8, "gpu1")])
        slurm = Slurm(failing={9})
        comments = AdminComments(slurm, store, "c1")
        comments.start()
        comments([9, 7])
        comments([8])
        comments.stop()
    assert [7, 8] == sorted(slurm.modified)
    assert slurm.modified[7].startswith("slurm-gpu:v2:gpus=2,gpu_s=7200,")
    assert slurm.modified[8].startswith("site-note slurm-gpu:v2:gpus=1,gpu_s=3600,")
