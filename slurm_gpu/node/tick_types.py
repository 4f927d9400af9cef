"""What the node agent's tick and its collaborators share: settings, a tick's result.

Here so that the readers (gpu_read.py, mig_read.py, share_read.py) and the tick
(agent.py) import them without an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurm_gpu.gpu import GpuSnapshot
from slurm_gpu.models import JobGpuSummary

# Where a GPU's reads stand (the spool's gpu_state): its last read (the agent's time), its
# newest sample (the source's clock) and its energy counter then.
GpuState = tuple[float | None, float | None, float | None]


@dataclass(frozen=True)
class AgentSettings:
    """The agent's numeric settings (see `NodeAgent` for each).

    Args:
        interval: seconds between ticks.
        period: shipping period in seconds (intervals are aggregated to this).
        active_threshold: `[node] active_threshold_percent`.
        sm_active_threshold: `[node] sm_active_threshold_percent`.
        max_gap_intervals: a read later than this many intervals after the previous one
            does not claim the gap: it is recorded as missing, not as idle.
        activity_refresh: `[node] activity_refresh`, seconds.
        clock_step: a wall clock further than this many seconds from the agent's time has
            stepped.
    """

    interval: float = 10.0
    period: float = 60.0
    active_threshold: float = 5.0
    sm_active_threshold: float = 5.0
    max_gap_intervals: float = 3.0
    activity_refresh: float = 300.0
    clock_step: float = 2.0

    @property
    def max_gap(self) -> float:
        """Seconds after the previous read past which a read does not claim the gap."""
        return self.max_gap_intervals * self.interval


@dataclass
class TickResult:
    """What one tick did (for logs, metrics and tests)."""

    time: float
    snapshots: dict[str, GpuSnapshot] = field(default_factory=dict)
    events: int = 0
    sealed: int = 0
    summaries: list[JobGpuSummary] = field(default_factory=list)
    unallocated: dict[str, tuple[int, ...]] = field(default_factory=dict)
    activity: int = 0  # activity rows queued (the others stand: ship_less.py)
