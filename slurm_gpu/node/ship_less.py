"""Ship less (issue 16): a job's activity row ships when it changed, a heartbeat every tick.

A GpuActivity row holds until the next one for that job and slot. The agent queues a
new row only when what the controller reads from it would change; in between, the
node's heartbeat of each tick (NodeHeartbeat: alive at `tick`, these slots read) lets the
store carry the standing row forward (`slurm_gpu.store.heartbeats.extended`, the one
place that rule lives; this module asks it what the store would show).

A row ships when, against what the store would show at this tick without it:
- it is the first for its job and slot (or the previous one left the agent's memory: a
  restarted agent, a slot that was not read, a run summarized here);
- anything but the moving figures differs: process count, `measured_since` (a gap in the
  readings), the slot and how it is measured;
- the newest window's activity differs: utilization at or above `[node]
  active_threshold_percent` or not (or not measured), the same for GPM SM activity by
  `[node] sm_active_threshold_percent`;
- utilization or SM activity moved by `STEP_PERCENT` points or more, memory in use by
  `MEM_STEP_FRACTION` of the slot's memory or more;
- the newest active time differs where the window is not active (a busy sample in a
  window whose mean is below the threshold: the store would not know of it);
- the last row shipped is `refresh` (`[node] activity_refresh`) old or older.

A slot the tick could not read (its GPU lost, a MIG slice or per-process read failing) is
left out of the heartbeat, so its rows go stale. Its standing rows are shipped once more,
carried to the last heartbeat that vouched for them, so the store says when the slot was
last read (not when its row last changed); the slot's next read ships a first row.

What is shipped is remembered only once the tick's transaction commits; a tick rolled
back ships all of it again next time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import replace

from slurm_gpu.activity import is_active
from slurm_gpu.models import GpuActivity, NodeHeartbeat
from slurm_gpu.node.outbox import decode_activity, decode_heartbeat
from slurm_gpu.store.heartbeats import extended

__all__ = ["MEM_STEP_FRACTION", "STEP_PERCENT", "ActivityLedger", "outbox_view"]

STEP_PERCENT = 5.0  # utilization / SM activity points that make a new row
MEM_STEP_FRACTION = 0.05  # of the slot's memory


class ActivityLedger:
    """What the agent shipped of each running job's activity, and the tick's heartbeat.

    Args:
        node: this node's name.
        active_threshold: `[node] active_threshold_percent`.
        sm_active_threshold: `[node] sm_active_threshold_percent`.
        refresh: `[node] activity_refresh`, seconds: the longest a row goes unshipped.
    """

    def __init__(
        self, node: str, active_threshold: float, sm_active_threshold: float, refresh: float
    ) -> None:
        self.node = node
        self.active_threshold = active_threshold
        self.sm_active_threshold = sm_active_threshold
        self.refresh = refresh
        self._shipped: dict[str, GpuActivity] = {}  # outbox key -> the row shipped, committed
        self._tick: dict[str, GpuActivity] = {}  # the same, as this tick leaves it
        self._slots: list[str] = []  # slots read this tick
        self._ended: set[int] = set()  # jobs with a run summarized this tick
        self._beat: NodeHeartbeat | None = None  # the newest heartbeat committed
        self.queued = 0  # activity rows queued this tick

    def begin(self) -> None:
        """A tick starts: nothing read, nothing queued yet."""
        self._tick = {}
        self._slots = []
        self._ended = set()
        self.queued = 0

    def read(self, slot_id: str) -> None:
        """Slot `slot_id` (a whole GPU's UUID, a MIG UUID, a share's id) was read this tick."""
        self._slots.append(slot_id)

    def offer(self, key: str, row: GpuActivity, mem_total: int | None) -> bool:
        """Whether `row` (outbox key `key`) must be queued now; remembers what stands.

        Args:
            key: the row's outbox key.
            row: the activity the agent read this tick.
            mem_total: the slot's memory (bytes), which memory changes are measured by;
                None: unknown, and any change of memory ships.
        """
        shipped = self._shipped.get(key)
        if shipped is not None and not self._changed(shipped, row, mem_total):
            self._tick[key] = shipped
            return False
        self._tick[key] = row
        self.queued += 1
        return True

    def forget_job(self, job_id: int) -> None:
        """A run of `job_id` was summarized this tick: the store then forgets the job's rows.

        Its rows queued this tick land before the summary and are dropped with it, so the
        next tick ships them again.
        """
        self._tick = {k: v for k, v in self._tick.items() if v.job_id != job_id}
        self._ended.add(job_id)

    def heartbeat(self, tick: float) -> NodeHeartbeat:
        """This tick's heartbeat: read up to `tick`, the slots read."""
        return NodeHeartbeat(self.node, tick, tuple(dict.fromkeys(self._slots)))

    def carried(self) -> list[tuple[str, GpuActivity]]:
        """The standing rows of slots this tick did not read, carried to their last read.

        (outbox key, row) of each row shipped before whose slot the last heartbeat
        vouched for and this tick did not read, its job not summarized this tick: the
        last heartbeat's view of it (`extended`), shipped once so the store keeps it.
        """
        beat = self._beat
        if beat is None:
            return []
        vouched, read = set(beat.slots), set(self._slots)
        out = []
        for key, row in self._shipped.items():
            slot = row.effective_slot_id
            if key in self._tick or row.job_id in self._ended or slot in read:
                continue
            if slot in vouched and beat.tick > row.last_reading:
                out += [(key, view) for view in extended([row], {self.node: beat})]
        return out

    def commit(self, beat: NodeHeartbeat) -> None:
        """The tick's transaction committed, with heartbeat `beat`: what it queued is shipped.

        Rows not offered this tick (of ended jobs, of slots not read) are forgotten.
        """
        self._shipped = self._tick
        self._tick = {}
        self._beat = beat

    def rollback(self) -> None:
        """The tick's transaction rolled back: nothing of it was queued."""
        self._tick = {}

    def _changed(self, shipped: GpuActivity, row: GpuActivity, mem_total: int | None) -> bool:
        """Whether the store, showing `shipped` carried to `row`'s reading, would mislead."""
        if row.last_reading - shipped.last_reading >= self.refresh:
            return True
        beat = NodeHeartbeat(row.node, row.last_reading, (row.effective_slot_id,))
        (view,) = extended([shipped], {row.node: beat})
        if _standing(view) != _standing(row):
            return True
        util_now, util_then = row.util_recent_percent, view.util_recent_percent
        sm_now, sm_then = row.sm_active_recent_percent, view.sm_active_recent_percent
        util_active = _active(util_now, self.active_threshold)
        sm_active = _active(sm_now, self.sm_active_threshold)
        if util_active != _active(util_then, self.active_threshold):
            return True
        if sm_active != _active(sm_then, self.sm_active_threshold):
            return True
        if _moved(util_now, util_then, STEP_PERCENT) or _moved(sm_now, sm_then, STEP_PERCENT):
            return True
        step = MEM_STEP_FRACTION * mem_total if mem_total else 0.0
        if _moved(row.mem_used_bytes, view.mem_used_bytes, step):
            return True
        # A window active by its mean is active up to its reading for the idle rule
        # (policy/rules/idle.py), whatever `last_active` says; otherwise it must be right.
        if not util_active and row.last_active != view.last_active:
            return True
        return not sm_active and row.last_sm_active != view.last_sm_active


