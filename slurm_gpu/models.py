"""Frozen value types shared across layers: devices, readings, job events, summaries.

Times are POSIX seconds (float, UTC). Units are in the names. A field that NVML could not
read (not supported, GPU lost) is None: missing data is never zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SlotKind(StrEnum):
    """What kind of GPU slot a job holds (docs/design/gpu-slots.md)."""

    GPU = "gpu"  # a whole GPU
    MIG = "mig"  # a MIG GPU instance (its compute instance)
    SHARD = "shard"  # a gres/shard share of a GPU
    MPS = "mps"  # a gres/mps share of a GPU


class Measurement(StrEnum):
    """How a slot's figures were measured; every summary and report says which."""

    NVML = "nvml"  # a whole GPU: NVML's utilization samples (and GPM where it has it)
    GPM = "gpm"  # a MIG slice on Hopper+: GPM of its GPU instance
    MEMORY_ONLY = "memory-only"  # a MIG slice without GPM (Ampere): memory, no utilization
    PER_PROCESS = "per-process"  # a shared GPU: the job's own processes


@dataclass(frozen=True)
class GpuSlot:
    """What a job holds of one physical GPU: the whole GPU, a MIG slice, or a share.

    `slot_id` identifies the slot wherever a GPU UUID did before: a whole GPU's is its
    UUID (so rows written before slots existed read as whole-GPU slots), a MIG slice's
    its MIG UUID, a share's "<parent UUID>/<kind>/<job>[.<restart>]" (two jobs sharing
    a GPU in one period need two rows). `share` is the slot's part of the parent's
    compute: 1 for a whole GPU, compute slices / the GPU's slices for MIG, shards held /
    shards configured for a shard.
    """

    kind: SlotKind
    slot_id: str
    parent_uuid: str
    share: float = 1.0
    mig_profile: str = ""  # "1g.10gb"
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @classmethod
    def whole(cls, gpu_uuid: str) -> GpuSlot:
        """The slot of a whole GPU."""
        return cls(SlotKind.GPU, gpu_uuid, gpu_uuid)

    @classmethod
    def shared(
        cls, kind: SlotKind, parent_uuid: str, job_id: int, share: float, restart: int = 0
    ) -> GpuSlot:
        """A job's share of a GPU (gres/shard or gres/mps)."""
        run = f".{restart}" if restart else ""
        return cls(kind, f"{parent_uuid}/{kind.value}/{job_id}{run}", parent_uuid, share)


@dataclass(frozen=True)
class MigDevice:
    """One MIG device of a GPU in MIG mode, as NVML lists it under its parent.

    Attributes:
        uuid: its MIG UUID ("MIG-..."), what CUDA_VISIBLE_DEVICES names.
        parent_uuid: the physical GPU's UUID.
        mig_index: its index under the parent (nvmlDeviceGetMigDeviceHandleByIndex).
        gpu_instance_id, compute_instance_id: NVML's GI and CI ids.
        profile: the profile name ("1g.10gb", "3g.40gb"), from the device name.
        slices: its compute slices (the profile's "Ng"); max_slices: the parent's.
        memory_total_bytes: the instance's own memory.
    """

    uuid: str
    parent_uuid: str
    mig_index: int
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    slices: int
    max_slices: int = 7
    memory_total_bytes: int | None = None

    @property
    def slot(self) -> GpuSlot:
        """This MIG device as a slot."""
        return GpuSlot(
            SlotKind.MIG,
            self.uuid,
            self.parent_uuid,
            self.slices / self.max_slices,
            self.profile,
            self.gpu_instance_id,
            self.compute_instance_id,
        )


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML lists it (`nvidia-smi --query-gpu=index,uuid,name,pci.bus_id`)."""

    uuid: str
    name: str
    minor: int
    nvml_index: int
    pci_bus_id: str
    memory_total_bytes: int | None
    gpm_supported: bool = False  # NVML GPM (Hopper and newer): SM activity and the rest
    # MIG mode on (nvmlDeviceGetMigMode current mode) and its MIG devices in index order;
    # in MIG mode NVML answers NOT_SUPPORTED to utilization, so slices are read by GPM.
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU (`nvidia-smi --query-compute-apps=pid,used_memory`)."""

    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True)
