"""`slurm-gpu status`: the cluster's GPUs now.

Slurm's view (`SlurmClient.gpu_nodes()`: configured and allocated GPUs per node, node
state; `running_owners()`: whose the running jobs are) beside the agents' (the newest
stored interval of every GPU within the window: utilization, memory, which job, processes
outside any allocation). Pure functions of those inputs; the CLI gathers them.

Stale readings are not shown as current (README: missing data is never idle): a GPU whose
newest reading is older than two agent intervals (`Freshness`) counts as stale, not as
reporting, and its last utilization and memory are left out of the figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_gpu.access import Scope
from slurm_gpu.config import Config
from slurm_gpu.models import GpuActivity
from slurm_gpu.slurm.scontrol import GpuNode
from slurm_gpu.slurm.squeue import JobOwner
from slurm_gpu.slurm.timespec import format_sacct_time
from slurm_gpu.units import GIB


@dataclass
class NodeStatus:
    """One node's GPUs now."""

    node: str
    state: str = ""
    gpus: int = 0
    alloc: int = 0
    idle_alloc: int = 0
    free: int = 0
    util_mean_percent: float | None = None
    mem_used_gib: float | None = None
    unallocated_gpus: int = 0
    reporting: int = 0
    stale: int = 0
    newest_reading: float | None = None


@dataclass
class ClusterStatus:
    """The cluster now; `visible_*` figures cover the jobs the caller may see."""

    nodes: list[NodeStatus]
    gpus: int
    alloc: int
    idle_alloc: int
    free: int
    util_mean_percent: float | None
    unallocated: list[dict[str, Any]] = field(default_factory=list)
    scope_all: bool = True
    latest: float | None = None
    now: float | None = None


@dataclass(frozen=True)
class Freshness:
    """When a GPU's newest reading is stale.

    Attributes:
        now: the current time (POSIX seconds).
        stale_after: a running job's GPU activity (sent every agent tick) older than this
            is stale: two [node].interval, and [node] ship_interval (rows wait that long
            in the spool).
        interval_lag: a GPU's newest stored interval (shipped once per [store]
            ship_aggregate) older than this is stale: ship_aggregate + stale_after.
    """

    now: float
    stale_after: float
    interval_lag: float

    @classmethod
    def of(cls, config: Config, now: float) -> Freshness:
        """The rule for `config`: two intervals and ship_interval; intervals ship_aggregate more."""
        stale_after = 2.0 * float(config.node.interval) + float(config.node.ship_interval)
        return cls(now, stale_after, float(config.store.ship_aggregate) + stale_after)

    def is_fresh(self, interval_end: float | None, activity: float | None) -> bool:
        """Whether a GPU still reports: by its running job's activity, else its intervals."""
        if activity is not None:
            return self.now - activity <= self.stale_after
        return interval_end is not None and self.now - interval_end <= self.interval_lag


def latest_per_gpu(
    intervals: Sequence[Mapping[str, Any]],
) -> dict[tuple[str, str], Mapping[str, Any]]:
    """The newest interval of each (node, GPU); within one period, the attributed piece."""
    newest: dict[tuple[str, str], Mapping[str, Any]] = {}
    for row in sorted(
        intervals,
        key=lambda r: (float(r["period_end"]), r.get("job_id") is not None),
    ):
        newest[(str(row["node"]), str(row["gpu_uuid"]))] = row
    return newest


