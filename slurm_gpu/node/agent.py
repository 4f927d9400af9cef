"""The node agent's sampling tick: hooks' events -> GPU reads -> spool, in one transaction.

Each tick:
1. takes the hooks' new event files into the spool (then deletes them),
2. reads every GPU through the GpuSource, splits the window since the last read by the
   jobs that held the GPU (attribution.py) and merges the pieces into the spool,
3. seals finished shipping periods into the outbox and summarizes the runs that ended (a
   requeued job runs again under its id: each run, Slurm's restart count, is summarized
   on its own),
4. queues the node's inventory with its lost GPUs (those it cannot read at all) at the
   first tick and whenever that set changes, for the controller's hot_node policy,
5. queues each running job's activity row (per GPU slot) only when it changed, and one
   heartbeat, last: the slots read this tick (ship_less.py, issue 16). The outbox ships
   in queue order, so a heartbeat reaches the store after the rows it vouches for.

GPU slots (issue 14, docs/design/gpu-slots.md). A Slurm index binds a slot
(`GpuOrder.index_slot`): a whole GPU, or a MIG slice. A GPU in MIG mode is never
measured as a whole GPU for a job: each of its MIG devices is measured as its own slot
(mig_read.py). A GPU held by shares (gres/shard, gres/mps) is measured per process
(share_read.py). Every GPU's own totals (power, energy, temperature, ECC, memory) go out
per period as a physical interval: a whole GPU's from its period rows when they are
sealed (no work a tick), a GPU in MIG mode or shared from its own read.
Shipping to the store happens elsewhere (shipper.py), so a store outage never stops this.

The tick's collaborators, one concept each (issue 25 item 7):
- agent_clock.py: the agent's time (a monotonic anchor) and the wall clock's steps,
- binding.py: Slurm index <-> GPU or MIG slice, GPUs named by UUID, the hooks' events and
  bindings bound (orphan bindings, het job leaders, SLUIDs, a job's shares),
- read_context.py, gpu_read.py, mig_read.py, share_read.py: reading a whole GPU, a GPU
  in MIG mode slice by slice, a GPU shares hold process by process, behind one `read`,
- activity_queue.py: each running job's activity row, queued when it changed,
- processes.py: a pid's job and owner, and GPU use outside any allocation,
- job_liveness.py: the runs Slurm ended without an epilog.
All of them log as "slurm_gpu.node.agent", as before the split.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from slurm_gpu.gpu import GpuSource
from slurm_gpu.models import (
    GpuDevice,
    GpuSlot,
    JobEvent,
    JobEventKind,
    LostGpu,
    Measurement,
    SlotKind,
)
from slurm_gpu.node.activity_queue import ActivityQueue
from slurm_gpu.node.agent_clock import AgentClock
from slurm_gpu.node.attribution import JobSpan
from slurm_gpu.node.binding import GpuBinding
from slurm_gpu.node.gpu_read import WholeGpuReader
from slurm_gpu.node.hookfiles import drop_bindings, read_events
from slurm_gpu.node.job_liveness import JobLiveness, OpenRun
from slurm_gpu.node.mig_read import MigGpuReader
from slurm_gpu.node.outbox import device_fields, fields_of
from slurm_gpu.node.processes import UnallocatedUse, job_of_pid, process_owner
from slurm_gpu.node.read_context import ReadContext, ReadMarks
from slurm_gpu.node.share_read import ShareReader
from slurm_gpu.node.ship_less import ActivityLedger
from slurm_gpu.node.spool import PieceBatch, Spool
from slurm_gpu.node.tick_types import AgentSettings, GpuState, TickResult
from slurm_gpu.slurm.gres import GresGpuFile, GresNode
from slurm_gpu.slurm.mig_minors import MigMinors

__all__ = ["AgentSettings", "NodeAgent", "TickResult", "job_of_pid", "process_owner"]

log = logging.getLogger(__name__)


class NodeAgent:
    """Samples one node's GPUs into its spool.

    Args:
        node: Slurm node name (SLURMD_NODENAME of the hooks).
        node_dir: <state_dir>/<node>, where the hooks write.
        source: the GPUs.
        spool: the node's spool.
        gres: this node's gres.conf lines (a plain list: its File= entries, no AutoDetect);
            slurmd's GPU numbering is derived from them (slurm_gpu.slurm.gpu_order).
        interval: seconds between ticks.
        period: shipping period in seconds (intervals are aggregated to this).
        active_threshold: a sample at or above this utilization percent is active
            (`slurm_gpu.activity.is_active`, [node] active_threshold_percent).
        sm_active_threshold: a GPM window whose SM activity is at or above this percent
            is active, by the same rule ([node] sm_active_threshold_percent).
        max_gap_intervals: a read later than this many intervals after the previous one
            does not claim the gap: it is recorded as missing, not as idle.
        clock: POSIX time (the wall clock). pid_job: maps a pid to its Slurm job (None: no
            job); default `job_of_pid` with the SLUIDs of the jobs bound here.
        monotonic: a clock that never steps (seconds): the agent's time is the wall clock
            at its anchor plus this clock's time since (agent_clock.py). None:
            time.monotonic with the real wall clock, else `clock` itself (a test's clock,
            which steps only when the test says so: pass both to step the wall alone).
        clock_step: a wall clock further than this many seconds from the agent's time, either
            way, has stepped (NTP): logged, and never measured twice nor as a gap.
        pid_owner: maps a pid to its owner's user name for the unallocated-use log;
            default `process_owner` (/proc).
        stat: os.stat, for resolving device minors.
        mig_minors: the driver's mig-minors ([node] mig_minors), which numbers gres.conf's
            MIG lines; None: no MIG slot is numbered.
        job_shares: job id -> (kind, count) of the gres/shard or gres/mps units it holds
            on this node, or None (scontrol -d show job); asked once when a job starts on
            a GPU gres.conf cuts into shares, as the prolog cannot tell. None: never asked.
        activity_refresh: the longest a running job's unchanged activity row goes
            unshipped, seconds ([node] activity_refresh); each tick's heartbeat vouches
            for it in between.
        liveness: asks Slurm whether the open runs' jobs still hold their GPUs here, and
            closes those Slurm ended without an epilog (node/job_liveness.py). None:
            only epilogs end runs.

    The numeric settings are kept together as `settings` (AgentSettings).
    """

    def __init__(
        self,
        node: str,
        node_dir: Path,
        source: GpuSource,
        spool: Spool,
        gres: GresNode | list[GresGpuFile],
        interval: float = 10.0,
        period: float = 60.0,
        active_threshold: float = 5.0,
        max_gap_intervals: float = 3.0,
        sm_active_threshold: float = 5.0,
        clock: Callable[[], float] = time.time,
        pid_job: Callable[[int], int | None] | None = None,
        pid_owner: Callable[[int], str] = process_owner,
        stat: Callable[[str], os.stat_result] = os.stat,
        mig_minors: MigMinors | None = None,
        job_shares: Callable[[int], tuple[str, int] | None] | None = None,
        activity_refresh: float = 300.0,
        monotonic: Callable[[], float] | None = None,
        clock_step: float = 2.0,
        liveness: JobLiveness | None = None,
    ) -> None:
        self.node = node
        self.node_dir = node_dir
        self.spool = spool
        self.settings = settings = AgentSettings(
            interval=interval,
            period=period,
            active_threshold=active_threshold,
            sm_active_threshold=sm_active_threshold,
            max_gap_intervals=max_gap_intervals,
            activity_refresh=activity_refresh,
            clock_step=clock_step,
        )
        self.clock = clock
        self.agent_clock = AgentClock(clock, monotonic, clock_step, self._shift_marks)
        self.liveness = liveness
        self._ledger = ActivityLedger(node, active_threshold, sm_active_threshold, activity_refresh)
        self.devices: list[GpuDevice] = source.devices()
        self.binding = binding = GpuBinding(node, self.devices, gres, stat, mig_minors, job_shares)
        pid_job = pid_job or (lambda pid: job_of_pid(pid, sluids=binding.sluid_jobs))
        self.activity = ActivityQueue(
            node, spool, self._ledger, active_threshold, sm_active_threshold
        )
        self.marks = ReadMarks()
        self.reads = ReadContext(
            node,
            settings,
            source,
            spool,
            self.agent_clock,
            binding,
            self._ledger,
            self.activity,
            UnallocatedUse(binding, pid_job, pid_owner),
            self.marks,
        )
        self.shares = ShareReader(self.reads, pid_job)
        self.whole_reader = WholeGpuReader(self.reads, self.shares)
        self.mig_reader = MigGpuReader(self.reads)
        self._gpu_state: dict[str, GpuState] | None = None
        # The spool's spans as last read; None once this agent changed them (an event, an
        # adopted binding, a summarized run, a rollback): it is their only writer, so a
        # tick that changed none reads none (saves a query a tick).
        self._spans: list[JobSpan] | None = None
        self._lost_reported: dict[str, LostGpu] | None = None  # None: not yet this run
        self.marks.lost.update(binding.unlisted(self.devices, clock()))

    # --- what callers and tests read (and set) of the collaborators --------------------

    @property
    def source(self) -> GpuSource:
        """The GPUs (the readers')."""
        return self.reads.source

    @source.setter
    def source(self, source: GpuSource) -> None:
        self.reads.source = source

    @property
    def interval(self) -> float:
        """Seconds between ticks."""
        return self.settings.interval

    @property
    def monotonic(self) -> Callable[[], float]:
        """The clock that never steps, which the agent's time runs on."""
        return self.agent_clock.monotonic

    @property
    def job_shares(self) -> Callable[[int], tuple[str, int] | None] | None:
        """Asks Slurm for a job's shares (binding.py); None: never asked."""
        return self.binding.job_shares

    @job_shares.setter
    def job_shares(self, job_shares: Callable[[int], tuple[str, int] | None] | None) -> None:
        self.binding.job_shares = job_shares

    @property
    def index_uuid(self) -> dict[int, str]:
        """Slurm index -> the uuid of the GPU or MIG slice it binds."""
        return self.binding.index_uuid

    @property
    def uuid_index(self) -> dict[str, int]:
        """uuid of a GPU or MIG slice -> its Slurm index."""
        return self.binding.uuid_index

    @property
    def index_slot(self) -> dict[int, GpuSlot]:
        """Slurm index -> the slot it binds (a whole GPU, a MIG slice)."""
        return self.binding.index_slot

    def tick(self) -> TickResult:
        """One sampling round (see module docstring)."""
        now = self.agent_clock.tick_time()
        result = TickResult(time=now)
        event_files = read_events(self.node_dir, self.node)
        if event_files:
            # Bound before the transaction: binding may ask Slurm (a job's shares), which
            # must not hold the spool's write lock against the shipper meanwhile.
            events = [self.binding.bound_event(item) for item in event_files]
            with self.spool.transaction() as db:
                for event in events:
                    self.spool.apply_event(db, event)
            self._spans = None  # the events opened or closed spans
        for item in event_files:
            item.path.unlink(missing_ok=True)
        result.events = len(event_files)
        if self._spans is None:
            self._spans = self.spool.spans()
        spans = self._adopt_orphan_bindings(self._spans)
        if self.liveness is not None:
            spans = self._close_runs_slurm_ended(spans)
        if self.agent_clock.lag and not any(s.end is None or s.end > now for s in spans):
            now = result.time = self._rejoin_wall(now)
        # Where each GPU's reads stand: the spool's at the first tick, then this agent's own
        # (it is the only writer), kept once committed.
        state = self._gpu_state if self._gpu_state is not None else self.spool.gpu_state()
        jump = self.agent_clock.jump
        if jump:  # a forward step: each last read, on the re-anchored clock
            state = {
                u: (None if r is None else r + jump, sample, energy)
                for u, (r, sample, energy) in state.items()
            }
        self._gpu_state = None  # unknown until this tick commits
        updates: dict[str, GpuState] = {}
        self._ledger.begin()
        try:
            with self.spool.transaction() as db:
                batch = PieceBatch()
                self.shares.begin(spans)
                whole, mig = self.whole_reader.read, self.mig_reader.read
                for device in self.devices:
                    read = mig if device.mig_enabled else whole
                    updates[device.uuid] = read(
                        db, batch, device, spans, state.get(device.uuid), now, result
                    )
                batch.flush(db)  # before the runs that ended are summarized
                self.spool.set_gpu_states(db, updates)
                for run in sorted({s.run for s in spans if s.end is not None and s.end <= now}):
                    self._spans = None
                    job_id, restart = run
                    result.summaries += self.spool.finish_job(
                        db, self.node, job_id, self.binding.index_uuid, restart, self._slot_of
                    )
                    self.activity.forget_run(run)
                    self.shares.forget_run(run)
                lost = self._queue_lost(db, now)
                for key, row in self._ledger.carried():  # slots not read: say when they were
                    self.spool.queue(db, "activity", key, fields_of(row))
                # Last of the tick: it ships behind the activity rows it vouches for.
                heartbeat = self._ledger.heartbeat(now)
                self.spool.queue(db, "heartbeat", f"heartbeat:{self.node}", fields_of(heartbeat))
        except BaseException:
            self.marks.next_seal.clear()  # rolled back: which periods are open is unknown again
            self._spans = None
            self._ledger.rollback()
            raise
        self._ledger.commit(heartbeat)
        self.agent_clock.committed()  # the states kept are on the re-anchored clock
        result.activity = self._ledger.queued
        if lost is not None:
            self._lost_reported = lost  # committed
        self._gpu_state = {**state, **updates}
        return result

    # --- the agent's clock (issue 25 item 3; agent_clock.py) ---------------------------

    def _rejoin_wall(self, now: float) -> float:
        """No job holds a GPU here: the agent's time goes back on the wall clock.

        Each GPU's reads stay where they are (`gpu_state`): its windows start again once
        the wall clock passes its last read, so nothing written is covered twice.
        """
        back = self.agent_clock.lag
        now = self.agent_clock.rejoin_wall(now)
        self.marks.measured_since.clear()  # the wall time repeated is not read: runs end here
        log.warning(
            "no job holds a GPU here: the agent's time is back on the wall clock (%.1f s"
            " back); each GPU's intervals start again after the last one written",
            back,
        )
        return now

    def _shift_marks(self, seconds: float) -> None:
        """Moves the instants the agent keeps by `seconds` when its clock is re-anchored.

        `measured_since`, last active: as long ago as they were on the monotonic clock.
        """
        measured_since = self.marks.measured_since
        for uuid in measured_since:
            measured_since[uuid] += seconds
        self.activity.shift(seconds)

    def _queue_lost(self, db: sqlite3.Connection, now: float) -> dict[str, LostGpu] | None:
        """Queues the inventory with the lost GPUs when they changed; returns what it queued."""
        lost = self.marks.lost
        if lost == self._lost_reported:
            return None
        payload = {
            "devices": [device_fields(d) for d in self.devices],
            "seen_at": now,
            "lost": [asdict(g) for _, g in sorted(lost.items())],
        }
        self.spool.queue(db, "inventory", f"inventory:{self.node}", payload)
        return dict(lost)

    def _adopt_orphan_bindings(self, spans: list[JobSpan]) -> list[JobSpan]:
        """A binding with no span means its started event was lost: trust the binding.

        Returns `spans` plus the spans adopted from bindings.
        """
        adopted = self.binding.orphans(self.node_dir, spans)
        if not adopted:
            return spans
        try:
            with self.spool.transaction() as db:
                for span in adopted:
                    self.spool.add_span(db, span)
        finally:
            self._spans = None  # re-read next tick, in the spool's order
        return spans + adopted

    def _close_runs_slurm_ended(self, spans: list[JobSpan]) -> list[JobSpan]:
        """Closes, as their epilog would, the open runs whose job Slurm ended here.

        Returns the spans as they stand after (job_liveness.py).
        """
        assert self.liveness is not None
        runs: dict[tuple[int, int], OpenRun] = {}
        for span in spans:
            if span.end is None:
                known = runs.get(span.run)
                start = span.start if known is None else min(known.start, span.start)
                runs[span.run] = OpenRun(span.job_id, span.restart, start)
        if not runs:
            return spans
        ended = self.liveness.ended_runs(runs.values(), self.clock(), self._last_read_of(spans))
        if not ended:
            return spans
        owner = {s.run: s for s in spans}
        events = [
            JobEvent(
                node=self.node,
                job_id=run.job_id,
                kind=JobEventKind.ENDED,
                time=run.end,
                user=owner[(run.job_id, run.restart)].user,
                account=owner[(run.job_id, run.restart)].account,
                partition=owner[(run.job_id, run.restart)].partition,
                restart=run.restart,
                state=run.state,
            )
            for run in ended
        ]
        try:
            with self.spool.transaction() as db:
                for event in events:
                    self.spool.apply_event(db, event)
        finally:
            self._spans = None
        for run in ended:  # else the next tick adopts them again as a run
            drop_bindings(self.node_dir, run.job_id)
        self._spans = self.spool.spans()
        return self._spans

    def _last_read_of(self, spans: list[JobSpan]) -> Callable[[int], float | None]:
        """job id -> the latest reading here of a GPU it holds (the spool's, at start)."""
        state = self._gpu_state if self._gpu_state is not None else self.spool.gpu_state()
        binding = self.binding

        def last_read(job_id: int) -> float | None:
            reads = [
                state.get(binding.index_uuid.get(s.slurm_index, ""), (None, None, None))[0]
                for s in spans
                if s.job_id == job_id
            ]
            known = [r for r in reads if r is not None]
            return max(known) if known else None

        return last_read

    def _slot_of(
        self, index: int, shards: int, shard_kind: str, job_id: int, restart: int
    ) -> tuple[GpuSlot, Measurement] | None:
        """The slot a run's span held (Spool.finish_job); None: the index's whole GPU."""
        if shards:
            uuid = self.binding.index_uuid.get(index)
            if uuid is None:
                return None
            span = JobSpan(
                job_id, index, 0.0, restart=restart, shards=shards, shard_kind=shard_kind
            )
            return self.shares.share_slot(uuid, span), Measurement.PER_PROCESS
        slot = self.binding.index_slot.get(index)
        if slot is None or slot.kind is SlotKind.GPU:
            return None
        found = self.binding.migs.get(slot.slot_id)
        return slot, self.mig_reader.measurement(*found) if found else Measurement.MEMORY_ONLY