def outbox_view(rows: Iterable[tuple[str, str]]) -> list[GpuActivity]:
    """What the store shows of outbox rows (kind, payload) once they are all shipped.

    Their activity rows carried forward to the newest heartbeat among them, as
    `Store.activity` does (for a look at a spool, and tests). Raises OutboxError.
    """
    activity: list[GpuActivity] = []
    beats: dict[str, NodeHeartbeat] = {}
    for kind, payload in rows:
        if kind == "activity":
            activity.append(decode_activity(payload))
        elif kind == "heartbeat":
            beat = decode_heartbeat(payload)
            if beat.node not in beats or beat.tick > beats[beat.node].tick:
                beats[beat.node] = beat
    return extended(activity, beats)


_MOVING = {
    "last_reading": 0.0,
    "last_active": None,
    "last_sm_active": None,
    "util_recent_percent": None,
    "sm_active_recent_percent": None,
    "mem_used_bytes": None,
}
assert set(_MOVING) <= {f.name for f in dataclasses.fields(GpuActivity)}


def _standing(row: GpuActivity) -> GpuActivity:
    """The row without its moving figures: what must be equal for a row to stand."""
    return replace(row, **_MOVING)  # type: ignore[arg-type]


def _active(value: float | None, threshold: float) -> bool | None:
    """Active, idle, or not measured (None)."""
    return None if value is None else is_active(value, threshold)


def _moved(now: float | None, then: float | None, step: float) -> bool:
    """Known on one side only, or moved by `step` or more (any change for a step of 0)."""
    if now is None or then is None:
        return (now is None) != (then is None)
    if step <= 0:
        return now != then
    return abs(now - then) >= step
