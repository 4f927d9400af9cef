"""Reading a whole GPU: its samples since the last read, split by the jobs that held it.

The window since the GPU's last read is split by the jobs that held it (attribution.py)
into pieces merged into the spool; each running job's activity is queued when it changed;
the GPU's ended periods are sealed into the outbox. A GPU shares hold in the window is
handed to the share reader (share_read.py); a GPU in MIG mode is read by mig_read.py,
which answers the same `read`.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from dataclasses import replace

from slurm_gpu.models import GpuDevice
from slurm_gpu.node.attribution import JobSpan, period_start, split_window
from slurm_gpu.node.read_context import ReadContext
from slurm_gpu.node.share_read import ShareReader
from slurm_gpu.node.spool import PieceBatch
from slurm_gpu.node.tick_types import GpuState, TickResult

# The agent's logger: what the tick's collaborators log reads as the agent's, as before.
log = logging.getLogger("slurm_gpu.node.agent")


class WholeGpuReader:
    """Reads whole GPUs (not in MIG mode); a GPU shares hold goes to `shares`."""

    def __init__(self, ctx: ReadContext, shares: ShareReader) -> None:
        self.ctx = ctx
        self.shares = shares

    def read(
        self,
        db: sqlite3.Connection,
        batch: PieceBatch,
        device: GpuDevice,
        spans: list[JobSpan],
        state: GpuState | None,
        now: float,
        result: TickResult,
    ) -> GpuState:
        """Reads one GPU into the spool; returns where its next read starts (gpu_state).

        Its pieces go into `batch`, written by the tick (or here, before a seal).
        """
        ctx = self.ctx
        marks, settings = ctx.marks, ctx.settings
        last_read, last_sample, last_energy = state or (None, None, None)
        if state is not None and last_read is not None and now <= last_read:
            return ctx.written_ahead(device, state)
        continuous = last_read is not None and 0 < now - last_read <= settings.max_gap
        w0 = ctx.window_start(last_read, now, continuous)
        since = last_sample if continuous and last_sample is not None else w0
        # The source stamps samples with the wall clock: `lag` behind the agent's time.
        lag = ctx.clock.lag
        since = min(since, w0 - lag)
        snap = ctx.source.snapshot(device, since)
        result.snapshots[device.uuid] = snap
        newest = max((s.time for s in snap.samples), default=last_sample)
        if lag and snap.samples:
            snap = replace(snap, samples=tuple(s._replace(time=s.time + lag) for s in snap.samples))
        previous_mem = marks.last_mem.pop(device.uuid, None) if continuous else None
        if snap.error is not None:
            # Nothing is known about this window: it stays uncovered (missing).
            ctx.unreadable(device, snap.error, now, (device.uuid,))
            return now, last_sample, None
        if marks.lost.pop(device.uuid, None) is not None:
            log.warning("GPU %s (minor %d) answers again", device.uuid, device.minor)
        if not continuous or device.uuid not in marks.measured_since:
            marks.measured_since[device.uuid] = w0
        marks.last_mem[device.uuid] = snap.mem_used_bytes
        energy_delta = None
        if continuous and snap.energy_joules is not None and last_energy is not None:
            delta = snap.energy_joules - last_energy
            energy_delta = delta if delta >= 0 else None  # counter reset (driver reload)
        index = ctx.binding.uuid_index.get(device.uuid)
        mine = [
            s
            for s in spans
            if s.slurm_index == index and s.start < now and (s.end is None or s.end > w0)
        ]
        # shares hold it in this window: measured per process
        held = self.shares.held
        if held and index in held and any(s.shards for s in mine):
            self.shares.read(db, batch, device, snap, mine, w0, now, energy_delta, result)
            return now, newest, snap.energy_joules
        ctx.ledger.read(device.uuid)
        period = settings.period
        pieces = split_window(
            w0, now, snap, mine, period, settings.active_threshold, energy_delta, previous_mem
        )
        unallocated = ctx.unallocated.strays(device.uuid, snap, mine, now)
        if unallocated:
            result.unallocated[device.uuid] = unallocated
        for n, piece in enumerate(pieces):
            batch.add(
                device.uuid,
                device.name,
                piece,
                snap.mem_total_bytes,
                snap.temperature_celsius,
                snap.ecc_errors_total,
                unallocated if n == len(pieces) - 1 else (),
            )
        for span in mine:
            if span.end is None:
                ctx.activity.queue_gpu(
                    db, device.uuid, span, snap, w0, now, marks.measured_since.get(device.uuid)
                )
        before = period_start(now, period) - period
        next_seal = marks.next_seal.get(device.uuid, -math.inf)
        if pieces:  # in time order: the first starts in the earliest period
            next_seal = min(next_seal, pieces[0].period_start)
        if next_seal <= before:
            batch.flush(db)  # sealing reads the period rows
            # a GPU shares held (or whose rows of a previous run are not known) has slot rows
            slotted = device.uuid in marks.slotted or device.uuid not in marks.next_seal
            result.sealed += ctx.spool.seal_periods(db, ctx.node, device.uuid, before, slotted)
            next_seal = before + period  # what is left starts in a later period
        marks.next_seal[device.uuid] = next_seal
        return now, newest, snap.energy_joules
