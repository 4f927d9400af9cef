"""`slurm-gpu job JOBID`: one job as its user reads it, with plain-language notes.

Finished jobs read their summaries; running jobs the totals of their stored intervals
(figures up to the newest shipped minute, said in the header).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_gpu.activity import measurement_text, slot_text
from slurm_gpu.models import GpuActivity
from slurm_gpu.reports.records import is_running
from slurm_gpu.reports.runs import notes_per_run, run_of, runs
from slurm_gpu.reports.status import Freshness
from slurm_gpu.reports.timeline import Segment, Timeline, build, from_hourly, from_interval
from slurm_gpu.reports.timeline import render as render_timeline
from slurm_gpu.slurm.timespec import format_elapsed, format_sacct_time
from slurm_gpu.store import Store
from slurm_gpu.units import GIB, is_known

BAR = 20

# NVML GPM advice (Hopper and newer). GPU utilization is a duty cycle: the share of time
# any kernel ran, so one tiny kernel reads 100 %. SM activity is the share of SMs with
# work: together they tell busy from "busy".
# Duty cycle at or above this with SM activity below LOW_SM_PERCENT: the GPU is kept
# "busy" without being used. 80 leaves room for input stalls of a real job; under 10 %
# of SMs (fewer than ~13 of an H100's 132) even a small model's kernels do not stay.
BUSY_UTIL_PERCENT = 80.0
LOW_SM_PERCENT = 10.0
# Tensor activity below this on a GPU busy at TENSOR_UTIL_PERCENT or more: its tensor
# cores (most of what a Hopper GPU's FLOPs are, and of its price) did nothing. Any
# matmul in bf16/fp16/tf32 reads several %; 1 % is measurement noise.
NO_TENSOR_PERCENT = 1.0
TENSOR_UTIL_PERCENT = 50.0
# DRAM bandwidth at or above this with SM activity below MEMORY_BOUND_SM_PERCENT: the
# kernels wait on memory. Sustained DRAM use over ~60 % of peak is where bandwidth, not
# compute, sets the pace; SMs half idle with it say they are starved.
MEMORY_BOUND_DRAM_PERCENT = 60.0
MEMORY_BOUND_SM_PERCENT = 50.0


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
    out += gpm_notes(gpus)
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


def _known(gpu: Mapping[str, Any], name: str) -> float | None:
    value = gpu.get(name)
    return float(value) if is_known(value) else None


def measured_by_gpm(gpu: Mapping[str, Any]) -> bool:
    """Whether GPM measured this GPU row (some GPM seconds and an SM activity)."""
    return (_known(gpu, "gpm_seconds") or 0.0) > 0 and _known(
        gpu, "sm_active_mean_percent"
    ) is not None


def _names(gpus: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{g['node']}/{short(str(g['gpu_uuid']))}" for g in gpus)


def _mean(gpus: Sequence[Mapping[str, Any]], name: str) -> float:
    """`name` over these GPUs, weighted by their GPM seconds."""
    weights = [(_known(g, "gpm_seconds") or 0.0, _known(g, name) or 0.0) for g in gpus]
    total = sum(w for w, _ in weights)
    return sum(w * v for w, v in weights) / total if total > 0 else 0.0


def gpm_notes(gpus: Sequence[Mapping[str, Any]]) -> list[str]:
    """Advice from the GPM figures (SM activity, tensor, DRAM), and where there are none.

    A GPU without GPM is said to be unmeasured, never 0 % active.
    """
    out: list[str] = []
    measured = [g for g in gpus if measured_by_gpm(g)]

    def util(g: Mapping[str, Any]) -> float:
        return _known(g, "util_mean_percent") or 0.0

    def sm(g: Mapping[str, Any]) -> float:
        return _known(g, "sm_active_mean_percent") or 0.0

    fake = [g for g in measured if util(g) >= BUSY_UTIL_PERCENT and sm(g) < LOW_SM_PERCENT]
    if fake:
        out.append(
            f"Duty cycle {_mean(fake, 'util_mean_percent'):.0f}% but only "
            f"{_mean(fake, 'sm_active_mean_percent'):.0f}% of SMs active on {_names(fake)}: "
            'the kernels keep the GPU "busy" without using it (one small kernel, a spin or '
            "polling loop, tiny batches). Utilization counts time any kernel runs, not how "
            "much of the GPU works: give each kernel more work (larger batches) or fewer GPUs."
        )
    no_tensor = [
        g
        for g in measured
        if g not in fake
        and util(g) >= TENSOR_UTIL_PERCENT
        and (tensor := _known(g, "tensor_active_mean_percent")) is not None
        and tensor < NO_TENSOR_PERCENT
    ]
    if no_tensor:
        models = ", ".join(sorted({str(g.get("gpu_model") or "?") for g in no_tensor}))
        out.append(
            f"No tensor-core use on {_names(no_tensor)} ({models}) although busy "
            f"({_mean(no_tensor, 'util_mean_percent'):.0f}% utilization): the tensor cores, "
            "most of what this GPU is bought for, stayed idle. Mixed precision (bf16/fp16 "
            "autocast, TF32 matmuls) puts the matrix work on them."
        )
    bound = [
        g
        for g in measured
        if (_known(g, "dram_bw_mean_percent") or 0.0) >= MEMORY_BOUND_DRAM_PERCENT
        and sm(g) < MEMORY_BOUND_SM_PERCENT
    ]
    if bound:
        out.append(
            f"Memory-bandwidth bound on {_names(bound)}: DRAM bandwidth "
            f"{_mean(bound, 'dram_bw_mean_percent'):.0f}% of its peak while "
            f"{_mean(bound, 'sm_active_mean_percent'):.0f}% of SMs active: the kernels wait "
            "on memory. Fused kernels, larger batches or lower precision move fewer bytes "
            "per operation."
        )
    unmeasured = [
        g
        for g in gpus
        if not measured_by_gpm(g) and g.get("gpu_uuid") and g.get("source") != "none"
    ]
    by_reason: dict[str, list[Mapping[str, Any]]] = {}
    for g in unmeasured:
        by_reason.setdefault(unmeasured_reason(g), []).append(g)
    for reason, part in by_reason.items():
        where = "this GPU" if len(part) == 1 else f"these {len(part)} GPUs"
        out.append(
            f"SM activity is not measured on {where} ({reason}): {_names(part)}. Its "
            "utilization is a duty cycle only (time any kernel ran), not how much of it worked."
        )
    if measured and unmeasured:
        gpm = sum(_known(g, "gpm_seconds") or 0.0 for g in gpus)
        held = sum(_known(g, "gpu_seconds") or 0.0 for g in gpus)
        out.append(
            f"The GPM figures (SM activity, tensor, DRAM) are partial: they cover "
            f"{len(measured)} of {len(gpus)} GPUs, {gpm / 3600.0:.4f} of {held / 3600.0:.4f} "
            "GPU-hours."
        )
    return out


def unmeasured_reason(gpu: Mapping[str, Any]) -> str:
    """Why a GPU row has no GPM figures, in words: its model has no GPM, or none came."""
    model = str(gpu.get("gpu_model") or "unknown")
    if gpu.get("gpm_supported") is False:
        return f"model {model} has no GPM"
    return f"model {model}: no GPM readings for this job"


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


def job_timeline(
    store: Store,
    job: Mapping[str, Any],
    gpus: Sequence[Mapping[str, Any]],
    *,
    gpm_supported: Mapping[str, bool | None] | None = None,
) -> Timeline | None:
    """The job's timeline: its stored intervals per GPU (and hourly rollups of old ones).

    Spans the job's start to its end (a running job: to its newest shipped interval);
    every GPU of `gpus` has a line, one without readings a line of gaps.
    """
    job_id = int(job["job_id"])
    segments: dict[tuple[str, str], list[Segment]] = {
        (str(g["node"]), str(g["gpu_uuid"])): [] for g in gpus if g.get("gpu_uuid")
    }
    for hour in store.hourly(job_id=job_id):
        segments.setdefault((hour.node, hour.gpu_uuid), []).append(from_hourly(hour))
    for row in store.intervals(job_id=job_id):
        segments.setdefault((row.node, row.gpu_uuid), []).append(from_interval(row))
    models = {
        (str(g["node"]), str(g["gpu_uuid"])): str(g.get("gpu_model") or "")
        for g in gpus
        if g.get("gpu_uuid")
    }
    end = None if is_running(job.get("state")) else job.get("end_time")
    return build(
        segments,
        start=job.get("start_time"),
        end=end,
        models=models,
        gpm_supported=gpm_supported,
    )


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
    timeline: Timeline | None = None,
    ascii_only: bool = False,
) -> str:
    """The text of `slurm-gpu job`; `stale`: `stale_nodes` lines (running jobs).

    `timeline`: the job's life per GPU (reports/timeline.py), drawn after the tables in
    Unicode blocks, or in ASCII with `ascii_only`.
    """
    lines: list[str] = []
    running = is_running(job.get("state"))
    lines.append(f"Job {job['job_id_text']} ({job['job_id']}) {job.get('name') or ''}".rstrip())
    sluid = job.get("sluid")
    if isinstance(sluid, str) and sluid:  # Slurm 25.11+
        lines.append(f"  SLUID {sluid}")
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
    suspended = job.get("suspended_seconds")
    if is_known(suspended) and _f(suspended) > 0:
        lines[-1] += f"  Suspended {format_elapsed(_f(suspended))}"
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
        + (
            f" (+ idle held {_f(job.get('idle_held_cost')):.2f} {currency}, priced apart)"
            if is_known(job.get("idle_held_cost"))
            else ""
        )
    )
    missing = _f(job.get("missing_seconds") or 0.0)
    if missing > 0:
        held = _f(job.get("gpu_seconds") or 0.0)
        share = f" ({100.0 * missing / held:.0f}% of the GPU-hours)" if held > 0 else ""
        lines.append(
            f"  Missing GPU-hours {missing / 3600.0:.4f}{share}: held with no readings "
            "(agent down, GPU lost); neither active nor idle, charged all the same"
        )
    suspended_gpu = _f(job.get("suspended_gpu_seconds") or 0.0)
    if suspended_gpu > 0:
        lines.append(
            f"  Suspended GPU-hours {suspended_gpu / 3600.0:.4f}: the GPUs stayed held while "
            "Slurm had the job suspended; neither active nor idle, and not in the GPU-hours, "
            "as Slurm charges ([cost] charge_suspended bills them)"
        )
    lines.append(_gpm_totals(job, gpus))
    if has_slot(gpus):
        lines.append(
            f"  Slot-hours held {_hours(job.get('gpu_seconds'))}  physical GPU-hours "
            f"{_hours(job.get('physical_gpu_seconds'))} (share of the GPU x slot-hours)"
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
    lines.extend(_gpm_table(gpus, several))
    lines.extend(_slot_table(gpus, several))
    drawn = render_timeline(timeline, ascii_only=ascii_only)
    if drawn:
        lines.append("")
        lines.extend(drawn)
    advice = notes(job, gpus, limits)
    if advice:
        lines.append("")
        lines.append("Notes:")
        lines.extend(f"  - {n}" for n in advice)
    return "\n".join(lines) + "\n"


def has_slot(gpus: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a GPU row is a MIG slice or a share (issue 14), not a whole GPU."""
    return any(str(g.get("slot_kind") or "gpu") != "gpu" for g in gpus if g.get("gpu_uuid"))


