"""The simulated nodes' batches: what one agent ships per tick, built with the product's codec.

Per node (one job on its 8 GPUs, the production defaults: [node] interval 10 s, periods of
60 s, one shipper batch per tick as `Shipper.run` drains the outbox after each tick):

- every tick: one `activity` row per GPU with a running job (Spool.queue, replaced by key),
  as `NodeAgent._queue_activity` does as of this code (or, where the shipper knows the
  `heartbeat` kind, one heartbeat row a tick and each GPU's activity every
  [node] activity_refresh: "ship less", issue 16);
- the first tick after a period ends: one `interval` and one `physical` row per GPU;
- the node's first batch: its job's `started` event and its `inventory`.

Bodies are built from templates made once with the product's codec (`fields_of`, `encode`,
`wire.encode_batch`) with sentinel values, then filled in by `str.format`;
`check_templates` compares them byte for byte with the codec's own output, so the fast
path cannot drift from what an agent ships.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

from slurm_gpu.collector.wire import WireRow, encode_batch
from slurm_gpu.models import (
    GpuActivity,
    GpuDevice,
    GpuInterval,
    GpuPhysicalInterval,
    JobEvent,
    JobEventKind,
    NodeHeartbeat,
)
from slurm_gpu.node import shipper
from slurm_gpu.node.outbox import device_fields, encode, fields_of

GPUS = 8
INTERVAL = 10.0  # [node] interval's default
PERIOD = 60.0  # [store] ship_aggregate's default: one interval row per GPU per period
TICKS_PER_PERIOD = round(PERIOD / INTERVAL)
ACTIVITY_REFRESH = 300.0  # [node] activity_refresh's default (ship-less mode only)
MODEL = "NVIDIA H100 80GB HBM3"
MEM_TOTAL = 80 * 2**30

# Sentinels: values no real row holds, replaced by format fields in the templates.
_NODE = "sentinelnode"
_UUID = "GPU-sentinel-uuid"
_JOB = 987654321
_INDEX = 5550555
_TICK = 1111111111.125
_PSTART = 2222222220.5
_PEND = 2222222280.5
_SINCE = 3333333330.5


def heartbeat_mode() -> bool:
    """Whether this code ships activity on change plus a heartbeat per tick (issue 16)."""
    return "heartbeat" in getattr(shipper, "_ORDER", {})


def node_name(number: int) -> str:
    """The simulated node `number`'s Slurm name."""
    return f"gpu{number:05d}"


def gpu_uuid(number: int, gpu: int) -> str:
    """The UUID of GPU `gpu` of node `number` (unique over the cluster)."""
    return f"GPU-{number:08x}-5ca1-4e00-8000-{gpu:012x}"


def job_of(number: int) -> int:
    """The one job running on node `number`'s 8 GPUs."""
    return 1_000_000 + number


def _activity(node: str, uuid: str, job: int, index: int, tick: float, since: float) -> GpuActivity:
    return GpuActivity(
        job_id=job,
        node=node,
        gpu_uuid=uuid,
        slurm_index=index,
        start=since,
        last_reading=tick,
        last_active=tick,
        util_recent_percent=87.5,
        mem_used_bytes=41 * 2**30,
        process_count=1,
        measured_since=since,
    )


def _interval(node: str, uuid: str, job: int, start: float, end: float) -> GpuInterval:
    return GpuInterval(
        node=node,
        gpu_uuid=uuid,
        period_start=start,
        period_end=end,
        job_id=job,
        util_mean_percent=87.5,
        util_max_percent=100.0,
        util_min_percent=62.0,
        util_sample_count=360,
        active_seconds=60.0,
        covered_seconds=60.0,
        mem_used_max_bytes=41 * 2**30,
        mem_total_bytes=MEM_TOTAL,
        power_mean_watts=512.25,
        energy_joules=30735.0,
        temperature_max_celsius=71.0,
        ecc_errors_total=0,
    )


def _physical(node: str, uuid: str, start: float, end: float) -> GpuPhysicalInterval:
    return GpuPhysicalInterval(
        node=node,
        gpu_uuid=uuid,
        period_start=start,
        period_end=end,
        covered_seconds=60.0,
        power_mean_watts=512.25,
        energy_joules=30735.0,
        temperature_max_celsius=71.0,
        ecc_errors_total=0,
        mem_used_max_bytes=41 * 2**30,
        mem_total_bytes=MEM_TOTAL,
    )


