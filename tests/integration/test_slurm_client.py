"""CliSlurmClient against the live test bed (Slurm 22.05): every call a real command.

The test bed is shared: these tests touch only their own jobs, bob's association in
`bio` (restored in a finally) and gpu2's drain state (resumed at once, in a finally).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_gpu.errors import SlurmError
from slurm_gpu.models import SlurmJob
from slurm_gpu.slurm.client import CliSlurmClient
from slurm_gpu.slurm.runner import SlurmCommands
from tests.integration.testbed import TestBed

LATER = "--begin=now+1hour"  # pending for the whole test, needs no free GPU


@pytest.fixture
def client(testbed: TestBed) -> CliSlurmClient:
    """A client on the test bed's slurm.conf."""
    return CliSlurmClient(SlurmCommands(conf=testbed.env["SLURM_CONF"]))


def _eventually(check: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return check()


def _scontrol_gpus(testbed: TestBed, job_id: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """GPU indices per node read straight from `scontrol -d show job` (a second opinion)."""
    out = testbed.run("scontrol", "-d", "show", "job", str(job_id)).stdout
    found: list[tuple[str, tuple[int, ...]]] = []
    for nodes, idx in re.findall(r"^\s+Nodes=(\S+) .*GRES=\S*\(IDX:([^)]*)\)", out, re.M):
        names = testbed.run("scontrol", "show", "hostnames", nodes).stdout.split()
        indices: list[int] = []
        for part in idx.split(","):
            lo, _, hi = part.partition("-")
            indices.extend(range(int(lo), int(hi or lo) + 1))
        found.extend((name, tuple(indices)) for name in names)
    return tuple(found)


def _job(client: CliSlurmClient, job_id: int, states: tuple[str, ...] = ()) -> SlurmJob:
    return next(job for job in client.jobs(states) if job.job_id == job_id)


def test_jobs_gpus_per_node_match_scontrol(
    testbed: TestBed, client: CliSlurmClient, cancel_after: list[int]
) -> None:
    """A two-node job and a two-GPU job: jobs() gives the GPUs scontrol -d shows."""
    multi = testbed.submit(
        "carol", "-A", "bio", "-N", "2", "--gres=gpu:1", "-t", "3", wrap="sleep 90"
    )
    pair = testbed.submit("alice", "--gres=gpu:2", "-t", "3", wrap="sleep 90")
    cancel_after.extend([multi, pair])
    for job_id in (multi, pair):
        testbed.wait_state(job_id, {"RUNNING"}, timeout=180)
    jobs = {job.job_id: job for job in client.jobs()}
    expected = [(_scontrol_gpus(testbed, multi), 2), (_scontrol_gpus(testbed, pair), 2)]
    actual = [(jobs[multi].gpus, jobs[multi].gpu_count), (jobs[pair].gpus, jobs[pair].gpu_count)]
    assert (expected, 2) == (actual, len(jobs[multi].nodes))


def test_jobs_lists_pending_array_and_gpu_less_jobs(
    testbed: TestBed, client: CliSlurmClient, cancel_after: list[int]
) -> None:
    """A pending array (one record, by its array id) and a job without GPUs are listed."""
    array = testbed.submit("alice", LATER, "--array=0-3", "--gres=gpu:1", "-t", "2", wrap="true")
    plain = testbed.submit("bob", LATER, "-t", "2", wrap="true")
    cancel_after.extend([array, plain])
    jobs = {job.job_id: job for job in client.jobs(("PENDING",))}
    expected = [("PENDING", array, None, 1), ("PENDING", None, None, 0)]
    actual = [
        (jobs[j].state, jobs[j].array_job_id, jobs[j].array_task_id, jobs[j].gpu_count)
        for j in (array, plain)
    ]
    assert expected == actual


def test_json_and_format_backends_agree(
    testbed: TestBed, client: CliSlurmClient, cancel_after: list[int]
) -> None:
    """The squeue -O fallback lists our job exactly as squeue --json does."""
    job_id = testbed.submit("carol", "-A", "physics", LATER, "--gres=gpu:a100:1", wrap="true")
    cancel_after.append(job_id)
    fallback = CliSlurmClient(SlurmCommands(conf=testbed.env["SLURM_CONF"]), use_json=False)
    assert _job(client, job_id) == _job(fallback, job_id)


def test_cancel_records_reason_in_admin_comment(
    testbed: TestBed, client: CliSlurmClient, cancel_after: list[int]
) -> None:
    """After cancel, sacct shows state CANCELLED and our reason in AdminComment."""
    job_id = testbed.submit("alice", LATER, "--gres=gpu:1", wrap="true")
    cancel_after.append(job_id)
    assert {job_id: None} == client.cancel([job_id], "idle GPU for 2h | ünï")

    def row() -> list[str]:
        out = testbed.run(
            "sacct", "-X", "-n", "-P", "--delimiter=\x1f", "-j", str(job_id),
            "-o", "State,AdminComment",
        ).stdout  # fmt: skip
        return (out.splitlines() or [""])[0].split("\x1f")

    _eventually(lambda: row()[0].startswith("CANCELLED") and len(row()) == 2 and bool(row()[1]))
    state, comment = row()
    assert ("CANCELLED", "slurm-gpu: idle GPU for 2h | ünï") == (state.split()[0], comment)


def test_cancel_one_bad_job_does_not_stop_the_others(
    testbed: TestBed, client: CliSlurmClient, cancel_after: list[int]
) -> None:
    """An unknown job id gets an error; the real job is still cancelled."""
    job_id = testbed.submit("bob", LATER, wrap="true")
    cancel_after.append(job_id)
    results = client.cancel([99999999, job_id], "test")
    assert (True, None) == (results[99999999] is not None, results[job_id])
    assert _eventually(lambda: testbed.job_state(job_id) == "CANCELLED")


def test_cancel_pending_array_tasks(
    testbed: TestBed, client: CliSlurmClient, cancel_after: list[int]
) -> None:
    """Cancelling a pending array's record cancels its tasks (as 123_[0-2]) with the reason."""
    array = testbed.submit("alice", LATER, "--array=0-2", "-t", "2", wrap="true")
    cancel_after.append(array)
    assert {array: None} == client.cancel([array], "array test")
    assert _eventually(lambda: testbed.job_state(array) == "CANCELLED")
    assert "slurm-gpu: array test" == testbed.sacct(array, "AdminComment")["AdminComment"]


def test_hold_then_release(
    testbed: TestBed, client: CliSlurmClient, cancel_after: list[int]
) -> None:
    """hold: squeue's reason is JobHeldAdmin and the reason is recorded; release undoes it."""
    job_id = testbed.submit("alice", LATER, wrap="true")
    cancel_after.append(job_id)

    def reason() -> str:
        return testbed.run("squeue", "-h", "-j", str(job_id), "-o", "%r").stdout.strip()

    assert {job_id: None} == client.hold([job_id], "over quota")
    held = (reason(), _job(client, job_id).admin_comment)
    assert {job_id: None} == client.release([job_id])
    assert (("JobHeldAdmin", "slurm-gpu: over quota"), False) == (
        held,
        reason().startswith("JobHeld"),
    )


def test_set_time_limit_comment_and_qos(
    testbed: TestBed, client: CliSlurmClient, cancel_after: list[int]
) -> None:
    """Time limit (rounded up to minutes), Comment and QOS are updated."""
    job_id = testbed.submit("bob", LATER, "-t", "30", wrap="true")
    cancel_after.append(job_id)
    client.set_time_limit(job_id, 9 * 60 + 1)
    client.set_comment(job_id, "capped by slurm-gpu")
    client.set_qos(job_id, "normal")
    job = _job(client, job_id)
    assert (600.0, "capped by slurm-gpu", "normal") == (
        job.time_limit_seconds,
        job.comment,
        job.qos,
    )


def test_set_association_blocks_then_clears_gpus(testbed: TestBed, client: CliSlurmClient) -> None:
    """GrpTRES=gres/gpu=0 on bob@bio shows in sacctmgr; gres/gpu=-1 clears it."""
    (before,) = client.associations(user="bob", account="bio")
    original = before.grp_tres.get("gres/gpu", -1)
    try:
        client.set_association("bio", "bob", GrpTRES="gres/gpu=0")
        shown = testbed.run(
            "sacctmgr", "-n", "-P", "show", "assoc", "where", "user=bob", "account=bio",
            "format=GrpTRES",
        ).stdout.strip()  # fmt: skip
        (blocked,) = client.associations(user="bob", account="bio")
        client.set_association("bio", "bob", GrpTRES="gres/gpu=-1")
        (cleared,) = client.associations(user="bob", account="bio")
    finally:
        client.set_association("bio", "bob", GrpTRES=f"gres/gpu={original}")
    assert ("gres/gpu=0", 0, None) == (
        shown,
        blocked.grp_tres.get("gres/gpu"),
        cleared.grp_tres.get("gres/gpu"),
    )


def test_set_association_unknown_user_raises(client: CliSlurmClient) -> None:
    """Modifying an association that does not exist raises SlurmError."""
    with pytest.raises(SlurmError):
        client.set_association("bio", "nosuchuser", GrpJobs=1)


def test_drain_and_resume_gpu2(client: CliSlurmClient) -> None:
    """gpu2 drained with a reason shows it in nodes(); resume clears the drain at once."""
    try:
        client.drain("gpu2", "integration test, resumed at once")
        drained = next(node for node in client.nodes() if node.name == "gpu2")
    finally:
        client.resume("gpu2")
    after = next(node for node in client.nodes() if node.name == "gpu2")
    assert (True, "slurm-gpu: integration test, resumed at once", False) == (
        drained.drained,
        drained.reason,
        after.drained,
    )


def test_nodes_lists_both_gpu_nodes(testbed: TestBed, client: CliSlurmClient) -> None:
    """nodes(): gpu1 with a100 and gpu2 with h100, each Gres as Slurm prints it."""
    expected = {"gpu1": testbed.gpu1_gres, "gpu2": "gpu:h100:4"}
    assert expected == {n.name: n.gres for n in client.nodes()}


def test_ping_up(client: CliSlurmClient) -> None:
    """The test bed's slurmctld answers."""
    client.ping()


def test_ping_wrong_port_raises(testbed: TestBed, tmp_path: Path) -> None:
    """A slurm.conf pointing at a port nobody listens on: ping raises SlurmError."""
    conf = Path(testbed.env["SLURM_CONF"]).read_text()
    wrong = tmp_path / "slurm.conf"
    wrong.write_text(re.sub(r"(?m)^SlurmctldPort=\d+", "SlurmctldPort=1", conf))
    client = CliSlurmClient(SlurmCommands(conf=str(wrong), timeout=60))
    with pytest.raises(SlurmError, match="slurmctld is not responding"):
        client.ping()


def test_admin_levels_and_coordinators(client: CliSlurmClient) -> None:
    """root is Administrator; both accounts are listed with their coordinators."""
    levels = client.admin_levels()
    accounts = client.coordinators()
    assert ("Administrator", "None", {"bio", "physics"} <= set(accounts)) == (
        levels["root"],
        levels["alice"],
        True,
    )


def test_gpu_nodes_and_running_owners_see_a_running_job(
    testbed: TestBed, client: CliSlurmClient, cancel_after: list[int]
) -> None:
    """A running 2-GPU job of alice: its owner is known, its node counts it as allocated.

    Other tests may hold GPUs at the same time, so the node's count is at least 2.
    """
    job = testbed.submit("alice", "--gres=gpu:2", "-t", "3", wrap="sleep 90")
    cancel_after.append(job)
    testbed.wait_state(job, {"RUNNING"}, timeout=180)
    node = testbed.sacct(job, "NodeList")["NodeList"]
    counts = {n.name: (n.gpus, n.alloc_gpus) for n in client.gpu_nodes()}
    owner = client.running_owners()[job]
    assert ({"gpu1", "gpu2"}, 4, True, ("alice", "physics"), []) == (
        set(counts),
        counts[node][0],
        counts[node][1] >= 2,
        (owner.user, owner.account),
        client.problems,
    )


def test_slurm_user_is_the_bed_slurm_user(client: CliSlurmClient) -> None:
    """slurm_user(): the test bed's slurmctld runs as `slurm`."""
    assert ("slurm", []) == (client.slurm_user(), client.problems)