def slot_of(gpu: Mapping[str, Any]) -> str:
    """A GPU row's slot in words: "whole GPU GPU-...", "MIG 1g.10gb of GPU-..."."""
    share = gpu.get("share")
    return slot_text(
        str(gpu.get("slot_kind") or "gpu"),
        str(gpu.get("slot_id") or gpu.get("gpu_uuid") or ""),
        str(gpu.get("gpu_uuid") or ""),
        _f(share) if is_known(share) else 1.0,
        str(gpu.get("mig_profile") or ""),
    )


def measurement_of(gpu: Mapping[str, Any]) -> str:
    """How a GPU row was measured, in words ("GPM of its GPU instance")."""
    return measurement_text(str(gpu.get("measured_by") or "nvml"))


def _slot_table(gpus: Sequence[Mapping[str, Any]], several: bool) -> list[str]:
    """Per slot, where the job held a MIG slice or a share: the slot and its measurement."""
    if not has_slot(gpus):
        return []
    lines = ["", f"  {'Run ' if several else ''}{'Node':<8} Slot: measured by"]
    shown = [g for g in gpus if g.get("gpu_uuid")]
    for g in sorted(shown, key=lambda g: (run_of(g), g["node"], g["gpu_uuid"])):
        lines.append(
            f"  {f'{run_of(g):<4}' if several else ''}{g['node']:<8} {slot_of(g)}: "
            f"{measurement_of(g)}"
        )
    return lines


