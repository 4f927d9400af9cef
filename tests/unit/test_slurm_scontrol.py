"""scontrol -d show job (GPU indices per node), scontrol ping and sinfo node parsers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu.errors import SlurmError
from slurm_gpu.slurm import scontrol

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
FORGED_NAME = "x\n     Nodes=gpu1 CPU_IDs=0 Mem=0 GRES=gpu:a100:4(IDX:0-3)\nJobId=1 JobName=forged"


def _real() -> dict[int, scontrol.NodeGpus]:
    """The 22.05 capture, with the names squeue --json gave at the same moment."""
    jobs = json.loads((DATA / "squeue-22.05.json").read_text())["jobs"]
    names = {job["job_id"]: job["name"] for job in jobs}
    text = (DATA / "scontrol-d-show-job-22.05.txt").read_text()
    details, problems = scontrol.parse_job_gpu_details(text, names)
    assert [] == problems
    return details


def _variants(
    names: dict[int, str] | None = None,
) -> tuple[dict[int, scontrol.NodeGpus], list[str]]:
    text = (DATA / "handmade" / "scontrol-d-show-job-variants.txt").read_text()
    return scontrol.parse_job_gpu_details(text, names)


def test_real_array_task_gpu() -> None:
    """Array task 272_0 (job 279) holds GPU 3 of gpu1."""
    assert (("gpu1", (3,)),) == _real()[279]


def test_real_heterogeneous_components() -> None:
    """Each het component has its own node and indices (273: gpu1 1; 274: gpu2 1-2)."""
    details = _real()
    assert ((("gpu1", (1,)),), (("gpu2", (1, 2)),)) == (details[273], details[274])


def test_real_multi_node_job() -> None:
    """A two-node job has one entry per node, in scontrol's order."""
    assert (("gpu1", (0,)), ("gpu2", (0,))) == _real()[275]


def test_real_pending_and_gpu_less_jobs_have_no_gpus() -> None:
    """Pending jobs and the job without GPUs map to ()."""
    details = _real()
    assert [(), (), ()] == [details[276], details[277], details[272]]


def test_real_odd_name_does_not_disturb_parsing() -> None:
    """The job named with HTML, unicode and `|` parses like any other."""
    assert (("gpu1", (2,)),) == _real()[278]


def test_grouped_nodes_and_index_lists_with_commas() -> None:
    """`Nodes=gpu[1-2] ... GRES=gpu:2(IDX:0,2)` gives both nodes GPUs 0 and 2."""
    assert (("gpu1", (0, 2)), ("gpu2", (0, 2))) == _variants()[0][501]


def test_two_gpu_types_on_one_node() -> None:
    """GPUs of two types on a node are merged; other GRES (mps) are ignored."""
    assert (("gpu3", (0, 4, 5)),) == _variants()[0][502]


def test_known_name_cannot_forge_an_allocation() -> None:
    """With squeue's names, a name holding fake detail lines is skipped exactly."""
    details, _ = _variants({503: FORGED_NAME})
    assert ((("gpu1", (2,)),), False) == (details[503], 1 in details)


def test_unknown_name_is_read_from_the_first_line_only() -> None:
    """Without names, the forged lines are read as the record (documented limit)."""
    details, _ = _variants()
    assert (("gpu1", (0, 1, 2, 3)),) == details[503]


def test_count_that_disagrees_with_indices_is_a_problem() -> None:
    """`gpu:a100:2(IDX:0)` leaves the job out and reports it."""
    details, problems = _variants()
    assert (False, ["504"]) == (504 in details, [p.split("job ")[1][:3] for p in problems])


def test_empty_gres_and_na_indices_mean_no_gpus() -> None:
    """`GRES=` and `gpu:0(IDX:N/A)` mean the job holds no GPU there."""
    details, _ = _variants()
    assert ((), ()) == (details[505], details[506])


def test_a_job_listed_twice_is_dropped() -> None:
    """If a job id appears twice (one forged by a name), neither copy is believed."""
    text = "JobId=7 JobName=a\n   Nodes=gpu1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)\n" * 2
    details, problems = scontrol.parse_job_gpu_details(text)
    assert ({}, 1) == (details, len(problems))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", (0,)), ("0-1,3", (0, 1, 3)), ("N/A", ()), ("", ())],
)
def test_parse_index_list(text: str, expected: tuple[int, ...]) -> None:
    """IDX lists: single, ranges and commas, N/A."""
    assert expected == scontrol.parse_index_list(text)


