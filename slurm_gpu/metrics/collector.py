"""`slurm-gpu exporter`'s metrics: a prometheus_client Collector reading Slurm and the store.

Each scrape is answered from one snapshot, re-read when older than `max_age` seconds, so
many Prometheus servers (or a fast scrape interval) cost one read per `max_age`.

Exported (counters end in `_total`; units in names, as in DESIGN.md):

- slurm_gpu_gpus{node, state}: state allocated (Slurm's gres/gpu per node,
  `SlurmClient.gpu_nodes()`: `scontrol -o show node`), idle_allocated (the part of
  allocated whose newest stored interval is below [node] active_threshold_percent:
  `slurm-gpu status`'s figure), free.
- slurm_gpu_node_info{node, state}: 1 per node, with its Slurm state.
- slurm_gpu_running_jobs{user, account}: `SlurmClient.running_owners()` (`squeue -t R,CG`).
- slurm_gpu_user_gpu_hours_total{user, account}: GPU-hours from job summaries (finished
  jobs) and stored intervals (running jobs), counted as the reports count them (on a
  store with the usage rollups, revision 0010, the jobs that ended before the settling
  horizon at the first read are summed from `job_usage`);
  slurm_gpu_user_gpu_active_hours_total: the part above the active threshold;
  slurm_gpu_account_gpu_hours_total{account}: the users' sum.
- slurm_gpu_user_cost_total{user, account, currency}, slurm_gpu_account_cost_total
  {account, currency}: by [cost] prices (the reports' `add_cost`); only when [cost] sets
  a price.
- slurm_gpu_controller_actions_total{policy, action, outcome}: audit log entries; outcome
  is the first word (done, failed, dry-run, recorded, planned).
- slurm_gpu_store_up, slurm_gpu_slurm_up: 1 when this refresh could read the store / run
  Slurm's commands; slurm_gpu_exporter_refresh_duration_seconds: how long it took.

A series is left out rather than guessed: no `slurm_gpu_gpus` while Slurm does not
answer (Slurm is the truth for allocations), no usage counters while the store does not.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config import Config
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.errors import SlurmError, StoreError
from slurm_gpu.metrics.totals import Monotonic, SettledSums
from slurm_gpu.models import GpuActivity
from slurm_gpu.reports import rollups
from slurm_gpu.reports.status import Freshness, NodeStatus, build_status
from slurm_gpu.reports.sums import job_sums
from slurm_gpu.reports.usage import Usage, load_usage
from slurm_gpu.slurm.client import SlurmClient
from slurm_gpu.store import Store, queries
from slurm_gpu.units import is_known

log = logging.getLogger(__name__)

EVERYONE = Scope(Caller(0, "slurm-gpu-exporter"), all=True, reason="exporter")
SETTLE_SECONDS = 3600.0
"""Rows older than this are final: summaries and outcomes have arrived by then."""

UserKey = tuple[str, str]
"""(user, account)"""
ActionKey = tuple[str, str, str]
"""(policy, action, outcome)"""


@dataclass(frozen=True)
class Snapshot:
    """What one refresh read; every metric of a scrape comes from one snapshot.

    Attributes:
        nodes: per-node GPU figures (None: Slurm did not answer).
        idle_known: the store answered, so idle_allocated means something.
        usage: (GPU-hours, active GPU-hours, cost) per (user, account), never decreasing.
        actions: audit entries per (policy, action, outcome), never decreasing.
        currency: [cost] currency, "" when no price is configured (no cost series).
    """

    time: float
    duration_seconds: float
    store_up: bool
    slurm_up: bool
    nodes: tuple[NodeStatus, ...] | None
    idle_known: bool
    running_jobs: dict[UserKey, int] = field(default_factory=dict)
    usage: dict[UserKey, tuple[float, float, float]] = field(default_factory=dict)
    actions: dict[ActionKey, float] = field(default_factory=dict)
    currency: str = ""


def priced(cost: CostSettings) -> bool:
    """True when [cost] sets any price (else cost series would all be zero: left out)."""
    return bool(cost.prices) or cost.default_price > 0


def outcome_label(outcome: str) -> str:
    """The audit outcome's first word: "failed: scancel said..." -> "failed"."""
    word = outcome.split(":", 1)[0].strip().lower()
    return word or "unknown"


