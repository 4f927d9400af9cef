"""Damaged Slurm output ends in a parse result or a SlurmError/ConfigError, never a traceback.

The seeds are real captured outputs (tests/data/slurm, tests/data/sacct); each test
mutates them (lines deleted, duplicated, swapped, truncated; random bytes, unicode and
boundary tokens inserted; delimiters swapped) and checks the parser's contract.
"""

from __future__ import annotations

import json
import stat
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from slurm_gpu.errors import ConfigError, SlurmError
from slurm_gpu.slurm.gres import parse_gres_conf
from slurm_gpu.slurm.hostlist import expand
from slurm_gpu.slurm.jobid import parse_job_id
from slurm_gpu.slurm.runner import SlurmCommands
from slurm_gpu.slurm.sacct import parse_sacct
from slurm_gpu.slurm.sacctmgr import parse_admin_levels, parse_associations, parse_coordinators
from slurm_gpu.slurm.scontrol import (
    parse_job_gpu_details,
    parse_node_gpus,
    parse_sinfo_nodes,
    parse_slurm_user,
)
from slurm_gpu.slurm.squeue import (
    SqueueResult,
    parse_running_owners,
    parse_squeue_format,
    parse_squeue_json,
)
from tests.fuzz.strategies import (
    SACCT_DATA,
    SLURM_DATA,
    fuzz,
    mutated,
    mutated_json,
    seeds,
)

HANDMADE = SLURM_DATA / "handmade"
SQUEUE_JSON = [
    json.loads(p.read_text())
    for p in (SLURM_DATA / "squeue-22.05.json", HANDMADE / "squeue-23.11-like.json")
]
SQUEUE_FORMAT = seeds(
    SLURM_DATA / "squeue-22.05-format.txt", HANDMADE / "squeue-21.08-like-format.txt"
)
SCONTROL = seeds(
    SLURM_DATA / "scontrol-d-show-job-22.05.txt", HANDMADE / "scontrol-d-show-job-variants.txt"
)
SINFO = seeds(
    SLURM_DATA / "sinfo-nodes.txt",
    SLURM_DATA / "sinfo-draining.txt",
    HANDMADE / "sinfo-variants.txt",
)
NODE_GPUS = seeds(SLURM_DATA / "scontrol-o-show-node-22.05.txt")
OWNERS = seeds(SLURM_DATA / "squeue-owners-22.05.txt")
SHOW_CONFIG = ["ClusterName             = testbed\nSlurmUser               = slurm(64030)\n"]
JOB_IDS = ["123", "272_3", "272_[2-3%1]", "273+0", "273+1.batch", "275.extern", "279_0.0"]
ASSOC = seeds(
    SLURM_DATA / "sacctmgr-show-assoc.txt",
    SLURM_DATA / "sacctmgr-show-assoc-limits.txt",
    HANDMADE / "sacctmgr-show-assoc-21.08-like.txt",
)
ADMIN_LEVELS = seeds(
    SLURM_DATA / "sacctmgr-show-user-adminlevel.txt", HANDMADE / "sacctmgr-show-user-21.08-like.txt"
)
COORDINATORS = seeds(
    SLURM_DATA / "sacctmgr-show-account-withcoord.txt",
    HANDMADE / "sacctmgr-show-account-withcoord-21.08-like.txt",
)
SACCT = seeds(*sorted(SACCT_DATA.glob("*.txt")))
GRES_CONF = [
    "NodeName=gpu[1-2] Name=gpu Type=a100 File=/dev/nvidia[0-3]\n",
    "# comment\nAutoDetect=off\nName=gpu Type=h100 File=/dev/nvidia0\n"
    "Name=gpu File=/dev/nvidia[1,3]\n",
    "NodeName=gpu1 Name=gpu Type=a100 File=/dev/tty[0-3]\nNodeName=gpu2 Name=mps Count=100\n",
]
HOSTLISTS = ["gpu[1-2]", "n[01-03,7],login", "gpu1", "rack[1-2]-n[001-004]", "/dev/nvidia[0-3]"]


