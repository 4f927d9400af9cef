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
"""

__all__ = ["is_active"]


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
