"""Config section of the collector on the head node: [collector] (issue 16).

`slurm-gpu collector run` takes the node agents' spool batches over HTTP (agents with
`[node] ship_to = "collector"`), checks each batch's MUNGE credential and writes it into
the store of [store] url, which only the collector needs to know then.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from slurm_gpu.config._loader import doc
from slurm_gpu.durations import Duration


def check_listen(address: str) -> str | None:
    """None for a "host:port" the collector can listen on, else the problem."""
    match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]*):(\d{1,5})", address)
    if match and 0 < int(match.group(2)) < 65536:
        return None
    return f'expected "host:port" (e.g. "0.0.0.0:6830", "[::]:6830"), got {json.dumps(address)}'


def _check_nodes(nodes: dict[str, list[str]]) -> str | None:
    for node, addresses in nodes.items():
        if not addresses:
            return f"node {json.dumps(node)}: expected at least one address"
    return None


@dataclass(frozen=True)
class CollectorSettings:
    """[collector]: the head node's collector, the one writer of the store."""

    listen: str = field(
        default="0.0.0.0:6830",
        metadata=doc(
            'Address the collector serves POST /v1/batch, /metrics and /healthz on "host:port".',
            check=check_listen,
        ),
    )
    pool_size: int = field(
        default=8,
        metadata=doc(
            "Store connections the collector holds, each writing one group of batches at a"
            " time: the store sees at most this many connections from the collector,"
            " whatever the number of nodes.",
            above=0,
        ),
    )
    processes: int = field(
        default=1,
        metadata=doc(
            "Collector processes serving the one port, each with its own write queue and"
            " a share of pool_size (Python runs one thread at a time per process: one"
            " process uses about one core). At most pool_size (one less with [node]"
            " write_admin_comment, whose writer holds a connection of its own).",
            above=0,
        ),
    )
    group_max_batches: int = field(
        default=32,
        metadata=doc(
            "Most batches a writer takes off the queue and commits in one transaction"
            " (group commit); each agent is answered once its group is committed.",
            above=0,
        ),
    )
    group_wait: Duration = field(
        default=Duration(0.02),
        metadata=doc(
            "Seconds a group of fewer than group_max_batches waits for more batches"
            " before it is committed: a batch written alone costs the collector and the"
            " store several times what it costs in a group. Each agent's answer comes at"
            " most this much later; 0 commits what is queued at once.",
            minimum=0,
        ),
    )
    queue_depth: int = field(
        default=64,
        metadata=doc(
            "Accepted batches waiting for a writer; one more is refused with 503 and"
            " Retry-After, and its agent keeps it and retries.",
            above=0,
        ),
    )
    max_batch_bytes: int = field(
        default=32 * 2**20,
        metadata=doc(
            "Largest request body taken (413 beyond); keep [node] ship_batch_size rows under it.",
            above=0,
        ),
    )
    credential_ttl: Duration = field(
        default=Duration(300.0),
        metadata=doc(
            "A credential encoded longer ago than this is refused as expired, even when"
            " munged's own TTL (munged --ttl, 300 s by default) is longer.",
            above=0,
        ),
    )
    retry_after: Duration = field(
        default=Duration(5.0),
        metadata=doc("Seconds a refused-for-load (503) agent is told to wait.", above=0),
    )
    munge_socket: str = field(
        default="",
        metadata=doc("munged's socket; \"\" is libmunge's default (/run/munge/munge.socket.2)."),
    )
    nodes: dict[str, list[str]] = field(
        default_factory=dict,
        metadata=doc(
            "The addresses each node's credentials may come from, {node = [addresses]};"
            " a node not listed is looked up as Slurm's NodeAddr (scontrol show node).",
            check=_check_nodes,
        ),
    )