def _squeue_seed_records() -> list[dict[str, Any]]:
    """One job record of each captured --json output, as a small document."""
    return [{"jobs": document["jobs"][:3]} for document in SQUEUE_JSON]


@fuzz(300)
@given(st.sampled_from(_squeue_seed_records()).flatmap(mutated_json))
@example('{"jobs": [{"job_id": Infinity, "job_state": "RUNNING", "user_name": "alice"}]}')
@example(
    '{"jobs": [{"job_id": 5, "array_job_id": 1e999, "job_state": "RUNNING", "user_name": "a"}]}'
)
def test_squeue_json_with_damaged_fields(text: str) -> None:
    """squeue --json with fields replaced by random JSON values: a result or a SlurmError.

    The SqueueResult has the bad records skipped and described.
    """
    try:
        result = parse_squeue_json(text)
    except SlurmError:
        return
    assert isinstance(result, SqueueResult)


@fuzz(150)
@given(mutated([json.dumps(d) for d in SQUEUE_JSON[:1]] + [json.dumps(_squeue_seed_records()[1])]))
def test_squeue_json_with_damaged_text(text: str) -> None:
    """squeue --json text damaged byte-wise: a SqueueResult or a SlurmError."""
    try:
        result = parse_squeue_json(text)
    except SlurmError:
        return
    assert isinstance(result, SqueueResult)


@fuzz(300)
@given(mutated(SQUEUE_FORMAT))
def test_squeue_format_any_text(text: str) -> None:
    """squeue -h -O output, damaged: a SqueueResult whose problems name what was skipped."""
    try:
        result = parse_squeue_format(text)
    except SlurmError:
        return
    assert isinstance(result, SqueueResult)


@fuzz(300)
@given(mutated(SCONTROL))
@example("")
@example("No jobs in the system\n")
@example("JobId=" + "1" * 5000 + " JobName=x\n")
def test_scontrol_job_details_any_text(text: str) -> None:
    """scontrol -d show job, damaged: ({job: GPUs}, problems) or a SlurmError."""
    try:
        details, problems = parse_job_gpu_details(text)
    except SlurmError:
        return
    assert isinstance(details, dict)
    assert all(isinstance(p, str) for p in problems)


@fuzz(200)
@given(mutated(SINFO))
def test_sinfo_nodes_any_text(text: str) -> None:
    """sinfo -N output, damaged: (nodes, problems), never an exception."""
    nodes, problems = parse_sinfo_nodes(text)
    assert all(node.name for node in nodes)
    assert all(isinstance(p, str) for p in problems)


@fuzz(200)
@given(mutated(NODE_GPUS))
@example("NodeName=gpu1 CfgTRES=gres/gpu=" + "9" * 5000 + "\n")
def test_scontrol_show_node_any_text(text: str) -> None:
    """scontrol -o show node, damaged: (GPU counts per node, problems), never an exception."""
    nodes, problems = parse_node_gpus(text)
    assert all(node.name and node.gpus >= 0 and node.alloc_gpus >= 0 for node in nodes)
    assert all(isinstance(p, str) for p in problems)


@fuzz(100)
@given(mutated(OWNERS))
@example("²|alice|physics\n")
def test_squeue_owners_any_text(text: str) -> None:
    """squeue -o %A|%u|%a, damaged: ({job: owner}, problems), never an exception."""
    owners, problems = parse_running_owners(text)
    assert all(job >= 0 for job in owners)
    assert all(isinstance(p, str) for p in problems)


@fuzz(100)
@given(mutated(SHOW_CONFIG))
def test_show_config_any_text(text: str) -> None:
    """scontrol show config, damaged: a user name or None, never an exception."""
    assert parse_slurm_user(text) is None or isinstance(parse_slurm_user(text), str)


