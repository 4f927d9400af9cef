"""The job summary token slurm-gpu writes into a job's AdminComment.

Format, version 1 (documented in conf/slurm-gpu.toml and README):

    slurm-gpu:v1:gpus=2,gpu_s=180,util_avg=70.1,util_max=72,active_s=178,mem_max_mib=20480,energy_j=54000,missing=0

Summed over the job's nodes; util_avg is weighted by GPU-seconds. Anything else in the
AdminComment (other tools, admins' notes) is kept; only our token is replaced. A requeued
job (Slurm runs it again under its id) sums every run, `gpus` is the most GPUs one run held
at once, and `runs=N` follows `missing` when it ran more than once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slurm_gpu.models import JobGpuSummary
from slurm_gpu.slurm.runner import CommandRunner

TOKEN_PREFIX = "slurm-gpu:v1:"
_TOKEN = re.compile(r"slurm-gpu:v\d+:[^\s]*")


def summary_token(summaries: Sequence[JobGpuSummary]) -> str:
    """The v1 token for all GPUs of one job (all nodes, every run)."""
    gpu_s = sum(s.gpu_seconds for s in summaries)
    weighted = [(s.util_mean_percent, s.gpu_seconds) for s in summaries]
    known = [(u, w) for u, w in weighted if u is not None]
    weight = sum(w for _, w in known)
    util_avg = sum(u * w for u, w in known) / weight if weight else 0.0
    util_max = max((s.util_max_percent or 0.0 for s in summaries), default=0.0)
    mem_max = max((s.mem_max_bytes or 0 for s in summaries), default=0)
    energy = sum(s.energy_joules or 0.0 for s in summaries)
    per_run: dict[int, int] = {}
    for s in summaries:
        per_run[s.restart] = per_run.get(s.restart, 0) + 1
    fields = {
        "gpus": str(max(per_run.values(), default=0)),
        "gpu_s": f"{gpu_s:.0f}",
        "util_avg": f"{util_avg:.1f}",
        "util_max": f"{util_max:.0f}",
        "active_s": f"{sum(s.active_seconds for s in summaries):.0f}",
        "mem_max_mib": str(mem_max // 2**20),
        "energy_j": f"{energy:.0f}",
        "missing": "1" if any(s.missing for s in summaries) else "0",
    }
    if len(per_run) > 1:
        fields["runs"] = str(len(per_run))
    return TOKEN_PREFIX + ",".join(f"{k}={v}" for k, v in fields.items())


def merge_token(existing: str, token: str) -> str:
    """Replaces our token in an AdminComment (or appends it), keeping everything else."""
    rest = _TOKEN.sub("", existing).strip()
    return f"{rest} {token}" if rest else token


def parse_token(text: str) -> dict[str, str]:
    """The fields of the slurm-gpu token found in an AdminComment ({} when absent)."""
    match = _TOKEN.search(text)
    if match is None:
        return {}
    body = match.group(0).split(":", 2)[2]
    return dict(item.split("=", 1) for item in body.split(",") if "=" in item)


def write_job_summary(
    run: CommandRunner, job_id: int, summaries: Sequence[JobGpuSummary], cluster: str = ""
) -> str:
    """Merges the token into the finished job's AdminComment through slurmdbd.

    `scontrol update` refuses finished jobs ("Job has already finished"), so this goes
    through `sacctmgr modify job`, which edits the accounting record (`sacct -o
    AdminComment` shows it).
    """
    where = ["sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "AdminComment"]
    if cluster:
        where += ["-M", cluster]
    lines = run(where).splitlines()
    current = lines[0] if lines else ""
    merged = merge_token(current, summary_token(summaries))
    argv = ["sacctmgr", "-i", "modify", "job", "where", f"jobid={job_id}"]
    if cluster:
        argv.append(f"cluster={cluster}")
    run([*argv, "set", f"AdminComment={merged}"])
    return merged
