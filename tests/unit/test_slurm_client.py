"""CliSlurmClient against a scripted runner replaying real 22.05 output (no Slurm needed)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from slurm_gpu.errors import SlurmError
from slurm_gpu.slurm.client import CliSlurmClient, SlurmClient, merge_reason
from slurm_gpu.testing import FakeRunner, Response

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
SQUEUE_JSON = (DATA / "squeue-22.05.json").read_text()
SQUEUE_FORMAT = (DATA / "squeue-22.05-format.txt").read_text()
SCONTROL = (DATA / "scontrol-d-show-job-22.05.txt").read_text()


def _client(
    replies: dict[tuple[str, ...], Response] | None = None,
) -> tuple[CliSlurmClient, FakeRunner]:
    """A client whose runner answers squeue --json and scontrol -d from the 22.05 capture.

    `replies` come first, so they override those defaults; any other command (scontrol
    update, scancel) prints nothing.
    """
    table: dict[tuple[str, ...], Response] = dict(replies or {})
    table.setdefault(("squeue", "--json"), SQUEUE_JSON)
    table.setdefault(("scontrol", "-d", "show", "job"), SCONTROL)
    table.setdefault((), "")
    runner = FakeRunner(table)
    return CliSlurmClient(runner, tz=dt.UTC), runner


def _json_with(job_id: int, **fields: object) -> str:
    document = json.loads(SQUEUE_JSON)
    for job in document["jobs"]:
        if job["job_id"] == job_id:
            job.update(fields)
    return json.dumps(document)


def test_cli_client_is_a_slurm_client() -> None:
    """CliSlurmClient satisfies the SlurmClient protocol."""
    assert isinstance(CliSlurmClient(FakeRunner({})), SlurmClient)


def test_jobs_fills_gpus_per_node_for_running_jobs() -> None:
    """Running GPU jobs get their indices per node from scontrol -d."""
    client, _ = _client()
    gpus = {job.job_id: job.gpus for job in client.jobs()}
    expected = {
        275: (("gpu1", (0,)), ("gpu2", (0,))),
        274: (("gpu2", (1, 2)),),
        279: (("gpu1", (3,)),),
        276: (),
        272: (),
    }
    assert expected == {k: gpus[k] for k in expected}


def test_jobs_runs_squeue_then_one_scontrol() -> None:
    """One squeue and one scontrol call, whatever the number of jobs."""
    client, runner = _client()
    client.jobs()
    assert ["squeue --json", "scontrol -d"] == runner.commands()


def test_jobs_skips_scontrol_without_running_gpu_jobs() -> None:
    """Only pending jobs wanted: no scontrol call."""
    client, runner = _client()
    client.jobs(states=["PENDING"])
    assert ["squeue --json"] == runner.commands()


def test_jobs_falls_back_to_format_and_remembers() -> None:
    """--json failing where -O works switches to -O for good."""
    client, runner = _client(
        {
            ("squeue", "--json"): SlurmError("squeue --json failed (exit 1): unrecognized"),
            ("squeue", "-h"): SQUEUE_FORMAT,
        }
    )
    first = client.jobs()
    second = client.jobs()
    expected = ["squeue --json", "squeue -h", "scontrol -d", "squeue -h", "scontrol -d"]
    assert (first, expected) == (second, runner.commands())


def test_fallback_gives_the_same_jobs_as_json() -> None:
    """The -O path, GPUs included, lists the same jobs as the --json path."""
    json_client, _ = _client()
    format_client, _ = _client(
        {("squeue", "--json"): SlurmError("no"), ("squeue", "-h"): SQUEUE_FORMAT}
    )
    assert sorted(json_client.jobs(), key=lambda j: j.job_id) == sorted(
        format_client.jobs(), key=lambda j: j.job_id
    )


def test_jobs_raises_when_slurmctld_is_down() -> None:
    """Both squeue forms failing raise SlurmError."""
    client, _ = _client({("squeue",): SlurmError("squeue failed (exit 1): Unable to contact")})
    with pytest.raises(SlurmError, match="Unable to contact"):
        client.jobs()


def test_jobs_uses_gres_detail_for_one_node_jobs_when_scontrol_fails() -> None:
    """scontrol failing: single-node jobs take --json gres_detail, multi-node are unknown."""
    client, _ = _client({("scontrol", "-d"): SlurmError("scontrol failed (exit 1): timeout")})
    gpus = {job.job_id: job.gpus for job in client.jobs()}
    assert ((("gpu2", (1, 2)),), ()) == (gpus[274], gpus[275])


def test_jobs_reports_when_gpus_are_unknown() -> None:
    """The multi-node job without scontrol detail is a problem line."""
    client, _ = _client({("scontrol", "-d"): SlurmError("scontrol failed (exit 1): timeout")})
    client.jobs()
    assert ["scontrol -d show job failed", "job 275"] == [
        next(w for w in ("scontrol -d show job failed", "job 275") if w in p)
        for p in client.problems
    ]


def test_jobs_distrusts_scontrol_disagreeing_with_squeue() -> None:
    """squeue says 4 GPUs, scontrol shows 1: the job's GPUs stay unknown, reported."""
    client, _ = _client({("squeue", "--json"): _json_with(279, tres_alloc_str="gres/gpu=4")})
    job = next(j for j in client.jobs() if j.job_id == 279)
    assert ((), True) == (job.gpus, any("job 279" in p for p in client.problems))


