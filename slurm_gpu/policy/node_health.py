"""What hot_node judges a node by, and the drains an admin owns (issue 25 item 4).

A node's health comes from the recent intervals (hottest GPU at the newest reading, ECC
errors counted since the previous cycle) and from its agent's inventory (the GPUs it
cannot read: lost).

An admin who resumes a node that slurm-gpu drained has taken the drain over. The
controller learns of it from Slurm: a node it drained ("drain", "done" in the audit log)
that sinfo lists without DRAIN was resumed by someone else (Slurm keeps no resume time;
the first cycle that sees it is the resume's time R, recorded in the audit log as a
hot_node "none" row with `resumed_at`). From then on the node is judged only by readings
newer than R: intervals that start at or after R, and a lost GPU only when it was lost
after R or the node's agent sent a heartbeat after R (a heartbeat is stored with the
inventory its tick knew: `slurm_gpu.store.heartbeats`). An inventory row not yet
refreshed after the GPU came back therefore never drains the node again; the drain
that older readings alone would have made is audited as a SKIP with its reason. A
node drained again on newer readings says so in its reason, and carries `resumed_at`,
which makes its message a new one (`notify.notification_key`).

R is the controller's clock, a heartbeat's tick the node's: clocks apart by more than a
controller interval can make one cycle's evidence count early or late.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from slurm_gpu.config import Config
from slurm_gpu.models import Action, GpuInterval, NodeHealth, Verdict
from slurm_gpu.policy.quota_periods import cluster_timezone
from slurm_gpu.policy.rules.context import HOT_NODE, Context
from slurm_gpu.policy.rules.nodes import hot_node
from slurm_gpu.slurm.scontrol import NodeInfo
from slurm_gpu.store import InventoryEntry
from slurm_gpu.store.control import ControlStore

__all__ = ["AdminResumes", "NodeReadings", "admin_resumes", "node_health", "owned_drains"]

_DONE_DRAIN = ("drain", "done")
_RESUME = ("none", "recorded")


@dataclass(frozen=True)
class AdminResumes:
    """Nodes an admin resumed after slurm-gpu drained them, and this cycle's new records.

    Attributes:
        since: {node: R}, when the controller first saw the node no longer drained.
        records: audit rows ("none") of the resumes first seen this cycle.
    """

    since: dict[str, float]
    records: list[Verdict]


def admin_resumes(
    control: ControlStore, nodes: Sequence[NodeInfo], now: float, config: Config
) -> AdminResumes:
    """The nodes whose slurm-gpu drain an admin undid, read from Slurm and the audit log.

    A node sinfo lists without DRAIN whose newest hot_node record is a drain that was
    done is newly resumed, at `now`; one whose newest record is a resume keeps its R.
    """
    undrained = [f"node:{n.name}" for n in nodes if "drain" not in n.state]
    if not undrained:
        return AdminResumes({}, [])
    newest = control.newest_entries(
        undrained, HOT_NODE, actions=(_DONE_DRAIN[0], _RESUME[0]), outcomes=("done", "recorded")
    )
    since: dict[str, float] = {}
    records: list[Verdict] = []
    for target, entry in newest.items():
        node = target.split(":", 1)[1]
        if (entry.action, entry.outcome) == _DONE_DRAIN and not entry.dry_run:
            since[node] = now
            drained = _time_text(entry.time, now, config)
            records.append(
                Verdict(
                    HOT_NODE,
                    Action.NONE,
                    target,
                    f"{node} was resumed by an admin (slurm-gpu drained it at {drained}; first "
                    f"seen back in service at {_time_text(now, now, config)}): slurm-gpu "
                    "drains it again only on a reading taken after that.",
                    node=node,
                    details=(
                        ("resumed_at", now),
                        ("drained_at", entry.time),
                        ("drain_reason", entry.reason),
                    ),
                )
            )
        elif (entry.action, entry.outcome) == _RESUME and "resumed_at" in entry.details:
            since[node] = float(entry.details["resumed_at"])
    return AdminResumes(since, records)


@dataclass(frozen=True)
class NodeReadings:
    """Node health twice: from the readings a drain may rest on, and from all of them.

    Attributes:
        evidence: what hot_node judges (for a resumed node, readings newer than R only).
        stale: of each resumed node, its health from every reading, as it would have
            been judged without the resume (for the SKIP rows).
    """

    evidence: list[NodeHealth]
    stale: dict[str, NodeHealth]


def node_health(
    recent: Sequence[GpuInterval],
    inventory: Sequence[InventoryEntry],
    drained: Collection[str],
    resumed: Mapping[str, float],
    ticks: Mapping[str, float],
    ecc_seen: dict[str, int],
) -> NodeReadings:
    """Each node's health from its recent intervals and its agent's lost GPUs.

    Args:
        recent: the intervals of the last few shipping periods.
        inventory: the GPU inventory (lost_since set: the agent cannot read the GPU).
        drained: nodes drained or draining in Slurm.
        resumed: {node: R} of nodes an admin resumed (`admin_resumes`).
        ticks: {node: its agent's newest heartbeat} (needed for resumed nodes only).
        ecc_seen: {GPU: ECC count at the previous cycle}; updated here.
    """
    nodes: dict[str, str] = {}
    newest: dict[str, tuple[float, float | None]] = {}  # readings a drain may rest on
    newest_all: dict[str, tuple[float, float | None]] = {}
    ecc_before: dict[str, int] = {}  # a resumed node's counts read before R
    ecc_after: dict[str, int] = {}
    for row in recent:
        gpu = row.gpu_uuid
        nodes[gpu] = row.node
        after = row.period_start >= resumed.get(row.node, -math.inf)
        _keep_newest(newest_all, row)
        if after:
            _keep_newest(newest, row)
        if row.ecc_errors_total is not None:
            ecc = ecc_after if after else ecc_before
            ecc[gpu] = max(ecc.get(gpu, 0), row.ecc_errors_total)
    evidence: dict[str, NodeHealth] = {}
    stale: dict[str, NodeHealth] = {}
    for gpu, node in nodes.items():
        seen = ecc_seen.get(gpu)
        counts = [c for c in (ecc_before.get(gpu), ecc_after.get(gpu)) if c is not None]
        new_ecc = stale_new_ecc = 0
        if gpu in ecc_after:
            # Errors counted before R are the baseline, not news after the resume.
            base = [c for c in (seen, ecc_before.get(gpu)) if c is not None]
            new_ecc = max(0, ecc_after[gpu] - max(base, default=ecc_after[gpu]))
        if counts:
            stale_new_ecc = max(0, max(counts) - (seen if seen is not None else max(counts)))
            ecc_seen[gpu] = max(counts)
        temp = newest[gpu][1] if gpu in newest else None
        _add(evidence, node, drained, temp, new_ecc)
        if node in resumed:
            _add(stale, node, drained, newest_all[gpu][1], stale_new_ecc)
    for entry in inventory:
        if entry.lost_since is None:
            continue
        if entry.node in resumed:
            _add(stale, entry.node, drained, lost=entry.device.uuid)
        since = resumed.get(entry.node, -math.inf)
        if entry.lost_since > since or ticks.get(entry.node, -math.inf) > since:
            _add(evidence, entry.node, drained, lost=entry.device.uuid)
    return NodeReadings(list(evidence.values()), stale)


def _keep_newest(newest: dict[str, tuple[float, float | None]], row: GpuInterval) -> None:
    """Keeps the GPU's newest interval end and its temperature."""
    last = newest.get(row.gpu_uuid)
    if last is None or row.period_end > last[0]:
        newest[row.gpu_uuid] = (row.period_end, row.temperature_max_celsius)


def _add(
    health: dict[str, NodeHealth],
    node: str,
    drained: Collection[str],
    temperature: float | None = None,
    new_ecc: int = 0,
    lost: str | None = None,
) -> None:
    """Folds one GPU's figures into its node's health."""
    old = health.get(node, NodeHealth(node, drained=node in drained))
    hottest = max(
        (t for t in (old.max_temperature_celsius, temperature) if t is not None), default=None
    )
    lost_gpus = (*old.lost_gpus, lost) if lost is not None else old.lost_gpus
    health[node] = NodeHealth(node, hottest, old.new_ecc_errors + new_ecc, lost_gpus, old.drained)


def owned_drains(
    verdicts: Sequence[Verdict],
    readings: NodeReadings,
    resumed: Mapping[str, float],
    config: Config,
    now: float,
) -> list[Verdict]:
    """The cycle's verdicts with the drains of resumed nodes told as such, and their SKIPs.

    A drain of a resumed node (on readings newer than R) carries `resumed_at` in its
    details; a resumed node that older readings alone would drain gets
    a SKIP verdict saying so.
    """
    out: list[Verdict] = []
    drained_now: set[str] = set()
    for v in verdicts:
        if v.action is Action.DRAIN and v.policy == HOT_NODE and v.node in resumed:
            # Slurm's reason stays the problem alone; the audit and the mail get R.
            drained_now.add(v.node)
            v = replace(v, details=(*v.details, ("resumed_at", resumed[v.node])))
        out.append(v)
    if not config.policy.hot_node.enabled:
        return out
    ctx = Context(config, now, (), {})
    for node, health in sorted(readings.stale.items()):
        if node in drained_now:
            continue
        would = hot_node(ctx, health)
        if would is None:
            continue
        when = _time_text(resumed[node], now, config)
        out.append(
            replace(
                would,
                action=Action.SKIP,
                reason=(
                    f"Drain of {node} skipped: an admin resumed it at {when}, and no reading "
                    f"since then shows {would.reason}."
                ),
                details=(*would.details, ("resumed_at", resumed[node])),
            )
        )
    return out


def _time_text(when: float, now: float, config: Config) -> str:
    """A time in the cluster's zone: "08:01:10" today, "2027-01-14 08:01:10" otherwise."""
    tz = cluster_timezone(config.controller.timezone)
    moment = dt.datetime.fromtimestamp(when, tz)
    today = dt.datetime.fromtimestamp(now, tz).date()
    return moment.strftime("%H:%M:%S" if moment.date() == today else "%Y-%m-%d %H:%M:%S")