class GpuInterval:
    """One GPU over one shipping period (a minute by default), attributed to a job.

    This is the row the agent ships to the store; (node, slot id, period_start) is its
    idempotency key (`effective_slot_id`: a whole GPU's is its UUID, as before slots), so
    shipping it twice stores it once, and two jobs sharing one GPU in one period (two
    shard slots) are two rows. A MIG or shared slot's row has the physical GPU's power,
    energy, temperature and ECC as None (they are `GpuPhysicalInterval`'s).
    """

    node: str
    gpu_uuid: str
    period_start: float
    period_end: float
    job_id: int | None
    util_mean_percent: float | None
    util_max_percent: float | None
    util_min_percent: float | None
    util_sample_count: int
    active_seconds: float
    covered_seconds: float
    mem_used_max_bytes: int | None
    mem_total_bytes: int | None
    power_mean_watts: float | None
    energy_joules: float | None
    temperature_max_celsius: float | None
    ecc_errors_total: int | None
    unallocated_pids: tuple[int, ...] = ()
    # NVML GPM (Hopper+), time-weighted over `gpm_seconds` of this row; None and 0 where
    # the GPU has no GPM (Ampere and older answer NOT_SUPPORTED): unknown, never 0%.
    gpm_seconds: float = 0.0
    sm_active_mean_percent: float | None = None  # NVML_GPM_METRIC_SM_UTIL
    sm_occupancy_mean_percent: float | None = None  # NVML_GPM_METRIC_SM_OCCUPANCY
    tensor_active_mean_percent: float | None = None  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    dram_bw_mean_percent: float | None = None  # NVML_GPM_METRIC_DRAM_BW_UTIL
    # The GPU slot of this row (docs/design/gpu-slots.md): "" is the whole GPU `gpu_uuid`
    # (rows from before slots read so); a MIG UUID or a share's id otherwise, `gpu_uuid`
    # then being its parent, the physical GPU.
    slot_id: str = ""
    slot_kind: SlotKind = SlotKind.GPU
    share: float = 1.0  # the slot's part of the parent's compute (1: the whole GPU)
    mig_profile: str = ""  # a MIG slice's profile ("1g.10gb"); "" otherwise
    measured_by: Measurement = Measurement.NVML
    # GPU-memory GiB-seconds of this row, summed piece by piece as the job's summary sums
    # its `mem_gib_seconds` (issue 24: a job's memory-hours do not jump when its summary
    # lands). None where the agent did not sum them (an older agent's row, a period open
    # across the agent's upgrade): read as mem_used_max_bytes x covered_seconds.
    mem_gib_seconds: float | None = None

    @property
    def effective_slot_id(self) -> str:
        """The slot's id: `slot_id`, or the GPU's UUID for a whole GPU ("")."""
        return self.slot_id or self.gpu_uuid


@dataclass(frozen=True)
class GpuPhysicalInterval:
    """One physical GPU's own totals over one shipping period, whatever its slots.

    Power, energy, temperature, ECC and memory belong to the GPU, not to a MIG slice or a
    share: the store keeps them per GPU here (`gpu_physical_intervals`), for every GPU,
    whole or partitioned; (node, gpu_uuid, period_start) is the idempotency key. A
    whole-GPU slot's `GpuInterval` keeps the same figures as before slots.
    """

    node: str
    gpu_uuid: str
    period_start: float
    period_end: float
    covered_seconds: float
    power_mean_watts: float | None
    energy_joules: float | None
    temperature_max_celsius: float | None
    ecc_errors_total: int | None
    mem_used_max_bytes: int | None
    mem_total_bytes: int | None


class JobEventKind(StrEnum):
    """What a hook saw happen to a job on a node."""

    STARTED = "started"
    ENDED = "ended"


@dataclass(frozen=True)
class JobEvent:
    """A prolog ("started") or epilog ("ended") event of one job on one node."""

    node: str
    job_id: int
    kind: JobEventKind
    time: float
    user: str = ""
    uid: int | None = None
    account: str = ""
    partition: str = ""
    gpu_indices: tuple[int, ...] = ()
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None
    exit_code: int | None = None
    restart: int = 0
    # Slurm's SLUID of the job (25.11+, SLURM_JOB_SLUID: "s" and 13 base-32 characters);
    # "" where Slurm has none or the hooks are older.
    sluid: str = ""
    # gres/shard (or gres/mps) units the job holds on this node, on the GPUs of
    # `gpu_indices` (issue 14); 0: whole GPUs (or MIG slices) only.
    shards: int = 0
    shard_kind: str = ""  # "shard" or "mps" where shards > 0
    # Slurm's state of the job where an "ended" event comes from Slurm's record, not from
    # an epilog (NODE_FAIL, a node set DOWN: node/job_liveness.py); "" from the hooks.
    state: str = ""

    @property
    def key(self) -> str:
        """Idempotency key: a node sees each run of a job start and end once.

        `restart` is Slurm's SLURM_RESTART_COUNT: a requeued job runs again under its id,
        and each run has its own events. The first run's key carries no count, so keys
        written before runs were told apart stay the same.
        """
        run = f":{self.restart}" if self.restart else ""
        return f"{self.node}:{self.job_id}:{self.kind.value}{run}"