def _cancel_client(
    replies: dict[tuple[str, ...], Response] | None = None,
) -> tuple[CliSlurmClient, FakeRunner]:
    """_client() where job 275 already has an AdminComment ("ticket 42")."""
    table = {("squeue", "--json"): _json_with(275, admin_comment="ticket 42"), **(replies or {})}
    return _client(table)


def test_cancel_sets_admin_comment_before_scancel() -> None:
    """Per job: scontrol update AdminComment=..., then scancel."""
    client, runner = _cancel_client()
    client.cancel([276], "idle GPUs for 2h")
    assert [
        ["scontrol", "update", "JobId=276", "AdminComment=slurm-gpu: idle GPUs for 2h"],
        ["scancel", "276"],
    ] == runner.calls[1:]


def test_cancel_keeps_an_existing_admin_comment() -> None:
    """Text already in the AdminComment is kept before ours."""
    client, runner = _cancel_client()
    client.cancel([275], "idle")
    assert "AdminComment=ticket 42; slurm-gpu: idle" == runner.calls[1][3]


def test_cancel_names_array_tasks() -> None:
    """Array task 279 is cancelled as 272_0 (scancel 272 would end the whole array)."""
    client, runner = _cancel_client()
    client.cancel([279], "idle")
    assert ["scancel", "272_0"] == runner.calls[-1]


def test_cancel_one_failure_does_not_stop_the_others() -> None:
    """A failing scancel is that job's error; the next job is still cancelled."""
    client, runner = _cancel_client(
        {("scancel", "276"): SlurmError("scancel failed (exit 1): Invalid job id")}
    )
    results = client.cancel([276, 277], "idle")
    assert ({276: "scancel failed (exit 1): Invalid job id", 277: None}, ["scancel", "277"]) == (
        results,
        runner.calls[-1],
    )


def test_cancel_without_admin_comment_does_not_scancel() -> None:
    """If the reason cannot be recorded, the job is not cancelled."""
    client, runner = _cancel_client(
        {("scontrol", "update"): SlurmError("scontrol update failed (exit 1): Access denied")}
    )
    results = client.cancel([276], "idle")
    assert (True, False) == (
        "Access denied" in (results[276] or ""),
        any(call[0] == "scancel" for call in runner.calls),
    )


def test_cancel_unknown_or_finished_jobs_are_errors() -> None:
    """A job squeue does not list, or one already finished, is reported, not touched."""
    client, runner = _client({("squeue", "--json"): _json_with(276, job_state="COMPLETED")})
    results = client.cancel([999, 276], "idle")
    assert (["not found", "already COMPLETED"], 1) == (
        [results[999] and "not found", results[276] and "already COMPLETED"],
        len(runner.calls),
    )


def test_hold_records_reason_then_holds() -> None:
    """hold: AdminComment, then scontrol hold."""
    client, runner = _cancel_client()
    assert {277: None} == client.hold([277], "over quota")
    assert [
        ["scontrol", "update", "JobId=277", "AdminComment=slurm-gpu: over quota"],
        ["scontrol", "hold", "277"],
    ] == runner.calls[1:]


def test_release() -> None:
    """release: scontrol release per job, the pending array tasks by range."""
    client, runner = _client()
    assert {272: None} == client.release([272])
    assert ["scontrol", "release", "272_[2-3]"] == runner.calls[-1]


def test_set_time_limit_rounds_up_to_minutes() -> None:
    """90 s becomes TimeLimit=2 (Slurm counts minutes)."""
    client, runner = _client()
    client.set_time_limit(275, 90)
    assert ["scontrol", "update", "JobId=275", "TimeLimit=2"] == runner.calls[-1]


def test_set_time_limit_rejects_nonsense() -> None:
    """Zero or negative limits raise SlurmError before any command runs."""
    client, runner = _client()
    with pytest.raises(SlurmError):
        client.set_time_limit(275, 0)
    assert [] == runner.calls