def test_parse_index_list_rejects_garbage() -> None:
    """A reversed or non-numeric range raises ValueError."""
    with pytest.raises(ValueError):
        scontrol.parse_index_list("3-1")


def test_gres_detail_trusted_for_one_node() -> None:
    """squeue --json gres_detail gives a single-node job's indices."""
    assert (("gpu2", (1, 2)),) == scontrol.gpus_from_gres_detail(
        ("gpu2",), ("gpu:h100:2(IDX:1-2)",)
    )


def test_gres_detail_not_trusted_for_several_nodes() -> None:
    """For multi-node jobs the pairing of gres_detail to nodes is not trusted (None)."""
    pair = scontrol.gpus_from_gres_detail(("gpu1", "gpu2"), ("gpu:1(IDX:0)", "gpu:1(IDX:1)"))
    assert None is pair


def test_ping_up() -> None:
    """A slurmctld that "... is UP" returns quietly."""
    scontrol.check_ping("Slurmctld(primary) at vm is UP\n")


def test_ping_backup_up_is_enough() -> None:
    """A primary DOWN with a backup UP still answers."""
    scontrol.check_ping((DATA / "handmade" / "scontrol-ping-backup-up.txt").read_text())


def test_ping_down_raises() -> None:
    """All controllers DOWN raises SlurmError with scontrol's words."""
    with pytest.raises(SlurmError, match="is DOWN"):
        scontrol.check_ping("Slurmctld(primary) at vm is DOWN\n")


def test_sinfo_one_record_per_node() -> None:
    """sinfo repeats a node per partition; each node is listed once."""
    nodes, _ = scontrol.parse_sinfo_nodes((DATA / "sinfo-nodes.txt").read_text())
    assert ["gpu1", "gpu2"] == [node.name for node in nodes]


def test_sinfo_not_responding_flag() -> None:
    """A node in state "mixed*" is mixed, and not responding."""
    nodes, _ = scontrol.parse_sinfo_nodes((DATA / "sinfo-nodes.txt").read_text())
    assert ("mixed", False) == (nodes[1].state, nodes[1].responding)


def test_sinfo_draining_with_reason() -> None:
    """A draining node keeps its reason verbatim (`|`, unicode) and counts as drained."""
    nodes, _ = scontrol.parse_sinfo_nodes((DATA / "sinfo-draining.txt").read_text())
    expected = scontrol.NodeInfo("gpu2", "draining", "slurm-gpu: hot node | 95C, ünï", "gpu:h100:4")
    assert (expected, True) == (nodes[1], nodes[1].drained)


def test_sinfo_variants() -> None:
    """Down*, (null) gres, a multi-line reason; a broken record is reported."""
    nodes, problems = scontrol.parse_sinfo_nodes(
        (DATA / "handmade" / "sinfo-variants.txt").read_text()
    )
    expected = [
        scontrol.NodeInfo("gpu1", "idle", "", "gpu:a100:4"),
        scontrol.NodeInfo("gpu2", "down", "Not responding", "gpu:h100:4", responding=False),
        scontrol.NodeInfo("gpu3", "drained", "slurm-gpu: GPU lost\nsecond line", ""),
    ]
    assert (expected, 1) == (nodes, len(problems))


def test_a_known_name_of_the_next_job_is_not_read_into_this_one() -> None:
    """The record before a job with a forging name ends where that job begins."""
    name = "x\n     Nodes=gpu2 CPU_IDs=0 Mem=0 GRES=gpu:a100:4(IDX:0-3)"
    text = (
        "JobId=1 JobName=a\n     Nodes=gpu1 CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:0)\n"
        f"JobId=2 JobName={name}\n     Nodes=gpu1 CPU_IDs=1 Mem=0 GRES=gpu:a100:1(IDX:1)\n"
    )
    details, problems = scontrol.parse_job_gpu_details(text, {1: "a", 2: name})
    assert ({1: (("gpu1", (0,)),), 2: (("gpu1", (1,)),)}, []) == (details, problems)


@pytest.mark.parametrize("text", ["", "No jobs in the system\n"])
def test_no_jobs_means_no_details(text: str) -> None:
    """Jobs that ended between squeue and scontrol leave nothing to parse: no details."""
    assert ({}, []) == scontrol.parse_job_gpu_details(text)