@dataclass(frozen=True)
class JobGpuSummary:
    """A finished job's use of one GPU on one node (the row reports are built on).

    One per run: a requeued job (Slurm's SLURM_RESTART_COUNT, `restart`) has one summary
    per run and GPU, so its totals add up over every run, as Slurm bills them.
    """

    job_id: int
    node: str
    gpu_uuid: str
    gpu_model: str
    start: float
    end: float
    gpu_seconds: float
    util_mean_percent: float | None
    util_max_percent: float | None
    active_seconds: float
    mem_max_bytes: int | None
    mem_gib_seconds: float
    energy_joules: float | None
    reading_count: int
    missing_seconds: float
    user: str = ""
    account: str = ""
    partition: str = ""
    restart: int = 0
    # NVML GPM (Hopper+), time-weighted over `gpm_seconds` of this row; None and 0 where
    # the GPU has no GPM (Ampere and older answer NOT_SUPPORTED): unknown, never 0%.
    gpm_seconds: float = 0.0
    sm_active_mean_percent: float | None = None  # NVML_GPM_METRIC_SM_UTIL
    sm_occupancy_mean_percent: float | None = None  # NVML_GPM_METRIC_SM_OCCUPANCY
    tensor_active_mean_percent: float | None = None  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    dram_bw_mean_percent: float | None = None  # NVML_GPM_METRIC_DRAM_BW_UTIL
    # The GPU slot of this row (docs/design/gpu-slots.md): "" is the whole GPU `gpu_uuid`
    # (rows from before slots read so); a MIG UUID or a share's id otherwise, `gpu_uuid`
    # then being its parent, the physical GPU.
    slot_id: str = ""
    slot_kind: SlotKind = SlotKind.GPU
    share: float = 1.0  # the slot's part of the parent's compute (1: the whole GPU)
    mig_profile: str = ""  # a MIG slice's profile ("1g.10gb"); "" otherwise
    measured_by: Measurement = Measurement.NVML

    @property
    def effective_slot_id(self) -> str:
        """The slot's id: `slot_id`, or the GPU's UUID for a whole GPU ("")."""
        return self.slot_id or self.gpu_uuid

    @property
    def key(self) -> str:
        """Idempotency key: one summary per run of a job (Slurm's restart count) and slot.

        A whole GPU's slot id is its UUID, so its keys are those from before slots.
        """
        run = f":{self.restart}" if self.restart else ""
        return f"{self.job_id}:{self.node}:{self.effective_slot_id}{run}"

    @property
    def missing(self) -> bool:
        """True when part of the job has no readings (agent down, GPU lost)."""
        return self.missing_seconds > 0


@dataclass(frozen=True)
class Binding:
    """One GPU allocated to one job on this node, as the prolog recorded it."""

    job_id: int
    slurm_index: int
    start: float
    user: str = ""
    uid: int | None = None
    account: str = ""
    partition: str = ""
    restart: int = 0
    het_job_id: int | None = None  # a heterogeneous job's leader (SLURM_HET_JOB_ID)
    het_job_offset: int | None = None
    shards: int = 0  # gres/shard or gres/mps units held on this GPU (JobEvent.shards)
    shard_kind: str = ""


