"""Test doubles for slurm-gpu's injectable interfaces, public API as structlog's `testing`.

One complete fake per protocol, so tests (ours and those of code built on slurm-gpu)
stop writing "just enough" fakes again and again:

- `FakeRunner`: a Slurm `CommandRunner` that answers argv from canned responses.
- `FakeSlurmClient`: a `SlurmClient` over in-memory jobs, nodes and associations.
- `FakeGpuSource`: a `GpuSource` whose GPUs' utilization (and GPM metrics, MIG devices
  and per-process utilization) are functions of time.
- `FixedClock`: the `Callable[[], float]` clock every component takes, moved by hand.

Every fake records what it was asked. Nothing here runs a command, touches NVML or opens
a database: none of subprocess, pynvml or sqlalchemy is imported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeVar, cast

from slurm_gpu.errors import SlurmError
from slurm_gpu.gpu import (
    GpmMetrics,
    GpuSnapshot,
    MigSnapshot,
    ProcessUtil,
    ProcessUtilization,
    UtilSample,
)
from slurm_gpu.models import GpuDevice, GpuProcess, MigDevice, SlurmJob
from slurm_gpu.slurm.client import DEFAULT_STATES
from slurm_gpu.slurm.sacctmgr import Association
from slurm_gpu.slurm.scontrol import GpuNode, NodeInfo
from slurm_gpu.slurm.squeue import JobOwner

if TYPE_CHECKING:
    from slurm_gpu.gpu import GpuSource
    from slurm_gpu.slurm.client import SlurmClient
    from slurm_gpu.slurm.runner import CommandRunner

_T = TypeVar("_T")

__all__ = [
    "CommandFailure",
    "FakeGpuSource",
    "FakeRunner",
    "FakeSlurmClient",
    "FixedClock",
    "Response",
    "SlurmCall",
    "UnexpectedCommand",
]


# --- clock ------------------------------------------------------------------------------


class FixedClock:
    """A clock that stands still until the test moves it: `clock()` returns `now`.

    Args:
        now: POSIX seconds the clock reads.
    """

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        """The current (fixed) time in POSIX seconds."""
        return self.now

    def advance(self, seconds: float) -> float:
        """Moves the clock forward by `seconds`; returns the new time."""
        self.now += seconds
        return self.now


# --- command runner ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CommandFailure:
    """A command that exits non-zero, answered with the error `SlurmCommands` raises.

    That is `<argv[0] argv[1]> failed (exit N): <last line of stderr, else stdout>`.

    Attributes:
        returncode: the exit status.
        stderr: what the command printed on stderr (its last line is the message).
        stdout: what it printed on stdout (used when stderr is empty).
    """

    returncode: int = 1
    stderr: str = ""
    stdout: str = ""

    def error(self, argv: Sequence[str]) -> SlurmError:
        """The SlurmError `SlurmCommands` would raise for this exit of `argv`."""
        detail = (self.stderr or self.stdout).strip().splitlines()
        return SlurmError(
            f"{' '.join(argv[:2])} failed (exit {self.returncode}): "
            + (detail[-1] if detail else "no output")
        )


Response = str | CommandFailure | SlurmError | Callable[[Sequence[str]], str]
"""What a command answers: its stdout, an exit status, an error to raise, or a function
of the whole argv returning stdout."""


class UnexpectedCommand(AssertionError):
    """`FakeRunner` was asked to run a command no response matches.

    An AssertionError, not a SlurmError: code that survives Slurm failures must not
    swallow a test's mistake.
    """


class FakeRunner:
    """A `CommandRunner` answering argv from canned responses; every call is recorded.

    A response's key is an argv prefix: `("squeue",)` answers every squeue,
    `("scontrol", "-d", "show", "job")` only that command, `()` every command. The first
    matching key in the mapping's order answers, so `{**overrides, **defaults}` lets an
    override win (`("squeue",)` failing beats a default for `("squeue", "--json")`), and
    a `()` last answers whatever nothing before it did.

    Args:
        responses: argv prefix -> `Response`.

    Attributes:
        responses: the table, which tests may change between calls.
        calls: every argv asked for, unexpected ones included, in order.
        outage: while set, every command raises it (slurmctld or slurmdbd down).

    Raises:
        UnexpectedCommand: (on a call) no prefix matches the argv.
    """

    def __init__(self, responses: Mapping[tuple[str, ...], Response]) -> None:
        self.responses: dict[tuple[str, ...], Response] = dict(responses)
        self.calls: list[list[str]] = []
        self.outage: SlurmError | None = None

    def __call__(self, argv: Sequence[str]) -> str:
        """Runs argv: the matching response's stdout, or its error raised."""
        self.calls.append(list(argv))
        if self.outage is not None:
            raise self.outage
        prefix = next((p for p in self.responses if tuple(argv[: len(p)]) == p), None)
        if prefix is None:
            known = ", ".join(" ".join(p) for p in self.responses) or "none"
            raise UnexpectedCommand(
                f"FakeRunner has no response for {list(argv)!r} (responses for: {known})"
            )
        response = self.responses[prefix]
        if isinstance(response, str):
            return response
        if isinstance(response, CommandFailure):
            raise response.error(argv)
        if isinstance(response, SlurmError):
            raise response
        return response(argv)

    def commands(self) -> list[str]:
        """Each call as "program first-argument" (`squeue --json`, `scontrol -d`)."""
        return [" ".join(call[:2]) for call in self.calls]


