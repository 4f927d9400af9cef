"""The fields of `slurm-gpu sacct -o`: sacct's names and widths, plus the GPU figures."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from slurm_gpu.activity import measurement_text, share_text
from slurm_gpu.reports.render import Cell, Field, fixed, fmt_int, fmt_text
from slurm_gpu.slurm.timespec import format_elapsed, format_sacct_time
from slurm_gpu.units import GIB, is_known

DEFAULT_FORMAT = (
    "JobID,JobName,User,Account,Partition,State,Elapsed,AllocGPUs,GPUHours,GPUUtilAvg,"
    "IdleGPUHours,Cost"
)
GPU_FORMAT = "JobID,User,Node,GPU,GPUModel,GPUHours,GPUUtilAvg,GPUUtilMax,GPUMemMax,IdleGPUHours"
# [cost] charge = "effective": the bill's second part, next to Cost.
HELD_COST_FORMAT = ",IdleHeldCost"


def _key(name: str) -> Callable[[Mapping[str, Any]], Cell]:
    def get(record: Mapping[str, Any]) -> Cell:
        value = record.get(name)
        return value if is_known(value) else None

    return get


def _hours(name: str) -> Callable[[Mapping[str, Any]], Cell]:
    def get(record: Mapping[str, Any]) -> Cell:
        value = record.get(name)
        return float(value) / 3600.0 if is_known(value) else None

    return get


def _scaled(name: str, factor: float) -> Callable[[Mapping[str, Any]], Cell]:
    def get(record: Mapping[str, Any]) -> Cell:
        value = record.get(name)
        return float(value) / factor if is_known(value) else None

    return get


def _time(value: Cell) -> str:
    return format_sacct_time(float(value)) if value is not None else "Unknown"


def _duration(value: Cell) -> str:
    if value is None or isinstance(value, str) or not is_known(value):
        return ""  # NaN: not recorded
    return format_elapsed(float(value))


def _limit(value: Cell) -> str:
    return "UNLIMITED" if value is None else format_elapsed(float(value))


def _time_get(name: str) -> Callable[[Mapping[str, Any]], Cell]:
    def get(record: Mapping[str, Any]) -> Cell:
        value = record.get(name)
        return float(value) if is_known(value) else None

    return get


def _share(record: Mapping[str, Any]) -> Cell:
    value = record.get("share")
    return share_text(float(value)) if is_known(value) else None


def _measured(record: Mapping[str, Any]) -> Cell:
    value = record.get("measured_by")
    return measurement_text(str(value)) if is_known(value) and value else None


def job_fields(currency: str = "") -> dict[str, Field]:
    """Every field, in --helpformat order; `currency` labels Cost."""
    cost_unit = f" ({currency})" if currency else ""
    h2, h4 = fixed(2), fixed(4)
    fields = [
        Field(
            "JobID",
            -12,
            "Job id as sacct shows it (array 12_3, het 7+1)",
            _key("job_id_text"),
            fmt_text,
        ),
        Field("JobIDRaw", -12, "Numeric job id", _key("job_id"), fmt_int),
        Field("JobName", 10, "Job name", _key("name"), fmt_text),
        Field("User", 9, "User name", _key("user"), fmt_text),
        Field("Account", 10, "Slurm account", _key("account"), fmt_text),
        Field("Partition", 10, "Partition", _key("partition"), fmt_text),
        Field("QOS", 10, "Quality of service (from sacct)", _key("qos"), fmt_text),
        Field("NodeList", 15, "Nodes of the job (comma-separated)", _key("nodes"), fmt_text),
        Field("Node", 10, "Node of this GPU (--gpus)", _key("node"), fmt_text),
        Field("GPU", 40, "GPU UUID (--gpus)", _key("gpu_uuid"), fmt_text),
        Field("State", 10, "Job state", _key("state"), fmt_text),
        Field("Submit", 19, "Submit time (local)", _time_get("submit_time"), _time),
        Field("Start", 19, "Start time (local)", _time_get("start_time"), _time),
        Field("End", 19, "End time (local; Unknown while running)", _time_get("end_time"), _time),
        Field(
            "Elapsed",
            10,
            "Run time [D-]HH:MM:SS (so far, while running)",
            _key("elapsed_seconds"),
            _duration,
        ),
        Field("ElapsedRaw", 10, "Run time in seconds", _key("elapsed_seconds"), fmt_int),
        Field(
            "Suspended",
            10,
            "Time suspended [D-]HH:MM:SS (sacct's; not in Elapsed)",
            _key("suspended_seconds"),
            _duration,
        ),
        Field("Timelimit", 10, "Time limit (from sacct)", _key("time_limit_seconds"), _limit),
        Field(
            "QueueWait", 10, "Start - Submit, [D-]HH:MM:SS", _key("queue_wait_seconds"), _duration
        ),
        Field("QueueWaitRaw", 12, "Start - Submit in seconds", _key("queue_wait_seconds"), fmt_int),
        Field("AllocGPUs", 9, "GPUs allocated", _key("alloc_gpus"), fmt_int),
        Field("GPUModel", 22, "GPU model(s)", _key("gpu_model"), fmt_text),
        Field("GPUHours", 10, "GPU-hours: GPUs x hours held", _hours("gpu_seconds"), h4),
        Field(
            "GPUUtilAvg",
            10,
            "Mean GPU utilization %, weighted by GPU-hours",
            _key("util_mean_percent"),
            fixed(1),
        ),
        Field("GPUUtilMax", 10, "Highest GPU utilization %", _key("util_max_percent"), fixed(1)),
        Field(
            "ActiveGPUHours",
            14,
            "GPU-hours above [node] active_threshold_percent",
            _hours("active_seconds"),
            h4,
        ),
        Field(
            "IdleGPUHours",
            12,
            "Measured GPU-hours below [node] active_threshold_percent (never missing time)",
            _hours("idle_seconds"),
            h4,
        ),
        Field(
            "MissingGPUHours",
            15,
            "GPU-hours held with no readings (agent down, GPU lost): neither active nor idle",
            _hours("missing_seconds"),
            h4,
        ),
        Field(
            "SuspendedGPUHours",
            17,
            "GPU-hours the job was suspended (not in GPUHours, as Slurm charges)",
            _hours("suspended_gpu_seconds"),
            h4,
        ),
        Field(
            "GPUMemMax",
            9,
            "Peak GPU memory used on one GPU, GiB",
            _scaled("mem_max_bytes", GIB),
            h2,
        ),
        Field(
            "GPUMemHours", 11, "GPU memory in use x hours, GiB-hours", _hours("mem_gib_seconds"), h4
        ),
        Field("EnergyKWh", 9, "GPU energy, kWh", _scaled("energy_joules", 3.6e6), fixed(5)),
        Field("Cost", 10, f"Cost by [cost] prices{cost_unit}", _key("cost"), h2),
        # NVML GPM (Hopper and newer): blank where the GPU has none, never 0.
        Field(
            "SMActiveAvg",
            11,
            "Mean SM activity % (GPM: share of SMs with work), over the GPM-measured seconds",
            _key("sm_active_mean_percent"),
            fixed(1),
        ),
        Field(
            "SMOccupancyAvg",
            14,
            "Mean SM occupancy % (GPM: resident warps / the most an SM holds)",
            _key("sm_occupancy_mean_percent"),
            fixed(1),
        ),
        Field(
            "TensorActiveAvg",
            15,
            "Mean tensor-core activity % (GPM: any tensor pipe)",
            _key("tensor_active_mean_percent"),
            fixed(1),
        ),
        Field(
            "DRAMBWAvg",
            9,
            "Mean DRAM bandwidth used, % of the peak (GPM)",
            _key("dram_bw_mean_percent"),
            fixed(1),
        ),
        Field(
            "EffectiveGPUHours",
            17,
            "GPM-measured GPU-hours x SM activity (blank where not measured)",
            _hours("effective_seconds"),
            h4,
        ),
        Field(
            "GPMGPUHours",
            11,
            "GPU-hours GPM measured (the GPM figures' weight; the rest: not measured)",
            _hours("gpm_seconds"),
            h4,
        ),
        Field(
            "IdleHeldCost",
            12,
            f'[cost] charge = "effective": measured, held, SMs not active; not in Cost{cost_unit}',
            _key("idle_held_cost"),
            h2,
        ),
        Field(
            "DataSource", 10, "summary (finished) or intervals (running)", _key("source"), fmt_text
        ),
        # GPU slots (issue 14, --gpus): what the job held of the GPU and how it was measured.
        Field(
            "Slot",
            40,
            "Slot id: GPU UUID, MIG UUID or share id (--gpus)",
            _key("slot_id"),
            fmt_text,
        ),
        Field("SlotKind", 8, "gpu, mig, shard or mps (--gpus)", _key("slot_kind"), fmt_text),
        Field(
            "MIGProfile", 10, "MIG slice profile, 1g.10gb (--gpus)", _key("mig_profile"), fmt_text
        ),
        Field("Share", 6, "The slot's share of its GPU, 1/7 (--gpus)", _share, fmt_text),
        Field(
            "MeasuredBy",
            20,
            "How the slot was measured: NVML samples, GPM of its GPU instance, memory only, "
            "per process (--gpus)",
            _measured,
            fmt_text,
        ),
        Field(
            "PhysGPUHours",
            12,
            "Physical GPU-hours: share of the GPU x hours held (a 1g.10gb slice: 1/7)",
            _hours("physical_gpu_seconds"),
            h4,
        ),
    ]
    return {f.name: f for f in fields}