def _row_json(kind: str, key: str, payload: str) -> str:
    """One row as encode_batch writes it inside `rows` (compact JSON)."""
    return json.dumps({"kind": kind, "key": key, "payload": payload}, separators=(",", ":"))


def _template(text: str, sentinels: dict[str, str]) -> str:
    """`text` as a format string: braces escaped, each sentinel a {field}."""
    out = text.replace("{", "{{").replace("}", "}}")
    for sentinel, name in sentinels.items():
        if sentinel not in out:
            raise AssertionError(f"sentinel {sentinel} not in template {text[:80]}")
        out = out.replace(sentinel, "{" + name + "}")
    return out


_SENTINELS = {
    _NODE: "node",
    _UUID: "uuid",
    str(_JOB): "job",
    str(_INDEX): "index",
    repr(_TICK): "tick",
    repr(_PSTART): "pstart",
    repr(_PEND): "pend",
    repr(_SINCE): "since",
}


def _used(text: str) -> dict[str, str]:
    return {s: n for s, n in _SENTINELS.items() if s in text}


def _make_templates() -> dict[str, str]:
    activity = _activity(_NODE, _UUID, _JOB, _INDEX, _TICK, _SINCE)
    interval = _interval(_NODE, _UUID, _JOB, _PSTART, _PEND)
    physical = _physical(_NODE, _UUID, _PSTART, _PEND)
    rows = {
        "activity": _row_json("activity", f"activity:{_JOB}:{_UUID}", encode(fields_of(activity))),
        "interval": _row_json(
            "interval", f"{_NODE}:{_UUID}:{_PSTART!r}", encode(fields_of(interval))
        ),
        "physical": _row_json(
            "physical", f"physical:{_NODE}:{_UUID}:{_PSTART!r}", encode(fields_of(physical))
        ),
    }
    return {kind: _template(text, _used(text)) for kind, text in rows.items()}


TEMPLATES = _make_templates()


@dataclass
class SimNode:
    """One simulated node: its name, GPUs, job and where its clock stands.

    Attributes:
        number: 0..N-1.
        ticks: ticks shipped (its simulated clock is `origin + ticks * INTERVAL`).
        pending: rows of batches not yet accepted (503, an error): shipped again with the
            next tick's rows, as the spool keeps them.
    """

    number: int
    origin: float
    ticks: int = 0
    primed: bool = False
    pending: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """Its Slurm node name."""
        return node_name(self.number)


def first_rows(node: SimNode) -> list[WireRow]:
    """The node's first batch's extra rows: its job's started event and its inventory."""
    name, job = node.name, job_of(node.number)
    event = JobEvent(
        node=name,
        job_id=job,
        kind=JobEventKind.STARTED,
        time=node.origin - 3600.0,
        user=f"user{node.number % 997}",
        uid=10_000 + node.number % 997,
        account=f"acct{node.number % 61}",
        partition="gpu",
        gpu_indices=tuple(range(GPUS)),
    )
    payload = asdict(event)
    del payload["sluid"], payload["shards"], payload["shard_kind"]  # as Spool.apply_event
    devices = [
        GpuDevice(
            uuid=gpu_uuid(node.number, g),
            name=MODEL,
            minor=g,
            nvml_index=g,
            pci_bus_id=f"00000000:{0x18 + g:02X}:00.0",
            memory_total_bytes=MEM_TOTAL,
            gpm_supported=True,
        )
        for g in range(GPUS)
    ]
    inventory = {
        "devices": [device_fields(d) for d in devices],
        "seen_at": node.origin,
        "lost": [],
    }
    return [
        WireRow("event", event.key, encode(payload)),
        WireRow("inventory", f"inventory:{name}", encode(inventory)),
    ]


