"""What the collector counts, for its own /metrics (Prometheus text format).

- `slurm_gpu_collector_batches_total`, `slurm_gpu_collector_rows_total`: accepted and
  committed batches, and the outbox rows in them.
- `slurm_gpu_collector_refused_total{reason=...}`: refused batches by reason (malformed,
  bad_credential, replayed, expired, non_root, digest_mismatch, wrong_node, foreign_rows,
  oversized, queue_full, store_down, munge_unavailable).
- `slurm_gpu_collector_queue_depth`: accepted batches waiting for a writer.
- `slurm_gpu_collector_write_seconds`: time to write one group of batches into the
  store (one transaction).
- `slurm_gpu_collector_group_batches`: batches per committed group (group commit).
- `slurm_gpu_collector_rows_written_total`: store rows the committed groups wrote (new
  events, intervals and physical intervals; activity rows and summaries upserted): a
  batch shipped again counts its activity and summaries only.
- `slurm_gpu_collector_connections_total`: connections accepted (agents keep theirs open
  between batches, so this grows with reconnects, not batches);
  `slurm_gpu_collector_open_connections`: connections open now.
- `slurm_gpu_collector_processes`: collector processes serving ([collector] processes).

With [collector] processes > 1 (collector/processes.py) every process counts into files of
$PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess mode, set before it is first
imported) and /metrics, from whichever process answers, sums them all: the counters and
histograms of every process, the gauges of the live ones (refreshed each second).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

# prometheus_client's own variable: set, its values live in files there, one per process.
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"

REASONS = (
    "malformed",
    "bad_credential",
    "replayed",
    "expired",
    "non_root",
    "digest_mismatch",
    "wrong_node",
    "foreign_rows",
    "oversized",
    "queue_full",
    "store_down",
    "munge_unavailable",
)


class CollectorMetrics:
    """The collector's counters, in a registry of their own (one per collector)."""

    def __init__(self) -> None:
        self.shared = bool(os.environ.get(MULTIPROC_DIR))
        self._tracked: list[tuple[Gauge, Callable[[], int]]] = []
        self.registry = CollectorRegistry()
        self.batches = Counter(
            "slurm_gpu_collector_batches",
            "Batches accepted and committed to the store",
            registry=self.registry,
        )
        self.rows = Counter(
            "slurm_gpu_collector_rows",
            "Outbox rows in the batches accepted",
            registry=self.registry,
        )
        self.refused = Counter(
            "slurm_gpu_collector_refused",
            "Batches refused, by reason",
            ["reason"],
            registry=self.registry,
        )
        for reason in REASONS:  # every reason has a series from the start, at 0
            self.refused.labels(reason=reason)
        self.queue_depth = Gauge(
            "slurm_gpu_collector_queue_depth",
            "Accepted batches waiting for a writer",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.write_seconds = Histogram(
            "slurm_gpu_collector_write_seconds",
            "Seconds to write one group of batches into the store (one transaction)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=self.registry,
        )
        self.group_batches = Histogram(
            "slurm_gpu_collector_group_batches",
            "Batches committed together in one transaction (group commit)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self.rows_written = Counter(
            "slurm_gpu_collector_rows_written",
            "Store rows written by the committed groups",
            registry=self.registry,
        )

        self.connections = Counter(
            "slurm_gpu_collector_connections",
            "Client connections accepted",
            registry=self.registry,
        )
        self.open_connections = Gauge(
            "slurm_gpu_collector_open_connections",
            "Client connections open now (idle or being served)",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.processes = Gauge(
            "slurm_gpu_collector_processes",
            "Collector processes serving",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.processes.set(1)

    def track_connections(self, count: Callable[[], int]) -> None:
        """Reads the open connections from `count` at each scrape."""
        self._track(self.open_connections, count)

    def track_queue(self, depth: Callable[[], int]) -> None:
        """Reads the queue depth from `depth` at each scrape."""
        self._track(self.queue_depth, depth)

    def _track(self, gauge: Gauge, value: Callable[[], int]) -> None:
        if self.shared:  # another process may answer the scrape: `refresh` writes it
            self._tracked.append((gauge, value))
            gauge.set(float(value()))
        else:
            gauge.set_function(lambda: float(value()))

    def refresh(self, stop: threading.Event, every: float = 1.0) -> None:
        """Writes the tracked gauges every `every` seconds until `stop` (shared only)."""
        while not stop.wait(every):
            for gauge, value in self._tracked:
                gauge.set(float(value()))

    def refused_count(self, reason: str) -> float:
        """How many batches were refused for `reason` so far."""
        value = self.registry.get_sample_value(
            "slurm_gpu_collector_refused_total", {"reason": reason}
        )
        return value or 0.0

    def text(self) -> bytes:
        """Every metric in the Prometheus text format (of every process, when shared)."""
        if not self.shared:
            return generate_latest(self.registry)
        everyone = CollectorRegistry()
        MultiProcessCollector(everyone)  # type: ignore[no-untyped-call]
        return generate_latest(everyone)