def test_set_comment_flattens_newlines() -> None:
    """Comment text is one line."""
    client, runner = _client()
    client.set_comment(276, "GPU idle\nsee report")
    assert ["scontrol", "update", "JobId=276", "Comment=GPU idle see report"] == runner.calls[-1]


def test_set_qos() -> None:
    """QOS change through scontrol update."""
    client, runner = _client()
    client.set_qos(277, "low")
    assert ["scontrol", "update", "JobId=277", "QOS=low"] == runner.calls[-1]


def test_update_of_unknown_job_raises() -> None:
    """An update for a job squeue does not list raises SlurmError naming it."""
    client, _ = _client()
    with pytest.raises(SlurmError, match="job 999"):
        client.set_comment(999, "x")


def test_set_association_nothing_modified_raises() -> None:
    """sacctmgr's "Nothing modified" is an error naming the association."""
    client, _ = _client({("sacctmgr",): " Nothing modified\n"})
    with pytest.raises(SlurmError, match="user bob in account bio"):
        client.set_association("bio", "bob", GrpTRES="gres/gpu=0")


def test_associations_reports_bad_lines() -> None:
    """Associations come back parsed; a bad line is in problems."""
    text = (DATA / "handmade" / "sacctmgr-show-assoc-21.08-like.txt").read_text()
    client, _ = _client({("sacctmgr",): text})
    assert (3, 3) == (len(client.associations()), len(client.problems))


def test_drain_and_resume_commands() -> None:
    """drain prefixes the reason; resume sets State=RESUME."""
    client, runner = _client()
    client.drain("gpu2", "hot\nnode")
    client.resume("gpu2")
    assert [
        ["scontrol", "update", "NodeName=gpu2", "State=DRAIN", "Reason=slurm-gpu: hot node"],
        ["scontrol", "update", "NodeName=gpu2", "State=RESUME"],
    ] == runner.calls


def test_drain_rejects_odd_node_names() -> None:
    """A node name with spaces (argument injection) raises SlurmError."""
    client, _ = _client()
    with pytest.raises(SlurmError):
        client.drain("gpu1 State=DOWN", "x")


def test_ping_failure_says_slurmctld() -> None:
    """A failing scontrol ping raises SlurmError saying slurmctld is not responding."""
    client, _ = _client({("scontrol", "ping"): SlurmError("scontrol ping failed (exit 1): ****")})
    with pytest.raises(SlurmError, match="slurmctld is not responding"):
        client.ping()


def test_merge_reason_into_empty() -> None:
    """An empty AdminComment becomes our reason."""
    assert "slurm-gpu: idle" == merge_reason("", "idle")


def test_merge_reason_keeps_the_summary_token() -> None:
    """The slurm-gpu:v1 summary token and other text stay."""
    existing = "slurm-gpu:v1:gpus=2,gpu_s=180"
    assert f"{existing}; slurm-gpu: idle" == merge_reason(existing, "idle")


def test_merge_reason_not_repeated() -> None:
    """The same reason twice is recorded once."""
    assert "slurm-gpu: idle" == merge_reason("slurm-gpu: idle", "idle")


def test_gpu_nodes_reads_scontrol_show_node() -> None:
    """gpu_nodes(): `scontrol -o show node` read into per-node GPU counts."""
    text = (DATA / "scontrol-o-show-node-22.05.txt").read_text()
    client, runner = _client({("scontrol", "-o", "show", "node"): text})
    counts = {n.name: (n.state, n.gpus, n.alloc_gpus) for n in client.gpu_nodes()}
    assert ({"gpu1": ("MIXED", 4, 2), "gpu2": ("IDLE", 4, 0)}, ["scontrol -o"]) == (
        counts,
        runner.commands(),
    )


def test_running_owners_reports_bad_lines() -> None:
    """running_owners(): {job: owner}; an unparsable squeue line is in problems."""
    client, _ = _client({("squeue", "-h", "-t", "R,CG"): "7|alice|physics\nnoise\n"})
    owners = client.running_owners()
    assert ({7: ("alice", "physics")}, 1) == (
        {job: (o.user, o.account) for job, o in owners.items()},
        len(client.problems),
    )


def test_slurm_user_from_show_config() -> None:
    """slurm_user(): the name before the uid; a config without one is "" and a problem."""
    config = "SlurmUser               = slurm(64030)\n"
    named, _ = _client({("scontrol", "show", "config"): config})
    unnamed, _ = _client({("scontrol", "show", "config"): "ClusterName = testbed\n"})
    assert ("slurm", "", 1) == (named.slurm_user(), unnamed.slurm_user(), len(unnamed.problems))
