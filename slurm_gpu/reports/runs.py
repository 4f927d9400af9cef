"""The runs of a requeued job in a job's view: Slurm requeues a job under its id.

Each run (Slurm's restart count, `sacct -D` lists them) holds its own GPUs; a job's GPU
rows carry their run in `restart`. The job's figures add up over every run, while advice
about how many GPUs the job needed is about the GPUs one run held at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from slurm_gpu.models import JobGpuSummary

_L = TypeVar("_L")


def run_of(gpu: Mapping[str, Any]) -> int:
    """The run a GPU row belongs to (0: the first; rows without a run are run 0)."""
    value = gpu.get("restart")
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def runs(gpus: Sequence[Mapping[str, Any]]) -> list[int]:
    """The runs of a job's GPU rows, in order."""
    return sorted({run_of(g) for g in gpus})


def notes_per_run(
    job: Mapping[str, Any],
    gpus: Sequence[Mapping[str, Any]],
    limits: _L,
    notes: Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]], _L], list[str]],
) -> list[str]:
    """`notes` for each run of a requeued job on its own GPUs, said once where all agree.

    A note every run gives alike (the time limit, "stayed idle" on every run) is about the
    job and is written once; the others name their run.
    """
    each = {r: notes(job, [g for g in gpus if run_of(g) == r], limits) for r in runs(gpus)}
    common = [n for n in next(iter(each.values())) if all(n in v for v in each.values())]
    out = [
        f"This job ran {len(each)} times (requeued under its id; sacct -D lists each run): "
        "its figures add up every run, the advice is per run."
    ]
    out += common
    for run, said in each.items():
        out += [f"Run {run}: {n}" for n in said if n not in common]
    return out


def with_runs(
    gpus: Sequence[Mapping[str, Any]], summaries: Sequence[JobGpuSummary]
) -> list[dict[str, Any]]:
    """A job's GPU rows, each with the run (`restart`) of the summary it was read from.

    A summary row is matched by node, GPU and end (its `data_until`); a row of a running
    job's intervals is the newest run's.
    """
    by_key = {(s.node, s.gpu_uuid, s.end): s.restart for s in summaries}
    newest = max((s.restart for s in summaries), default=0)
    out = []
    for g in gpus:
        row = dict(g)
        if "restart" not in row:
            until = g.get("data_until")
            key = (str(g.get("node")), str(g.get("gpu_uuid")), float(until) if until else 0.0)
            row["restart"] = by_key.get(key, newest if g.get("source") == "intervals" else 0)
        out.append(row)
    return out