@dataclass(frozen=True)
class SlurmJob:
    """A pending or running job as slurmctld reports it (`squeue --json`, `scontrol -d`).

    `gpus` maps each node to the Slurm GPU indices the job holds there (empty while
    pending, or for jobs without GPUs).
    """

    job_id: int
    user: str
    account: str
    partition: str
    state: str
    name: str = ""
    qos: str = ""
    submit_time: float | None = None
    start_time: float | None = None
    time_limit_seconds: float | None = None
    nodes: tuple[str, ...] = ()
    gpus: tuple[tuple[str, tuple[int, ...]], ...] = ()
    gpu_count: int = 0
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None
    admin_comment: str = ""
    comment: str = ""
    suspend_time: float | None = None
    pre_suspend_seconds: float = 0.0

    def suspended_seconds(self, now: float) -> float:
        """Seconds Slurm has had the job suspended by `now` (0: never, or not known).

        From `suspend_time` (Slurm's: when the job was last suspended or resumed) and
        `pre_suspend_seconds` (SecsPreSuspend: its run time before the last suspend),
        which `squeue --json` gives; `squeue -O` does not, and a job's suspensions are
        then known only from sacct's Suspended.
        """
        if self.start_time is None or self.suspend_time is None:
            return 0.0
        until = now if self.state == "SUSPENDED" else self.suspend_time
        return max(until - self.start_time - self.pre_suspend_seconds, 0.0)

    def resumed_at(self) -> float | None:
        """When a running job was last resumed after a suspension; None if never."""
        if self.state != "RUNNING" or self.suspend_time is None:
            return None
        return self.suspend_time


@dataclass(frozen=True)
class NodeHeartbeat:
    """One tick of a node's agent: which slots it read then (issue 16, "ship less").

    A GpuActivity row describes a state that holds until the agent ships the next row for
    that job and slot; the agent ships one only when that state changes (or every
    `[node] activity_refresh`). The newest heartbeat vouches that the agent was alive at
    `tick` and read every slot in `slots`: the store extends those slots' activity rows to
    it (`Store.activity`). A slot not in `slots` (lost, unreadable) is not extended, so its
    reading goes stale as before.

    Attributes:
        node: the node's name.
        tick: end of the agent's newest read (POSIX seconds).
        slots: the slot ids read successfully in that tick.
    """

    node: str
    tick: float
    slots: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuActivity:
    """What the node agent last knew about one GPU of one running job.

    One row per job and slot, replaced. The agent ships a new one only when what it says
    changes (or every `[node] activity_refresh`); in between, the node's NodeHeartbeat
    carries it forward (`Store.activity`), so the controller sees data no older than an
    agent interval plus shipping time.

    Attributes:
        last_reading: end of the newest window read from this GPU for this job.
        last_active: newest NVML sample above the active threshold (None: never).
        util_recent_percent: mean utilization of the newest window.
        mem_used_bytes: memory in use at the newest read.
        process_count: compute processes at the newest read.
        measured_since: where the GPU's current unbroken run of readings began (after
            a gap: the agent down, the GPU lost); idle time is never counted before it.
            None: not known (an older agent).
    """

    job_id: int
    node: str
    gpu_uuid: str
    slurm_index: int
    start: float
    last_reading: float
    last_active: float | None
    util_recent_percent: float | None
    mem_used_bytes: int | None
    process_count: int | None
    measured_since: float | None = None
    # GPM (Hopper+): mean SM activity of the newest GPM window, and the end of the newest
    # window at or above `[node] sm_active_threshold_percent`. None: not measured here.
    sm_active_recent_percent: float | None = None
    last_sm_active: float | None = None
    # The GPU slot of this row (docs/design/gpu-slots.md): "" is the whole GPU `gpu_uuid`
    # (rows from before slots read so); a MIG UUID or a share's id otherwise, `gpu_uuid`
    # then being its parent, the physical GPU.
    slot_id: str = ""
    slot_kind: SlotKind = SlotKind.GPU
    share: float = 1.0  # the slot's part of the parent's compute (1: the whole GPU)
    mig_profile: str = ""  # a MIG slice's profile ("1g.10gb"); "" otherwise
    measured_by: Measurement = Measurement.NVML

    @property
    def effective_slot_id(self) -> str:
        """The slot's id: `slot_id`, or the GPU's UUID for a whole GPU ("")."""
        return self.slot_id or self.gpu_uuid


@dataclass(frozen=True)
class LostGpu:
    """A GPU its node agent cannot read at all (NVML: lost, fallen off the bus).

    Attributes:
        uuid: the GPU's UUID; "" for a GPU gres.conf lists that NVML never showed.
        minor: its device minor (/dev/nvidiaN), which names it when the UUID is unknown.
        since: when the agent first failed to read it.
        reason: NVML's error, or why the agent counts it lost.
    """

    uuid: str
    minor: int | None
    since: float
    reason: str


