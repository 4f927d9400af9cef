"""What the transport's tests share: a cluster name, spools of intervals, an ingest worker."""

from __future__ import annotations

import threading
from pathlib import Path

import sqlalchemy as sa

from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.jetstream.bus import Bus
from slurm_gpu.jetstream.ingest import IngestWorker
from slurm_gpu.models import GpuInterval
from slurm_gpu.node.outbox import fields_of
from slurm_gpu.node.shipper import StoreSink
from slurm_gpu.node.spool import Spool
from slurm_gpu.store import Store
from slurm_gpu.store.schema import gpu_intervals

CLUSTER = "c1"
T0 = 1_800_000_000.0


def interval(node: str, start: float) -> GpuInterval:
    return GpuInterval(
        node, "GPU-1", start, start + 60, 7, 50.0, 60.0, 40.0, 60, 60.0, 60.0,
        None, None, None, None, None, None,
    )  # fmt: skip


def spool_with(path: Path, node: str, count: int, first: float = T0) -> Spool:
    spool = Spool(path)
    with spool.transaction() as db:
        for i in range(count):
            start = first + 60 * i
            Spool.queue(db, "interval", f"{node}:GPU-1:{start!r}", fields_of(interval(node, start)))
    return spool


def stored_intervals(store: Store) -> list[tuple[str, float]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(gpu_intervals.c.node, gpu_intervals.c.period_start).order_by(
                gpu_intervals.c.node, gpu_intervals.c.period_start
            )
        )
        return [(str(n), float(s)) for n, s in rows]


class Running:
    """An ingest worker pulling in a thread until `stop()`."""

    def __init__(self, settings: NatsSettings, store: StoreSink, name: str = "w") -> None:
        self.bus = Bus(settings, f"test ingest {name}")
        self.worker = IngestWorker(settings, CLUSTER, store, self.bus, retry_delay=0.5)
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.worker.run, args=(self.halt,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(timeout=10)
        self.bus.close()
