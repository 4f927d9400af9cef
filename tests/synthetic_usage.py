"""The synthetic store of the usage tests, and how its reports are compared.

Jobs of every shape: whole A100s and H100s on one or two nodes, MIG slices, shards of a
quarter GPU; with and without GPM, utilization, energy; missing data; jobs over midnight
and over a month's end; a requeued job (two runs); a job of no length; a running job
(intervals only) and an ended one whose summary never came. `fill` writes it through the
ingest methods, so the rollups hold it as ingest folds it.

Used by tests/unit/test_usage_rollups.py (the fold and `slurm-gpu report` from every
source of sums), tests/unit/test_monthly_sources.py (`report monthly`),
tests/unit/test_exporter_rollups.py and their twins on every backend under tests/store/.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import random
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from slurm_gpu.access import Scope
from slurm_gpu.config import Config
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.ledger.figures import FIGURE_KEYS
from slurm_gpu.models import (
    Action,
    GpuDevice,
    GpuInterval,
    JobGpuSummary,
    Measurement,
    SlotKind,
    Verdict,
)
from slurm_gpu.reports.monthly import MonthlyReport
from slurm_gpu.reports.service import ReportEnv
from slurm_gpu.reports.summary import Report
from slurm_gpu.reports.usage import JobFilter
from slurm_gpu.store import Store
from slurm_gpu.store.schema import (
    job_usage,
    jobs,
    usage_across,
    usage_daily,
    usage_monthly,
    usage_unfolded,
)
from slurm_gpu.store.usage_rollup import wait_bucket
from tests.usage_sources import ROOT, SOURCES, period_report

UTC = dt.UTC
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
DEC = dt.datetime(2026, 12, 1, tzinfo=UTC).timestamp()
H = 3600.0
NOW = DEC + 5 * 24 * H
LAG = 300.0
NO_FILTER = JobFilter()
A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
NODES = ["gpu1", "gpu2", "gpu3", "gpu9"]
COSTS = [
    CostSettings(currency="EUR", unit="gpu_hour", prices={"a100": 2.0, "h100": 4.0}),
    CostSettings(
        currency="EUR",
        unit="gpu_hour",
        prices={"a100": 2.0, "h100": 4.0, "h100:1g.10gb": 0.9},
        charge="effective",
    ),
    CostSettings(currency="EUR", unit="gpu_mem_hour", prices={"a100": 0.01}),
    CostSettings(currency="EUR", unit="job_hour", prices={"h100": 3.0}, charge="effective"),
]
WINDOWS = {
    "month": (NOV, DEC),
    "cut days": (NOV + 2 * 24 * H + 5.5 * H, NOV + 19 * 24 * H + 17 * H),
    "inside a day": (NOV + 4 * 24 * H + 1 * H, NOV + 4 * 24 * H + 9 * H),
    # A whole month (usage_monthly), a whole day before it (usage_daily), cut days.
    "month and days": (NOV - 36 * H, DEC + 17 * H),
    # One whole day between two cut ones: jobs of 50 hours run across both ends.
    "one whole day": (NOV + 13 * 24 * H + 12 * H, NOV + 15 * 24 * H + 6 * H),
}
# `report monthly`: the clock, and a local time 5:30 ahead of UTC whose days are not the
# rollups' UTC days.
MONTH_NOW = dt.datetime.fromtimestamp(NOW, UTC)
KOLKATA = dt.timezone(dt.timedelta(hours=5, minutes=30))


def summary(
    job: int,
    restart: int,
    node: str,
    gpu: str,
    model: str,
    start: float,
    seconds: float,
    rng: random.Random,
    **slot: Any,
) -> JobGpuSummary:
    missing = rng.choice([0.0, 0.0, seconds * 0.25, seconds * 1.5])  # > held: clipped
    util = rng.choice([None, 0.0, 3.0, 55.0, 97.0])
    gpm = rng.choice([0.0, seconds * 0.8])
    means: dict[str, Any] = (
        {
            "sm_active_mean_percent": rng.uniform(0, 100),
            "sm_occupancy_mean_percent": rng.uniform(0, 100),
            "tensor_active_mean_percent": rng.choice([None, rng.uniform(0, 60)]),
            "dram_bw_mean_percent": rng.uniform(0, 40),
        }
        if gpm
        else {}
    )
    return JobGpuSummary(
        job_id=job,
        node=node,
        gpu_uuid=gpu,
        gpu_model=model,
        start=start,
        end=start + seconds,
        gpu_seconds=seconds,
        util_mean_percent=util,
        util_max_percent=util,
        active_seconds=seconds * (util or 0.0) / 100 * 1.1,
        mem_max_bytes=2**33,
        mem_gib_seconds=seconds * rng.uniform(0, 8),
        energy_joules=rng.choice([None, seconds * 250.0]),
        reading_count=int(seconds / 60),
        missing_seconds=min(missing, seconds * 2),
        user=f"u{job % 5}",
        account=f"acct{job % 3}",
        partition=("gpu", "mig")[job % 2],
        restart=restart,
        gpm_seconds=gpm,
        **means,
        **slot,
    )


def fill(store: Store, seed: int = 11) -> None:
    """The synthetic store (module docstring), written through the ingest methods."""
    rng = random.Random(seed)
    summaries: list[JobGpuSummary] = []
    jobs: list[dict[str, Any]] = []
    for job in range(100, 160):
        start = NOV - 2 * 24 * H + rng.uniform(0, 34 * 24 * H)
        seconds = rng.choice([0.0, 600.0, 5 * H, 20 * H, 50 * H])
        shape = job % 4
        nodes = ["gpu1", "gpu2"] if job % 7 == 0 else [f"gpu{1 + job % 3}"]
        restart = 1 if job % 11 == 0 else 0
        for node in nodes:
            if shape == 0:  # whole GPUs
                for g in range(2):
                    summaries.append(
                        summary(
                            job,
                            restart,
                            node,
                            f"GPU-{node}-{g}",
                            A100 if job % 3 else H100,
                            start,
                            seconds,
                            rng,
                        )
                    )
            elif shape == 1:  # MIG slices
                summaries.append(
                    summary(
                        job,
                        restart,
                        node,
                        f"GPU-{node}-h",
                        H100,
                        start,
                        seconds,
                        rng,
                        slot_id=f"MIG-{job}-{node}",
                        slot_kind=SlotKind.MIG,
                        share=1 / 7,
                        mig_profile="1g.10gb",
                        measured_by=Measurement.GPM,
                    )
                )
            elif shape == 2:  # a shard of a quarter GPU
                summaries.append(
                    summary(
                        job,
                        restart,
                        node,
                        f"GPU-{node}-a",
                        A100,
                        start,
                        seconds,
                        rng,
                        slot_id=f"GPU-{node}-a/shard/{job}",
                        slot_kind=SlotKind.SHARD,
                        share=0.25,
                        measured_by=Measurement.PER_PROCESS,
                    )
                )
            else:  # a whole GPU of a model only the inventory knows
                summaries.append(
                    summary(job, restart, node, f"GPU-{node}-x", "", start, seconds, rng)
                )
        jobs.append(
            {
                "job_id": job,
                "user": f"u{job % 5}",
                "account": f"acct{job % 3}",
                "partition": ("gpu", "mig")[job % 2],
                "job_name": f"j{job}",
                "state": "COMPLETED",
                "submit_time": None if job % 13 == 0 else start - rng.uniform(0, 3 * H),
                "start_time": start,
                "end_time": start + seconds,
                "nodes": ",".join(nodes),
                "gpus": 2 * len(nodes) if shape == 0 else len(nodes),
                # Some jobs were suspended a fifth of their time (sacct's Suspended).
                "suspended_seconds": seconds / 5 if job % 5 == 2 else None,
            }
        )
    # Running (intervals only) and ended with no summary (all of it missing).
    jobs.append(
        {
            "job_id": 900,
            "user": "u1",
            "account": "acct0",
            "partition": "gpu",
            "submit_time": DEC - 3 * H,
            "start_time": DEC - 2 * H,
            "end_time": None,
            "nodes": "gpu1",
            "gpus": 1,
        }
    )
    jobs.append(
        {
            "job_id": 901,
            "user": "u2",
            "account": "acct1",
            "partition": "gpu",
            "submit_time": NOV + 3 * H,
            "start_time": NOV + 4 * H,
            "end_time": NOV + 30 * H,
            "nodes": "gpu2",
            "gpus": 2,
        }
    )
    store.upsert_jobs(jobs)
    store.add_summaries(summaries[: len(summaries) // 2])
    store.add_summaries(summaries[len(summaries) // 2 :])
    store.add_intervals(
        [
            GpuInterval(
                node="gpu1",
                gpu_uuid="GPU-gpu1-0",
                period_start=DEC - 2 * H + 60 * i,
                period_end=DEC - 2 * H + 60 * (i + 1),
                job_id=900,
                util_mean_percent=40.0,
                util_max_percent=60.0,
                util_min_percent=20.0,
                util_sample_count=6,
                active_seconds=60.0,
                covered_seconds=60.0,
                mem_used_max_bytes=2**32,
                mem_total_bytes=2**36,
                power_mean_watts=200.0,
                energy_joules=12000.0,
                temperature_max_celsius=60.0,
                ecc_errors_total=0,
                unallocated_pids=(),
            )
            for i in range(30)
        ]
    )
    # A model the inventory knows for the GPUs whose summaries name none.
    for n, node in enumerate(("gpu1", "gpu2", "gpu3")):
        store.upsert_inventory(
            node,
            [
                GpuDevice(
                    uuid=f"GPU-{node}-x",
                    name=A100,
                    minor=0,
                    nvml_index=0,
                    pci_bus_id=f"0000:0{n}:00.0",
                    memory_total_bytes=2**36,
                )
            ],
            NOV,
        )


def synthetic_file(directory: Path, *, enforced: bool = False) -> Path:
    """A SQLite file of the synthetic store at head in `directory`, `enforce`d if asked.

    Written once per test module: each test opens a copy (`copied`), instead of upgrading
    a new store and ingesting it all again.
    """
    path = directory / "synthetic.db"
    with Store(f"sqlite:///{path}", cluster="c1") as store:
        store.upgrade()
        fill(store)
        if enforced:
            enforce(store)
    return path


def copied(template: Path, directory: Path) -> Store:
    """A Store of cluster c1 on a copy of `template` (`synthetic_file`) in `directory`."""
    path = directory / "store.db"
    shutil.copyfile(template, path)
    return Store(f"sqlite:///{path}", cluster="c1")


def report(
    store: Store,
    group: str,
    since: float,
    until: float,
    cost: CostSettings,
    filters: JobFilter = NO_FILTER,
    scope: Scope = ROOT,
) -> Report:
    """`slurm-gpu report <group>` of the synthetic store as the command builds it."""
    return period_report(
        store,
        group,
        since=since,
        until=until,
        now=NOW,
        cost=cost,
        lag=LAG,
        scope=scope,
        filters=filters,
        cluster="c1",
        all_nodes=NODES,
    )


def tables(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the usage rollups, sorted, by table."""
    with store.reading("test") as conn:
        return {
            t.name: sorted(tuple(r) for r in conn.execute(sa.select(t)))
            for t in (job_usage, usage_daily, usage_monthly, usage_unfolded, usage_across)
        }


