"""The collector writes finished jobs' AdminComment (an agent shipping to it reads no store)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

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
    """sacct answers job 8 with an AdminComment of the site's; sacctmgr is recorded.

    A job in `failing` is refused (slurmdbd down), `failures` times each (None: always).
    """

    def __init__(self, failing: set[int], failures: int | None = None) -> None:
        self.failing = failing
        self.failures = failures
        self.refused: dict[int, int] = {}
        self.modified: dict[int, str] = {}

    def __call__(self, argv: Sequence[str]) -> str:
        job = int(argv[argv.index("-j") + 1]) if "-j" in argv else int(argv[5].split("=")[1])
        refused = self.refused.get(job, 0)
        if job in self.failing and (self.failures is None or refused < self.failures):
            self.refused[job] = refused + 1
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


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_job_refused_while_slurmdbd_is_down_is_written_once_it_answers(tmp_path: Path) -> None:
    """Job 9 refused twice (slurmdbd down), then written: its token over its summary."""
    with Store(f"sqlite:///{tmp_path / 's.db'}", cluster="c1") as store:
        store.upgrade()
        store.add_summaries([summary(9, "gpu1")])
        slurm = Slurm(failing={9}, failures=2)
        comments = AdminComments(slurm, store, "c1", first_retry=0.05)
        comments.start()
        comments([9])
        wait_until(lambda: 9 in slurm.modified)
        comments.stop()
    assert 2 == slurm.refused[9]
    assert slurm.modified[9].startswith("slurm-gpu:v2:gpus=1,gpu_s=3600,")
    assert [] == comments.pending_retries()


def test_a_job_slurm_keeps_refusing_is_given_up_with_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Past give_up_after the job is dropped with an error naming it; others go on."""
    with Store(f"sqlite:///{tmp_path / 's.db'}", cluster="c1") as store:
        store.upgrade()
        store.add_summaries([summary(9, "gpu1"), summary(8, "gpu1")])
        slurm = Slurm(failing={9})
        comments = AdminComments(slurm, store, "c1", first_retry=0.02, give_up_after=0.2)
        comments.start()
        comments([9])
        wait_until(lambda: "gave up" in caplog.text)
        comments([8])
        comments.stop()
    assert "gave up writing the AdminComment of job 9" in caplog.text
    assert [8] == sorted(slurm.modified)
    assert [] == comments.pending_retries()
    assert slurm.refused[9] >= 3  # tried again before giving up


def test_stopping_with_retries_waiting_names_the_jobs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Store(f"sqlite:///{tmp_path / 's.db'}", cluster="c1") as store:
        store.upgrade()
        store.add_summaries([summary(9, "gpu1")])
        comments = AdminComments(Slurm(failing={9}), store, "c1", first_retry=60.0)
        comments.start()
        comments([9])
        wait_until(lambda: comments.pending_retries() == [9])
        comments.stop()
    assert "AdminComment of jobs 9 not written" in caplog.text
