"""When a GPU counts as active: the one rule the node agent and the idle policy share.

The threshold is `[node] active_threshold_percent` (default 5, the operations guide's
"under 5% utilization is idle"). The agent marks each NVML sample active or not with it
(a job's `active_s`, the `last_active` time the controller reads), and `[policy.idle_gpu]`
applies it to a GPU's recent mean utilization, so a reading exactly at the threshold is
classified the same on both sides.

The same rule classifies NVML GPM's SM activity (issue #13) against `[node]
sm_active_threshold_percent` (default 5): the agent's `last_sm_active` is the end of the
newest GPM window whose SM activity is active by it, and `[policy.idle_gpu] signal =
"sm_active"` judges a GPU's recent SM activity by it.

A GPU slot (issue 14: a whole GPU, a MIG slice, a shard or MPS share) is judged by its own
activity row with the same rule: a MIG slice's utilization is GPM's graphics activity of
its GPU instance, a share's the sum of its own job's processes. The helpers below name a
slot and its measurement the one way every policy reason and report uses.
"""

from __future__ import annotations

from fractions import Fraction

from slurm_gpu.models import Measurement, SlotKind

__all__ = [
    "MEASUREMENT_TEXT",
    "is_active",
    "measurement_text",
    "share_text",
    "slot_text",
    "utilization_measured",
]


def is_active(util_percent: float, threshold_percent: float) -> bool:
    """Whether a GPU utilization reading counts as use of the GPU.

    Below the threshold is idle, at or above it is active: with the default 5%, a GPU
    at 4.9% is idle and one at 5.0% is in use. A threshold of 0 makes every reading
    active (nothing is idle).

    Args:
        util_percent: NVML utilization (`nvidia-smi --query-gpu=utilization.gpu`), 0-100,
            or GPM SM activity (`NVML_GPM_METRIC_SM_UTIL`), 0-100.
        threshold_percent: `[node] active_threshold_percent` (for SM activity,
            `[node] sm_active_threshold_percent`).
    """
    return util_percent >= threshold_percent


# How a slot is named and how its figures were measured (issue 14, docs/design/gpu-slots.md):
# the idle policy's reasons, the job view, sacct and the reports say it the same way.
MEASUREMENT_TEXT = {
    Measurement.NVML: "NVML samples",
    Measurement.GPM: "GPM of its GPU instance",
    Measurement.MEMORY_ONLY: "memory only: utilization not measured on an Ampere MIG slice",
    Measurement.PER_PROCESS: "per process",
}


def measurement_text(measured_by: str) -> str:
    """What a summary says about how it was measured ("GPM of its GPU instance")."""
    try:
        return MEASUREMENT_TEXT[Measurement(measured_by)]
    except ValueError:
        return str(measured_by)


def share_text(share: float) -> str:
    """A share of a GPU as a fraction: 0.25 -> "1/4", 1/7 -> "1/7" (1 -> "1")."""
    fraction = Fraction(share).limit_denominator(128)
    if fraction.denominator == 1:
        return str(fraction.numerator)
    return f"{fraction.numerator}/{fraction.denominator}"


def slot_text(
    kind: str, slot_id: str, parent_uuid: str, share: float = 1.0, mig_profile: str = ""
) -> str:
    """A slot for people: "whole GPU GPU-1", "MIG 1g.10gb of GPU-1", "shard 1/4 of GPU-1".

    Args:
        kind: a `SlotKind` value ("gpu", "mig", "shard", "mps").
        slot_id: the slot's id (a whole GPU's is its UUID).
        parent_uuid: the physical GPU's UUID.
        share: the slot's part of the parent's compute.
        mig_profile: a MIG slice's profile.
    """
    if kind == SlotKind.MIG:
        return f"MIG {mig_profile or '?'} of {parent_uuid}"
    if kind == SlotKind.SHARD:
        return f"shard {share_text(share)} of {parent_uuid}"
    if kind == SlotKind.MPS:
        return f"MPS {share_text(share)} of {parent_uuid}"
    return f"whole GPU {slot_id or parent_uuid}"


def utilization_measured(measured_by: str) -> bool:
    """False where a slot's utilization is not measured at all (an Ampere MIG slice)."""
    return measured_by != Measurement.MEMORY_ONLY
