"""Config section of the NATS JetStream transport: [nats] (issue 26).

Agents with `[node] ship_to = "nats"` publish each spool batch to a JetStream stream on
their own node's subject; `slurm-gpu ingest run` workers (any number, on any host) pull
the batches, write them into the store of [store] url, and record per node the last
batch committed, which the agent waits for before it deletes the batch from its spool.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from slurm_gpu.config._loader import doc
from slurm_gpu.durations import Duration

# JetStream names: no spaces, dots, '*', '>' or path separators (nats-server's rule).
_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _check_name(name: str) -> str | None:
    if _NAME.fullmatch(name):
        return None
    return f"expected letters, digits, '_' or '-' only, got {json.dumps(name)}"


def _check_servers(url: str) -> str | None:
    for server in url.split(","):
        if not re.fullmatch(r"(nats|tls)://[^\s/]+(:\d{1,5})?", server.strip()):
            return f'expected "nats://host:port" (several: comma-separated), got {json.dumps(url)}'
    return None


@dataclass(frozen=True)
class NatsSettings:
    """[nats]: where batches travel from the agents to the ingest workers."""

    url: str = field(
        default="nats://127.0.0.1:4222",
        metadata=doc(
            'The NATS servers, "nats://host:4222" (a cluster: several, comma-separated).',
            check=_check_servers,
        ),
    )
    credentials: str = field(
        default="",
        metadata=doc(
            "This process's NATS nkey seed file (`slurm-gpu nats keygen`; root only):"
            ' a node\'s grants publishing on its own subject only. "" connects without'
            " one (a server with no authorization, e.g. a test on loopback)."
        ),
    )
    stream: str = field(
        default="SLURM_GPU_BATCHES",
        metadata=doc("The JetStream stream of the agents' batches.", check=_check_name),
    )
    subject_prefix: str = field(
        default="sgpu.batch",
        metadata=doc(
            "A node's batches go to <subject_prefix>.<cluster>.<node> (the stream takes"
            " <subject_prefix>.>)."
        ),
    )
    flush_prefix: str = field(
        default="sgpu.flush",
        metadata=doc(
            "A node takes the controller's requests to ship now on"
            " <flush_prefix>.<cluster>.<node> ([controller] flush_over_nats)."
        ),
    )
    committed_bucket: str = field(
        default="slurm_gpu_committed",
        metadata=doc(
            "The JetStream key-value bucket where the workers record, per node, the last"
            " batch the store committed (the agents read it before deleting a batch).",
            check=_check_name,
        ),
    )
    commit_wait: Duration = field(
        default=Duration(30.0),
        metadata=doc(
            "Seconds an agent waits for its published batch to be committed; past it, the"
            " batch stays in the spool and is published again later (a duplicate that"
            " JetStream and the store's keys absorb).",
            above=0,
        ),
    )
    duplicate_window: Duration = field(
        default=Duration(600.0),
        metadata=doc(
            "How long the stream remembers a batch id (Nats-Msg-Id) to drop a batch"
            " published again.",
            above=0,
        ),
    )
    max_batch_bytes: int = field(
        default=2**20,
        metadata=doc(
            "Largest batch published (nats-server's max_payload, 1 MiB by default, must"
            " allow it); an agent splits its spool batches to stay under it.",
            above=0,
        ),
    )
    replicas: int = field(
        default=1,
        metadata=doc(
            "Copies JetStream keeps of the stream and the bucket (3 on a 3-server NATS"
            " cluster: a server lost loses no batch). Used when a worker makes them.",
            minimum=1,
            maximum=5,
        ),
    )
    fetch_batches: int = field(
        default=32,
        metadata=doc(
            "Most batches an ingest worker pulls and commits in one store transaction.",
            above=0,
        ),
    )
    ack_wait: Duration = field(
        default=Duration(60.0),
        metadata=doc(
            "Seconds a batch pulled by a worker stays its own before JetStream hands it to"
            " another (a worker killed mid-write): longer than a store transaction takes.",
            above=0,
        ),
    )