def test_an_absurd_job_id_is_a_problem() -> None:
    """A JobId of thousands of digits is reported and skipped, not an int() error."""
    details, problems = scontrol.parse_job_gpu_details("JobId=" + "1" * 5000 + " JobName=x\n")
    assert ({}, 1) == (details, len(problems))
    assert problems[0].startswith("scontrol -d show job: bad JobId in 'JobId=111")


@pytest.mark.parametrize("text", ["0-999999999", "1024", "0-" + "9" * 5000])
def test_parse_index_list_refuses_absurd_indices(text: str) -> None:
    """A node has at most a few hundred GPUs: a larger index is a SlurmError.

    Not a billion-item tuple.
    """
    with pytest.raises(SlurmError, match="beyond index 1023"):
        scontrol.parse_index_list(text)


def test_parse_index_list_takes_ascii_digits_only() -> None:
    """'²' passes str.isdigit() but is no index: a ValueError like other garbage."""
    with pytest.raises(ValueError, match="bad GPU index range"):
        scontrol.parse_index_list("²")


# --- scontrol -o show node ----------------------------------------------------------


def test_node_gpus_from_the_capture() -> None:
    """The 22.05 capture: gpu1 MIXED with 2 of 4 GPUs allocated, gpu2 IDLE with none.

    Both at NodeAddr 127.0.0.1 (the collector checks credentials against it).
    """
    text = (DATA / "scontrol-o-show-node-22.05.txt").read_text()
    expected = [
        scontrol.GpuNode("gpu1", "MIXED", 4, 2, "127.0.0.1"),
        scontrol.GpuNode("gpu2", "IDLE", 4, 0, "127.0.0.1"),
    ]
    assert (expected, []) == scontrol.parse_node_gpus(text)


def test_node_gpus_reason_cannot_override_the_counts() -> None:
    """A drain reason holding `AllocTRES=gres/gpu=0` does not replace the real count."""
    line = "NodeName=gpu1 State=MIXED+DRAIN CfgTRES=gres/gpu=4 AllocTRES=gres/gpu=3 "
    line += "Reason=AllocTRES=gres/gpu=0 CfgTRES=gres/gpu=99 [root@2026-12-01T09:00:00]\n"
    assert ([scontrol.GpuNode("gpu1", "MIXED+DRAIN", 4, 3)], []) == scontrol.parse_node_gpus(line)


def test_node_gpus_reports_lines_it_cannot_read() -> None:
    """A line without NodeName, or with an absurd GPU count, is skipped and described."""
    text = "No nodes here\nNodeName=gpu9 CfgTRES=gres/gpu=" + "9" * 5000 + "\n"
    nodes, problems = scontrol.parse_node_gpus(text)
    assert ([], 2) == (nodes, len(problems))
    assert problems[0].startswith("scontrol show node: line 1: no NodeName")
    assert problems[1].startswith("scontrol show node: node 'gpu9': absurd GPU count")


def test_slurm_user_from_show_config() -> None:
    """`SlurmUser = slurm(64030)` names the user; no such line is None."""
    config = "ClusterName             = testbed\nSlurmUser               = slurm(64030)\n"
    assert ("slurm", None) == (
        scontrol.parse_slurm_user(config),
        scontrol.parse_slurm_user("ClusterName = testbed\n"),
    )


def test_job_node_shares_reads_the_shards_a_job_holds_on_a_node() -> None:
    """`scontrol -d show job` detail lines as Slurm 22.05 printed them on the shapes bed."""
    text = (
        "JobId=12 JobName=share\n   UserId=alice(1001) GroupId=alice(1001)\n"
        "   Nodes=gpu4 CPU_IDs=0 Mem=0 GRES=shard:2(IDX:0)\n   JOB_GRES=shard:2\n"
        "JobId=13 JobName=whole\n   Nodes=gpu4 CPU_IDs=1 Mem=0 GRES=gpu:a100:1(IDX:0)\n"
        "JobId=14 JobName=mps\n   Nodes=gpu[3-4] CPU_IDs=0 Mem=0 GRES=mps:a100:50(IDX:0)\n"
    )
    assert scontrol.job_node_shares(text, 12, "gpu4") == ("shard", 2)
    assert scontrol.job_node_shares(text, 13, "gpu4") is None
    assert scontrol.job_node_shares(text, 12, "gpu3") is None
    assert scontrol.job_node_shares(text, 14, "gpu4") == ("mps", 50)
    assert scontrol.job_node_shares(text, 99, "gpu4") is None
