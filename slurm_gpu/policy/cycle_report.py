"""What one controller cycle did: for logs, `controller run --once` output and tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from slurm_gpu.models import Verdict


@dataclass
class CycleReport:
    """What one cycle did: for logs, `--once` output and tests."""

    time: float
    dry_run: bool
    skipped: str = ""
    verdicts: list[Verdict] = field(default_factory=list)
    outcomes: dict[int, str] = field(default_factory=dict)
    notified: int = 0
    store_down_since: float | None = None
    """When the store stopped answering, while it has not come back (None: it answers)."""
    spooled: int = 0
    """Audit rows this cycle put in the local spool instead of the store."""