# --- Slurm client -----------------------------------------------------------------------


class SlurmCall(NamedTuple):
    """One call to `FakeSlurmClient`: the method's name and its arguments."""

    method: str
    args: tuple[object, ...]


class FakeSlurmClient:
    """A `SlurmClient` over in-memory Slurm state; every call is recorded in `calls`.

    The state changes only when the test changes it: a cancel is recorded, the job stays
    in `queue`. Per-job actions answer as the CLI client does: a job missing from
    `queue` is "not found", one in `refusals` fails with that text, the others succeed.

    Args:
        jobs: what squeue lists (`queue`).
        nodes: what sinfo lists (`node_rows`).
        gpu_nodes: what `scontrol show node` counts (`gpu_node_rows`).
        associations: what `sacctmgr show assoc` lists (`association_rows`).
        admin_levels: {user: AdminLevel} (`admin_levels_by_user`).
        coordinators: {account: coordinator users} (`coordinators_by_account`).
        slurm_user: the SlurmUser of slurm.conf (`slurm_user_name`).

    Attributes:
        calls: every call, in order.
        refusals: {job_id: error text} for cancel, hold and release of that job.
        outage: while set, every method raises it (slurmctld down).
    """

    def __init__(
        self,
        jobs: Iterable[SlurmJob] = (),
        *,
        nodes: Iterable[NodeInfo] = (),
        gpu_nodes: Iterable[GpuNode] = (),
        associations: Iterable[Association] = (),
        admin_levels: Mapping[str, str] | None = None,
        coordinators: Mapping[str, Iterable[str]] | None = None,
        slurm_user: str = "slurm",
    ) -> None:
        self.queue: list[SlurmJob] = list(jobs)
        self.node_rows: list[NodeInfo] = list(nodes)
        self.gpu_node_rows: list[GpuNode] = list(gpu_nodes)
        self.association_rows: list[Association] = list(associations)
        self.admin_levels_by_user: dict[str, str] = dict(admin_levels or {})
        self.coordinators_by_account: dict[str, set[str]] = {
            account: set(users) for account, users in (coordinators or {}).items()
        }
        self.slurm_user_name = slurm_user
        self.refusals: dict[int, str] = {}
        self.outage: SlurmError | None = None
        self.calls: list[SlurmCall] = []

    def _record(self, method: str, *args: object) -> None:
        self.calls.append(SlurmCall(method, args))
        if self.outage is not None:
            raise self.outage

    def calls_to(self, method: str) -> list[tuple[object, ...]]:
        """The arguments of every call to `method`, in order."""
        return [call.args for call in self.calls if call.method == method]

    @property
    def cancelled(self) -> list[tuple[int, str]]:
        """(job_id, reason) of every job asked to be cancelled, in order."""
        return [
            (job_id, str(reason))
            for ids, reason in self.calls_to("cancel")
            for job_id in cast("tuple[int, ...]", ids)
        ]

    # --- jobs

    def jobs(self, states: Sequence[str] = DEFAULT_STATES) -> list[SlurmJob]:
        """The jobs of `queue` in `states` (all when empty)."""
        self._record("jobs", tuple(states))
        wanted = {state.upper() for state in states}
        return [job for job in self.queue if not wanted or job.state in wanted]

    def _per_job(self, method: str, job_ids: Iterable[int], *rest: object) -> dict[int, str | None]:
        ids = list(dict.fromkeys(job_ids))
        self._record(method, tuple(ids), *rest)
        queued = {job.job_id for job in self.queue}
        return {
            job_id: (
                self.refusals.get(job_id)
                if job_id in queued
                else f"job {job_id} not found by squeue (finished or unknown)"
            )
            for job_id in ids
        }

    def cancel(self, job_ids: Iterable[int], reason: str) -> dict[int, str | None]:
        """Records the cancel; {job_id: None, or why it failed}."""
        return self._per_job("cancel", job_ids, reason)

    def hold(self, job_ids: Iterable[int], reason: str) -> dict[int, str | None]:
        """Records the hold; {job_id: None, or why it failed}."""
        return self._per_job("hold", job_ids, reason)

    def release(self, job_ids: Iterable[int]) -> dict[int, str | None]:
        """Records the release; {job_id: None, or why it failed}."""
        return self._per_job("release", job_ids)

    def _update(self, method: str, job_id: int, value: object) -> None:
        self._record(method, job_id, value)
        if job_id not in {job.job_id for job in self.queue}:
            raise SlurmError(f"scontrol update: job {job_id} not found by squeue")

    def set_time_limit(self, job_id: int, seconds: float) -> None:
        """Records the new time limit; SlurmError for a job not in `queue`."""
        self._update("set_time_limit", job_id, seconds)

    def set_comment(self, job_id: int, text: str) -> None:
        """Records the new Comment; SlurmError for a job not in `queue`."""
        self._update("set_comment", job_id, text)

    def set_qos(self, job_id: int, qos: str) -> None:
        """Records the new QOS; SlurmError for a job not in `queue`."""
        self._update("set_qos", job_id, qos)

    # --- associations

    def associations(
        self, user: str | None = None, account: str | None = None
    ) -> list[Association]:
        """The rows of `association_rows` of this user and/or account (all when None)."""
        self._record("associations", user, account)
        return [
            row
            for row in self.association_rows
            if (user is None or row.user == user) and (account is None or row.account == account)
        ]

    def set_association(self, account: str, user: str | None = None, **fields: object) -> None:
        """Records the change, its fields as one dict argument."""
        self._record("set_association", account, user, dict(fields))

    def admin_levels(self) -> dict[str, str]:
        """A copy of `admin_levels_by_user`."""
        self._record("admin_levels")
        return dict(self.admin_levels_by_user)

    def coordinators(self) -> dict[str, set[str]]:
        """A copy of `coordinators_by_account`."""
        self._record("coordinators")
        return {account: set(users) for account, users in self.coordinators_by_account.items()}

    # --- nodes and the controller

    def drain(self, node: str, reason: str) -> None:
        """Records the drain."""
        self._record("drain", node, reason)

    def resume(self, node: str) -> None:
        """Records the resume."""
        self._record("resume", node)

    def nodes(self) -> list[NodeInfo]:
        """A copy of `node_rows`."""
        self._record("nodes")
        return list(self.node_rows)

    def gpu_nodes(self) -> list[GpuNode]:
        """A copy of `gpu_node_rows`."""
        self._record("gpu_nodes")
        return list(self.gpu_node_rows)

    def running_owners(self) -> dict[int, JobOwner]:
        """{job_id: owner} of the RUNNING and COMPLETING jobs of `queue`."""
        self._record("running_owners")
        return {
            job.job_id: JobOwner(job.user, job.account)
            for job in self.queue
            if job.state in ("RUNNING", "COMPLETING")
        }

    def slurm_user(self) -> str:
        """`slurm_user_name`."""
        self._record("slurm_user")
        return self.slurm_user_name

    def ping(self) -> None:
        """Returns, unless `outage` is set."""
        self._record("ping")


