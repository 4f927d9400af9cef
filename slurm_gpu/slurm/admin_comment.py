"""The job summary token slurm-gpu writes into a job's AdminComment.

Format, version 2 (documented in conf/slurm-gpu.toml and README):

    slurm-gpu:v2:gpus=2,gpu_s=180,util_avg=70.1,util_max=72,active_s=178,mem_max_mib=20480,energy_j=54000,missing_s=0,missing=0,gpm_s=180,sm_avg=31.2,occ_avg=18.5,tensor_avg=60.3,dram_avg=22.0,eff_gpu_s=56

Summed over the job's nodes; util_avg is weighted by GPU-seconds. Unknown is left out,
never written as 0: a job with no utilization reading at all (its node's agent down,
a job that failed before the first sample) has no util_avg and util_max, and one with no
energy reading no energy_j. `missing_s` is the GPU-seconds held with no readings (agent
down, GPU lost), `missing=1` when there are any. `susp_s` (v2, when the job was
suspended) is the part of `gpu_s` Slurm had the job suspended: neither active nor idle
nor missing, and not in Slurm's charge (Elapsed x GPUs = gpu_s - susp_s). Anything
else in the AdminComment (other tools, admins' notes) is kept; only our token is replaced.

Version 2 is version 1 plus optional NVML GPM fields (Hopper and newer GPUs); every v1
field keeps its name and meaning, so a v1 reader (which takes `slurm-gpu:v<N>:` and its
`key=value` pairs) reads a v2 token as before and skips the fields it does not know:

- `gpm_s`: the GPU-seconds GPM measured; less than `gpu_s` when only some of the job's
  GPUs (or part of its time) were measured.
- `sm_avg`, `occ_avg`, `tensor_avg`, `dram_avg`: mean SM activity, SM occupancy,
  tensor-pipe activity and DRAM bandwidth use in percent, weighted by the GPM-measured
  GPU-seconds of each GPU (measured GPUs only).
- `eff_gpu_s`: effective GPU-seconds, the sum of gpu_s x sm_avg / 100 over the GPUs
  whose SM activity was measured.

A job none of whose GPUs has GPM (Ampere and older) has none of them: not measured is
never 0. The writer always writes v2; `parse_token` reads v1, v2 and any later version
(its fields as they are: a reader uses the names it knows and ignores the rest).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slurm_gpu.models import JobGpuSummary
from slurm_gpu.slurm.runner import CommandRunner
from slurm_gpu.slurm.timespec import parse_elapsed

TOKEN_VERSION = 2
TOKEN_PREFIX = f"slurm-gpu:v{TOKEN_VERSION}:"
_TOKEN = re.compile(r"slurm-gpu:v(\d+):[^\s]*")
_TOKEN_AND_SPACE = re.compile(r"slurm-gpu:v\d+:[^\s]*\s*")
# v2's GPM means: (token field, JobGpuSummary field).
GPM_FIELDS = (
    ("sm_avg", "sm_active_mean_percent"),
    ("occ_avg", "sm_occupancy_mean_percent"),
    ("tensor_avg", "tensor_active_mean_percent"),
    ("dram_avg", "dram_bw_mean_percent"),
)


def _gpm_fields(summaries: Sequence[JobGpuSummary]) -> dict[str, str | None]:
    """v2's GPM fields: weighted by the GPM-measured GPU-seconds; None where not measured."""
    measured = [s for s in summaries if s.gpm_seconds > 0]
    fields: dict[str, str | None] = {
        "gpm_s": f"{sum(s.gpm_seconds for s in measured):.0f}" if measured else None
    }
    for name, attr in GPM_FIELDS:
        pairs = [(getattr(s, attr), s.gpm_seconds) for s in measured]
        known = [(value, seconds) for value, seconds in pairs if value is not None]
        weight = sum(seconds for _, seconds in known)
        mean = sum(v * w for v, w in known) / weight if weight > 0 else None
        fields[name] = None if mean is None else f"{mean:.1f}"
    sm = [
        (s.gpu_seconds, s.sm_active_mean_percent)
        for s in measured
        if s.sm_active_mean_percent is not None
    ]
    fields["eff_gpu_s"] = f"{sum(g * p / 100 for g, p in sm):.0f}" if sm else None
    return fields


def _suspended_and_comment(line: str) -> tuple[float, str]:
    """sacct's `Suspended|AdminComment` line: suspended seconds (0 if none) and the comment."""
    head, bar, rest = line.partition("|")
    try:
        seconds = parse_elapsed(head) if bar else None
    except ValueError:
        seconds = None
    if seconds is None:
        return 0.0, line  # no Suspended field before the comment
    return seconds, rest


def summary_token(summaries: Sequence[JobGpuSummary], suspended_seconds: float = 0.0) -> str:
    """The token (v2) for all GPUs of one job (all nodes); unknown fields left out.

    `suspended_seconds`: how long Slurm had the job suspended (sacct's Suspended); each
    GPU row spans it, and `susp_s` is their GPU-seconds suspended (written when any).
    """
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
    susp_s = sum(min(max(suspended_seconds, 0.0), s.gpu_seconds) for s in summaries)
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
        "susp_s": f"{susp_s:.0f}" if susp_s > 0 else None,
        **_gpm_fields(summaries),
    }
    return TOKEN_PREFIX + ",".join(f"{k}={v}" for k, v in fields.items() if v is not None)


def merge_token(existing: str, token: str) -> str:
    """Replaces our token in an AdminComment (or appends it), keeping everything else."""
    rest = _TOKEN_AND_SPACE.sub("", existing).strip()  # "a TOKEN b" -> "a b"
    return f"{rest} {token}" if rest else token


def parse_token(text: str) -> dict[str, str]:
    """The fields of the slurm-gpu token found in an AdminComment ({} when absent).

    Any version (v1, v2, later): every `key=value` field as it is written, so a v1
    token reads as before and a newer one's fields this version does not know are
    there for the caller to ignore. `token_version` says which version it was.
    """
    match = _TOKEN.search(text)
    if match is None:
        return {}
    body = match.group(0).split(":", 2)[2]
    return dict(item.split("=", 1) for item in body.split(",") if "=" in item)


def token_version(text: str) -> int | None:
    """The version of the slurm-gpu token in an AdminComment (None when absent)."""
    match = _TOKEN.search(text)
    return None if match is None else int(match.group(1))


def write_job_summary(
    run: CommandRunner, job_id: int, summaries: Sequence[JobGpuSummary], cluster: str = ""
) -> str:
    """Merges the token into the finished job's AdminComment through slurmdbd.

    `scontrol update` refuses finished jobs ("Job has already finished"), so this goes
    through `sacctmgr modify job`, which edits the accounting record (`sacct -o
    AdminComment` shows it).
    """
    # Suspended first: the AdminComment (anything, `|` included) is the rest of the line.
    where = ["sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "Suspended,AdminComment"]
    if cluster:
        where += ["-M", cluster]
    lines = run(where).splitlines()
    suspended, current = _suspended_and_comment(lines[0] if lines else "")
    merged = merge_token(current, summary_token(summaries, suspended))
    argv = ["sacctmgr", "-i", "modify", "job", "where", f"jobid={job_id}"]
    if cluster:
        argv.append(f"cluster={cluster}")
    run([*argv, "set", f"AdminComment={merged}"])
    return merged
