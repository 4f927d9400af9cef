"""What every GPU reader works with, and what the readers keep between ticks.

The agent reads a whole GPU (gpu_read.py), a GPU in MIG mode slice by slice (mig_read.py)
or a GPU shares hold, process by process (share_read.py); each reader answers the same
`read(db, batch, device, spans, state, now, result)`. They share a `ReadContext`: the
settings, the source, the spool, the agent's clock and binding, the activity queue, the
unallocated-use check, and `ReadMarks`, the state they keep between ticks; and its
helpers: where a window starts, a GPU that cannot be read, sealing a GPU with slots.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from dataclasses import dataclass, field

from slurm_gpu.activity import is_active
from slurm_gpu.gpu import GpuSource
from slurm_gpu.models import GpuDevice, LostGpu
from slurm_gpu.node.activity_queue import ActivityQueue
from slurm_gpu.node.agent_clock import AgentClock
from slurm_gpu.node.attribution import Piece, period_start
from slurm_gpu.node.binding import GpuBinding
from slurm_gpu.node.processes import UnallocatedUse
from slurm_gpu.node.ship_less import ActivityLedger
from slurm_gpu.node.spool import PieceBatch, Spool
from slurm_gpu.node.tick_types import AgentSettings, GpuState, TickResult

# The agent's logger: what the tick's collaborators log reads as the agent's, as before.
log = logging.getLogger("slurm_gpu.node.agent")


@dataclass
class ReadMarks:
    """What the readers keep of each GPU and slot between ticks (ids: uuid, slot id)."""

    # where the current unbroken run of readings began (GpuActivity.measured_since)
    measured_since: dict[str, float] = field(default_factory=dict)
    last_mem: dict[str, int | None] = field(default_factory=dict)  # memory at its last read
    # GPUs that cannot be read, by uuid ("minor:N" for one NVML never showed)
    lost: dict[str, LostGpu] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)  # slot or GPU ids whose fault was logged
    # uuid -> no open period of it in the spool starts before this (absent: unknown, as
    # at start, when rows of the previous run may wait): saves a query a tick per GPU
    next_seal: dict[str, float] = field(default_factory=dict)
    slotted: set[str] = field(default_factory=set)  # GPUs with slot rows (MIG, shares)


@dataclass
class ReadContext:
    """What every reader works with (see the module docstring)."""

    node: str
    settings: AgentSettings
    source: GpuSource
    spool: Spool
    clock: AgentClock
    binding: GpuBinding
    ledger: ActivityLedger
    activity: ActivityQueue
    unallocated: UnallocatedUse
    marks: ReadMarks

    def window_start(self, last_read: float | None, now: float, continuous: bool) -> float:
        """Where this read's window starts: the last read, else an interval before now.

        Never before the last read (after the wall clock stepped back): what is written
        is never covered twice.
        """
        if continuous and last_read is not None:
            return last_read
        w0 = now - self.settings.interval
        return w0 if last_read is None else max(w0, last_read)

    def written_ahead(self, device: GpuDevice, state: GpuState) -> GpuState:
        """The GPU's intervals are written past now: it is not read until now passes them.

        The wall clock stepped back while no agent ran (the spool's last read is ahead of
        a new agent's time), or the agent went back on the wall clock (`rejoin_wall`).
        """
        for uuid in (device.uuid, *(m.uuid for m in device.mig_devices)):
            self.marks.measured_since.pop(uuid, None)  # no readings meanwhile: the run ends
        return state

    def unreadable(self, device: GpuDevice, error: str, now: float, slots: tuple[str, ...]) -> None:
        """`device` could not be read this tick.

        The idle clocks of `slots` start again after the gap, and the GPU is reported lost
        (logged once, until it answers again).
        """
        for uuid in slots:
            self.marks.measured_since.pop(uuid, None)
        if device.uuid not in self.marks.lost:
            log.error("GPU %s (minor %d) cannot be read: %s", device.uuid, device.minor, error)
            self.marks.lost[device.uuid] = LostGpu(device.uuid, device.minor, now, error)

    def measured(self, piece: Piece, util: float) -> Piece:
        """A slot's piece measured by one figure for its window (GPM graphics, per process)."""
        active = 1 if is_active(util, self.settings.active_threshold) else 0
        return piece._replace(
            util_sum=util, util_count=1, util_max=util, util_min=util, active_count=active
        )

    def seal_slotted(
        self,
        db: sqlite3.Connection,
        batch: PieceBatch,
        uuid: str,
        first_period: float | None,
        now: float,
        result: TickResult,
    ) -> None:
        """Seals the ended periods of a GPU with slots: its slots' rows and its totals."""
        marks, period = self.marks, self.settings.period
        marks.slotted.add(uuid)
        before = period_start(now, period) - period
        next_seal = marks.next_seal.get(uuid, -math.inf)
        if first_period is not None:
            next_seal = min(next_seal, first_period)
        if next_seal <= before:
            batch.flush(db)
            result.sealed += self.spool.seal_periods(db, self.node, uuid, before, slotted=True)
            next_seal = before + period
        marks.next_seal[uuid] = next_seal