def _gpm_totals(job: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]]) -> str:
    """The job's GPM line: SM activity, occupancy, tensor, DRAM, effective GPU-hours."""
    gpm, held = _known(job, "gpm_seconds") or 0.0, _known(job, "gpu_seconds") or 0.0
    if gpm <= 0 or _known(job, "sm_active_mean_percent") is None:
        return "  SM activity not measured (no GPU of this job has GPM readings): blank, not 0%"
    share = f"{100.0 * gpm / held:.0f}%" if held > 0 else "-"
    partial = any(not measured_by_gpm(g) for g in gpus if g.get("gpu_uuid"))
    return (
        f"  SM active {_pct(job.get('sm_active_mean_percent'))}  "
        f"occupancy {_pct(job.get('sm_occupancy_mean_percent'))}  "
        f"tensor {_pct(job.get('tensor_active_mean_percent'))}  "
        f"DRAM BW {_pct(job.get('dram_bw_mean_percent'))}  "
        f"effective GPU-hours {_hours(job.get('effective_seconds'))}  "
        f"(GPM measured {share} of the GPU-hours{'; partial' if partial else ''})"
    )


def _gpm_table(gpus: Sequence[Mapping[str, Any]], several: bool) -> list[str]:
    """Per GPU: the GPM figures, or why there are none (never 0 %)."""
    shown = [g for g in gpus if g.get("gpu_uuid")]
    if not shown:
        return []
    lines = [
        "",
        f"  {'Run ' if several else ''}{'Node':<8} {'GPU':<12} "
        f"{'SM active':>9} {'Occupancy':>9} {'Tensor':>7} {'DRAM BW':>7} {'Measured':>8}",
    ]
    for g in sorted(shown, key=lambda g: (run_of(g), g["node"], g["gpu_uuid"])):
        run = f"{run_of(g):<4}" if several else ""
        head = f"  {run}{g['node']:<8} {short(str(g['gpu_uuid'])):<12} "
        if not measured_by_gpm(g):
            why = "this model has no GPM" if g.get("gpm_supported") is False else "no GPM readings"
            lines.append(f"{head}not measured ({why})")
            continue
        held = _known(g, "gpu_seconds") or 0.0
        share = 100.0 * (_known(g, "gpm_seconds") or 0.0) / held if held > 0 else None
        lines.append(
            f"{head}{_pct(g.get('sm_active_mean_percent')):>9} "
            f"{_pct(g.get('sm_occupancy_mean_percent')):>9} "
            f"{_pct(g.get('tensor_active_mean_percent')):>7} "
            f"{_pct(g.get('dram_bw_mean_percent')):>7} "
            f"{f'{share:.0f}%' if share is not None else '-':>8}"
        )
    return lines


def _hours(seconds: Any) -> str:
    return f"{_f(seconds) / 3600.0:.4f}" if is_known(seconds) else "-"


def _pct(value: Any) -> str:
    return f"{float(value):.1f}%" if is_known(value) else "-"
