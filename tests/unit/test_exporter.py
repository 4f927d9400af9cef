"""`slurm-gpu exporter` (slurm_gpu/metrics/): metrics from a hand-made store and fake Slurm."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpu.cli.main import cli
from slurm_gpu.config import Config
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.errors import SlurmError
from slurm_gpu.metrics.collector import ClusterCollector, outcome_label
from slurm_gpu.metrics.totals import Monotonic, SettledSums
from slurm_gpu.models import Action, GpuDevice, GpuInterval, JobGpuSummary, Verdict
from slurm_gpu.slurm.client import CliSlurmClient
from slurm_gpu.store import Store
from slurm_gpu.store.control import ControlStore
from slurm_gpu.testing import FakeRunner, FixedClock

T0 = 1_800_000_000.0
A100 = "NVIDIA A100-SXM4-80GB"
NODES = (
    "NodeName=gpu1 CfgTRES=cpu=8,gres/gpu=4 AllocTRES=cpu=2,gres/gpu=2 State=MIXED\n"
    "NodeName=gpu2 CfgTRES=cpu=8,gres/gpu=4 AllocTRES= State=IDLE\n"
)
OWNERS = "3|alice|physics\n"
Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def fake_runner() -> FakeRunner:
    """Answers scontrol (the nodes) and squeue (the running jobs' owners) from text."""
    return FakeRunner({("scontrol",): NODES, ("squeue",): OWNERS})


def fake_slurm(runner: FakeRunner | None = None) -> CliSlurmClient:
    """The real client over the fake runner (the collector reads Slurm through it)."""
    return CliSlurmClient(runner if runner is not None else fake_runner())


def interval(
    gpu: str, job: int | None, start: float, util: float, seconds: float = 60.0
) -> GpuInterval:
    return GpuInterval(
        node="gpu1",
        gpu_uuid=gpu,
        period_start=start,
        period_end=start + seconds,
        job_id=job,
        util_mean_percent=util,
        util_max_percent=util,
        util_min_percent=util,
        util_sample_count=6,
        active_seconds=seconds if util >= 5 else 0.0,
        covered_seconds=seconds,
        mem_used_max_bytes=2**30,
        mem_total_bytes=80 * 2**30,
        power_mean_watts=100.0,
        energy_joules=100.0 * seconds,
        temperature_max_celsius=50.0,
        ecc_errors_total=0,
    )


def summary(job: int, gpu: str, seconds: float, end: float, active: float) -> JobGpuSummary:
    return JobGpuSummary(
        job_id=job,
        node="gpu1",
        gpu_uuid=gpu,
        gpu_model=A100,
        start=end - seconds,
        end=end,
        gpu_seconds=seconds,
        util_mean_percent=50.0,
        util_max_percent=60.0,
        active_seconds=active,
        mem_max_bytes=2**30,
        mem_gib_seconds=seconds,
        energy_joules=1.0,
        reading_count=10,
        missing_seconds=0.0,
    )


@pytest.fixture
def store(store: Store) -> Store:
    """Job 1 (bob/bio) ended with a 2-hour summary; job 3 (alice/physics) runs.

    Job 3 runs on GPU-a (busy) and GPU-b (idle): 10 minutes of intervals each.
    """
    store.upsert_inventory(
        "gpu1",
        [GpuDevice(f"GPU-{x}", A100, i, i, f"0:{i}", 80 * 2**30) for i, x in enumerate("abcd")],
        T0,
    )
    store.upsert_jobs(
        [
            {
                "job_id": 1,
                "user": "bob",
                "account": "bio",
                "state": "COMPLETED",
                "start_time": T0 - 7200,
                "end_time": T0,
                "nodes": "gpu1",
            },
            {
                "job_id": 3,
                "user": "alice",
                "account": "physics",
                "state": "RUNNING",
                "start_time": T0,
                "nodes": "gpu1",
            },
        ]
    )
    store.add_summaries([summary(1, "GPU-c", 7200.0, T0, 3600.0)])
    store.add_intervals(
        [interval("GPU-a", 3, T0 + 60 * i, 80.0) for i in range(10)]
        + [interval("GPU-b", 3, T0 + 60 * i, 0.0) for i in range(10)]
    )
    return store


def config(prices: dict[str, float] | None = None) -> Config:
    base = Config()
    return dataclasses.replace(base, cost=CostSettings(currency="EUR", prices=prices or {}))


def scrape(collector: ClusterCollector) -> Sample:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Sample, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


NOW = T0 + 600


def test_gpus_by_state_per_node(store: Store) -> None:
    """Slurm's allocations per node; idle_allocated counts held GPUs below the threshold."""
    samples = scrape(ClusterCollector(config(), store, fake_slurm(), clock=FixedClock(NOW)))
    assert 2.0 == value(samples, "slurm_gpu_gpus", node="gpu1", state="allocated")
    assert 1.0 == value(samples, "slurm_gpu_gpus", node="gpu1", state="idle_allocated")
    assert 2.0 == value(samples, "slurm_gpu_gpus", node="gpu1", state="free")
    assert 4.0 == value(samples, "slurm_gpu_gpus", node="gpu2", state="free")
    assert 1.0 == value(samples, "slurm_gpu_node_info", node="gpu1", state="mixed")
    assert 1.0 == value(samples, "slurm_gpu_running_jobs", user="alice", account="physics")


def test_gpu_hours_from_summaries_and_intervals(store: Store) -> None:
    """Finished jobs count their summaries, running jobs their intervals (as the reports)."""
    samples = scrape(ClusterCollector(config(), store, fake_slurm(), clock=FixedClock(NOW)))
    assert 2.0 == value(samples, "slurm_gpu_user_gpu_hours_total", user="bob", account="bio")
    assert pytest.approx(20 / 60) == value(
        samples, "slurm_gpu_user_gpu_hours_total", user="alice", account="physics"
    )
    assert pytest.approx(10 / 60) == value(
        samples, "slurm_gpu_user_gpu_active_hours_total", user="alice", account="physics"
    )
    assert 2.0 == value(samples, "slurm_gpu_account_gpu_hours_total", account="bio")


def test_cost_only_with_prices(store: Store) -> None:
    """Cost series use [cost] prices (via the reports); without a price there are none."""
    priced = scrape(
        ClusterCollector(config({"a100": 3.0}), store, fake_slurm(), clock=FixedClock(NOW))
    )
    assert 6.0 == value(priced, "slurm_gpu_account_cost_total", account="bio", currency="EUR")
    assert pytest.approx(1.0) == value(
        priced, "slurm_gpu_user_cost_total", user="alice", account="physics", currency="EUR"
    )
    unpriced = scrape(ClusterCollector(config(), store, fake_slurm(), clock=FixedClock(NOW)))
    assert not [k for k in unpriced if k[0].endswith("_cost_total")]


def test_controller_actions_by_outcome(store: Store) -> None:
    """Audit entries count by policy, action and the outcome's first word.

    A fresh "planned" entry waits for its outcome.
    """
    control = ControlStore(store)
    verdict = Verdict("idle_gpu", Action.CANCEL, "job:3", "idle", job_id=3)
    for outcome in ("done", "failed: scancel said no", "failed: again", "planned"):
        control.audit(
            [verdict], time=NOW - 5, cycle="x", controller="t", dry_run=False, outcome=outcome
        )
    samples = scrape(ClusterCollector(config(), store, fake_slurm(), clock=FixedClock(NOW)))
    name = "slurm_gpu_controller_actions_total"
    assert 1.0 == value(samples, name, policy="idle_gpu", action="cancel", outcome="done")
    assert 2.0 == value(samples, name, policy="idle_gpu", action="cancel", outcome="failed")
    assert value(samples, name, policy="idle_gpu", action="cancel", outcome="planned") is None


def test_snapshot_is_reused_within_max_age(store: Store) -> None:
    """Scrapes within max_age share one read of Slurm; a later scrape reads again."""
    runner, clock = fake_runner(), FixedClock(NOW)
    collector = ClusterCollector(config(), store, fake_slurm(runner), clock=clock, max_age=15.0)
    scrape(collector)
    clock.now += 10
    scrape(collector)
    assert 2 == len(runner.calls)
    clock.now += 10
    scrape(collector)
    assert 4 == len(runner.calls)


def test_slurm_down_leaves_out_gpu_states(store: Store) -> None:
    """Slurm is the truth for allocations: without it there is no slurm_gpu_gpus."""
    runner = fake_runner()
    runner.outage = SlurmError("slurmctld is not responding")
    samples = scrape(ClusterCollector(config(), store, fake_slurm(runner), clock=FixedClock(NOW)))
    assert 0.0 == value(samples, "slurm_gpu_slurm_up")
    assert not [k for k in samples if k[0] == "slurm_gpu_gpus"]
    assert 2.0 == value(samples, "slurm_gpu_account_gpu_hours_total", account="bio")


def test_store_down_leaves_out_usage(tmp_path: Path) -> None:
    """An unreadable store: store_up 0, no usage counters, no idle_allocated."""
    broken = Store(f"sqlite:///{tmp_path}/missing/dir/store.db", cluster="c")
    samples = scrape(ClusterCollector(config(), broken, fake_slurm(), clock=FixedClock(NOW)))
    assert 0.0 == value(samples, "slurm_gpu_store_up")
    assert not [k for k in samples if "gpu_hours" in k[0]]
    assert value(samples, "slurm_gpu_gpus", node="gpu1", state="idle_allocated") is None
    assert 2.0 == value(samples, "slurm_gpu_gpus", node="gpu1", state="allocated")


def test_counter_never_drops_when_summary_replaces_intervals(store: Store) -> None:
    """A running job's summary may count less than its intervals did: the counter holds."""
    clock = FixedClock(NOW)
    collector = ClusterCollector(config(), store, fake_slurm(), clock=clock, max_age=0.0)
    before = value(
        scrape(collector), "slurm_gpu_user_gpu_hours_total", user="alice", account="physics"
    )
    store.upsert_jobs([{"job_id": 3, "end_time": NOW, "state": "COMPLETED"}])
    store.add_summaries([summary(3, "GPU-a", 500.0, NOW, 500.0)])
    clock.now += 1
    after = value(
        scrape(collector), "slurm_gpu_user_gpu_hours_total", user="alice", account="physics"
    )
    assert before == after


def test_settled_rows_are_not_read_again() -> None:
    """Rows older than the settling time are folded once; the recent part is replaced."""
    sums: SettledSums[str] = SettledSums(1, settle_seconds=100.0)
    sums.update([("a", 10.0, [1.0]), ("a", None, [2.0]), ("b", 950.0, [4.0])], now=1000.0)
    assert 900.0 == sums.horizon
    assert {"a": (3.0,), "b": (4.0,)} == sums.totals()
    sums.update([("a", None, [5.0])], now=1010.0)
    assert {"a": (6.0,)} == sums.totals()


def test_monotonic_keeps_the_largest_value() -> None:
    """A smaller value later is exported as the largest seen; vanished keys stay."""
    guard: Monotonic[str] = Monotonic()
    assert {"a": 2.0} == guard.apply({"a": 2.0})
    assert {"a": 2.0, "b": 1.0} == guard.apply({"a": 1.5, "b": 1.0})
    assert {"a": 3.0, "b": 1.0} == guard.apply({"a": 3.0})


def test_outcome_label_is_the_first_word() -> None:
    """Failure messages do not become label values (one series per outcome kind)."""
    assert "failed" == outcome_label("failed: scancel: Invalid job id")
    assert "dry-run" == outcome_label("dry-run")
    assert "unknown" == outcome_label("")


def test_every_counter_ends_in_total(store: Store) -> None:
    """DESIGN naming: counters end in _total; every name starts slurm_gpu_."""
    registry = CollectorRegistry()
    registry.register(
        ClusterCollector(config({"a100": 1.0}), store, fake_slurm(), clock=FixedClock(NOW))
    )
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    assert all(f.name.startswith("slurm_gpu_") for f in families)
    counters = [s.name for f in families if f.type == "counter" for s in f.samples]
    assert counters and all(name.endswith("_total") for name in counters)


def test_cli_rejects_a_bad_listen_address() -> None:
    """--listen must be host:port."""
    result = CliRunner().invoke(cli, ["exporter", "--listen", "nowhere"])
    assert 2 == result.exit_code
    assert "host:port" in result.output