def approx_tables(a: dict[str, list[tuple[Any, ...]]], b: dict[str, list[tuple[Any, ...]]]) -> None:
    """The same rows in the same tables, floats to 1e-9."""
    for name in a:
        assert len(a[name]) == len(b[name]), name
        for x, y in zip(a[name], b[name], strict=True):
            assert all(_same(p, q) for p, q in zip(x, y, strict=True)), (name, x, y)


def longest_folded(store: Store) -> float:
    """Seconds of the longest `job_usage` row."""
    with store.reading("test") as conn:
        u = job_usage.c
        return float(conn.execute(sa.select(sa.func.max(u.end_time - u.start_time))).scalar_one())


def job_across(store: Store, job: int, start: float, end: float) -> None:
    """A job of u2 on one H100 of gpu2 from `start` to `end`, ingested with its summary."""
    store.upsert_jobs(
        [
            {
                "job_id": job,
                "user": "u2",
                "account": "acct1",
                "partition": "gpu",
                "job_name": "long",
                "state": "COMPLETED",
                "submit_time": start - H,
                "start_time": start,
                "end_time": end,
                "nodes": "gpu2",
                "gpus": 1,
            }
        ]
    )
    rng = random.Random(job)
    store.add_summaries([summary(job, 0, "gpu2", "GPU-gpu2-1", H100, start, end - start, rng)])


