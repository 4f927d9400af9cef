"""Node heartbeats (issue 16, "ship less"): the one place activity rows are extended.

A GpuActivity row holds until its agent ships the next one for that job and slot, which
it does only when the state changed (or every `[node] activity_refresh`). Every tick the
agent ships one NodeHeartbeat: alive at `tick`, and these slots read then. The store keeps
each node's newest heartbeat (`node_heartbeats`), and `extended` carries an activity row
forward to it: where the node's heartbeat is newer than the row and vouches for the row's
slot, the row was read, unchanged, up to the heartbeat's tick.

The agent's spool ships a tick's heartbeat behind the activity rows of that tick (its
outbox is in queue order, and a replaced row moves behind the rows queued before it), so
a heartbeat in the store never vouches for a state whose row has not arrived yet.

A slot missing from the newest heartbeat (its GPU lost, unreadable) is not extended, and
neither is a node whose agent stopped: their rows go stale, and stale is unknown, never
idle (DESIGN.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from slurm_gpu.models import GpuActivity, NodeHeartbeat
from slurm_gpu.store.schema import node_heartbeats

__all__ = ["extended", "newest_per_node", "read_heartbeats", "write_heartbeats"]

log = logging.getLogger(__name__)

# Up to this many nodes are selected by an IN list; beyond, every heartbeat of the cluster
# (one row a node) is read and filtered here, which stays cheap at 10^4 nodes.
_IN_LIST_MAX = 500


def newest_per_node(rows: Iterable[NodeHeartbeat]) -> dict[str, NodeHeartbeat]:
    """Each node's newest heartbeat of `rows` (one statement may write a node once)."""
    newest: dict[str, NodeHeartbeat] = {}
    for row in rows:
        kept = newest.get(row.node)
        if kept is None or row.tick > kept.tick:
            newest[row.node] = row
    return newest


def write_heartbeats(conn: sa.Connection, cluster: str, rows: Sequence[NodeHeartbeat]) -> int:
    """Stores each node's newest heartbeat, in the caller's transaction.

    A heartbeat older than (or as old as) the stored one changes nothing: a batch
    shipped twice, or late, never moves a node's heartbeat back.

    Returns:
        The number of nodes whose heartbeat was offered (after keeping the newest each).
    """
    newest = newest_per_node(rows)
    if not newest:
        return 0
    params = [
        {"cluster": cluster, "node": h.node, "tick": h.tick, "slots": _slots_text(h.slots)}
        for _, h in sorted(newest.items())
    ]
    conn.execute(_newer_wins(conn.dialect.name), params)
    return len(params)


def read_heartbeats(
    conn: sa.Connection, cluster: str, nodes: Iterable[str] | None = None
) -> dict[str, NodeHeartbeat]:
    """The stored heartbeats of `cluster` (of `nodes`, or of every node), by node.

    A heartbeat whose slots do not decode (a damaged row) vouches for nothing, and is
    logged: its node's activity rows then go stale, never idle.
    """
    h = node_heartbeats.c
    query = sa.select(h.node, h.tick, h.slots).where(h.cluster == cluster)
    wanted = None if nodes is None else set(nodes)
    if wanted is not None and not wanted:
        return {}
    if wanted is not None and len(wanted) <= _IN_LIST_MAX:
        query = query.where(h.node.in_(sorted(wanted)))
    found: dict[str, NodeHeartbeat] = {}
    for node, tick, slots in conn.execute(query):
        if wanted is not None and node not in wanted:
            continue  # many nodes: the cluster's rows were read (one a node), not an IN list
        decoded = _decode_slots(slots)
        if decoded is None:
            log.error(
                "node_heartbeats row of node %s (cluster %r): slots are not a JSON list of"
                " strings (%.60r): the heartbeat vouches for none of its slots",
                node,
                cluster,
                slots,
            )
            decoded = ()
        found[node] = NodeHeartbeat(node=node, tick=float(tick), slots=decoded)
    return found


def extended(
    rows: Sequence[GpuActivity], heartbeats: Mapping[str, NodeHeartbeat]
) -> list[GpuActivity]:
    """The activity rows carried forward to their nodes' heartbeats.

    A row whose node's heartbeat is newer than its `last_reading` and lists its slot
    (`effective_slot_id`: a whole GPU's slot is its UUID) gets `last_reading` = the
    heartbeat's tick; `last_active` too where the row was active at its own reading
    (`last_active == last_reading`), and the same for `last_sm_active`. Everything else
    (utilization, memory, processes, `measured_since`) is the row's: the agent ships a
    new row when any of it changes.
    """
    if not heartbeats:
        return list(rows)
    slot_sets = {node: frozenset(h.slots) for node, h in heartbeats.items()}
    out = []
    for row in rows:
        beat = heartbeats.get(row.node)
        if (
            beat is None
            or beat.tick <= row.last_reading
            or row.effective_slot_id not in slot_sets[row.node]
        ):
            out.append(row)
            continue
        out.append(
            replace(
                row,
                last_reading=beat.tick,
                last_active=beat.tick if row.last_active == row.last_reading else row.last_active,
                last_sm_active=(
                    beat.tick if row.last_sm_active == row.last_reading else row.last_sm_active
                ),
            )
        )
    return out


def _slots_text(slots: Sequence[str]) -> str:
    return json.dumps(sorted(set(slots)), separators=(",", ":"))


def _decode_slots(text: Any) -> tuple[str, ...] | None:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return tuple(value)


def _newer_wins(dialect: str) -> Any:
    """INSERT, or UPDATE tick and slots only where the new tick is newer than the stored."""
    table = node_heartbeats
    old = table.c
    if dialect in ("mysql", "mariadb"):
        stmt: Any = mysql.insert(table)
        new = stmt.inserted
        newer = new.tick > old.tick
        # MySQL assigns left to right, each later term seeing the earlier ones' new values:
        # slots is set while `tick` is still the stored one.
        return stmt.on_duplicate_key_update(
            [
                ("slots", sa.case((newer, new.slots), else_=old.slots)),
                ("tick", sa.case((newer, new.tick), else_=old.tick)),
            ]
        )
    if dialect in ("postgresql", "sqlite"):
        stmt = (postgresql if dialect == "postgresql" else sqlite).insert(table)
        new = stmt.excluded
        return stmt.on_conflict_do_update(
            index_elements=["cluster", "node"],
            set_={"tick": new.tick, "slots": new.slots},
            where=new.tick > old.tick,
        )
    raise ValueError(f"unsupported database dialect {dialect!r}")
