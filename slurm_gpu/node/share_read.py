"""Reading a GPU shares hold (gres/shard, gres/mps): its totals, and each share by process.

A GPU held by shares (a job with gres/shard or gres/mps, `JobSpan.shards`) is measured
per process: each job's share is the sum of its own processes' smUtil; a job without a
process there is idle, a failed read unknown. The GPU's own totals go out as a physical
interval. The whole-GPU reader (gpu_read.py) hands such a GPU here for the windows shares
hold it.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from slurm_gpu.gpu import GpuSnapshot
from slurm_gpu.models import GpuDevice, GpuSlot, Measurement, SlotKind
from slurm_gpu.node.attribution import JobSpan, split_window
from slurm_gpu.node.read_context import ReadContext
from slurm_gpu.node.spool import PieceBatch
from slurm_gpu.node.tick_types import TickResult

# The agent's logger: what the tick's collaborators log reads as the agent's, as before.
log = logging.getLogger("slurm_gpu.node.agent")


class ShareReader:
    """Reads GPUs shares hold, process by process.

    Args:
        ctx: what every reader works with.
        pid_job: maps a pid to its Slurm job (None: no job).
    """

    def __init__(self, ctx: ReadContext, pid_job: Callable[[int], int | None]) -> None:
        self.ctx = ctx
        self.pid_job = pid_job
        self.held: set[int] = set()  # Slurm indices shares hold this tick
        self._proc_seen: dict[str, float] = {}  # uuid: newest per-process sample read
        # (job, restart, GPU uuid) -> memory of a share's processes at its last read
        self._share_mem: dict[tuple[int, int, str], int | None] = {}

    def begin(self, spans: list[JobSpan]) -> None:
        """A tick begins: the Slurm indices shares hold among `spans`."""
        self.held = {s.slurm_index for s in spans if s.shards}

    def forget_run(self, run: tuple[int, int]) -> None:
        """A run (job, restart) was summarized: its shares' memory is no longer kept."""
        if self._share_mem:
            self._share_mem = {k: v for k, v in self._share_mem.items() if k[:2] != run}

    def read(
        self,
        db: sqlite3.Connection,
        batch: PieceBatch,
        device: GpuDevice,
        snap: GpuSnapshot,
        mine: list[JobSpan],
        w0: float,
        now: float,
        energy_delta: float | None,
        result: TickResult,
    ) -> None:
        """A GPU shares hold over (w0, now]: its totals, and each share by its processes.

        A share's utilization is the sum of its own job's processes' smUtil (at most
        100); a job without a process there in the window is idle (0); a failed read is
        unknown for every share of the GPU (no piece: missing, never idle).
        """
        ctx = self.ctx
        settings, warned = ctx.settings, ctx.marks.warned
        uuid = device.uuid
        physical = split_window(
            w0, now, snap, [], settings.period, settings.active_threshold, energy_delta
        )
        for piece in physical:
            batch.add_physical(
                uuid, piece, snap.mem_total_bytes, snap.temperature_celsius, snap.ecc_errors_total
            )
        unallocated = ctx.unallocated.strays(uuid, snap, mine, now)
        if unallocated:
            result.unallocated[uuid] = unallocated
        # This window's samples only, on the source's (wall) clock; a newest sample seen
        # ahead of the window is of before a wall clock step back: not a bound.
        floor = w0 - ctx.clock.lag
        seen = self._proc_seen.get(uuid, floor)
        since = max(seen, floor) if seen - floor <= settings.clock_step else floor
        read = ctx.source.process_utilization(device, since)
        if read.error is not None:
            self._proc_seen.pop(uuid, None)
            if f"process:{uuid}" not in warned:
                warned.add(f"process:{uuid}")
                log.error(
                    "GPU %s: per-process utilization cannot be read (%s): its shares' use is"
                    " unknown meanwhile (missing, never idle)",
                    uuid,
                    read.error,
                )
        else:
            if f"process:{uuid}" in warned:
                warned.discard(f"process:{uuid}")
                log.warning("GPU %s: per-process utilization answers again", uuid)
            self._proc_seen[uuid] = max(read.last_seen, since)
            util: dict[int | None, float] = {}
            for process in read.processes:
                job = self.pid_job(process.pid)
                util[job] = util.get(job, 0.0) + process.sm_util_percent
            memory: dict[int | None, int] = {}
            count: dict[int | None, int] = {}
            for gpu_process in snap.processes or ():
                job = self.pid_job(gpu_process.pid)
                memory[job] = memory.get(job, 0) + (gpu_process.used_memory_bytes or 0)
                count[job] = count.get(job, 0) + 1
            known = snap.processes is not None
            for span in mine:
                if span.shards:
                    job = span.job_id
                    self._read_share(
                        db,
                        batch,
                        device,
                        snap,
                        span,
                        w0,
                        now,
                        min(100.0, util.get(job, 0.0)),
                        memory.get(job, 0) if known else None,
                        count.get(job, 0) if known else None,
                    )
        first = physical[0].period_start if physical else None
        ctx.seal_slotted(db, batch, uuid, first, now, result)

    def _read_share(
        self,
        db: sqlite3.Connection,
        batch: PieceBatch,
        device: GpuDevice,
        snap: GpuSnapshot,
        span: JobSpan,
        w0: float,
        now: float,
        util: float,
        memory: int | None,
        processes: int | None,
    ) -> None:
        """One share's pieces of (w0, now] (the part its job held) and its activity."""
        ctx = self.ctx
        slot = self.share_slot(device.uuid, span)
        ctx.ledger.read(slot.slot_id)
        key = (span.job_id, span.restart, device.uuid)
        previous_mem = self._share_mem.get(key)
        self._share_mem[key] = memory
        view = GpuSnapshot(slot.slot_id, snap.time, mem_used_bytes=memory)
        for piece in split_window(
            w0,
            now,
            view,
            [span],
            ctx.settings.period,
            ctx.settings.active_threshold,
            None,
            previous_mem,
        ):
            if piece.job_id is not None:
                measured = ctx.measured(piece, util)
                batch.add_slot(
                    slot, device.name, measured, snap.mem_total_bytes, Measurement.PER_PROCESS
                )
        if span.end is None:
            ctx.activity.queue_slot(
                db,
                slot,
                span,
                Measurement.PER_PROCESS,
                ctx.marks.measured_since.get(device.uuid),
                now,
                util,
                memory,
                processes,
                None,
                snap.mem_total_bytes,
            )

    def share_slot(self, uuid: str, span: JobSpan) -> GpuSlot:
        """A run's share of GPU `uuid`: shards held / shards gres.conf gives that GPU."""
        kind = SlotKind.MPS if span.shard_kind == SlotKind.MPS.value else SlotKind.SHARD
        capacity = self.ctx.binding.capacity.get((kind.value, span.slurm_index))
        if capacity is None or not capacity.count:
            warned = self.ctx.marks.warned
            if (note := f"capacity:{kind.value}:{span.slurm_index}") not in warned:
                warned.add(note)
                log.error(
                    "job %d holds %d gres/%s on Slurm GPU %d (%s), but gres.conf gives that GPU"
                    " no %s count: its share is recorded as 0",
                    span.job_id,
                    span.shards,
                    kind.value,
                    span.slurm_index,
                    uuid,
                    kind.value,
                )
            share = 0.0
        else:
            share = capacity.share(span.shards)
        return GpuSlot.shared(kind, uuid, span.job_id, share, span.restart)