def suspensions(store: Store) -> list[dict[str, Any]]:
    """The jobs' suspended seconds (sacct's), to write again as `slurm-gpu sync` would.

    A downgrade below revision 0016 drops them.
    """
    j = jobs.c
    query = sa.select(j.job_id, j.suspended_seconds).where(
        j.cluster == store.cluster, j.suspended_seconds.is_not(None)
    )
    with store.reading("test: suspended seconds") as conn:
        return [{"job_id": int(i), "suspended_seconds": float(v)} for i, v in conn.execute(query)]


def downgrade(store: Store, revision: str) -> None:
    """The store's schema taken back to `revision` (Store.upgrade only goes forward)."""
    import alembic.command

    with store.writing(f"test: downgrade to {revision}") as conn:
        alembic.command.downgrade(store._alembic_config(conn), revision)
    assert revision == store.current_revision()


# ---------------------------------------------------------------- comparing reports


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) or isinstance(b, str):
        return bool(a == b)
    return bool(a == pytest.approx(b, rel=1e-9, abs=1e-9))


def same_bucket(exact: Any, folded: Any) -> bool:
    """The 95th percentile of waits from histogram buckets is within one bucket of numpy's."""
    if exact is None or folded is None:
        return exact is None and folded is None
    return abs(wait_bucket(float(exact)) - wait_bucket(float(folded))) <= 1


