"""`slurm-gpu job <leader id>` of a heterogeneous job: its components together.

`sacct -j <leader>` lists every component of a heterogeneous job (`<leader>+<offset>`);
`slurm-gpu job` does the same: a line for the whole job, then each component's own view
(each component has its own job id, GPUs and figures:
https://slurm.schedmd.com/heterogeneous_jobs.html).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_COMPONENT = re.compile(r"(\d+)\+(\d+)")  # sacct's JobID of a het component: <leader>+<offset>


def _component(record: Mapping[str, Any]) -> tuple[int, int] | None:
    match = _COMPONENT.fullmatch(str(record.get("job_id_text") or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def het_components(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The records, by offset, when they are the components of one het job; else None."""
    parts = [_component(r) for r in records]
    leaders = {p[0] for p in parts if p is not None}
    offsets = {p[1] for p in parts if p is not None}
    if None in parts or len(leaders) != 1 or len(offsets) < len(records):
        return None
    return sorted(records, key=lambda r: (_component(r) or (0, 0))[1])


def het_leader(parts: Sequence[Mapping[str, Any]]) -> int:
    """The leader's job id (SLURM_HET_JOB_ID) of a het job's components."""
    return (_component(parts[0]) or (int(parts[0]["job_id"]), 0))[0]


def het_header(parts: Sequence[Mapping[str, Any]]) -> str:
    """One line about the whole het job: its components, GPUs and GPU-hours in all."""
    ids = ", ".join(str(p["job_id_text"]) for p in parts)
    gpus = sum(int(p.get("alloc_gpus") or 0) for p in parts)
    seconds = sum(float(p.get("gpu_seconds") or 0.0) for p in parts)
    return (
        f"Heterogeneous job {het_leader(parts)}: {len(parts)} components ({ids}), "
        f"GPUs {gpus} and GPU-hours {seconds / 3600.0:.4f} in all"
    )