def build_status(
    slurm_nodes: Sequence[GpuNode],
    intervals: Sequence[Mapping[str, Any]],
    inventory: Mapping[str, Sequence[str]],
    job_owners: Mapping[int, JobOwner],
    scope: Scope,
    *,
    idle_percent: float,
    freshness: Freshness | None = None,
    activity: Sequence[GpuActivity] = (),
) -> ClusterStatus:
    """Combine Slurm's node view with the newest interval per GPU.

    Args:
        slurm_nodes: from `SlurmClient.gpu_nodes()` (empty: Slurm unreachable).
        intervals: recent `gpu_intervals` rows (the status window).
        inventory: {node: GPU UUIDs} the store knows.
        job_owners: the running jobs' owners (`SlurmClient.running_owners()`).
        scope: what the caller may see: others' jobs count in Slurm's totals only.
        idle_percent: a held GPU below this utilization is idle.
        freshness: when a reading is stale (None: every reading in the window counts).
        activity: the running jobs' GPU activity (`Store.activity()`): a held GPU's
            freshness, newer than its intervals.
    """
    latest = latest_per_gpu(intervals)
    # A running job's GPU: its activity says when the agent last read it.
    newest_activity: dict[tuple[str, str], float] = {}
    for a in activity:
        if a.job_id in job_owners:
            key = (a.node, a.gpu_uuid)
            newest_activity[key] = max(newest_activity.get(key, a.last_reading), a.last_reading)

    def fresh(key: tuple[str, str], row: Mapping[str, Any]) -> bool:
        if freshness is None:
            return True
        return freshness.is_fresh(float(row["period_end"]), newest_activity.get(key))

    names = sorted({n.name for n in slurm_nodes} | set(inventory) | {k[0] for k in latest})
    by_name = {n.name: n for n in slurm_nodes}
    nodes: list[NodeStatus] = []
    unallocated: list[dict[str, Any]] = []
    weighted = 0.0
    counted = 0
    for name in names:
        slurm = by_name.get(name)
        mine = [(k, r) for k, r in latest.items() if k[0] == name]
        rows = [r for k, r in mine if fresh(k, r)]
        status = NodeStatus(node=name)
        status.stale = len(mine) - len(rows)
        times = [float(r["period_end"]) for _, r in mine]
        times += [t for k, t in newest_activity.items() if k[0] == name]
        status.newest_reading = max(times, default=None)
        status.gpus = slurm.gpus if slurm else len(inventory.get(name, ()))
        status.state = slurm.state if slurm else "?"
        # A GPU counts as held by a job only while Slurm says the job runs (its newest
        # interval may predate the job's end by up to a shipping period).
        held = [r for r in rows if r.get("job_id") is not None and int(r["job_id"]) in job_owners]
        status.alloc = slurm.alloc_gpus if slurm else len(held)
        status.free = max(status.gpus - status.alloc, 0)
        status.reporting = len(rows)
        visible = [r for r in held if _sees(scope, job_owners.get(int(r["job_id"])))]
        utils = [
            float(r["util_mean_percent"]) for r in visible if r.get("util_mean_percent") is not None
        ]
        status.idle_alloc = sum(1 for u in utils if u < idle_percent)
        status.util_mean_percent = sum(utils) / len(utils) if utils else None
        mems = [
            int(r["mem_used_max_bytes"]) for r in visible if r.get("mem_used_max_bytes") is not None
        ]
        status.mem_used_gib = sum(mems) / GIB if mems else None
        weighted += sum(utils)
        counted += len(utils)
        for r in rows:
            pids = str(r.get("unallocated_pids") or "")
            if pids:
                status.unallocated_gpus += 1
                if scope.all:
                    unallocated.append(
                        {
                            "node": name,
                            "gpu_uuid": r["gpu_uuid"],
                            "pids": pids,
                            "job_id": r.get("job_id"),
                            "util_mean_percent": r.get("util_mean_percent"),
                            "period_end": r["period_end"],
                        }
                    )
        if not scope.all:
            status.unallocated_gpus = 0
        nodes.append(status)
    return ClusterStatus(
        nodes=nodes,
        gpus=sum(n.gpus for n in nodes),
        alloc=sum(n.alloc for n in nodes),
        idle_alloc=sum(n.idle_alloc for n in nodes),
        free=sum(n.free for n in nodes),
        util_mean_percent=weighted / counted if counted else None,
        unallocated=unallocated,
        scope_all=scope.all,
        latest=max((float(r["period_end"]) for r in latest.values()), default=None),
        now=freshness.now if freshness else None,
    )


def _sees(scope: Scope, owner: JobOwner | None) -> bool:
    return scope.sees(owner.user, owner.account) if owner else scope.sees("", "")


def render_status(status: ClusterStatus, scope_text: str, window_text: str) -> str:
    """The text of `slurm-gpu status`."""
    util = f"{status.util_mean_percent:.1f}%" if status.util_mean_percent is not None else "-"
    whose = "" if status.scope_all else " (your jobs only)"
    lines = [
        f"GPUs: {status.gpus} total, {status.alloc} allocated, {status.free} free; "
        f"{status.idle_alloc} idle while allocated{whose}",
        f"Mean utilization of allocated GPUs{whose}: {util}   "
        f"(newest readings within {window_text}; {scope_text})",
        "",
        f"{'Node':<10} {'State':<12} {'GPUs':>4} {'Alloc':>5} {'IdleAlloc':>9} {'Free':>4} "
        f"{'UtilAvg':>7} {'MemUsedGiB':>10} {'Unalloc':>7} {'Reporting':>9} {'Stale':>5}",
    ]
    for n in status.nodes:
        lines.append(
            f"{n.node:<10} {n.state:<12.12} {n.gpus:>4} {n.alloc:>5} {n.idle_alloc:>9} {n.free:>4} "
            f"{(f'{n.util_mean_percent:.1f}' if n.util_mean_percent is not None else '-'):>7} "
            f"{(f'{n.mem_used_gib:.1f}' if n.mem_used_gib is not None else '-'):>10} "
            f"{n.unallocated_gpus:>7} {n.reporting:>9} {n.stale:>5}"
        )
    stale = [n for n in status.nodes if n.stale]
    if stale:
        lines += ["", "Stale readings (older than two agent intervals; not shown as current):"]
        for n in stale:
            age = (
                f", newest {format_sacct_time(n.newest_reading)}"
                f" ({status.now - n.newest_reading:.0f} s ago)"
                if n.newest_reading is not None and status.now is not None
                else ""
            )
            lines.append(
                f"  {n.node}: {n.stale} GPU(s) stopped reporting{age}: its agent is down or "
                "cannot reach the store"
            )
    if status.unallocated:
        lines += ["", "GPU use outside any allocation (processes no Slurm job owns):"]
        for u in status.unallocated:
            lines.append(f"  {u['node']} {u['gpu_uuid']} pids {u['pids']}")
    return "\n".join(lines) + "\n"