# --- GPUs -------------------------------------------------------------------------------


class FakeGpuSource:
    """A `GpuSource` of the given GPUs, read at the time of `clock`.

    Each GPU's utilization is a function of time, sampled once a second as NVML does:
    a snapshot holds one sample per whole second after `samples_since` up to now. Power
    is constant, and the energy counter grows at that power since the epoch.

    A GPU named in `gpm` has GPM (Hopper and newer; `devices()` says `gpm_supported`): each
    snapshot takes one GPM sample and, from the second snapshot on, carries the metrics
    since the previous one, as NvmlSource does. Each metric is the mean of its function
    over the whole seconds of (previous snapshot, this one], the time-weighted truth at
    NVML's one-second resolution. A GPU not named has no GPM: `gpm` is None.

    A GPU named in `mig` is in MIG mode (`devices()` says `mig_enabled` and lists its MIG
    devices), and answers as NVML does then: its snapshots have no utilization samples
    (unknown, never 0%), its processes are its own and every MIG device's, and
    `process_utilization` fails with "Not Supported". `mig_snapshot` reads one MIG device:
    its processes (`processes` by MIG UUID), memory used (their memory) and total (the
    MigDevice's), and, for a MIG UUID named in `gpm`, the GPM of its GPU instance from its
    second read on, as for a GPU (an Ampere slice: not named, memory only).

    `process_util` gives per-process utilization (shards, MPS): each process is sampled
    once a second, as NVML does, and a read averages each process's samples after
    `since`, answering as `nvmlDeviceGetProcessesUtilizationInfo` (`process_util_call`).

    Args:
        devices: the GPUs, in NVML's order.
        clock: POSIX seconds now (a `FixedClock` the test moves).
        util: {uuid: percent as a function of POSIX time}; 0 for a GPU not named.
        gpm: {uuid: POSIX time -> {GpmMetrics field: value}}, e.g.
            `{"A": lambda t: {"sm_active_percent": 30.0}}`; a field not in the mapping
            reads None ("not supported" for that metric). MIG UUIDs may be named too.
        mig: {GPU uuid: its MIG devices, in index order}: the GPUs in MIG mode.
        process_util: {uuid: {pid: POSIX time -> smUtil percent, or None while that
            process is not running}}; a GPU not named has no process sampled.

    Attributes:
        util: the utilization functions, which tests may replace at any time.
        gpm: the GPM functions, likewise.
        mig: the MIG layouts, likewise.
        process_util: the per-process functions, likewise.
        process_util_call: the call `process_utilization` says answered (set it to
            "nvmlDeviceGetProcessUtilization" to play a driver before R550).
        lost: uuids (GPU or MIG) that answer "GPU is lost" (no readings at all); a lost
            GPU's MIG devices are lost too.
        unsupported: GpuSnapshot, MigSnapshot and GpmMetrics fields every GPU leaves None
            ("not supported"); "process_utilization" makes that read fail "Not Supported".
        processes: {uuid: the compute processes on it}; MIG UUIDs for a MIG device's.
        reads: (uuid, samples_since) of every snapshot asked for.
        mig_reads: the MIG UUID of every mig_snapshot asked for.
        process_reads: (uuid, since) of every process_utilization asked for.
        gpm_samples: uuid -> how many GPM samples were taken of it.
        closed: whether `close()` was called.
    """

    def __init__(
        self,
        devices: Sequence[GpuDevice],
        clock: Callable[[], float],
        *,
        util: Mapping[str, Callable[[float], float]] | None = None,
        gpm: Mapping[str, Callable[[float], Mapping[str, float]]] | None = None,
        mig: Mapping[str, Sequence[MigDevice]] | None = None,
        process_util: Mapping[str, Mapping[int, Callable[[float], float | None]]] | None = None,
        mem_used_bytes: int = 2**30,
        power_watts: float = 100.0,
        temperature_celsius: float = 40.0,
    ) -> None:
        self.device_list = list(devices)
        self.clock = clock
        self.util: dict[str, Callable[[float], float]] = dict(util or {})
        self.gpm: dict[str, Callable[[float], Mapping[str, float]]] = dict(gpm or {})
        self.mig: dict[str, tuple[MigDevice, ...]] = {
            uuid: tuple(migs) for uuid, migs in (mig or {}).items()
        }
        self.process_util: dict[str, dict[int, Callable[[float], float | None]]] = {
            uuid: dict(pids) for uuid, pids in (process_util or {}).items()
        }
        self.process_util_call = "nvmlDeviceGetProcessesUtilizationInfo"
        self.gpm_samples: dict[str, int] = {}
        self._gpm_last: dict[str, float] = {}  # uuid -> time of its newest GPM sample
        self.lost: set[str] = set()
        self.unsupported: set[str] = set()
        self.processes: dict[str, tuple[GpuProcess, ...]] = {}
        self.mem_used_bytes = mem_used_bytes
        self.power_watts = power_watts
        self.temperature_celsius = temperature_celsius
        self.reads: list[tuple[str, float]] = []
        self.mig_reads: list[str] = []
        self.process_reads: list[tuple[str, float]] = []
        self.closed = False

    def devices(self) -> list[GpuDevice]:
        """The GPUs given, in that order, as NVML would describe them.

        Those named in `gpm` with `gpm_supported`, those in `mig` in MIG mode with their
        MIG devices.
        """
        found = []
        for d in self.device_list:
            if d.uuid in self.gpm:
                d = dataclasses.replace(d, gpm_supported=True)
            if d.uuid in self.mig:
                d = dataclasses.replace(d, mig_enabled=True, mig_devices=self.mig[d.uuid])
            found.append(d)
        return found

    def snapshot(self, device: GpuDevice, samples_since: float) -> GpuSnapshot:
        """The GPU at `clock()`: samples after `samples_since`, or its error when lost."""
        self.reads.append((device.uuid, samples_since))
        now = self.clock()
        if device.uuid in self.lost:
            self._gpm_last.pop(device.uuid, None)  # its counters start again when it returns
            for mig in self.mig.get(device.uuid, ()):
                self._gpm_last.pop(mig.uuid, None)
            return GpuSnapshot(device.uuid, now, error="GPU is lost")
        util = self.util.get(device.uuid, _idle)
        # in MIG mode NVML has no utilization samples of the GPU (NOT_SUPPORTED)
        seconds = range(int(samples_since) + 1, int(now) + 1) if device.uuid not in self.mig else ()
        processes = self.processes.get(device.uuid, ()) + tuple(
            p for mig in self.mig.get(device.uuid, ()) for p in self.processes.get(mig.uuid, ())
        )
        return GpuSnapshot(
            device.uuid,
            now,
            samples=tuple(UtilSample(float(t), util(float(t))) for t in seconds),
            mem_used_bytes=self._supported("mem_used_bytes", self.mem_used_bytes),
            mem_total_bytes=self._supported("mem_total_bytes", device.memory_total_bytes),
            power_watts=self._supported("power_watts", self.power_watts),
            energy_joules=self._supported("energy_joules", self.power_watts * now),
            temperature_celsius=self._supported("temperature_celsius", self.temperature_celsius),
            ecc_errors_total=self._supported("ecc_errors_total", 0),
            processes=self._supported("processes", processes),
            gpm=self._gpm_read(device.uuid, now),
        )

    def mig_snapshot(self, device: GpuDevice, mig: MigDevice) -> MigSnapshot:
        """The MIG device at `clock()`: its memory, processes and GPM, or its error."""
        self.mig_reads.append(mig.uuid)
        now = self.clock()
        if device.uuid in self.lost or mig.uuid in self.lost:
            self._gpm_last.pop(mig.uuid, None)
            return MigSnapshot(mig.uuid, now, error="GPU is lost")
        if mig.uuid not in {m.uuid for m in self.mig.get(device.uuid, ())}:
            return MigSnapshot(mig.uuid, now, error="Not Found")
        processes = self.processes.get(mig.uuid, ())
        return MigSnapshot(
            mig.uuid,
            now,
            mem_used_bytes=self._supported(
                "mem_used_bytes", sum(p.used_memory_bytes or 0 for p in processes)
            ),
            mem_total_bytes=self._supported("mem_total_bytes", mig.memory_total_bytes),
            processes=self._supported("processes", processes),
            gpm=self._gpm_read(mig.uuid, now),
        )

    def process_utilization(self, device: GpuDevice, since: float) -> ProcessUtilization:
        """Each process's mean smUtil over its once-a-second samples in (since, now]."""
        self.process_reads.append((device.uuid, since))
        now = self.clock()
        call = self.process_util_call
        if device.uuid in self.lost:
            return ProcessUtilization(
                device.uuid, now, last_seen=since, call=call, error="GPU is lost"
            )
        if device.uuid in self.mig or "process_utilization" in self.unsupported:
            return ProcessUtilization(
                device.uuid, now, last_seen=since, call=call, error="Not Supported"
            )
        seconds = [float(t) for t in range(int(since) + 1, int(now) + 1) if t > since]
        processes = []
        newest = since
        for pid, level in sorted(self.process_util.get(device.uuid, {}).items()):
            sampled = [(t, v) for t in seconds if (v := level(t)) is not None]
            if sampled:
                values = [v for _, v in sampled]
                processes.append(ProcessUtil(pid, sum(values) / len(values), None, len(values)))
                newest = max(newest, sampled[-1][0])
        return ProcessUtilization(
            device.uuid, now, processes=tuple(processes), last_seen=newest, call=call
        )

    def _gpm_read(self, uuid: str, now: float) -> GpmMetrics | None:
        """One GPM sample at `now`; the metrics since the previous one (None: first, or none)."""
        levels = self.gpm.get(uuid)
        if levels is None:
            return None
        self.gpm_samples[uuid] = self.gpm_samples.get(uuid, 0) + 1
        previous = self._gpm_last.get(uuid)
        self._gpm_last[uuid] = now
        if previous is None or now <= previous:
            return None
        seconds = [float(t) for t in range(int(previous) + 1, int(now) + 1)] or [now]
        readings = [levels(t) for t in seconds]
        names = {name for reading in readings for name in reading}
        unknown = names - _GPM_FIELDS
        if unknown:
            raise ValueError(f"FakeGpuSource gpm: unknown GpmMetrics field {sorted(unknown)[0]}")
        means: dict[str, float | None] = {}
        for name in names:
            values = [reading[name] for reading in readings if name in reading]
            known = name not in self.unsupported and len(values) == len(readings)
            means[name] = sum(values) / len(values) if known else None
        return GpmMetrics(start=previous, end=now, **means)

    def _supported(self, field: str, value: _T) -> _T | None:
        return None if field in self.unsupported else value

    def close(self) -> None:
        """Marks the source closed."""
        self.closed = True


def _idle(_time: float) -> float:
    return 0.0


_GPM_FIELDS = frozenset(GpmMetrics._fields) - {"start", "end"}


if TYPE_CHECKING:
    # mypy fails here when a protocol grows a method its fake lacks.
    def _fakes_are_complete(
        slurm: FakeSlurmClient, runner: FakeRunner, gpus: FakeGpuSource
    ) -> tuple[SlurmClient, CommandRunner, GpuSource]:
        return slurm, runner, gpus
