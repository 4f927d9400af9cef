"""The job summary token slurm-gpu writes into a job's AdminComment.

Format, version 1 (documented in conf/slurm-gpu.toml and README):

    slurm-gpu:v1:gpus=2,gpu_s=180,util_avg=70.1,util_max=72,active_s=178,mem_max_mib=20480,energy_j=54000,missing=0

Summed over the job's nodes; util_avg is weighted by GPU-seconds. Unknown is left out,
never written as 0: a job with no utilization reading at all (its node's agent down,
a job that failed before the first sample) has no util_avg and util_max, and one with no
energy reading no energy_j. `missing_s` is the GPU-seconds held with no readings (agent
down, GPU lost), `missing=1` when there are any. Anything else in the AdminComment
(other tools, admins' notes) is kept; only our token is replaced.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slurm_gpu.models import JobGpuSummary
from slurm_gpu.slurm.runner import CommandRunner

TOKEN_PREFIX = "slurm-gpu:v1:"
_TOKEN = re.compile(r"slurm-gpu:v\d+:[^\s]*")


def summary_token(summaries: Sequence[JobGpuSummary]) -> str:
    """The v1 token for all GPUs of one job (all nodes); unknown fields left out."""
    gpu_s = sum(s.gpu_seconds for s in summaries)
    known = [(s.util_mean_percent, s.gpu_seconds) for s in summaries if s.reading_count > 0]
    utils = [(u, w) for u, w in known if u is not None]
    weight = sum(w for _, w in utils)
    util_avg = (
        sum(u * w for u, w in utils) / weight
        if weight > 0
        else (sum(u for u, _ in utils) / len(utils) if utils else None)
    )
    peaks = [s.util_max_percent for s in summaries if s.util_max_percent is not None]
    mems = [s.mem_max_bytes for s in summaries if s.mem_max_bytes is not None]
    energies = [s.energy_joules for s in summaries if s.energy_joules is not None]
    missing_s = sum(s.missing_seconds for s in summaries)
    # A requeued job (Slurm runs it again under its id) sums every run; `gpus` is the most
    # GPUs one run held at once, and `runs=N` is added when it ran more than once.
    per_run: dict[int, int] = {}
    for s in summaries:
        per_run[s.restart] = per_run.get(s.restart, 0) + 1
    fields = {
        "gpus": str(max(per_run.values(), default=0)),
        "gpu_s": f"{gpu_s:.0f}",
        "util_avg": None if util_avg is None else f"{util_avg:.1f}",
        "util_max": f"{max(peaks):.0f}" if peaks else None,
        "active_s": f"{sum(s.active_seconds for s in summaries):.0f}" if known else None,
        "mem_max_mib": str(max(mems) // 2**20) if mems else None,
        "energy_j": f"{sum(energies):.0f}" if energies else None,
        "missing_s": f"{missing_s:.0f}",
        "missing": "1" if any(s.missing for s in summaries) else "0",
        "runs": str(len(per_run)) if len(per_run) > 1 else None,
    }
    return TOKEN_PREFIX + ",".join(f"{k}={v}" for k, v in fields.items() if v is not None)


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
