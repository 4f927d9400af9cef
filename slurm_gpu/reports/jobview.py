"""`slurm-gpu job JOBID`: one job as its user reads it, with plain-language notes.

Finished jobs read their summaries; running jobs the totals of their stored intervals
(figures up to the newest shipped minute, said in the header).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_gpu.models import GpuActivity
from slurm_gpu.reports.records import is_running
from slurm_gpu.reports.runs import notes_per_run, run_of, runs
from slurm_gpu.reports.status import Freshness
from slurm_gpu.slurm.timespec import format_elapsed, format_sacct_time
from slurm_gpu.units import GIB, is_known

BAR = 20


@dataclass(frozen=True)
class Thresholds:
    """When a note is written.

    Attributes:
        idle_percent: a GPU below this mean utilization is idle ([node]
            active_threshold_percent).
        limit_factor: a time limit this many times the run time (and an hour more) is
            "far too long".
        memory_only_gib: memory above this with idle compute is "memory-only use".
    """

    idle_percent: float = 5.0
    limit_factor: float = 3.0
    memory_only_gib: float = 1.0


def bar(fraction: float | None, width: int = BAR) -> str:
    """`[########------------]` for 0..1; `[?...]` when unknown."""
    if not is_known(fraction):
        return "[" + "?" * width + "]"
    filled = round(min(max(fraction, 0.0), 1.0) * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def notes(
    job: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]], limits: Thresholds
) -> list[str]:
    """Plain-language advice about how the job used its GPUs."""
    out: list[str] = []
    if not gpus:
        if int(job.get("alloc_gpus") or 0) > 0:
            out.append("No GPU readings were recorded for this job (agent down or too short).")
        return out
    if len(runs(gpus)) > 1:  # a requeued job: advice about each run's GPUs
        return notes_per_run(job, gpus, limits, notes)
    utils = [g.get("util_mean_percent") for g in gpus]
    idle = [
        g for g, u in zip(gpus, utils, strict=True) if u is not None and u < limits.idle_percent
    ]
    memory_only = [g for g in idle if (g.get("mem_max_bytes") or 0) / GIB >= limits.memory_only_gib]
    compute_idle = [g for g in idle if g not in memory_only]
    if compute_idle and len(compute_idle) == len(gpus):
        out.append(
            f"All {len(gpus)} GPU(s) stayed idle (mean utilization below "
            f"{limits.idle_percent:g}%): this job did not use its GPUs; run it without --gres=gpu."
        )
    elif compute_idle:
        # The fewer-GPUs advice rests on GPUs that did nothing, never on a mean: 4 GPUs
        # busy at 60% each split the work between them, 3 would not have done it.
        names = ", ".join(f"{g['node']}/{short(g['gpu_uuid'])}" for g in compute_idle)
        needed = len(gpus) - len(compute_idle)
        out.append(
            f"{len(compute_idle)} of {len(gpus)} GPUs stayed idle ({names}): "
            f"{needed} GPU(s) would have done the same work; ask for {needed} GPU(s) next time."
        )
    if memory_only:
        names = ", ".join(f"{g['node']}/{short(g['gpu_uuid'])}" for g in memory_only)
        out.append(
            f"Memory-only use on {names}: GPU memory was held but hardly any compute ran "
            "(a model loaded and waiting, or work running on the CPU)."
        )
    limit, elapsed = job.get("time_limit_seconds"), job.get("elapsed_seconds")
    if (
        _number(limit)
        and _number(elapsed)
        and not is_running(job.get("state"))
        and _f(limit) > limits.limit_factor * _f(elapsed)
        and _f(limit) - _f(elapsed) >= 3600
    ):
        out.append(
            f"Time limit far too long: the job ran {format_elapsed(_f(elapsed))} of "
            f"{format_elapsed(_f(limit))}. A --time near the real run time (with a margin) "
            "starts sooner: the scheduler backfills short jobs."
        )
    if any((g.get("missing_seconds") or 0) > 0 for g in gpus):
        if all(not is_known(g.get("util_mean_percent")) for g in gpus):
            out.append(
                "No GPU readings for this job (agent down or GPU lost): its utilization is "
                "unknown, not idle."
            )
        else:
            out.append(
                "Part of the job has no readings (agent down or GPU lost): figures are "
                "partial; that time counts as missing, not idle."
            )
    return out


def stale_nodes(
    job: Mapping[str, Any],
    gpus: Sequence[Mapping[str, Any]],
    activity: Sequence[GpuActivity],
    freshness: Freshness,
) -> list[str]:
    """Which of a running job's nodes stopped reporting, one line each ([] when none).

    A node reports while its agent's newest reading for the job (its activity, else its
    newest shipped interval) is fresh (`Freshness`); the time since is missing.
    """
    if not is_running(job.get("state")):
        return []
    start = job.get("start_time")
    nodes = [n for n in str(job.get("nodes") or "").split(",") if n]
    nodes += sorted({str(g["node"]) for g in gpus if g.get("node")} - set(nodes))
    out = []
    for node in nodes:
        shipped = [
            _f(g.get("data_until"))
            for g in gpus
            if g.get("node") == node and is_known(g.get("data_until"))
        ]
        read = [a.last_reading for a in activity if a.node == node]
        newest_interval = max(shipped, default=None)
        newest_activity = max(read, default=None)
        if freshness.is_fresh(newest_interval, newest_activity):
            continue
        newest = max([*shipped, *read], default=None)
        if newest is not None:
            out.append(
                f"Node {node} stopped reporting: newest reading {format_sacct_time(newest)} "
                f"({freshness.now - newest:.0f} s ago); the time since counts as missing."
            )
        elif is_known(start) and freshness.now - _f(start) > freshness.interval_lag:
            out.append(
                f"Node {node} has sent no readings for this job (its agent is down or cannot "
                "reach the store): its GPU time counts as missing."
            )
    return out


def _f(value: Any) -> float:
    return float(value) if value is not None else math.nan


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and is_known(float(value)) and float(value) > 0


def short(uuid: str) -> str:
    """A GPU UUID cut to something readable (GPU-1fc863e6)."""
    return uuid[:12] if uuid else "?"


def render_job(
    job: Mapping[str, Any],
    gpus: Sequence[Mapping[str, Any]],
    *,
    memory_total: Mapping[str, int | None],
    limits: Thresholds,
    currency: str,
    stale: list[str] | None = None,
) -> str:
    """The text of `slurm-gpu job`; `stale`: `stale_nodes` lines (running jobs)."""
    lines: list[str] = []
    running = is_running(job.get("state"))
    lines.append(f"Job {job['job_id_text']} ({job['job_id']}) {job.get('name') or ''}".rstrip())
    lines.append(
        f"  User {job.get('user')}  Account {job.get('account')}  "
        f"Partition {job.get('partition')}  State {job.get('state')}"
    )
    lines.append(
        f"  Submit {format_sacct_time(job.get('submit_time'))}  "
        f"Start {format_sacct_time(job.get('start_time'))}  "
        f"End {format_sacct_time(job.get('end_time'))}"
    )
    wait = job.get("queue_wait_seconds")
    limit = job.get("time_limit_seconds")
    lines.append(
        f"  Elapsed {format_elapsed(job.get('elapsed_seconds'))}  "
        f"Timelimit {format_elapsed(limit) if _number(limit) else 'UNLIMITED'}  "
        f"QueueWait {format_elapsed(wait) if wait is not None else '-'}  "
        f"Nodes {job.get('nodes') or '-'}  GPUs {job.get('alloc_gpus') or 0}"
    )
    several = len(runs(gpus)) > 1  # requeued: each run's GPUs are rows of their own
    if several:
        lines[-1] += f"  Runs {len(runs(gpus))}"
    shipped = [_f(g["data_until"]) for g in gpus if is_known(g.get("data_until"))]
    if running and shipped:
        lines.append(
            f"  Running: GPU figures up to {format_sacct_time(max(shipped))} (last shipped minute)"
        )
    lines.extend(f"  {line}" for line in stale or ())
    lines.append("")
    # The job's totals (reports/figures.py): idle is measured time only, missing apart.
    energy = job.get("energy_joules")
    lines.append(
        f"  GPU-hours {_hours(job.get('gpu_seconds'))}  "
        f"active {_hours(job.get('active_seconds'))}  idle {_hours(job.get('idle_seconds'))}  "
        f"mean utilization {_pct(job.get('util_mean_percent'))}  "
        + (f"energy {_f(energy) / 3.6e6:.5f} kWh  " if is_known(energy) else "")
        + f"cost {_f(job.get('cost') or 0.0):.2f} {currency}"
    )
    missing = _f(job.get("missing_seconds") or 0.0)
    if missing > 0:
        held = _f(job.get("gpu_seconds") or 0.0)
        share = f" ({100.0 * missing / held:.0f}% of the GPU-hours)" if held > 0 else ""
        lines.append(
            f"  Missing GPU-hours {missing / 3600.0:.4f}{share}: held with no readings "
            "(agent down, GPU lost); neither active nor idle, charged all the same"
        )
    lines.append("")
    if gpus:
        lines.append(
            f"  {'Run ' if several else ''}"
            f"{'Node':<8} {'GPU':<12} {'Model':<24} {'Util avg/max':>13} {'':22} {'Mem max':>18}"
        )
    for g in sorted(gpus, key=lambda g: (run_of(g), g["node"], g["gpu_uuid"])):
        total = memory_total.get(str(g["gpu_uuid"]))
        mem = g.get("mem_max_bytes")
        mem_text = (
            f"{_f(mem) / GIB:.1f}/{_f(total) / GIB:.0f} GiB"
            if is_known(mem) and total
            else (f"{_f(mem) / GIB:.1f} GiB" if is_known(mem) else "-")
        )
        util_g = g.get("util_mean_percent")
        umax = g.get("util_max_percent")
        lines.append(
            f"  {f'{run_of(g):<4}' if several else ''}"
            f"{g['node']:<8} {short(str(g['gpu_uuid'])):<12} {g.get('gpu_model') or ''!s:<24.24} "
            f"{_pct(util_g):>6}/{_pct(umax):>6} "
            f"{bar(None if not is_known(util_g) else _f(util_g) / 100)} "
            f"{mem_text:>18} "
            f"{bar(_f(mem) / _f(total) if is_known(mem) and total else None)}"
        )
    advice = notes(job, gpus, limits)
    if advice:
        lines.append("")
        lines.append("Notes:")
        lines.extend(f"  - {n}" for n in advice)
    return "\n".join(lines) + "\n"


def _hours(seconds: Any) -> str:
    return f"{_f(seconds) / 3600.0:.4f}" if is_known(seconds) else "-"


def _pct(value: Any) -> str:
    return f"{float(value):.1f}%" if is_known(value) else "-"
