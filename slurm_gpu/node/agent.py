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
measured as a whole GPU for a job (NVML has no utilization samples of it): each of its
MIG devices is read (`mig_snapshot`) and measured as its own slot, by the GPM of its GPU
instance (Hopper+: utilization = graphics activity) or by memory only (Ampere:
utilization unknown, never 0). A GPU held by shares (a job with gres/shard or gres/mps,
`JobSpan.shards`) is measured per process: each job's share is the sum of its own
processes' smUtil; a job without a process there is idle, a failed read unknown. Every
GPU's own totals (power, energy, temperature, ECC, memory) go out per period as a
physical interval: a whole GPU's from its period rows when they are sealed (no work a
tick), a GPU in MIG mode or shared from its own read.
Shipping to the store happens elsewhere (shipper.py), so a store outage never stops this.
"""

from __future__ import annotations

import logging
import math
import os
import pwd
import re
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from slurm_gpu.activity import is_active
from slurm_gpu.errors import SlurmError
from slurm_gpu.gpu import GpuSnapshot, GpuSource, MigSnapshot
from slurm_gpu.models import (
    Binding,
    GpuActivity,
    GpuDevice,
    GpuSlot,
    JobEvent,
    JobEventKind,
    JobGpuSummary,
    LostGpu,
    Measurement,
    MigDevice,
    SlotKind,
)
from slurm_gpu.node.attribution import JobSpan, Piece, gpm_span, period_start, split_window
from slurm_gpu.node.hookfiles import (
    UNKNOWN_INDEX,
    BindingFile,
    EventFile,
    drop_bindings,
    read_binding_files,
    read_events,
)
from slurm_gpu.node.job_liveness import JobLiveness, OpenRun
from slurm_gpu.node.outbox import device_fields, fields_of
from slurm_gpu.node.ship_less import ActivityLedger
from slurm_gpu.node.spool import PieceBatch, Spool
from slurm_gpu.slurm.gpu_order import slurm_gpu_order
from slurm_gpu.slurm.gres import GresGpuFile, GresNode
from slurm_gpu.slurm.mig_minors import MigMinors

log = logging.getLogger(__name__)

_CGROUP_JOB = re.compile(rb"/job_(\d+)(?:/|$)", re.MULTILINE)
# Slurm 26.05's cgroup/v2 names a job's cgroup by its SLUID unless cgroup.conf says
# CgroupJobIdPaths=yes: src/plugins/cgroup/v2/cgroup_v2.c, cgroup_p_step_create
# ("/job_%u" with cgroup_job_id_paths, else "/%s" of print_sluid), under which come
# step_N/user/task_N. A SLUID is "s" and 13 characters of Crockford's base 32
# (src/common/sluid.c, print_sluid).
_CGROUP_SLUID = re.compile(rb"/(s[0-9A-HJKMNP-TV-Z]{13})(?:/|$)", re.MULTILINE)


def _iso(posix: float) -> str:
    """A POSIX time as UTC ISO 8601 (for the log)."""
    return datetime.fromtimestamp(posix, UTC).isoformat(timespec="seconds")


def job_of_pid(
    pid: int, proc: Path = Path("/proc"), sluids: Mapping[str, int] | None = None
) -> int | None:
    """The Slurm job a process belongs to: its cgroup, else its SLURM_JOB_ID.

    The cgroup is Slurm's and cannot be changed by the job's user; the environment can.
    A cgroup path names the job as `/job_N/` (Slurm before 25.11, or CgroupJobIdPaths=yes)
    or by its SLUID (26.05's default), which `sluids` (SLUID -> job id, from the hooks'
    bindings) maps to the job. A process in the cgroup of a SLUID no binding on this node
    names belongs to no job holding a GPU here: None, whatever its environment says.
    """
    try:
        cgroup = (proc / str(pid) / "cgroup").read_bytes()
        match = _CGROUP_JOB.search(cgroup)
        if match:
            return int(match.group(1))
        named = _CGROUP_SLUID.search(cgroup)
        if named:
            return (sluids or {}).get(named.group(1).decode())
        for item in (proc / str(pid) / "environ").read_bytes().split(b"\0"):
            if item.startswith(b"SLURM_JOB_ID="):
                value = item.split(b"=", 1)[1]
                return int(value) if value.isdigit() else None
    except OSError:
        return None
    return None


def process_owner(pid: int, proc: Path = Path("/proc")) -> str:
    """The user name owning a process (its real uid), "?" when it is gone."""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
                try:
                    return pwd.getpwuid(uid).pw_name
                except KeyError:
                    return str(uid)
    except (OSError, ValueError, IndexError):
        pass
    return "?"


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
            at its anchor plus this clock's time since (`_tick_time`). None:
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
        self.source = source
        self.spool = spool
        self.interval = interval
        self.period = period
        self.active_threshold = active_threshold
        self.sm_active_threshold = sm_active_threshold
        self.max_gap = max_gap_intervals * interval
        self.clock = clock
        if monotonic is None:
            monotonic = time.monotonic if clock is time.time else clock
        self.monotonic = monotonic
        self.clock_step = clock_step
        # The agent's time (issue 25 item 3): wall at the anchor + monotonic time since it.
        self._anchor: tuple[float, float] | None = None  # (wall, monotonic) at the anchor
        self._lag = 0.0  # seconds the wall clock is behind the agent's time (a step back)
        self._jump = 0.0  # a forward step re-anchored at this tick: missing, never measured
        self.job_shares = job_shares
        self.liveness = liveness
        self._ledger = ActivityLedger(node, active_threshold, sm_active_threshold, activity_refresh)
        self._sluid_jobs: dict[str, int] = {}  # SLUID -> job id, of the jobs bound here
        self.pid_job = pid_job or (lambda pid: job_of_pid(pid, sluids=self._sluid_jobs))
        self.pid_owner = pid_owner
        self.devices: list[GpuDevice] = source.devices()
        # GPUs and MIG devices NVML lists (a MIG UUID is a slot id CUDA_VISIBLE_DEVICES names)
        self._nvml_uuids = {d.uuid for d in self.devices}
        self._migs: dict[str, tuple[GpuDevice, MigDevice]] = {
            m.uuid: (d, m) for d in self.devices for m in d.mig_devices
        }
        self._nvml_uuids |= set(self._migs)
        self._uuid_warned: set[tuple[int, str]] = set()  # (job, uuid) logged as unbindable
        # Slurm index -> NVML device, numbered as slurmd numbers them (gpu_order).
        self.gpu_order = slurm_gpu_order(
            gres if isinstance(gres, GresNode) else GresNode.listing(node, gres),
            self.devices,
            stat,
            mig_minors,
        )
        for problem in self.gpu_order.problems:
            log.error("%s", problem)
        self.index_uuid: dict[int, str] = self.gpu_order.index_uuid()
        self.uuid_index = {u: i for i, u in self.index_uuid.items()}
        # Slurm index -> the slot it binds (a whole GPU, a MIG slice)
        self.index_slot: dict[int, GpuSlot] = self.gpu_order.index_slot()
        # (kind, Slurm index) -> shards (or mps) configured on that GPU (gres.conf)
        self._capacity = {(c.kind, c.index): c for c in self.gpu_order.shares}
        self._shared: set[int] = set()  # Slurm indices shares hold this tick
        self._slotted: set[str] = set()  # GPUs with slot rows (MIG, shares) in the spool
        self._proc_seen: dict[str, float] = {}  # uuid: newest per-process sample read
        self._slot_warned: set[str] = set()  # slot or GPU ids whose fault was logged
        self._mig_gpm: set[str] = set()  # MIG devices that gave GPM metrics
        # (job, restart, GPU uuid) -> memory of a share's processes at its last read
        self._share_mem: dict[tuple[int, int, str], int | None] = {}
        self._warned_pids: set[tuple[str, int]] = set()
        self._last_active: dict[tuple[int, int, str], float] = {}  # (job, restart, uuid)
        self._last_sm_active: dict[tuple[int, int, str], float] = {}  # the same, by GPM
        self._last_mem: dict[str, int | None] = {}  # uuid: memory in use at its last read
        # uuid -> no open period of it in the spool starts before this (absent: unknown, as
        # at start, when rows of the previous run may wait): saves a query a tick per GPU
        self._next_seal: dict[str, float] = {}
        self._gpu_state: dict[str, tuple[float | None, float | None, float | None]] | None = None
        self._het: dict[int, int] = {}  # job id: its het job's leader, from the bindings
        # The spool's spans as last read; None once this agent changed them (an event, an
        # adopted binding, a summarized run, a rollback): it is their only writer, so a
        # tick that changed none reads none (saves a query a tick).
        self._spans: list[JobSpan] | None = None
        # uuid -> where its current unbroken run of readings began (GpuActivity.measured_since)
        self._measured_since: dict[str, float] = {}
        # GPUs that cannot be read, by uuid ("minor:N" for one NVML never showed)
        self._lost: dict[str, LostGpu] = {}
        self._lost_reported: dict[str, LostGpu] | None = None  # None: not yet this run
        started = clock()
        minors = {d.minor for d in self.devices}
        for gpu in self.gpu_order.gpus:
            # A GPU NVML lists but gres.conf's line cannot bind (a whole GPU in MIG mode, a
            # MIG line mig-minors does not know) is a problem logged above, not a lost GPU.
            if gpu.uuid is None and gpu.minor is not None and gpu.minor not in minors:
                reason = (
                    f"gres.conf GPU {gpu.index} (/dev/nvidia{gpu.minor}) is not among NVML's GPUs"
                )
                self._lost[f"minor:{gpu.minor}"] = LostGpu("", gpu.minor, started, reason)

    def tick(self) -> TickResult:
        """One sampling round (see module docstring)."""
        now = self._tick_time()
        result = TickResult(time=now)
        event_files = read_events(self.node_dir, self.node)
        if event_files:
            # Bound before the transaction: binding may ask Slurm (a job's shares), which
            # must not hold the spool's write lock against the shipper meanwhile.
            events = [self._bound_event(item) for item in event_files]
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
        if self._lag and not any(s.end is None or s.end > now for s in spans):
            now = result.time = self._rejoin_wall(now)
        # Where each GPU's reads stand: the spool's at the first tick, then this agent's own
        # (it is the only writer), kept once committed.
        state = self._gpu_state if self._gpu_state is not None else self.spool.gpu_state()
        if self._jump:  # a forward step: each last read, on the re-anchored clock
            state = {
                u: (None if r is None else r + self._jump, sample, energy)
                for u, (r, sample, energy) in state.items()
            }
        self._gpu_state = None  # unknown until this tick commits
        updates: dict[str, tuple[float | None, float | None, float | None]] = {}
        self._ledger.begin()
        try:
            with self.spool.transaction() as db:
                batch = PieceBatch()
                self._shared = {s.slurm_index for s in spans if s.shards}
                for device in self.devices:
                    read = self._read_mig_gpu if device.mig_enabled else self._read_gpu
                    updates[device.uuid] = read(
                        db, batch, device, spans, state.get(device.uuid), now, result
                    )
                batch.flush(db)  # before the runs that ended are summarized
                self.spool.set_gpu_states(db, updates)
                for run in sorted({s.run for s in spans if s.end is not None and s.end <= now}):
                    self._spans = None
                    job_id, restart = run
                    result.summaries += self.spool.finish_job(
                        db, self.node, job_id, self.index_uuid, restart, self._slot_of
                    )
                    self._ledger.forget_job(job_id)
                    self._last_active = {k: v for k, v in self._last_active.items() if k[:2] != run}
                    self._last_sm_active = {
                        k: v for k, v in self._last_sm_active.items() if k[:2] != run
                    }
                    if self._share_mem:
                        self._share_mem = {k: v for k, v in self._share_mem.items() if k[:2] != run}
                lost = self._queue_lost(db, now)
                for key, row in self._ledger.carried():  # slots not read: say when they were
                    self.spool.queue(db, "activity", key, fields_of(row))
                # Last of the tick: it ships behind the activity rows it vouches for.
                heartbeat = self._ledger.heartbeat(now)
                self.spool.queue(db, "heartbeat", f"heartbeat:{self.node}", fields_of(heartbeat))
        except BaseException:
            self._next_seal.clear()  # rolled back: which periods are open is unknown again
            self._spans = None
            self._ledger.rollback()
            raise
        self._ledger.commit(heartbeat)
        self._jump = 0.0  # committed: the states kept are on the re-anchored clock
        result.activity = self._ledger.queued
        if lost is not None:
            self._lost_reported = lost  # committed
        self._gpu_state = {**state, **updates}
        return result

    # --- the agent's clock (issue 25 item 3) ---------------------------------------------

    def _tick_time(self) -> float:
        """This tick's time: the wall clock at the anchor plus the monotonic time since.

        Interval lengths and order come from the monotonic clock, so a wall clock step
        (NTP) never makes a read window negative or lets two windows of a GPU overlap.
        The wall clock is compared every tick; one further than `clock_step` from where it
        should be has stepped, which is logged once:

        - back (it ran ahead and was corrected): the agent keeps its own time, now ahead
          of the wall clock by `_lag`, while any job holds a GPU here, so a running job is
          charged the time it really held (the monotonic time, which is Slurm's elapsed
          time: slurmctld's clock did not step) and no second interval ever covers wall
          time already written. Its intervals may end up to `_lag` after the epilog's wall
          time; the hooks' times (span start, end) are kept as the hooks wrote them, and
          only decide a job's edges at the tick that reads them, within one interval. Once
          no job holds a GPU here, `_rejoin_wall` goes back on the wall clock, and each
          GPU's intervals start again after the last one written (the wall time the clock
          repeats is not measured: missing, on a node no job held).
        - forward: the agent re-anchors on the wall clock, first using up any `_lag`; the
          rest of the jump is time the agent never measured: each GPU's next window starts
          its monotonic interval before this read, and the jump stays uncovered (missing),
          never an interval with readings it did not take.
        """
        wall, mono = self.clock(), self.monotonic()
        if self._anchor is None:
            self._anchor = (wall, mono)
            return wall
        now = self._anchor[0] + (mono - self._anchor[1])
        drift = wall - (now - self._lag)
        if abs(drift) <= self.clock_step:
            return now
        at = _iso(wall)
        if drift < 0:
            self._lag -= drift
            log.warning(
                "wall clock stepped back %.1f s at %s; intervals continue on the monotonic"
                " clock (%.1f s ahead of the wall clock while a job holds a GPU here)",
                -drift,
                at,
                self._lag,
            )
        else:
            caught = min(self._lag, drift)
            self._lag = max(0.0, self._lag - caught)
            jump = drift - caught
            if jump > 0:
                self._jump += jump
                self._shift_marks(jump)
                now += jump
            log.warning(
                "wall clock stepped forward %.1f s at %s; intervals continue on the monotonic"
                " clock: %s",
                drift,
                at,
                f"the {jump:.1f} s jump is missing time, never measured"
                if jump > 0
                else "back on the wall clock",
            )
        self._anchor = (now, mono)
        return now

    def _rejoin_wall(self, now: float) -> float:
        """No job holds a GPU here: the agent's time goes back on the wall clock.

        Each GPU's reads stay where they are (`gpu_state`): its windows start again once
        the wall clock passes its last read, so nothing written is covered twice.
        """
        back, self._lag = self._lag, 0.0
        assert self._anchor is not None
        self._anchor = (self._anchor[0] - back, self._anchor[1])
        self._shift_marks(-back)
        self._measured_since.clear()  # the wall time repeated is not read: runs end here
        log.warning(
            "no job holds a GPU here: the agent's time is back on the wall clock (%.1f s"
            " back); each GPU's intervals start again after the last one written",
            back,
        )
        return now - back

    def _shift_marks(self, seconds: float) -> None:
        """Moves the instants the agent keeps by `seconds` when its clock is re-anchored.

        `measured_since`, last active: as long ago as they were on the monotonic clock.
        """
        for uuid in self._measured_since:
            self._measured_since[uuid] += seconds
        for marks in (self._last_active, self._last_sm_active):
            for key in marks:
                marks[key] += seconds

    def _queue_lost(self, db: sqlite3.Connection, now: float) -> dict[str, LostGpu] | None:
        """Queues the inventory with the lost GPUs when they changed; returns what it queued."""
        if self._lost == self._lost_reported:
            return None
        payload = {
            "devices": [device_fields(d) for d in self.devices],
            "seen_at": now,
            "lost": [asdict(g) for _, g in sorted(self._lost.items())],
        }
        self.spool.queue(db, "inventory", f"inventory:{self.node}", payload)
        return dict(self._lost)

    def _adopt_orphan_bindings(self, spans: list[JobSpan]) -> list[JobSpan]:
        """A binding with no span means its started event was lost: trust the binding.

        Returns `spans` plus the spans adopted from bindings.
        """
        files = read_binding_files(self.node_dir)
        if not files:  # no job holds a GPU here
            self._het = {}
            self._sluid_jobs.clear()
            return spans
        bindings = self._bound_bindings(files)
        known = {(s.job_id, s.restart, s.slurm_index) for s in spans}
        self._het = {b.job_id: b.het_job_id for b in bindings if b.het_job_id is not None}
        adopted = [
            JobSpan(
                b.job_id,
                b.slurm_index,
                b.start,
                None,
                b.user,
                b.account,
                b.partition,
                b.restart,
                b.shards,
                b.shard_kind,
            )
            for b in bindings
            if (b.job_id, b.restart, b.slurm_index) not in known
        ]
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

        def last_read(job_id: int) -> float | None:
            reads = [
                state.get(self.index_uuid.get(s.slurm_index, ""), (None, None, None))[0]
                for s in spans
                if s.job_id == job_id
            ]
            known = [r for r in reads if r is not None]
            return max(known) if known else None

        return last_read

    # --- GPUs named by UUID (gres.conf Flags=env_uuid) -------------------------------

    def _bound_event(self, item: EventFile) -> JobEvent:
        """The event with its GPUs bound by the UUIDs slurmd named, where it named them.

        With indices and UUIDs (the prolog's SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES,
        paired by slurmd itself) each index is bound to its UUID; with UUIDs alone each
        UUID is looked up among the GPUs this node's gres.conf maps.
        """
        event = self._with_shares(item.event)
        if not item.gpu_uuids:
            return event
        if event.gpu_indices:
            for index, uuid in zip(event.gpu_indices, item.gpu_uuids, strict=True):
                self._follow_slurm(index, uuid, event.job_id)
            return event
        found = (self._index_of(uuid, event.job_id) for uuid in item.gpu_uuids)
        return replace(event, gpu_indices=tuple(i for i in found if i is not None))

    def _with_shares(self, event: JobEvent) -> JobEvent:
        """A started job on GPUs gres.conf cuts into shares, with the shares Slurm gave it.

        The prolog cannot tell a shard job from a whole-GPU job on the same GPU (Slurm
        22.05 gives both SLURM_JOB_GPUS=0 and nothing more), so the agent asks Slurm once
        per such job (`job_shares`: scontrol -d show job). Where Slurm cannot be asked,
        the job is recorded as holding its whole GPUs, and the error says so.
        """
        if (
            event.kind != JobEventKind.STARTED
            or event.shards
            or self.job_shares is None
            or not any(
                (kind, index) in self._capacity
                for index in event.gpu_indices
                for kind in (SlotKind.SHARD.value, SlotKind.MPS.value)
            )
        ):
            return event
        try:
            found = self.job_shares(event.job_id)
        except (SlurmError, ValueError) as exc:
            log.error(
                "job %d: cannot tell whether it holds shares of Slurm GPU %s (%s):"
                " recorded as holding the whole GPU",
                event.job_id,
                ",".join(map(str, event.gpu_indices)),
                exc,
            )
            return event
        if found is None:
            return event
        kind, count = found
        return replace(event, shards=count, shard_kind=kind)

    def _bound_bindings(self, files: list[BindingFile]) -> list[Binding]:
        """The bindings by Slurm index (UUID-only ones looked up); learns the SLUIDs."""
        self._sluid_jobs.clear()
        bindings = []
        for item in files:
            binding = item.binding
            if item.sluid:
                self._sluid_jobs[item.sluid] = binding.job_id
            if item.gpu_uuid and binding.slurm_index == UNKNOWN_INDEX:
                index = self._index_of(item.gpu_uuid, binding.job_id)
                if index is None:
                    continue
                binding = replace(binding, slurm_index=index)
            elif item.gpu_uuid:
                self._follow_slurm(binding.slurm_index, item.gpu_uuid, binding.job_id)
            bindings.append(binding)
        return bindings

    def _follow_slurm(self, index: int, uuid: str, job_id: int) -> None:
        """slurmd says Slurm GPU `index` is `uuid`: bind the index to that GPU.

        The UUID is the GPU the job's CUDA programs see, so it wins over what gres.conf's
        device files gave (an AutoDetect node has none); a conflict is logged as an error.
        A UUID NVML does not list here leaves the index as it was, and is logged. A MIG
        UUID (slurmd always names MIG slots by UUID) binds the index to that MIG slice.
        """
        if self.index_uuid.get(index) == uuid:
            return
        if uuid not in self._nvml_uuids:
            if (job_id, uuid) not in self._uuid_warned:
                self._uuid_warned.add((job_id, uuid))
                log.error(
                    "job %d: slurmd names Slurm GPU %d %s (CUDA_VISIBLE_DEVICES), which NVML"
                    " does not list on this node: GPU %d stays bound by gres.conf (%s)",
                    job_id,
                    index,
                    uuid,
                    index,
                    self.index_uuid.get(index, "no GPU"),
                )
            return
        before = self.index_uuid.get(index)
        if before is None:
            log.warning("Slurm GPU %d is %s (slurmd, job %d)", index, uuid, job_id)
        else:
            log.error(
                "Slurm GPU %d is %s by slurmd's CUDA_VISIBLE_DEVICES (job %d), but gres.conf's"
                " device file gave %s: following slurmd",
                index,
                uuid,
                job_id,
                before,
            )
        for other in [i for i, u in self.index_uuid.items() if u == uuid and i != index]:
            del self.index_uuid[other]  # that index was this GPU by gres.conf only
            self.index_slot.pop(other, None)
        self.index_uuid[index] = uuid
        self.uuid_index = {u: i for i, u in self.index_uuid.items()}
        mig = self._migs.get(uuid)
        self.index_slot[index] = mig[1].slot if mig else GpuSlot.whole(uuid)

    def _index_of(self, uuid: str, job_id: int) -> int | None:
        """The Slurm index of the GPU `uuid` on this node; None (logged) when unknown."""
        index = self.uuid_index.get(uuid)
        if index is None and (job_id, uuid) not in self._uuid_warned:
            self._uuid_warned.add((job_id, uuid))
            where = "NVML lists it but" if uuid in self._nvml_uuids else "NVML does not list it and"
            log.error(
                "job %d: GPU %s (CUDA_VISIBLE_DEVICES, no SLURM_JOB_GPUS): %s gres.conf gives"
                " it no Slurm index on this node: not bound",
                job_id,
                uuid,
                where,
            )
        return index

    def _read_gpu(
        self,
        db: sqlite3.Connection,
        batch: PieceBatch,
        device: GpuDevice,
        spans: list[JobSpan],
        state: tuple[float | None, float | None, float | None] | None,
        now: float,
        result: TickResult,
    ) -> tuple[float | None, float | None, float | None]:
        """Reads one GPU into the spool; returns where its next read starts (gpu_state).

        Its pieces go into `batch`, written by the tick (or here, before a seal).
        """
        last_read, last_sample, last_energy = state or (None, None, None)
        if state is not None and last_read is not None and now <= last_read:
            return self._written_ahead(device, state)
        continuous = last_read is not None and 0 < now - last_read <= self.max_gap
        w0 = self._window_start(last_read, now, continuous)
        since = last_sample if continuous and last_sample is not None else w0
        # The source stamps samples with the wall clock: `_lag` behind the agent's time.
        since = min(since, w0 - self._lag)
        snap = self.source.snapshot(device, since)
        result.snapshots[device.uuid] = snap
        newest = max((s.time for s in snap.samples), default=last_sample)
        if self._lag and snap.samples:
            lag = self._lag
            snap = replace(snap, samples=tuple(s._replace(time=s.time + lag) for s in snap.samples))
        previous_mem = self._last_mem.pop(device.uuid, None) if continuous else None
        if snap.error is not None:
            # Nothing is known about this window: it stays uncovered (missing).
            self._unreadable(device, snap.error, now, (device.uuid,))
            return now, last_sample, None
        if self._lost.pop(device.uuid, None) is not None:
            log.warning("GPU %s (minor %d) answers again", device.uuid, device.minor)
        if not continuous or device.uuid not in self._measured_since:
            self._measured_since[device.uuid] = w0
        self._last_mem[device.uuid] = snap.mem_used_bytes
        energy_delta = None
        if continuous and snap.energy_joules is not None and last_energy is not None:
            delta = snap.energy_joules - last_energy
            energy_delta = delta if delta >= 0 else None  # counter reset (driver reload)
        index = self.uuid_index.get(device.uuid)
        mine = [
            s
            for s in spans
            if s.slurm_index == index and s.start < now and (s.end is None or s.end > w0)
        ]
        # shares hold it in this window: measured per process
        if self._shared and index in self._shared and any(s.shards for s in mine):
            self._read_shares(db, batch, device, snap, mine, w0, now, energy_delta, result)
            return now, newest, snap.energy_joules
        self._ledger.read(device.uuid)
        pieces = split_window(
            w0, now, snap, mine, self.period, self.active_threshold, energy_delta, previous_mem
        )
        unallocated = self._unallocated(device.uuid, snap, mine, now)
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
                self._queue_activity(db, device.uuid, span, snap, w0, now)
        before = period_start(now, self.period) - self.period
        next_seal = self._next_seal.get(device.uuid, -math.inf)
        if pieces:  # in time order: the first starts in the earliest period
            next_seal = min(next_seal, pieces[0].period_start)
        if next_seal <= before:
            batch.flush(db)  # sealing reads the period rows
            # a GPU shares held (or whose rows of a previous run are not known) has slot rows
            slotted = device.uuid in self._slotted or device.uuid not in self._next_seal
            result.sealed += self.spool.seal_periods(db, self.node, device.uuid, before, slotted)
            next_seal = before + self.period  # what is left starts in a later period
        self._next_seal[device.uuid] = next_seal
        return now, newest, snap.energy_joules

    def _window_start(self, last_read: float | None, now: float, continuous: bool) -> float:
        """Where this read's window starts: the last read, else an interval before now.

        Never before the last read (after the wall clock stepped back): what is written
        is never covered twice.
        """
        if continuous and last_read is not None:
            return last_read
        w0 = now - self.interval
        return w0 if last_read is None else max(w0, last_read)

    def _written_ahead(
        self,
        device: GpuDevice,
        state: tuple[float | None, float | None, float | None],
    ) -> tuple[float | None, float | None, float | None]:
        """The GPU's intervals are written past now: it is not read until now passes them.

        The wall clock stepped back while no agent ran (the spool's last read is ahead of
        a new agent's time), or `_rejoin_wall` put the agent back on the wall clock.
        """
        for uuid in (device.uuid, *(m.uuid for m in device.mig_devices)):
            self._measured_since.pop(uuid, None)  # no readings meanwhile: the run ends
        return state

    # --- GPU slots: MIG slices and shares (issue 14) -----------------------------------

    def _slot_of(
        self, index: int, shards: int, shard_kind: str, job_id: int, restart: int
    ) -> tuple[GpuSlot, Measurement] | None:
        """The slot a run's span held (Spool.finish_job); None: the index's whole GPU."""
        if shards:
            uuid = self.index_uuid.get(index)
            if uuid is None:
                return None
            span = JobSpan(
                job_id, index, 0.0, restart=restart, shards=shards, shard_kind=shard_kind
            )
            return self._share_slot(uuid, span), Measurement.PER_PROCESS
        slot = self.index_slot.get(index)
        if slot is None or slot.kind is SlotKind.GPU:
            return None
        found = self._migs.get(slot.slot_id)
        return slot, self._mig_measurement(*found) if found else Measurement.MEMORY_ONLY

    def _mig_measurement(self, device: GpuDevice, mig: MigDevice) -> Measurement:
        """A MIG slice is measured by GPM where its GPU has it (Hopper+), else memory only."""
        if device.gpm_supported or mig.uuid in self._mig_gpm:
            return Measurement.GPM
        return Measurement.MEMORY_ONLY

    def _share_slot(self, uuid: str, span: JobSpan) -> GpuSlot:
        """A run's share of GPU `uuid`: shards held / shards gres.conf gives that GPU."""
        kind = SlotKind.MPS if span.shard_kind == SlotKind.MPS.value else SlotKind.SHARD
        capacity = self._capacity.get((kind.value, span.slurm_index))
        if capacity is None or not capacity.count:
            if (warned := f"capacity:{kind.value}:{span.slurm_index}") not in self._slot_warned:
                self._slot_warned.add(warned)
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

    def _measured(self, piece: Piece, util: float) -> Piece:
        """A slot's piece measured by one figure for its window (GPM graphics, per process)."""
        active = 1 if is_active(util, self.active_threshold) else 0
        return piece._replace(
            util_sum=util, util_count=1, util_max=util, util_min=util, active_count=active
        )

    def _seal_slotted(
        self,
        db: sqlite3.Connection,
        batch: PieceBatch,
        uuid: str,
        first_period: float | None,
        now: float,
        result: TickResult,
    ) -> None:
        """Seals the ended periods of a GPU with slots: its slots' rows and its totals."""
        self._slotted.add(uuid)
        before = period_start(now, self.period) - self.period
        next_seal = self._next_seal.get(uuid, -math.inf)
        if first_period is not None:
            next_seal = min(next_seal, first_period)
        if next_seal <= before:
            batch.flush(db)
            result.sealed += self.spool.seal_periods(db, self.node, uuid, before, slotted=True)
            next_seal = before + self.period
        self._next_seal[uuid] = next_seal

    def _unreadable(
        self, device: GpuDevice, error: str, now: float, slots: tuple[str, ...]
    ) -> None:
        """`device` could not be read this tick.

        The idle clocks of `slots` start again after the gap, and the GPU is reported lost
        (logged once, until it answers again).
        """
        for uuid in slots:
            self._measured_since.pop(uuid, None)
        if device.uuid not in self._lost:
            log.error("GPU %s (minor %d) cannot be read: %s", device.uuid, device.minor, error)
            self._lost[device.uuid] = LostGpu(device.uuid, device.minor, now, error)

    def _read_mig_gpu(
        self,
        db: sqlite3.Connection,
        batch: PieceBatch,
        device: GpuDevice,
        spans: list[JobSpan],
        state: tuple[float | None, float | None, float | None] | None,
        now: float,
        result: TickResult,
    ) -> tuple[float | None, float | None, float | None]:
        """Reads a GPU in MIG mode: its own totals, and each MIG device as its own slot.

        The GPU itself is never a job's slot: NVML has no utilization samples of it in
        MIG mode, and an idle rule fed its empty samples would read it idle.
        """
        last_read, _, last_energy = state or (None, None, None)
        if state is not None and last_read is not None and now <= last_read:
            return self._written_ahead(device, state)
        continuous = last_read is not None and 0 < now - last_read <= self.max_gap
        w0 = self._window_start(last_read, now, continuous)
        snap = self.source.snapshot(device, w0 - self._lag)
        result.snapshots[device.uuid] = snap
        if snap.error is not None:
            # Nothing is known about this window, of the GPU or of its slices: missing.
            slots = (device.uuid, *(m.uuid for m in device.mig_devices))
            self._unreadable(device, snap.error, now, slots)
            return now, None, None
        if self._lost.pop(device.uuid, None) is not None:
            log.warning("GPU %s (minor %d) answers again", device.uuid, device.minor)
        if not continuous or device.uuid not in self._measured_since:
            self._measured_since[device.uuid] = w0
        energy_delta = None
        if continuous and snap.energy_joules is not None and last_energy is not None:
            delta = snap.energy_joules - last_energy
            energy_delta = delta if delta >= 0 else None
        physical = split_window(w0, now, snap, [], self.period, self.active_threshold, energy_delta)
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
        self._seal_slotted(db, batch, device.uuid, first, now, result)
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
        index = self.uuid_index.get(mig.uuid)
        mine = [
            s
            for s in spans
            if index is not None
            and s.slurm_index == index
            and s.start < now
            and (s.end is None or s.end > w0)
        ]
        read: MigSnapshot = self.source.mig_snapshot(device, mig)
        previous_mem = self._last_mem.pop(mig.uuid, None) if continuous else None
        if read.error is not None:
            self._measured_since.pop(mig.uuid, None)  # a gap: missing, never idle
            if mig.uuid not in self._slot_warned:
                self._slot_warned.add(mig.uuid)
                log.error(
                    "MIG device %s (%s) of GPU %s cannot be read: %s",
                    mig.uuid,
                    mig.profile,
                    device.uuid,
                    read.error,
                )
            return
        if mig.uuid in self._slot_warned:
            self._slot_warned.discard(mig.uuid)
            log.warning("MIG device %s of GPU %s answers again", mig.uuid, device.uuid)
        if not continuous or mig.uuid not in self._measured_since:
            self._measured_since[mig.uuid] = w0
        self._ledger.read(mig.uuid)
        self._last_mem[mig.uuid] = read.mem_used_bytes
        if read.gpm is not None:
            self._mig_gpm.add(mig.uuid)
        measured = self._mig_measurement(device, mig)
        view = GpuSnapshot(
            mig.uuid,
            read.time,
            mem_used_bytes=read.mem_used_bytes,
            mem_total_bytes=read.mem_total_bytes,
            processes=read.processes,
            gpm=read.gpm,
        )
        pieces = split_window(
            w0, now, view, mine, self.period, self.active_threshold, None, previous_mem
        )
        # A slice's utilization: its GPU instance's graphics activity, for the part of each
        # piece its GPM window covers; without GPM none (memory only: unknown, never 0).
        graphics = read.gpm.graphics_active_percent if read.gpm is not None else None
        window = gpm_span(w0, now, view) if graphics is not None else None
        if graphics is not None and window is not None:
            pieces = [
                self._measured(p, graphics)
                if min(p.end, window[1]) > max(p.start, window[0])
                else p
                for p in pieces
            ]
        unallocated = self._unallocated(mig.uuid, view, mine, now)
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
                if (note := f"idle:{span.job_id}:{mig.uuid}") not in self._slot_warned:
                    self._slot_warned.add(note)
                    log.info(
                        "job %d: MIG %s %s (memory only, no GPM) runs no process: idle",
                        span.job_id,
                        mig.profile,
                        mig.uuid,
                    )
            processes = None if read.processes is None else len(read.processes)
            memory = read.mem_used_bytes
            self._queue_slot_activity(
                db,
                slot,
                span,
                measured,
                mig.uuid,
                now,
                util,
                memory,
                processes,
                sm_active,
                read.mem_total_bytes,
            )

    def _read_shares(
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
        uuid = device.uuid
        physical = split_window(w0, now, snap, [], self.period, self.active_threshold, energy_delta)
        for piece in physical:
            batch.add_physical(
                uuid, piece, snap.mem_total_bytes, snap.temperature_celsius, snap.ecc_errors_total
            )
        unallocated = self._unallocated(uuid, snap, mine, now)
        if unallocated:
            result.unallocated[uuid] = unallocated
        # This window's samples only, on the source's (wall) clock; a newest sample seen
        # ahead of the window is of before a wall clock step back: not a bound.
        floor = w0 - self._lag
        seen = self._proc_seen.get(uuid, floor)
        since = max(seen, floor) if seen - floor <= self.clock_step else floor
        read = self.source.process_utilization(device, since)
        if read.error is not None:
            self._proc_seen.pop(uuid, None)
            if f"process:{uuid}" not in self._slot_warned:
                self._slot_warned.add(f"process:{uuid}")
                log.error(
                    "GPU %s: per-process utilization cannot be read (%s): its shares' use is"
                    " unknown meanwhile (missing, never idle)",
                    uuid,
                    read.error,
                )
        else:
            if f"process:{uuid}" in self._slot_warned:
                self._slot_warned.discard(f"process:{uuid}")
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
        self._seal_slotted(db, batch, uuid, first, now, result)

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
        slot = self._share_slot(device.uuid, span)
        self._ledger.read(slot.slot_id)
        key = (span.job_id, span.restart, device.uuid)
        previous_mem = self._share_mem.get(key)
        self._share_mem[key] = memory
        view = GpuSnapshot(slot.slot_id, snap.time, mem_used_bytes=memory)
        for piece in split_window(
            w0, now, view, [span], self.period, self.active_threshold, None, previous_mem
        ):
            if piece.job_id is not None:
                measured = self._measured(piece, util)
                batch.add_slot(
                    slot, device.name, measured, snap.mem_total_bytes, Measurement.PER_PROCESS
                )
        if span.end is None:
            measured_by = Measurement.PER_PROCESS
            self._queue_slot_activity(
                db,
                slot,
                span,
                measured_by,
                device.uuid,
                now,
                util,
                memory,
                processes,
                None,
                snap.mem_total_bytes,
            )

    def _queue_slot_activity(
        self,
        db: sqlite3.Connection,
        slot: GpuSlot,
        span: JobSpan,
        measured: Measurement,
        reader: str,
        now: float,
        util: float | None,
        memory: int | None,
        processes: int | None,
        sm_active: float | None,
        mem_total: int | None,
    ) -> None:
        """The controller's view of a running job's slot (MIG slice, share), when it changed.

        `reader`: what was read for it (the MIG device, the shared GPU), whose unbroken
        run of readings `measured_since` is. A window at or above the threshold is active
        up to this read (GPM windows and per-process means have no finer time).
        `mem_total`: the slot's memory, which memory changes are measured by.
        """
        key = (span.job_id, span.restart, slot.slot_id)
        if util is not None and is_active(util, self.active_threshold):
            self._last_active[key] = now
        if sm_active is not None and is_active(sm_active, self.sm_active_threshold):
            self._last_sm_active[key] = now
        activity = GpuActivity(
            job_id=span.job_id,
            node=self.node,
            gpu_uuid=slot.parent_uuid,
            slurm_index=span.slurm_index,
            start=span.start,
            last_reading=now,
            last_active=self._last_active.get(key),
            util_recent_percent=util,
            mem_used_bytes=memory,
            process_count=processes,
            measured_since=self._measured_since.get(reader),
            sm_active_recent_percent=sm_active,
            last_sm_active=self._last_sm_active.get(key),
            slot_id=slot.slot_id,
            slot_kind=slot.kind,
            share=slot.share,
            mig_profile=slot.mig_profile,
            measured_by=measured,
        )
        row_key = f"activity:{span.job_id}:{slot.slot_id}"
        if self._ledger.offer(row_key, activity, mem_total):
            self.spool.queue(db, "activity", row_key, fields_of(activity))

    def _queue_activity(
        self,
        db: sqlite3.Connection,
        uuid: str,
        span: JobSpan,
        snap: GpuSnapshot,
        w0: float,
        now: float,
    ) -> None:
        """The controller's view of a running job's GPU, queued when it changed (replaced)."""
        since = max(w0, span.start)
        mine = [s for s in snap.samples if since < s.time <= now]
        busy = [s.time for s in mine if is_active(s.util_percent, self.active_threshold)]
        key = (span.job_id, span.restart, uuid)
        if busy:
            self._last_active[key] = max(busy)
        # GPM: the newest window's SM activity. A job that started inside that window
        # shares its mean with what ran before (the finest truth one window gives, as in
        # attribution.py); its end is this read, on the agent's clock.
        sm_active = snap.gpm.sm_active_percent if snap.gpm is not None else None
        if sm_active is not None and is_active(sm_active, self.sm_active_threshold):
            self._last_sm_active[key] = now
        activity = GpuActivity(
            job_id=span.job_id,
            node=self.node,
            gpu_uuid=uuid,
            slurm_index=span.slurm_index,
            start=span.start,
            last_reading=now,
            last_active=self._last_active.get(key),
            util_recent_percent=sum(s.util_percent for s in mine) / len(mine) if mine else None,
            mem_used_bytes=snap.mem_used_bytes,
            process_count=None if snap.processes is None else len(snap.processes),
            measured_since=self._measured_since.get(uuid),
            sm_active_recent_percent=sm_active,
            last_sm_active=self._last_sm_active.get(key),
        )
        row_key = f"activity:{span.job_id}:{uuid}"
        if self._ledger.offer(row_key, activity, snap.mem_total_bytes):
            self.spool.queue(db, "activity", row_key, fields_of(activity))

    def _unallocated(
        self, uuid: str, snap: GpuSnapshot, spans: list[JobSpan], now: float
    ) -> tuple[int, ...]:
        """Pids on this GPU that belong to no job holding it now (DESIGN: security).

        Every task of a heterogeneous job carries the leader's SLURM_JOB_ID, whatever its
        component (https://slurm.schedmd.com/heterogeneous_jobs.html, "Environment
        Variables"): a process that names the leader of the het job a holder is a
        component of is that component's own, not GPU use outside an allocation.
        """
        if not snap.processes:  # nothing runs on it: no stray, and no pid to remember
            if self._warned_pids:
                self._warned_pids = {w for w in self._warned_pids if w[0] != uuid}
            return ()
        holders = {s.job_id for s in spans if s.end is None or s.end >= now}
        holders |= {self._het[j] for j in holders if j in self._het}
        jobs = {p.pid: self.pid_job(p.pid) for p in snap.processes or ()}
        strays = tuple(pid for pid, job in jobs.items() if job not in holders)
        for pid in strays:
            if (uuid, pid) not in self._warned_pids:
                self._warned_pids.add((uuid, pid))
                job = jobs[pid]
                log.warning(
                    "unallocated GPU use: pid %d (user %s, %s) on GPU %s (%s) belongs to no"
                    " job holding it",
                    pid,
                    self.pid_owner(pid),
                    f"Slurm job {job}" if job is not None else "no Slurm job",
                    self.uuid_index.get(uuid, "?"),
                    uuid,
                )
        # Forget pids gone from this GPU: the set stays the size of what runs now.
        self._warned_pids = {w for w in self._warned_pids if w[0] != uuid or w[1] in strays}
        return strays