def assert_same_report(expected: Report, actual: Report, where: str = "report") -> None:
    """Every row, total and top waste the same; `actual`'s p95 within a bucket of `expected`'s.

    `expected` is the exact one (raw rows: every job counted one by one), `actual` may
    take its queue wait p95 from the rollups' buckets.
    """
    names = [n for n in (*FIGURE_KEYS, "physical_gpu_hours", "share_percent", "busy")]
    names.remove("queue_wait_p95")
    pairs = zip([*expected.rows, expected.total], [*actual.rows, actual.total], strict=True)
    for exact, folded in pairs:
        p95 = (exact["queue_wait_p95"], folded["queue_wait_p95"])
        assert same_bucket(*p95), (where, exact["key"], p95)

    def table(report: Report) -> list[tuple[Any, ...]]:
        rows = [*report.rows, report.total]
        return [(r["key"], *(r.get(n) for n in names)) for r in rows]

    want, got = table(expected), table(actual)
    assert [r[0] for r in want] == [r[0] for r in got], where
    for w, g in zip(want, got, strict=True):
        diff = [(n, x, y) for n, x, y in zip(["key", *names], w, g, strict=True) if not _same(x, y)]
        assert diff == [], (where, w[0])
    assert [w["key"] for w in expected.top_waste] == [w["key"] for w in actual.top_waste], where
    assert [w["idle_gpu_hours"] for w in expected.top_waste] == pytest.approx(
        [w["idle_gpu_hours"] for w in actual.top_waste], rel=1e-9
    ), where


def assert_same_reports(by_source: Mapping[str, Mapping[Any, Report]]) -> None:
    """Each report of the folded and half-folded sources is that of the raw source.

    `by_source`: {source: {key: report}} (tests/usage_sources.py `by_source`); the raw
    source counts every job one by one, so its queue wait p95 is the exact one.
    """
    raw = by_source["raw"]
    assert raw, "no report to compare"
    for source in SOURCES:
        assert list(by_source[source]) == list(raw), source
        for key, expected in raw.items():
            assert_same_report(expected, by_source[source][key], f"{source}: {key}")


# ---------------------------------------------------------------- report monthly


def enforce(store: Store) -> None:
    """Enforced entries: a done cancellation of job 104 (u4), a warning to job 901 (u2)."""
    cancel = Verdict("idle_gpu", Action.CANCEL, "job:104", "idle", job_id=104, user="u4",
                     account="acct2")  # fmt: skip
    warn = Verdict("idle_gpu", Action.WARN, "job:901", "idle", job_id=901, user="u2",
                   account="acct1")  # fmt: skip
    for verdict, at in ((cancel, NOV + 5 * H), (warn, NOV + 9 * H)):
        store.control.audit([verdict], time=at, cycle="x", controller="h", dry_run=False,
                            outcome="done")  # fmt: skip


def monthly_env(
    store: Store,
    cost: CostSettings = COSTS[0],
    tz: dt.tzinfo = UTC,
    scope: Scope = ROOT,
) -> ReportEnv:
    """What `slurm-gpu report monthly` reads: the store, no sacct, the clock in `tz`."""
    config = dataclasses.replace(Config(), cost=cost)
    return ReportEnv(config, store, None, scope, MONTH_NOW.astimezone(tz), [])


def assert_same(expected: Any, actual: Any, where: str = "report") -> None:
    """Equal, floats to 1e-9 (relative, or absolute near 0); None and NaN as unknown."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), where
        assert set(expected) == set(actual), f"{where}: {set(expected) ^ set(actual)}"
        for key in expected:
            assert_same(expected[key], actual[key], f"{where}.{key}")
    elif isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple), where
        assert len(expected) == len(actual), f"{where}: {len(expected)} != {len(actual)}"
        for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(expected, float) or isinstance(actual, float):
        unknown = [
            v is None or (isinstance(v, float) and math.isnan(v)) for v in (expected, actual)
        ]
        assert unknown[0] == unknown[1], f"{where}: {expected!r} != {actual!r}"
        if not unknown[0]:
            assert math.isclose(expected, actual, rel_tol=1e-9, abs_tol=1e-9), (
                f"{where}: {expected!r} != {actual!r}"
            )
    else:
        assert expected == actual, f"{where}: {expected!r} != {actual!r}"


def assert_same_monthly(by_source: Mapping[str, Any]) -> None:
    """Every table of each source's monthly report(s) is that of the raw source.

    `by_source`: {source: a MonthlyReport, or {key: MonthlyReport}}. The monthly report
    counts every job one by one (reports/monthly_rows.py): its queue waits are exact from
    every source.
    """
    expected = _plain(by_source["raw"])
    assert expected, "no report to compare"
    for source in SOURCES:
        assert_same(expected, _plain(by_source[source]), source)


def _plain(built: Any) -> Any:
    """A monthly report (or a mapping of them) as plain dicts and lists."""
    if isinstance(built, MonthlyReport):
        return dataclasses.asdict(built)
    return {str(key): _plain(value) for key, value in built.items()}