def tick_rows(node: SimNode, heartbeat: bool, change: float = 0.0) -> list[str]:
    """The rows of the node's next tick (advances its clock).

    `change`: ship-less only, the share of GPU-ticks whose activity changed.
    """
    node.ticks += 1
    name, job = node.name, job_of(node.number)
    tick = node.origin + node.ticks * INTERVAL
    since = node.origin - 3600.0
    rows: list[str] = []
    if not node.primed:
        node.primed = True
        rows.extend(_row_json(r.kind, r.key, r.payload) for r in first_rows(node))
    refresh = round(ACTIVITY_REFRESH / INTERVAL)
    for g in range(GPUS):
        if not heartbeat or node.ticks == 1 or _activity_due(node, g, refresh, change):
            rows.append(
                TEMPLATES["activity"].format(
                    node=name,
                    job=job,
                    uuid=gpu_uuid(node.number, g),
                    index=g,
                    tick=repr(tick),
                    since=repr(since),
                )
            )
    # The tick after a period ended seals it. Real agents' periods are whole minutes, so
    # all nodes seal in the same tick; here the nodes' periods are staggered by a tick, so
    # that every window of whole ticks holds its share of interval rows at any multiple.
    if (node.ticks + node.number) % TICKS_PER_PERIOD == 0:
        pend = node.origin + node.ticks * INTERVAL
        pstart = pend - PERIOD
        for g in range(GPUS):
            uuid = gpu_uuid(node.number, g)
            rows.append(
                TEMPLATES["interval"].format(
                    node=name, uuid=uuid, job=job, pstart=repr(pstart), pend=repr(pend)
                )
            )
            rows.append(
                TEMPLATES["physical"].format(
                    node=name, uuid=uuid, pstart=repr(pstart), pend=repr(pend)
                )
            )
    if heartbeat:  # queued last: it vouches for the rows before it
        rows.append(heartbeat_row(name, tick, [gpu_uuid(node.number, g) for g in range(GPUS)]))
    return rows


def _activity_due(node: SimNode, gpu: int, refresh: int, change: float) -> bool:
    """Ship-less: whether a GPU's activity ships this tick (changed, or refresh is due).

    Its refresh every `refresh` ticks, staggered over nodes and GPUs; a change in a
    `change` share of ticks, spread by a fixed hash (the same in every run).
    """
    if (node.ticks + gpu + node.number) % refresh == 0:
        return True
    spread = (node.number * 7919 + node.ticks * 104_729 + gpu * 15_485_863) % 1000
    return spread < change * 1000


def heartbeat_row(node: str, tick: float, slots: list[str]) -> str:
    """A heartbeat row as this code's agent queues it (NodeHeartbeat's fields)."""
    beat = NodeHeartbeat(node=node, tick=tick, slots=tuple(slots))
    return _row_json("heartbeat", f"heartbeat:{node}", encode(fields_of(beat)))


def body_of(node: str, batch: str, sent: float, rows: list[str]) -> bytes:
    """encode_batch's body, from rows already in its JSON form."""
    head = json.dumps(
        {"version": 1, "node": node, "batch": batch, "sent": sent}, separators=(",", ":")
    )
    return (head[:-1] + ',"rows":[' + ",".join(rows) + "]}").encode()


def rows_per_second(nodes: int, heartbeat: bool, change: float = 0.0) -> tuple[float, float]:
    """(rows/s, batches/s) the production cadence asks of `nodes` nodes (steady state)."""
    if heartbeat:
        refresh = INTERVAL / ACTIVITY_REFRESH
        per_tick = 1 + GPUS * (change + (1 - change) * refresh)
    else:
        per_tick = GPUS
    per_tick += 2 * GPUS / TICKS_PER_PERIOD  # interval + physical per GPU per period
    return nodes * per_tick / INTERVAL, nodes / INTERVAL


def check_templates(decode: Callable[[bytes], object]) -> None:
    """The templated bodies equal the codec's own, byte for byte; `decode` takes them.

    Raises:
        AssertionError: a template drifted from fields_of/encode/encode_batch.
    """
    node = SimNode(number=4242 - 4242 % TICKS_PER_PERIOD, origin=1_733_000_000.0)
    for _ in range(TICKS_PER_PERIOD):
        fast = tick_rows(node, heartbeat=False)
    name, job, tick = node.name, job_of(node.number), node.origin + node.ticks * INTERVAL
    since = node.origin - 3600.0
    want: list[WireRow] = []
    for g in range(GPUS):
        a = _activity(name, gpu_uuid(node.number, g), job, g, tick, since)
        want.append(WireRow("activity", f"activity:{job}:{a.gpu_uuid}", encode(fields_of(a))))
    for g in range(GPUS):
        uuid, end = gpu_uuid(node.number, g), tick
        i = _interval(name, uuid, job, end - PERIOD, end)
        p = _physical(name, uuid, end - PERIOD, end)
        want.append(WireRow("interval", f"{name}:{uuid}:{end - PERIOD!r}", encode(fields_of(i))))
        want.append(
            WireRow("physical", f"physical:{name}:{uuid}:{end - PERIOD!r}", encode(fields_of(p)))
        )
    mine = body_of(name, "b", 1.5, fast)
    theirs = encode_batch(name, "b", 1.5, want)
    if mine != theirs:
        raise AssertionError("templated batch differs from wire.encode_batch's")
    decode(mine)
