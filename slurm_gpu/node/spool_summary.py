"""Summaries at a run's end: its totals per slot turned into `summary` outbox rows.

A run's `job_acc` totals (one per GPU, MIG slice or share it held here) become
JobGpuSummary rows, behind its last periods (sealed first) and beside its spans' held
time; the run's totals and ended spans are then forgotten.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping

from slurm_gpu.models import GpuSlot, JobGpuSummary, Measurement, SlotKind
from slurm_gpu.node.outbox import encode, fields_of
from slurm_gpu.node.spool_rows import (
    SLOT_COLUMNS,
    JobAccRow,
    SlotRow,
    columns,
    gpm_means,
    slot_fields,
)
from slurm_gpu.node.spool_seal import seal_job

__all__ = ["SlotOf", "finish_job"]

SlotOf = Callable[[int, int, str, int, int], tuple[GpuSlot, Measurement] | None]
"""(Slurm index, shards, shard_kind, job, restart) -> the slot held and how it is measured."""

_NO_ACC = JobAccRow("", 0.0, 0.0, 0, None, 0.0, None, 0.0, None, 0)


def finish_job(
    db: sqlite3.Connection,
    node: str,
    job_id: int,
    uuids: Mapping[int, str],
    restart: int = 0,
    slot_of: SlotOf | None = None,
) -> list[JobGpuSummary]:
    """Turns an ended run's totals into summaries in the outbox; forgets the run.

    Args:
        db: the open transaction.
        node: this node's name.
        job_id: the ended job.
        uuids: {Slurm GPU index: slot id (GPU or MIG UUID)} on this node.
        restart: which run of the job ended (0: the first; Slurm's restart count).
        slot_of: the slot a span held and how it is measured, from (Slurm index,
            shards, shard_kind, job, restart); None for the index's whole GPU. A slot's
            totals, where it has any, say its slot themselves.

    Returns:
        One summary per slot (whole GPU, MIG slice, share) the run held here; its
        GPU-seconds are the slot's held time (the share is recorded beside them).
    """
    seal_job(db, node, job_id, restart)
    spans = db.execute(
        "SELECT slurm_index, start, end, user, account, partition, shards, shard_kind"
        " FROM spans WHERE job_id = ? AND restart = ? AND end IS NOT NULL",
        (job_id, restart),
    ).fetchall()
    summaries: list[JobGpuSummary] = []
    for index, start, end, user, account, partition, shards, shard_kind in spans:
        held = slot_of(index, shards, shard_kind, job_id, restart) if slot_of else None
        uuid = held[0].slot_id if held else uuids.get(index, f"unresolved-index-{index}")
        found = db.execute(
            f"SELECT {columns((*JobAccRow._fields, *SLOT_COLUMNS))} FROM job_acc"
            " WHERE job_id = ? AND restart = ? AND uuid = ?",
            (job_id, restart, uuid),
        ).fetchone()
        acc = JobAccRow(*found[: len(JobAccRow._fields)]) if found else _NO_ACC
        if found and found[len(JobAccRow._fields)]:  # a slot's totals (parent set)
            slot = SlotRow._make(found[len(JobAccRow._fields) :])
        elif held and held[0].kind is not SlotKind.GPU:
            kept = held[0]
            slot = SlotRow(
                kept.parent_uuid, kept.kind.value, kept.share, kept.mig_profile, held[1].value
            )
        else:
            slot = SlotRow("", SlotKind.GPU.value, 1.0, "", Measurement.NVML.value)
        gpu_seconds = max(0.0, end - start)
        # Less than a second unaccounted is clock granularity, not missing data.
        missing = gpu_seconds - acc.covered
        summary = JobGpuSummary(
            job_id=job_id,
            node=node,
            gpu_uuid=slot.parent or uuid,
            gpu_model=acc.model,
            start=start,
            end=end,
            gpu_seconds=gpu_seconds,
            util_mean_percent=acc.util_sum / acc.util_count if acc.util_count else None,
            util_max_percent=acc.util_max,
            active_seconds=acc.active_seconds,
            mem_max_bytes=acc.mem_max,
            mem_gib_seconds=acc.mem_gib_seconds,
            energy_joules=acc.energy,
            reading_count=acc.readings,
            missing_seconds=missing if missing >= 1.0 else 0.0,
            user=user or "",
            account=account or "",
            partition=partition or "",
            restart=restart,
            **gpm_means(acc),
            **slot_fields(uuid, slot),
        )
        summaries.append(summary)
        db.execute(
            "INSERT OR IGNORE INTO outbox (kind, key, payload) VALUES ('summary', ?, ?)",
            (summary.key, encode(fields_of(summary))),
        )
    db.execute("DELETE FROM job_acc WHERE job_id = ? AND restart = ?", (job_id, restart))
    db.execute(
        "DELETE FROM spans WHERE job_id = ? AND restart = ? AND end IS NOT NULL",
        (job_id, restart),
    )
    return summaries