class Action(StrEnum):
    """What a verdict asks the controller to do through Slurm."""

    NONE = "none"
    NOTICE = "notice"
    WARN = "warn"
    CANCEL = "cancel"
    CAP_TIME = "cap_time"
    HOLD = "hold"
    RELEASE = "release"
    BLOCK = "block"
    UNBLOCK = "unblock"
    SET_QOS = "set_qos"
    SET_FAIRSHARE = "set_fairshare"
    DRAIN = "drain"
    REPORT = "report"
    # Exemptions in the audit log (records; nothing is done through Slurm): granted by
    # `slurm-gpu exempt`, relied on (a policy skipped a job it would have acted on), ended.
    EXEMPT = "exempt"
    SKIP = "skip"
    EXPIRE = "expire"


@dataclass(frozen=True)
class Verdict:
    """One decision of one policy about one job, user, account or node.

    Every verdict is written to the audit log before it is acted on.

    Attributes:
        policy: idle_gpu, max_runtime, gpu_quota, hot_node or unallocated_use.
        target: what it is about: "job:123", "account:physics", "user:alice", "node:gpu1".
        reason: one plain sentence for the user and the audit log.
        deadline: when the next step happens (e.g. the cancel after a warning).
        details: JSON-able figures behind the decision (idle seconds, GPU-hours...).
    """

    policy: str
    action: Action
    target: str
    reason: str
    job_id: int | None = None
    user: str = ""
    account: str = ""
    node: str = ""
    deadline: float | None = None
    details: tuple[tuple[str, object], ...] = ()


# ---------------------------------------------------------------------------- policy inputs


@dataclass(frozen=True)
class Exemption:
    """An admin's exemption from policies (`slurm-gpu exempt`), until it expires.

    Attributes:
        scope: what is exempt: "job:123", "user:alice" or "account:physics".
        policy: the policy it exempts from (idle_gpu, max_runtime, gpu_quota); "" = all.
        expires: POSIX seconds when it stops applying; None = never.
        reason: why, for the audit log.
        created_by: who granted it.

    From the store's ExemptionRecord: scope = f"{kind}:{target}", expires = until.
    """

    scope: str
    policy: str = ""
    expires: float | None = None
    reason: str = ""
    created_by: str = ""


@dataclass(frozen=True)
class QuotaUsage:
    """Measured use of one [[quota]] scope in one period (`sacct`-like sums from the store).

    Attributes:
        scope: "account:physics" or "user:alice".
        unit: gpu_hours, gpu_mem_hours or job_hours.
        period: the rule's period text ("month", "week", "30d"): with scope and unit it
            names the [[quota]] rule this usage was measured for.
        used: usage in `unit` within [period_start, period_end).
    """

    scope: str
    unit: str
    period: str
    used: float
    period_start: float
    period_end: float


@dataclass(frozen=True)
class QuotaApplied:
    """A quota action the controller carried out and has not undone yet.

    Attributes:
        scope, unit, period: the [[quota]] rule that caused it.
        action: HOLD, BLOCK, SET_QOS or SET_FAIRSHARE.
        target: "job:123" (HOLD, SET_QOS) or the scope (BLOCK, SET_FAIRSHARE).
        job_id: the job, for HOLD and SET_QOS.
        previous: what to restore: the job's QOS before SET_QOS, the association's
            fairshare before SET_FAIRSHARE ("" = unknown: Slurm's default 1).
        period_end: end of the calendar period it was applied in (ignored for rolling
            periods, which never end).
        applied_at: when it was carried out.

    The verdict that asked for it carries what to record: scope (user/account), unit,
    period, period_end and, for SET_QOS, previous in its details.
    """

    scope: str
    unit: str
    period: str
    action: Action
    target: str
    job_id: int | None = None
    previous: str = ""
    period_end: float | None = None
    applied_at: float = 0.0


@dataclass(frozen=True)
class NodeHealth:
    """What the node agents last reported about one node's GPUs.

    Attributes:
        max_temperature_celsius: hottest GPU of the node at the newest reading.
        new_ecc_errors: ECC errors counted since the previous controller cycle.
        lost_gpus: UUIDs of GPUs NVML reports lost (fell off the bus).
        drained: the node is already drained or draining in Slurm.
    """

    node: str
    max_temperature_celsius: float | None = None
    new_ecc_errors: int = 0
    lost_gpus: tuple[str, ...] = ()
    drained: bool = False


@dataclass(frozen=True)
class UnallocatedUse:
    """Compute processes on a GPU that no running job's allocation holds.

    Attributes:
        pids: the processes (host PIDs).
        slurm_index: the GPU's Slurm index, when gres.conf maps it.
        users: owners of the processes, when the agent could read them.
    """

    node: str
    gpu_uuid: str
    pids: tuple[int, ...]
    slurm_index: int | None = None
    users: tuple[str, ...] = ()
