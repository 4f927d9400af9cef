"""The controller's view of each running job's GPU or slot, queued when it changed.

`ActivityQueue` builds a running job's `GpuActivity` row from a read (a whole GPU's
samples, a MIG slice's or a share's one figure), keeps when each job last was active on
each GPU or slot, and hands the row to the ship-less ledger (ship_less.py), which says
whether it changed enough to be queued in the spool's outbox.
"""

from __future__ import annotations

import sqlite3

from slurm_gpu.activity import is_active
from slurm_gpu.gpu import GpuSnapshot
from slurm_gpu.models import GpuActivity, GpuSlot, Measurement
from slurm_gpu.node.attribution import JobSpan
from slurm_gpu.node.outbox import fields_of
from slurm_gpu.node.ship_less import ActivityLedger
from slurm_gpu.node.spool import Spool


class ActivityQueue:
    """Running jobs' activity rows, with when each job was last active where it runs.

    Args:
        node: this node's name.
        spool: the node's spool (its outbox).
        ledger: what was shipped (ship_less.py): a row is queued only when it changed.
        active_threshold: `[node] active_threshold_percent`.
        sm_active_threshold: `[node] sm_active_threshold_percent`.
    """

    def __init__(
        self,
        node: str,
        spool: Spool,
        ledger: ActivityLedger,
        active_threshold: float,
        sm_active_threshold: float,
    ) -> None:
        self.node = node
        self.spool = spool
        self.ledger = ledger
        self.active_threshold = active_threshold
        self.sm_active_threshold = sm_active_threshold
        self.last_active: dict[tuple[int, int, str], float] = {}  # (job, restart, uuid)
        self.last_sm_active: dict[tuple[int, int, str], float] = {}  # the same, by GPM

    def shift(self, seconds: float) -> None:
        """Moves the last active times by `seconds` (the agent's clock re-anchored)."""
        for marks in (self.last_active, self.last_sm_active):
            for key in marks:
                marks[key] += seconds

    def forget_run(self, run: tuple[int, int]) -> None:
        """A run (job, restart) was summarized: its activity is no longer kept."""
        self.ledger.forget_job(run[0])
        self.last_active = {k: v for k, v in self.last_active.items() if k[:2] != run}
        self.last_sm_active = {k: v for k, v in self.last_sm_active.items() if k[:2] != run}

    def queue_gpu(
        self,
        db: sqlite3.Connection,
        uuid: str,
        span: JobSpan,
        snap: GpuSnapshot,
        w0: float,
        now: float,
        measured_since: float | None,
    ) -> None:
        """The controller's view of a running job's GPU, queued when it changed (replaced).

        `measured_since`: where the GPU's current unbroken run of readings began.
        """
        since = max(w0, span.start)
        mine = [s for s in snap.samples if since < s.time <= now]
        busy = [s.time for s in mine if is_active(s.util_percent, self.active_threshold)]
        key = (span.job_id, span.restart, uuid)
        if busy:
            self.last_active[key] = max(busy)
        # GPM: the newest window's SM activity. A job that started inside that window
        # shares its mean with what ran before (the finest truth one window gives, as in
        # attribution.py); its end is this read, on the agent's clock.
        sm_active = snap.gpm.sm_active_percent if snap.gpm is not None else None
        if sm_active is not None and is_active(sm_active, self.sm_active_threshold):
            self.last_sm_active[key] = now
        activity = GpuActivity(
            job_id=span.job_id,
            node=self.node,
            gpu_uuid=uuid,
            slurm_index=span.slurm_index,
            start=span.start,
            last_reading=now,
            last_active=self.last_active.get(key),
            util_recent_percent=sum(s.util_percent for s in mine) / len(mine) if mine else None,
            mem_used_bytes=snap.mem_used_bytes,
            process_count=None if snap.processes is None else len(snap.processes),
            measured_since=measured_since,
            sm_active_recent_percent=sm_active,
            last_sm_active=self.last_sm_active.get(key),
        )
        row_key = f"activity:{span.job_id}:{uuid}"
        if self.ledger.offer(row_key, activity, snap.mem_total_bytes):
            self.spool.queue(db, "activity", row_key, fields_of(activity))

    def queue_slot(
        self,
        db: sqlite3.Connection,
        slot: GpuSlot,
        span: JobSpan,
        measured: Measurement,
        measured_since: float | None,
        now: float,
        util: float | None,
        memory: int | None,
        processes: int | None,
        sm_active: float | None,
        mem_total: int | None,
    ) -> None:
        """The controller's view of a running job's slot (MIG slice, share), when it changed.

        `measured_since`: where the unbroken run of readings of what was read for it (the
        MIG device, the shared GPU) began. A window at or above the threshold is active
        up to this read (GPM windows and per-process means have no finer time).
        `mem_total`: the slot's memory, which memory changes are measured by.
        """
        key = (span.job_id, span.restart, slot.slot_id)
        if util is not None and is_active(util, self.active_threshold):
            self.last_active[key] = now
        if sm_active is not None and is_active(sm_active, self.sm_active_threshold):
            self.last_sm_active[key] = now
        activity = GpuActivity(
            job_id=span.job_id,
            node=self.node,
            gpu_uuid=slot.parent_uuid,
            slurm_index=span.slurm_index,
            start=span.start,
            last_reading=now,
            last_active=self.last_active.get(key),
            util_recent_percent=util,
            mem_used_bytes=memory,
            process_count=processes,
            measured_since=measured_since,
            sm_active_recent_percent=sm_active,
            last_sm_active=self.last_sm_active.get(key),
            slot_id=slot.slot_id,
            slot_kind=slot.kind,
            share=slot.share,
            mig_profile=slot.mig_profile,
            measured_by=measured,
        )
        row_key = f"activity:{span.job_id}:{slot.slot_id}"
        if self.ledger.offer(row_key, activity, mem_total):
            self.spool.queue(db, "activity", row_key, fields_of(activity))
