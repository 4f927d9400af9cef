"""Pure conversions between the frozen models and table rows, and the jobs-row merge.

No I/O here: everything is a function of its arguments, so it is unit-tested without a
database (tests/unit/test_store_convert.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_gpu.models import (
    GpuActivity,
    GpuDevice,
    GpuInterval,
    GpuPhysicalInterval,
    JobEvent,
    JobEventKind,
    JobGpuSummary,
    Measurement,
    SlotKind,
)

Row = dict[str, Any]

INTERVAL_FIELDS = tuple(f.name for f in dataclasses.fields(GpuInterval))
SUMMARY_FIELDS = tuple(f.name for f in dataclasses.fields(JobGpuSummary))
ACTIVITY_FIELDS = tuple(f.name for f in dataclasses.fields(GpuActivity))
PHYSICAL_FIELDS = tuple(f.name for f in dataclasses.fields(GpuPhysicalInterval))


def _defaults(model: type) -> dict[str, Any]:
    """The fields of `model` that have a default, with it (fields added later have one)."""
    return {
        f.name: f.default for f in dataclasses.fields(model) if f.default is not dataclasses.MISSING
    }


# What a row lacking a later column (a caller's mapping from before it) reads as: the
# model's default, e.g. 0 GPM seconds and None for every GPM mean (revision 0006).
_INTERVAL_DEFAULTS = _defaults(GpuInterval)
_SUMMARY_DEFAULTS = _defaults(JobGpuSummary)
_ACTIVITY_DEFAULTS = _defaults(GpuActivity)


def _values(row: Mapping[Any, Any], fields: tuple[str, ...], defaults: Row) -> Row:
    """The model's fields from `row`; a field the row lacks takes its default.

    The slot columns (revision 0009) read as the models hold them: a whole GPU's
    slot id (its UUID) as "", the kind and measurement as their enums.
    """
    values = {name: row[name] if name in row else defaults[name] for name in fields}
    if "slot_id" in values:
        values["slot_id"] = slot_of_row(values["gpu_uuid"], values["slot_id"])
        values["slot_kind"] = SlotKind(values["slot_kind"])
        values["measured_by"] = Measurement(values["measured_by"])
        values["share"] = float(values["share"])
    return values


def slot_of_row(gpu_uuid: str, slot_id: str | None) -> str:
    """A stored slot id as the models hold it: "" for the whole GPU `gpu_uuid`."""
    return "" if not slot_id or slot_id == gpu_uuid else slot_id


def _slot_row(row: Row, model: GpuInterval | JobGpuSummary | GpuActivity) -> Row:
    """`row` with the stored form of the slot columns: the effective slot id, plain text."""
    row["slot_id"] = model.effective_slot_id
    row["slot_kind"] = SlotKind(model.slot_kind).value
    row["measured_by"] = Measurement(model.measured_by).value
    return row


# Jobs-row columns a hook event can fill; the rest (job_name, submit_time...) come from Slurm.
JOB_COLUMNS = (
    "array_job_id",
    "array_task_id",
    "het_job_id",
    "het_job_offset",
    "user",
    "uid",
    "account",
    "partition",
    "job_name",
    "state",
    "exit_code",
    "submit_time",
    "start_time",
    "end_time",
    "nodes",
    "gpus",
    "restart",
    "sluid",
    "suspended_seconds",
)
# States the hooks derive; a state set from Slurm (CANCELLED, TIMEOUT...) is never replaced.
HOOK_STATES = frozenset({"RUNNING", "COMPLETED", "FAILED"})


def pids_to_text(pids: tuple[int, ...]) -> str:
    """`(12, 34)` -> `"12,34"`; `()` -> `""`."""
    return ",".join(str(p) for p in pids)


def text_to_pids(text: str | None) -> tuple[int, ...]:
    """Inverse of `pids_to_text`."""
    return tuple(int(p) for p in text.split(",")) if text else ()


def interval_to_row(interval: GpuInterval) -> Row:
    """A GpuInterval as a `gpu_intervals` row (same column names as the fields)."""
    row = {name: getattr(interval, name) for name in INTERVAL_FIELDS}
    row["unallocated_pids"] = pids_to_text(interval.unallocated_pids)
    return _slot_row(row, interval)


def row_to_interval(row: Mapping[Any, Any]) -> GpuInterval:
    """Inverse of `interval_to_row`."""
    values = _values(row, INTERVAL_FIELDS, _INTERVAL_DEFAULTS)
    values["unallocated_pids"] = text_to_pids(row["unallocated_pids"])
    return GpuInterval(**values)


def summary_to_row(summary: JobGpuSummary, cluster: str) -> Row:
    """A JobGpuSummary as a `job_gpu_summaries` row of `cluster`."""
    row = {name: getattr(summary, name) for name in SUMMARY_FIELDS}
    row["cluster"] = cluster
    return _slot_row(row, summary)


def row_to_summary(row: Mapping[Any, Any]) -> JobGpuSummary:
    """Inverse of `summary_to_row` (the cluster column is dropped)."""
    return JobGpuSummary(**_values(row, SUMMARY_FIELDS, _SUMMARY_DEFAULTS))


def activity_to_row(activity: GpuActivity, cluster: str) -> Row:
    """A GpuActivity as a `gpu_activity` row of `cluster`."""
    row = {name: getattr(activity, name) for name in ACTIVITY_FIELDS}
    row["cluster"] = cluster
    return _slot_row(row, activity)


def row_to_activity(row: Mapping[Any, Any]) -> GpuActivity:
    """Inverse of `activity_to_row` (the cluster column is dropped)."""
    return GpuActivity(**_values(row, ACTIVITY_FIELDS, _ACTIVITY_DEFAULTS))


def physical_to_row(physical: GpuPhysicalInterval) -> Row:
    """A GpuPhysicalInterval as a `gpu_physical_intervals` row (same names as the fields)."""
    return {name: getattr(physical, name) for name in PHYSICAL_FIELDS}


def row_to_physical(row: Mapping[Any, Any]) -> GpuPhysicalInterval:
    """Inverse of `physical_to_row`."""
    return GpuPhysicalInterval(**{name: row[name] for name in PHYSICAL_FIELDS})


def device_to_row(node: str, device: GpuDevice, seen_at: float) -> Row:
    """A GpuDevice seen on `node` at `seen_at` as a `gpu_inventory` row."""
    return {
        "node": node,
        "uuid": device.uuid,
        "model": device.name,
        "minor": device.minor,
        "nvml_index": device.nvml_index,
        "pci_bus_id": device.pci_bus_id,
        "memory_total_bytes": device.memory_total_bytes,
        "gpm_supported": device.gpm_supported,
        "first_seen": seen_at,
        "last_seen": seen_at,
    }


def row_to_device(row: Mapping[Any, Any]) -> GpuDevice:
    """The GpuDevice of a `gpu_inventory` row."""
    return GpuDevice(
        uuid=row["uuid"],
        name=row["model"],
        minor=row["minor"],
        nvml_index=row["nvml_index"],
        pci_bus_id=row["pci_bus_id"],
        memory_total_bytes=row["memory_total_bytes"],
        gpm_supported=bool(row.get("gpm_supported", False)),
    )


def event_payload(event: JobEvent) -> str:
    """The whole event as compact JSON (the `job_events.payload` column)."""
    data = dataclasses.asdict(event)
    data["kind"] = event.kind.value
    data["gpu_indices"] = list(event.gpu_indices)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def event_to_row(event: JobEvent, cluster: str) -> Row:
    """A JobEvent as a `job_events` row."""
    return {
        "cluster": cluster,
        "event_key": event.key,
        "node": event.node,
        "job_id": event.job_id,
        "kind": event.kind.value,
        "time": event.time,
        "payload": event_payload(event),
        "restart": event.restart,
    }


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def merge_job_event(existing: Mapping[Any, Any] | None, event: JobEvent) -> Row:
    """The jobs row after `event`, merged into `existing` (None: no row yet).

    Order-independent, so events may arrive in any order and more than once: a known
    (non-null, non-empty) value is never replaced by an unknown one; start is the earliest
    start of any node, end the latest end; `nodes` is the sorted union of the nodes seen.
    The state the hooks derive (RUNNING, then COMPLETED or FAILED by exit code) never
    replaces one that came from Slurm.

    A requeued job runs again under its id (`event.restart`, Slurm's restart count): like
    `sacct` without `-D`, the row shows the newest run. An event of a newer run than the
    row's starts that run afresh (start, end, exit code, nodes); an older run's event only fills
    what the row lacks (user, account...). The GPU totals still cover every run: they
    come from the per-run `job_gpus` and summaries.

    Args:
        existing: the stored row's JOB_COLUMNS (other keys are ignored), or None.
        event: a prolog ("started") or epilog ("ended") event.

    Returns:
        Every JOB_COLUMNS key (values may be None); `gpus` is left to the caller, which
        counts `job_gpus` rows.
    """
    row: Row = {name: None for name in JOB_COLUMNS}
    if existing is not None:
        row.update({name: existing.get(name) for name in JOB_COLUMNS})
    current = row["restart"] or 0
    if event.restart > current or row["restart"] is None:
        if event.restart > current:  # a newer run: the older run's times are not its own
            row.update(start_time=None, end_time=None, exit_code=None, nodes=None)
            if row["state"] in HOOK_STATES:
                row["state"] = None
        row["restart"] = event.restart
    elif event.restart < current:
        for name in ("user", "account", "partition", "sluid"):
            if not row[name] and getattr(event, name):
                row[name] = getattr(event, name)
        return row
    if event.sluid and not row["sluid"]:
        row["sluid"] = event.sluid  # a job keeps its SLUID, whichever event names it first
    if event.kind is JobEventKind.STARTED:
        for name in ("user", "account", "partition"):
            if getattr(event, name):
                row[name] = getattr(event, name)
        for name in ("uid", "array_job_id", "array_task_id", "het_job_id", "het_job_offset"):
            if getattr(event, name) is not None:
                row[name] = getattr(event, name)
        row["start_time"] = _min(row["start_time"], event.time)
    else:
        row["end_time"] = _max(row["end_time"], event.time)
        if event.exit_code is not None:
            row["exit_code"] = event.exit_code
    nodes = set(row["nodes"].split(",")) if row["nodes"] else set()
    nodes.add(event.node)
    row["nodes"] = ",".join(sorted(nodes))
    if row["state"] is None or row["state"] in HOOK_STATES:
        if event.kind is JobEventKind.ENDED and event.state:
            row["state"] = event.state  # Slurm's word, where the agent asked it (NODE_FAIL)
        elif row["end_time"] is None:
            row["state"] = "RUNNING"
        else:
            row["state"] = "COMPLETED" if row["exit_code"] in (0, None) else "FAILED"
    return row


def assign_runs(
    stored: Sequence[tuple[int, str, float, int]], events: Sequence[JobEvent]
) -> list[JobEvent]:
    """`events` with the run (`restart`) each belongs to, from what the store holds.

    The hooks give Slurm's restart count where slurmd sets it, and a node's agent counts
    the runs it saw; a requeued job's next run on another node is told apart here: a
    prolog after an epilog of the same job (any node: Slurm starts a requeued job only
    once its epilogs are done) starts the next run, and an epilog belongs to the newest
    run started before it. A count the event already carries is never lowered, and
    re-sent events get the run they got the first time.

    Args:
        stored: the stored events of the same jobs as (job_id, kind, time, restart).
        events: new events, in any order.

    Returns:
        The events in time order, each with its run.
    """
    known: dict[int, list[tuple[str, float, int]]] = {}
    for job_id, kind, time, restart in stored:
        known.setdefault(job_id, []).append((kind, time, restart))
    out = []
    order = {JobEventKind.STARTED: 0, JobEventKind.ENDED: 1}
    for event in sorted(events, key=lambda e: (e.time, order[e.kind])):
        seen = known.setdefault(event.job_id, [])
        if event.kind is JobEventKind.STARTED:
            before = [r for k, t, r in seen if k == JobEventKind.ENDED.value and t <= event.time]
            inferred = max(before) + 1 if before else 0
        else:
            before = [r for k, t, r in seen if k == JobEventKind.STARTED.value and t <= event.time]
            inferred = max(before) if before else 0
        event = dataclasses.replace(event, restart=max(event.restart, inferred))
        seen.append((event.kind.value, event.time, event.restart))
        out.append(event)
    return out


def merge_fields(existing: Mapping[str, Any] | None, update: Mapping[str, Any]) -> Row:
    """`existing` with every non-null, non-empty value of `update` laid over it."""
    row: Row = dict(existing or {})
    for name, value in update.items():
        if value is not None and value != "":
            row[name] = value
        else:
            row.setdefault(name, None)
    return row
