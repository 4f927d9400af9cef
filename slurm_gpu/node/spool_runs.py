"""The spool's job spans and the hooks' events that open and close them.

A span is one run of a job holding one GPU (Slurm index) on this node, from its prolog's
event to its epilog's; each run (`restart`, Slurm's SLURM_RESTART_COUNT) has its own. An
event is queued for the store as it is recorded (`event` outbox rows).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, replace

from slurm_gpu.models import JobEvent, JobEventKind
from slurm_gpu.node.attribution import JobSpan
from slurm_gpu.node.outbox import encode
from slurm_gpu.node.spool_rows import columns, placeholders

__all__ = ["add_span", "apply_event", "spans"]

_SPAN_COLUMNS = (
    "job_id",
    "slurm_index",
    "start",
    "end",
    "user",
    "account",
    "partition",
    "restart",
    "shards",
    "shard_kind",
)

_SPAN_INSERT = (
    f"INSERT OR IGNORE INTO spans ({columns(_SPAN_COLUMNS)}) VALUES ({placeholders(_SPAN_COLUMNS)})"
)


def spans(db: sqlite3.Connection) -> list[JobSpan]:
    """Every job span the agent knows (running, or ended but not yet summarized)."""
    rows = db.execute(f"SELECT {columns(_SPAN_COLUMNS)} FROM spans")
    return [
        JobSpan(job, index, start, end, user or "", account or "", partition or "", *rest)
        for job, index, start, end, user, account, partition, *rest in rows
    ]


def apply_event(db: sqlite3.Connection, event: JobEvent) -> None:
    """Records an event: queues it for the store and opens or closes its spans.

    The run (`restart`) is the hooks' SLURM_RESTART_COUNT where slurmd gives it. Where
    it does not (Slurm's prolog environment lacks it on some releases), a prolog after
    an epilog of the same job on this node starts the next run; an epilog ends the
    job's open run. So a requeued job's second run never merges into its first.
    """
    event = replace(event, restart=_run_of(db, event))
    payload = asdict(event)
    if not event.sluid:
        # The payload of a job without a SLUID (Slurm before 25.11) stays the one an
        # agent before SLUIDs wrote, which that agent can still read back.
        del payload["sluid"]
    if not event.shards and not event.shard_kind:
        del payload["shards"], payload["shard_kind"]  # likewise, without shares
    if not event.state:
        del payload["state"]  # likewise, for an epilog's event
    db.execute(
        "INSERT OR IGNORE INTO outbox (kind, key, payload) VALUES ('event', ?, ?)",
        (event.key, encode(payload)),
    )
    if event.kind is JobEventKind.STARTED:
        for index in event.gpu_indices:
            add_span(
                db,
                JobSpan(
                    event.job_id,
                    index,
                    event.time,
                    None,
                    event.user,
                    event.account,
                    event.partition,
                    event.restart,
                    event.shards,
                    event.shard_kind,
                ),
            )
    else:
        db.execute(
            "UPDATE spans SET end = ? WHERE job_id = ? AND restart = ? AND end IS NULL",
            (event.time, event.job_id, event.restart),
        )


def _run_of(db: sqlite3.Connection, event: JobEvent) -> int:
    """The run an event belongs to: the hooks' count, or what this node saw of the job."""
    if event.kind is JobEventKind.ENDED:
        # An epilog ends the run open on this node, whatever count it carries: Slurm
        # counts a requeue before the requeued run's epilog runs (22.05: that epilog
        # has SLURM_JOB_RESTART_COUNT=1 for run 0), so its count names the next run.
        open_run = db.execute(
            "SELECT max(restart) FROM spans WHERE job_id = ? AND end IS NULL", (event.job_id,)
        ).fetchone()[0]
        return int(open_run) if open_run is not None else event.restart
    ended = db.execute(
        "SELECT max(restart) FROM spans WHERE job_id = ? AND end IS NOT NULL AND end <= ?",
        (event.job_id, event.time),
    ).fetchone()[0]
    restart = max(event.restart, ended + 1) if ended is not None else event.restart
    # A started event of an earlier run still waiting in the outbox (the store was
    # down while that run was summarized): this prolog is a later run's.
    while True:
        key = replace(event, restart=restart).key
        found = db.execute("SELECT payload FROM outbox WHERE key = ?", (key,)).fetchone()
        if found is None or json.loads(found[0]).get("time") == event.time:
            return restart
        restart += 1


def add_span(db: sqlite3.Connection, span: JobSpan) -> None:
    """Adds a span (kept as it is when that run of the job already holds the index)."""
    db.execute(_SPAN_INSERT, tuple(getattr(span, name) for name in _SPAN_COLUMNS))