@fuzz(200)
@given(mutated(JOB_IDS))
@example("1" * 5000)
def test_job_id_any_text(text: str) -> None:
    """A damaged job id: taken apart (its printed form reads back the same) or a ValueError."""
    try:
        job = parse_job_id(text)
    except ValueError:
        return
    assert job == parse_job_id(str(job))


@fuzz(200)
@given(mutated(ASSOC))
def test_sacctmgr_associations_any_text(text: str) -> None:
    """sacctmgr show assoc, damaged: (associations, problems), never an exception."""
    associations, problems = parse_associations(text)
    assert all(a.account for a in associations)
    assert all(isinstance(p, str) for p in problems)


@fuzz(100)
@given(mutated(ADMIN_LEVELS))
def test_sacctmgr_admin_levels_any_text(text: str) -> None:
    """sacctmgr show user AdminLevel, damaged: ({user: level}, problems)."""
    levels, problems = parse_admin_levels(text)
    assert all(user for user in levels)
    assert all(isinstance(p, str) for p in problems)


@fuzz(100)
@given(mutated(COORDINATORS))
def test_sacctmgr_coordinators_any_text(text: str) -> None:
    """sacctmgr show account withcoord, damaged: ({account: users}, problems)."""
    accounts, problems = parse_coordinators(text)
    assert all(account for account in accounts)
    assert all(isinstance(p, str) for p in problems)


@fuzz(300)
@given(mutated(SACCT))
def test_sacct_any_text(text: str) -> None:
    """sacct -P output, damaged: a list of SacctJobs or a SlurmError naming the job."""
    try:
        jobs = parse_sacct(text)
    except SlurmError:
        return
    assert all(job.job_id >= 0 for job in jobs)


@fuzz(300)
@given(mutated(GRES_CONF), st.sampled_from(["gpu1", "gpu2", "n²", ""]))
@example("NodeName=n[²] Name=gpu File=/dev/nvidia0\n", "n1")
@example("Name=gpu File=/dev/nvidia[٣-²]\n", "n1")
def test_gres_conf_any_text(text: str, node: str) -> None:
    """gres.conf, damaged: the node's GPU files or a ConfigError naming file and line."""
    try:
        files = parse_gres_conf(text, node, "fuzz-gres.conf")
    except ConfigError as exc:
        assert all(p.startswith("fuzz-gres.conf: line ") for p in exc.problems), exc.problems
        return
    assert [f.slurm_index for f in files] == list(range(len(files)))


@fuzz(400)
@given(mutated(HOSTLISTS) | st.text(alphabet="n0129²٣[]-,", max_size=20))
@example("n[²]")
@example("gpu[1-²]")
def test_hostlist_any_text(text: str) -> None:
    """A hostlist expression: its names or a SlurmError, never another exception."""
    try:
        names = expand(text)
    except SlurmError:
        return
    assert all(isinstance(name, str) and name for name in names)


def test_hostlist_expansion_is_bounded() -> None:
    """Nested ranges cannot multiply past the one-range cap (100000 names).

    A hostlist such as n[0-999][0-999] is refused, not expanded to a million names (a
    hostile or mistyped node list must not exhaust memory; n[0-99999][0-99999] would try
    10^10).
    """
    try:
        names = expand("n[0-999][0-999]")
    except SlurmError:
        return
    assert len(names) <= 100_000, f"expanded to {len(names)} names"


@fuzz(20)
@given(st.binary(max_size=64))
@example(b"\xff\xfeJobId=1 JobName=caf\xe9\n")
def test_runner_output_in_any_encoding(output: bytes) -> None:
    """A Slurm command printing bytes that are not UTF-8 is text or a SlurmError.

    A job name in Latin-1 never makes SlurmCommands raise UnicodeDecodeError.
    """
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "out").write_bytes(output)
        script = Path(tmp) / "squeue"
        script.write_text(f"#!/bin/sh\nexec cat {Path(tmp) / 'out'}\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        runner = SlurmCommands(bin_dir=tmp, timeout=10)
        try:
            text = runner(["squeue"])
        except SlurmError:
            return
        assert isinstance(text, str)