def _text(value: Any) -> str:
    return str(value) if is_known(value) else ""


def _time(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return None if math.isnan(number) else number


def _number(value: Any) -> float:
    number = _time(value)
    return 0.0 if number is None else number


class ClusterCollector:
    """The exporter's prometheus_client collector.

    Args:
        config: the configuration ([cluster], [node] active_threshold_percent, [cost],
            [reports] status_window).
        store: the accounting store (read only).
        slurm: asks Slurm (production: `App.slurm`, the CLI client over [slurm]'s commands).
        clock: POSIX seconds now.
        max_age: seconds one snapshot answers scrapes for.
        settle_seconds: see `SettledSums`.
    """

    def __init__(
        self,
        config: Config,
        store: Store,
        slurm: SlurmClient,
        *,
        clock: Callable[[], float] = time.time,
        max_age: float = 15.0,
        settle_seconds: float = SETTLE_SECONDS,
    ) -> None:
        self.config = config
        self.store = store
        self.control = store.control
        self.slurm = slurm
        self.clock = clock
        self.max_age = max_age
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._usage: SettledSums[UserKey] = SettledSums(3, settle_seconds)
        self._actions: SettledSums[ActionKey] = SettledSums(1, settle_seconds)
        self._usage_max: Monotonic[tuple[str, str, str]] = Monotonic()
        self._actions_max: Monotonic[ActionKey] = Monotonic()
        self._settle = settle_seconds

    # ---- reading ----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The current snapshot, refreshed when older than `max_age` (or the clock went back)."""
        with self._lock:
            now = self.clock()
            old = self._snapshot
            if old is None or not 0 <= now - old.time < self.max_age:
                self._snapshot = self.refresh(now)
            assert self._snapshot is not None
            return self._snapshot

    def refresh(self, now: float) -> Snapshot:
        """Reads Slurm and the store once (no caching); see the module's table."""
        started = time.perf_counter()
        slurm_up = True
        try:
            slurm_nodes = self.slurm.gpu_nodes()
            owners = self.slurm.running_owners()
        except SlurmError as exc:
            log.warning("Slurm did not answer: %s", exc)
            slurm_up, slurm_nodes, owners = False, [], {}
        store_up = True
        intervals: list[dict[str, Any]] = []
        inventory: dict[str, list[str]] = {}
        activity: list[GpuActivity] = []
        try:
            window = float(self.config.reports.status_window)
            intervals = queries.recent_intervals(self.store, now - window)
            activity = self.store.activity()
            for entry in self.store.inventory():
                inventory.setdefault(entry.node, []).append(entry.device.uuid)
            self._read_usage(now)
            self._read_actions(now)
        except StoreError as exc:
            log.warning("the store did not answer: %s", exc)
            store_up = False
        nodes: tuple[NodeStatus, ...] | None = None
        if slurm_up:
            status = build_status(
                slurm_nodes,
                intervals,
                inventory,
                owners,
                EVERYONE,
                idle_percent=self.config.node.active_threshold_percent,
                freshness=Freshness.of(self.config, now),  # stale readings are not current
                activity=activity,
            )
            nodes = tuple(status.nodes)
        running: dict[UserKey, int] = {}
        for owner in owners.values():
            key = (owner.user, owner.account)
            running[key] = running.get(key, 0) + 1
        usage: dict[UserKey, tuple[float, float, float]] = {}
        actions: dict[ActionKey, float] = {}
        if store_up:
            flat = {
                (kind, user, account): values[i]
                for (user, account), values in self._usage.totals().items()
                for i, kind in enumerate(("gpu", "active", "cost"))
            }
            guarded = self._usage_max.apply(flat)
            for (kind, user, account), value in guarded.items():
                figures = list(usage.get((user, account), (0.0, 0.0, 0.0)))
                figures[("gpu", "active", "cost").index(kind)] = value
                usage[(user, account)] = (figures[0], figures[1], figures[2])
            actions = self._actions_max.apply({k: v[0] for k, v in self._actions.totals().items()})
        return Snapshot(
            time=now,
            duration_seconds=time.perf_counter() - started,
            store_up=store_up,
            slurm_up=slurm_up,
            nodes=nodes,
            idle_known=store_up,
            running_jobs=running,
            usage=usage,
            actions=actions,
            currency=self.config.cost.currency if priced(self.config.cost) else "",
        )

    def _read_usage(self, now: float) -> None:
        """Jobs since the settled horizon, summed per job like `slurm-gpu report`.

        On the first read, the jobs folded in the usage rollups that ended before the
        settling horizon come from them, summed by the database; the rest (and jobs not
        folded) from raw rows.
        """
        cost = self.config.cost if priced(self.config.cost) else None
        since = self._usage.horizon
        rows: list[tuple[UserKey, float | None, list[float]]] = []
        if since is None:
            since = now - self._settle
            rows += self._settled_from_rollups(since, cost)
        usage = load_usage(
            self.store,
            since=since,
            until=None,
            now=now,
            sacct_jobs=None,
            scope=EVERYONE,
            cost=cost,
        )
        rows += self._per_job(usage)
        self._usage.update(rows, now)

    def _settled_from_rollups(
        self, before: float, cost: CostSettings | None
    ) -> list[tuple[UserKey, float | None, list[float]]]:
        """Rows (settled: time before `before`) of the jobs that ended before `before`.

        The folded ones from the rollups; those not folded (no summary, no start) from
        raw rows, as before.
        """
        settled = before - 1.0
        rows: list[tuple[UserKey, float | None, list[float]]] = []
        for r in rollups.usage_before(self.store, before, cost).to_dict("records"):
            figures = [
                _number(r["gpu_seconds"]) / 3600.0,
                _number(r["active_seconds"]) / 3600.0,
                _number(r["cost"]),
            ]
            rows.append(((_text(r["user"]), _text(r["account"])), settled, figures))
        rows += self._per_job(rollups.unfolded_before(self.store, before, cost))
        return rows

    @staticmethod
    def _per_job(usage: Usage) -> list[tuple[UserKey, float | None, list[float]]]:
        """(owner, end time, [GPU-hours, active GPU-hours, cost]) of each job with GPU rows.

        Held and active seconds are the ledger's of each row (active clipped to the
        measured time, as the reports and the rollups have it); cost is the row's.
        """
        per_job = job_sums(usage.gpus)
        figures = {
            int(job_id): [gpu / 3600.0, active / 3600.0, cost]
            for job_id, gpu, active, cost in per_job.itertuples(name=None)
        }
        rows: list[tuple[UserKey, float | None, list[float]]] = []
        for job in usage.jobs.to_dict("records"):
            found = figures.get(int(job["job_id"]))
            if found is not None:
                key = (_text(job["user"]), _text(job["account"]))
                rows.append((key, _time(job["end_time"]), found))
        return rows

    def _read_actions(self, now: float) -> None:
        """Audit entries since the settled horizon, by policy, action and outcome.

        A "planned" entry gets its outcome seconds later: it counts only once it is
        settled (so planned-then-done is not counted twice).
        """
        recent = now - self._settle
        rows: list[tuple[ActionKey, float | None, tuple[float]]] = []
        for e in self.control.audit_entries(since=self._actions.horizon):
            outcome = outcome_label(e.outcome)
            if outcome == "planned" and e.time >= recent:
                continue
            rows.append(((e.policy, e.action, outcome), e.time, (1.0,)))
        self._actions.update(rows, now)

    # ---- exposing ---------------------------------------------------------------------

    def describe(self) -> Iterable[Metric]:
        """The metric families without samples (registering reads nothing)."""
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        """Every metric of the current snapshot."""
        return list(self._families(self.snapshot()))

    def _families(self, snap: Snapshot | None) -> Iterator[Metric]:
        store_up = GaugeMetricFamily(
            "slurm_gpu_store_up", "1 when the exporter could read the accounting store"
        )
        slurm_up = GaugeMetricFamily(
            "slurm_gpu_slurm_up", "1 when the exporter could run scontrol and squeue"
        )
        duration = GaugeMetricFamily(
            "slurm_gpu_exporter_refresh_duration_seconds",
            "Seconds the last read of Slurm and the store took",
        )
        gpus = GaugeMetricFamily(
            "slurm_gpu_gpus",
            "GPUs per node by state: allocated (Slurm), idle_allocated (the allocated ones "
            "below the active threshold; part of allocated), free",
            labels=["node", "state"],
        )
        node_info = GaugeMetricFamily(
            "slurm_gpu_node_info",
            "1 per node, labelled with its Slurm state",
            labels=["node", "state"],
        )
        running = GaugeMetricFamily(
            "slurm_gpu_running_jobs",
            "Running jobs per user and account (squeue -t R,CG)",
            labels=["user", "account"],
        )
        user_hours = CounterMetricFamily(
            "slurm_gpu_user_gpu_hours_total",
            "GPU-hours used (one GPU for one hour) per user and account",
            labels=["user", "account"],
        )
        user_active = CounterMetricFamily(
            "slurm_gpu_user_gpu_active_hours_total",
            "GPU-hours above the active threshold per user and account",
            labels=["user", "account"],
        )
        account_hours = CounterMetricFamily(
            "slurm_gpu_account_gpu_hours_total",
            "GPU-hours used per account",
            labels=["account"],
        )
        user_cost = CounterMetricFamily(
            "slurm_gpu_user_cost_total",
            "Cost of GPU use by [cost] prices per user and account",
            labels=["user", "account", "currency"],
        )
        account_cost = CounterMetricFamily(
            "slurm_gpu_account_cost_total",
            "Cost of GPU use by [cost] prices per account",
            labels=["account", "currency"],
        )
        actions = CounterMetricFamily(
            "slurm_gpu_controller_actions_total",
            "Controller decisions in the audit log by policy, action and outcome",
            labels=["policy", "action", "outcome"],
        )
        if snap is not None:
            store_up.add_metric([], 1.0 if snap.store_up else 0.0)
            slurm_up.add_metric([], 1.0 if snap.slurm_up else 0.0)
            duration.add_metric([], snap.duration_seconds)
            for n in snap.nodes or ():
                gpus.add_metric([n.node, "allocated"], float(n.alloc))
                if snap.idle_known:
                    gpus.add_metric([n.node, "idle_allocated"], float(n.idle_alloc))
                gpus.add_metric([n.node, "free"], float(n.free))
                node_info.add_metric([n.node, n.state.lower() or "unknown"], 1.0)
            for (user, account), jobs in sorted(snap.running_jobs.items()):
                running.add_metric([user, account], float(jobs))
            by_account: dict[str, list[float]] = {}
            for (user, account), (hours, active, cost) in sorted(snap.usage.items()):
                user_hours.add_metric([user, account], hours)
                user_active.add_metric([user, account], active)
                sums = by_account.setdefault(account, [0.0, 0.0])
                sums[0] += hours
                sums[1] += cost
                if snap.currency:
                    user_cost.add_metric([user, account, snap.currency], cost)
            for account, (hours, cost) in sorted(by_account.items()):
                account_hours.add_metric([account], hours)
                if snap.currency:
                    account_cost.add_metric([account, snap.currency], cost)
            for (policy, action, outcome), count in sorted(snap.actions.items()):
                actions.add_metric([policy, action, outcome], count)
        yield from (store_up, slurm_up, duration, gpus, node_info, running)
        yield from (user_hours, user_active, account_hours, user_cost, account_cost, actions)


def serve(collector: ClusterCollector, address: str) -> Callable[[], None]:
    """Serves /metrics on "host:port" in a background thread; returns a stop function."""
    host, _, port = address.rpartition(":")
    registry = CollectorRegistry()
    registry.register(collector)
    server, thread = start_http_server(
        int(port), addr=host.strip("[]") or "127.0.0.1", registry=registry
    )

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
