"""The node agent's sampling tick: hooks' events -> GPU reads -> spool, in one transaction.

Each tick:
1. takes the hooks' new event files into the spool (then deletes them),
2. reads every GPU through the GpuSource, splits the window since the last read by the
   jobs that held the GPU (attribution.py) and merges the pieces into the spool,
3. seals finished shipping periods into the outbox and summarizes the runs that ended (a
   requeued job runs again under its id: each run, Slurm's restart count, is summarized
   on its own),
4. queues the node's inventory with its lost GPUs (those it cannot read at all) at the
   first tick and whenever that set changes, for the controller's hot_node policy.
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
from pathlib import Path

from slurm_gpu.activity import is_active
from slurm_gpu.gpu import GpuSnapshot, GpuSource
from slurm_gpu.models import Binding, GpuActivity, GpuDevice, JobEvent, JobGpuSummary, LostGpu
from slurm_gpu.node.attribution import JobSpan, period_start, split_window
from slurm_gpu.node.hookfiles import (
    UNKNOWN_INDEX,
    BindingFile,
    EventFile,
    read_binding_files,
    read_events,
)
from slurm_gpu.node.outbox import fields_of
from slurm_gpu.node.spool import PieceBatch, Spool
from slurm_gpu.slurm.gpu_order import slurm_gpu_order
from slurm_gpu.slurm.gres import GresGpuFile, GresNode

log = logging.getLogger(__name__)

_CGROUP_JOB = re.compile(rb"/job_(\d+)(?:/|$)", re.MULTILINE)
# Slurm 26.05's cgroup/v2 names a job's cgroup by its SLUID unless cgroup.conf says
# CgroupJobIdPaths=yes: src/plugins/cgroup/v2/cgroup_v2.c, cgroup_p_step_create
# ("/job_%u" with cgroup_job_id_paths, else "/%s" of print_sluid), under which come
# step_N/user/task_N. A SLUID is "s" and 13 characters of Crockford's base 32
# (src/common/sluid.c, print_sluid).
_CGROUP_SLUID = re.compile(rb"/(s[0-9A-HJKMNP-TV-Z]{13})(?:/|$)", re.MULTILINE)


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
        clock: POSIX time. pid_job: maps a pid to its Slurm job (None: no job); default
            `job_of_pid` with the SLUIDs of the jobs bound here.
        stat: os.stat, for resolving device minors.
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
        stat: Callable[[str], os.stat_result] = os.stat,
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
        self._sluid_jobs: dict[str, int] = {}  # SLUID -> job id, of the jobs bound here
        self.pid_job = pid_job or (lambda pid: job_of_pid(pid, sluids=self._sluid_jobs))
        self.devices: list[GpuDevice] = source.devices()
        self._nvml_uuids = {d.uuid for d in self.devices}
        self._uuid_warned: set[tuple[int, str]] = set()  # (job, uuid) logged as unbindable
        # Slurm index -> NVML device, numbered as slurmd numbers them (gpu_order).
        self.gpu_order = slurm_gpu_order(
            gres if isinstance(gres, GresNode) else GresNode.listing(node, gres),
            self.devices,
            stat,
        )
        for problem in self.gpu_order.problems:
            log.error("%s", problem)
        self.index_uuid: dict[int, str] = self.gpu_order.index_uuid()
        self.uuid_index = {u: i for i, u in self.index_uuid.items()}
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
        for gpu in self.gpu_order.gpus:
            if gpu.uuid is None and gpu.minor is not None:
                reason = (
                    f"gres.conf GPU {gpu.index} (/dev/nvidia{gpu.minor}) is not among NVML's GPUs"
                )
                self._lost[f"minor:{gpu.minor}"] = LostGpu("", gpu.minor, started, reason)

    def tick(self) -> TickResult:
        """One sampling round (see module docstring)."""
        now = self.clock()
        result = TickResult(time=now)
        event_files = read_events(self.node_dir, self.node)
        if event_files:
            with self.spool.transaction() as db:
                for item in event_files:
                    self.spool.apply_event(db, self._bound_event(item))
            self._spans = None  # the events opened or closed spans
        for item in event_files:
            item.path.unlink(missing_ok=True)
        result.events = len(event_files)
        if self._spans is None:
            self._spans = self.spool.spans()
        spans = self._adopt_orphan_bindings(self._spans)
        # Where each GPU's reads stand: the spool's at the first tick, then this agent's own
        # (it is the only writer), kept once committed.
        state = self._gpu_state if self._gpu_state is not None else self.spool.gpu_state()
        self._gpu_state = None  # unknown until this tick commits
        updates: dict[str, tuple[float | None, float | None, float | None]] = {}
        try:
            with self.spool.transaction() as db:
                batch = PieceBatch()
                for device in self.devices:
                    updates[device.uuid] = self._read_gpu(
                        db, batch, device, spans, state.get(device.uuid), now, result
                    )
                batch.flush(db)  # before the runs that ended are summarized
                self.spool.set_gpu_states(db, updates)
                for run in sorted({s.run for s in spans if s.end is not None and s.end <= now}):
                    self._spans = None
                    job_id, restart = run
                    result.summaries += self.spool.finish_job(
                        db, self.node, job_id, self.index_uuid, restart
                    )
                    self._last_active = {k: v for k, v in self._last_active.items() if k[:2] != run}
                    self._last_sm_active = {
                        k: v for k, v in self._last_sm_active.items() if k[:2] != run
                    }
                lost = self._queue_lost(db, now)
        except BaseException:
            self._next_seal.clear()  # rolled back: which periods are open is unknown again
            self._spans = None
            raise
        if lost is not None:
            self._lost_reported = lost  # committed
        self._gpu_state = {**state, **updates}
        return result

    def _queue_lost(self, db: sqlite3.Connection, now: float) -> dict[str, LostGpu] | None:
        """Queues the inventory with the lost GPUs when they changed; returns what it queued."""
        if self._lost == self._lost_reported:
            return None
        payload = {
            "devices": [asdict(d) for d in self.devices],
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
                b.job_id, b.slurm_index, b.start, None, b.user, b.account, b.partition, b.restart
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

    # --- GPUs named by UUID (gres.conf Flags=env_uuid) -------------------------------

    def _bound_event(self, item: EventFile) -> JobEvent:
        """The event with its GPUs bound by the UUIDs slurmd named, where it named them.

        With indices and UUIDs (the prolog's SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES,
        paired by slurmd itself) each index is bound to its UUID; with UUIDs alone each
        UUID is looked up among the GPUs this node's gres.conf maps.
        """
        event = item.event
        if not item.gpu_uuids:
            return event
        if event.gpu_indices:
            for index, uuid in zip(event.gpu_indices, item.gpu_uuids, strict=True):
                self._follow_slurm(index, uuid, event.job_id)
            return event
        found = (self._index_of(uuid, event.job_id) for uuid in item.gpu_uuids)
        return replace(event, gpu_indices=tuple(i for i in found if i is not None))

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
        A UUID NVML does not list here leaves the index as it was, and is logged.
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
        self.index_uuid[index] = uuid
        self.uuid_index = {u: i for i, u in self.index_uuid.items()}

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
        continuous = last_read is not None and 0 < now - last_read <= self.max_gap
        w0 = last_read if continuous and last_read is not None else now - self.interval
        since = last_sample if continuous and last_sample is not None else w0
        snap = self.source.snapshot(device, since)
        result.snapshots[device.uuid] = snap
        previous_mem = self._last_mem.pop(device.uuid, None) if continuous else None
        if snap.error is not None:
            # Nothing is known about this window: it stays uncovered (missing).
            self._measured_since.pop(device.uuid, None)  # a gap: idle clocks start again
            if device.uuid not in self._lost:
                log.error(
                    "GPU %s (minor %d) cannot be read: %s", device.uuid, device.minor, snap.error
                )
                self._lost[device.uuid] = LostGpu(device.uuid, device.minor, now, snap.error)
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
            result.sealed += self.spool.seal_periods(db, self.node, device.uuid, before)
            next_seal = before + self.period  # what is left starts in a later period
        self._next_seal[device.uuid] = next_seal
        newest = max((s.time for s in snap.samples), default=last_sample)
        return now, newest, snap.energy_joules

    def _queue_activity(
        self,
        db: sqlite3.Connection,
        uuid: str,
        span: JobSpan,
        snap: GpuSnapshot,
        w0: float,
        now: float,
    ) -> None:
        """The controller's view of a running job's GPU: replaced every tick."""
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
        self.spool.queue(db, "activity", f"activity:{span.job_id}:{uuid}", fields_of(activity))

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
                    process_owner(pid),
                    f"Slurm job {job}" if job is not None else "no Slurm job",
                    self.uuid_index.get(uuid, "?"),
                    uuid,
                )
        # Forget pids gone from this GPU: the set stays the size of what runs now.
        self._warned_pids = {w for w in self._warned_pids if w[0] != uuid or w[1] in strays}
        return strays
