"""The Slurm parsers over the real output of every release the test bed runs.

tests/data/<release>/ holds what `python -m tests.data.capture_release` captured on the
test bed of that release (`local-cluster up --slurm RELEASE`): the same jobs every time
(jobs.json names their ids): alice's 2-GPU job on gpu1 with an odd name, a comment and a
30-minute limit; bob's 2-task GPU array on gpu2; carol's pending GPU job and her finished
one. Each test reads what slurm-gpu would read from that release and checks what a user
would be shown.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu.slurm import sacct, scontrol, squeue

DATA = Path(__file__).resolve().parents[1] / "data"
RELEASES = sorted(p.parent.name for p in DATA.glob("*/jobs.json"))
ODD_NAME = "<b>odd</b> ünï|x"


def test_every_release_of_the_test_bed_is_captured() -> None:
    """The matrix of docker/slurm-cluster/release-root.sh, each with its captures."""
    assert RELEASES == ["22.05", "24.11"] or RELEASES == ["22.05", "24.11", "26.05"]


def _jobs(release: str) -> dict[str, int]:
    ids: dict[str, int] = json.loads((DATA / release / "jobs.json").read_text())
    return ids


def _text(release: str, name: str) -> str:
    return (DATA / release / name).read_text()


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    """One captured release."""
    value: str = request.param
    return value


@pytest.mark.parametrize("source", ["json", "format"])
def test_squeue_lists_the_jobs_with_owner_gpus_and_state(release: str, source: str) -> None:
    """squeue --json (each release's schema) and squeue -O read the same four jobs."""
    ids = _jobs(release)
    states = ("RUNNING", "PENDING")
    if source == "json":
        result = squeue.parse_squeue_json(_text(release, "squeue.json"), states, None)
    else:
        result = squeue.parse_squeue_format(_text(release, "squeue-format.txt"), states, None)
    assert result.problems == []
    jobs = {job.job_id: job for job in result.jobs}
    alice = jobs[ids["alice"]]
    assert (alice.user, alice.account, alice.state, alice.nodes, alice.gpu_count) == (
        "alice",
        "physics",
        "RUNNING",
        ("gpu1",),
        2,
    )
    assert (alice.name, alice.comment, alice.time_limit_seconds) == (ODD_NAME, "capture", 1800.0)
    assert alice.start_time is not None and alice.submit_time is not None
    assert alice.start_time >= alice.submit_time
    bob = sorted(
        (j for j in result.jobs if ids["bob_array"] in (j.job_id, j.array_job_id)),
        key=lambda j: j.job_id,
    )
    assert [(j.user, j.state, j.nodes, j.gpu_count) for j in bob] == [
        ("bob", "RUNNING", ("gpu2",), 1)
    ] * 2
    assert {j.array_task_id for j in bob} == {0, 1}
    pending = jobs[ids["pending"]]
    assert (pending.user, pending.state, pending.nodes, pending.gpu_count) == (
        "carol",
        "PENDING",
        (),
        1,
    )


def test_scontrol_gives_each_running_job_its_gpu_indices(release: str) -> None:
    """scontrol -d show job: alice holds 2 GPUs of gpu1, bob's tasks one each of gpu2."""
    ids = _jobs(release)
    listing = squeue.parse_squeue_json(_text(release, "squeue.json"), (), None)
    names = {job.job_id: job.name for job in listing.jobs}
    details, problems = scontrol.parse_job_gpu_details(
        _text(release, "scontrol-d-show-job.txt"), names
    )
    assert problems == []
    [(node, alice)] = details[ids["alice"]]
    assert node == "gpu1" and len(alice) == 2 and set(alice) <= {0, 1, 2, 3}
    bob = [
        details[j.job_id] for j in listing.jobs if ids["bob_array"] in (j.job_id, j.array_job_id)
    ]
    assert sorted(idx for [(node, (idx,))] in bob if node == "gpu2") == [0, 1]
    assert details[ids["pending"]] == ()
    # squeue --json's gres_detail agrees where the release has it (22.05 and later).
    from_json = scontrol.gpus_from_gres_detail(("gpu1",), listing.gres_detail.get(ids["alice"], ()))
    assert from_json == details[ids["alice"]]


def test_nodes_owners_and_slurm_user(release: str) -> None:
    """scontrol -o show node, sinfo, squeue -o owners and scontrol show config."""
    ids = _jobs(release)
    gpu_nodes, problems = scontrol.parse_node_gpus(_text(release, "scontrol-o-show-node.txt"))
    assert problems == []
    # The capture's jobs hold 2 GPUs of each node (on a shared test bed, others' jobs more).
    assert [(n.name, n.gpus) for n in gpu_nodes] == [("gpu1", 4), ("gpu2", 4)]
    assert all(n.alloc_gpus >= 2 for n in gpu_nodes)
    nodes, problems = scontrol.parse_sinfo_nodes(_text(release, "sinfo-nodes.txt"))
    assert problems == []
    assert [(n.name, n.gres, n.responding, n.drained) for n in nodes] == [
        ("gpu1", "gpu:a100:4", True, False),
        ("gpu2", "gpu:h100:4", True, False),
    ]
    owners, problems = squeue.parse_running_owners(_text(release, "squeue-owners.txt"))
    assert problems == []
    assert owners[ids["alice"]] == squeue.JobOwner(user="alice", account="physics")
    bob = squeue.JobOwner(user="bob", account="bio")
    assert [o for j, o in owners.items() if j > ids["bob_array"]].count(bob) >= 1
    assert owners[ids["bob_array"]] == bob
    assert scontrol.parse_slurm_user(_text(release, "scontrol-show-config.txt")) == "slurm"


def test_sacct_reads_the_finished_and_the_running_job(release: str) -> None:
    """sacct -P (slurm-gpu's fields): GPUs by type, states, times, exit code."""
    ids = _jobs(release)
    rows = {job.job_id: job for job in sacct.parse_sacct(_text(release, "sacct.txt"))}
    done = rows[ids["finished"]]
    assert (done.user, done.account, done.state, done.alloc_gpus, done.exit_code) == (
        "carol",
        "bio",
        "COMPLETED",
        1,
        0,
    )
    assert done.end_time is not None and done.start_time is not None
    assert done.end_time >= done.start_time
    alice = rows[ids["alice"]]
    assert (alice.name, alice.state, alice.alloc_gpus, alice.gpu_types) == (
        ODD_NAME,
        "RUNNING",
        2,
        (("a100", 2),),
    )
    assert alice.end_time is None and alice.time_limit_seconds == 1800.0


def test_sacct_json_of_the_release_names_the_same_jobs(release: str) -> None:
    """sacct --json (captured for reference): job ids, users and GPU TRES of each job."""
    ids = _jobs(release)
    document = json.loads(_text(release, "sacct.json"))
    jobs = {job["job_id"]: job for job in document["jobs"]}
    assert set(jobs) == {ids["finished"], ids["alice"]}
    assert jobs[ids["alice"]]["user"] == "alice"
    allocated = jobs[ids["alice"]]["tres"]["allocated"]
    assert {"type": "gres", "name": "gpu", "count": 2} in [
        {k: t.get(k) for k in ("type", "name", "count")} for t in allocated
    ]
