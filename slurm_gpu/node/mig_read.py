"""Reading a GPU in MIG mode: its own totals, and each MIG slice as its own slot.

A GPU in MIG mode is never measured as a whole GPU for a job (NVML has no utilization
samples of it): each of its MIG devices is read (`mig_snapshot`) and measured as its own
slot, by the GPM of its GPU instance (Hopper+: utilization = graphics activity) or by
memory only (Ampere: utilization unknown, never 0). The GPU's own totals (power, energy,
temperature, ECC, memory) go out per period as a physical interval.
"""

from __future__ import annotations

import logging
import sqlite3

from slurm_gpu.gpu import GpuSnapshot, MigSnapshot
from slurm_gpu.models import GpuDevice, Measurement, MigDevice
from slurm_gpu.node.attribution import JobSpan, gpm_span, split_window
from slurm_gpu.node.read_context import ReadContext
from slurm_gpu.node.spool import PieceBatch
from slurm_gpu.node.tick_types import GpuState, TickResult

# The agent's logger: what the tick's collaborators log reads as the agent's, as before.
log = logging.getLogger("slurm_gpu.node.agent")


class MigGpuReader:
    """Reads GPUs in MIG mode, slice by slice (the same `read` as `WholeGpuReader`)."""

    def __init__(self, ctx: ReadContext) -> None:
        self.ctx = ctx
        self._mig_gpm: set[str] = set()  # MIG devices that gave GPM metrics

    def measurement(self, device: GpuDevice, mig: MigDevice) -> Measurement:
        """A MIG slice is measured by GPM where its GPU has it (Hopper+), else memory only."""
        if device.gpm_supported or mig.uuid in self._mig_gpm:
            return Measurement.GPM
        return Measurement.MEMORY_ONLY

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
        """Reads a GPU in MIG mode: its own totals, and each MIG device as its own slot.

        The GPU itself is never a job's slot: NVML has no utilization samples of it in
        MIG mode, and an idle rule fed its empty samples would read it idle.
        """
        ctx = self.ctx
        marks, settings = ctx.marks, ctx.settings
        last_read, _, last_energy = state or (None, None, None)
        if state is not None and last_read is not None and now <= last_read:
            return ctx.written_ahead(device, state)
        continuous = last_read is not None and 0 < now - last_read <= settings.max_gap
        w0 = ctx.window_start(last_read, now, continuous)
        snap = ctx.source.snapshot(device, w0 - ctx.clock.lag)
        result.snapshots[device.uuid] = snap
        if snap.error is not None:
            # Nothing is known about this window, of the GPU or of its slices: missing.
            slots = (device.uuid, *(m.uuid for m in device.mig_devices))
            ctx.unreadable(device, snap.error, now, slots)
            return now, None, None
        if marks.lost.pop(device.uuid, None) is not None:
            log.warning("GPU %s (minor %d) answers again", device.uuid, device.minor)
        if not continuous or device.uuid not in marks.measured_since:
            marks.measured_since[device.uuid] = w0
        energy_delta = None
        if continuous and snap.energy_joules is not None and last_energy is not None:
            delta = snap.energy_joules - last_energy
            energy_delta = delta if delta >= 0 else None
        physical = split_window(
            w0, now, snap, [], settings.period, settings.active_threshold, energy_delta
        )
        for piece in physical:
            batch.add_physical(
                device.uuid,
                piece,
                snap.mem_total_bytes,
                snap.temperature_celsius,
                snap.ecc_errors_total,
            )
        for mig in device.mig_devices:
            self._read_mig(db, batch, device, mig, spans, w0, now, continuous, result)
        first = physical[0].period_start if physical else None
        ctx.seal_slotted(db, batch, device.uuid, first, now, result)
        return now, None, snap.energy_joules

    def _read_mig(
        self,
        db: sqlite3.Connection,
        batch: PieceBatch,
        device: GpuDevice,
        mig: MigDevice,
        spans: list[JobSpan],
        w0: float,
        now: float,
        continuous: bool,
        result: TickResult,
    ) -> None:
        """One MIG device over (w0, now]: its slot's pieces and its jobs' activity."""
        ctx = self.ctx
        marks, warned = ctx.marks, ctx.marks.warned
        index = ctx.binding.uuid_index.get(mig.uuid)
        mine = [
            s
            for s in spans
            if index is not None
            and s.slurm_index == index
            and s.start < now
            and (s.end is None or s.end > w0)
        ]
        read: MigSnapshot = ctx.source.mig_snapshot(device, mig)
        previous_mem = marks.last_mem.pop(mig.uuid, None) if continuous else None
        if read.error is not None:
            marks.measured_since.pop(mig.uuid, None)  # a gap: missing, never idle
            if mig.uuid not in warned:
                warned.add(mig.uuid)
                log.error(
                    "MIG device %s (%s) of GPU %s cannot be read: %s",
                    mig.uuid,
                    mig.profile,
                    device.uuid,
                    read.error,
                )
            return
        if mig.uuid in warned:
            warned.discard(mig.uuid)
            log.warning("MIG device %s of GPU %s answers again", mig.uuid, device.uuid)
        if not continuous or mig.uuid not in marks.measured_since:
            marks.measured_since[mig.uuid] = w0
        ctx.ledger.read(mig.uuid)
        marks.last_mem[mig.uuid] = read.mem_used_bytes
        if read.gpm is not None:
            self._mig_gpm.add(mig.uuid)
        measured = self.measurement(device, mig)
        view = GpuSnapshot(
            mig.uuid,
            read.time,
            mem_used_bytes=read.mem_used_bytes,
            mem_total_bytes=read.mem_total_bytes,
            processes=read.processes,
            gpm=read.gpm,
        )
        pieces = split_window(
            w0,
            now,
            view,
            mine,
            ctx.settings.period,
            ctx.settings.active_threshold,
            None,
            previous_mem,
        )
        # A slice's utilization: its GPU instance's graphics activity, for the part of each
        # piece its GPM window covers; without GPM none (memory only: unknown, never 0).
        graphics = read.gpm.graphics_active_percent if read.gpm is not None else None
        window = gpm_span(w0, now, view) if graphics is not None else None
        if graphics is not None and window is not None:
            pieces = [
                ctx.measured(p, graphics) if min(p.end, window[1]) > max(p.start, window[0]) else p
                for p in pieces
            ]
        unallocated = ctx.unallocated.strays(mig.uuid, view, mine, now)
        if unallocated:
            result.unallocated[mig.uuid] = unallocated
        slot = mig.slot
        for n, piece in enumerate(pieces):
            batch.add_slot(
                slot,
                device.name,
                piece,
                read.mem_total_bytes,
                measured,
                unallocated if n == len(pieces) - 1 else (),
            )
        sm_active = read.gpm.sm_active_percent if read.gpm is not None else None
        for span in mine:
            if span.end is not None:
                continue
            util = graphics
            if util is None and measured is Measurement.MEMORY_ONLY and read.processes == ():
                # No process at all on the slice: idle, whatever its utilization would say.
                util = 0.0
                if (note := f"idle:{span.job_id}:{mig.uuid}") not in warned:
                    warned.add(note)
                    log.info(
                        "job %d: MIG %s %s (memory only, no GPM) runs no process: idle",
                        span.job_id,
                        mig.profile,
                        mig.uuid,
                    )
            processes = None if read.processes is None else len(read.processes)
            memory = read.mem_used_bytes
            ctx.activity.queue_slot(
                db,
                slot,
                span,
                measured,
                marks.measured_since.get(mig.uuid),
                now,
                util,
                memory,
                processes,
                sm_active,
                read.mem_total_bytes,
            )
