"""`slurm-gpu report` from the usage rollups (revision 0010, issue 16) equals the raw way.

A synthetic store of jobs of every shape: whole A100s and H100s on one or two nodes, MIG
slices, shards of a quarter GPU; with and without GPM, utilization, energy; missing data;
jobs over midnight and over a month's end; a requeued job (two runs); a job of no length;
a running job (intervals only) and an ended one whose summary never came. Every report
group, over a UTC month, a window that cuts days and one inside a day, under every
[cost] unit and charge, is the same from the rollups written at ingest, from rebuilt
rollups, from rollups built by the 0009 -> 0010 upgrade, and from raw rows the old way
(`load_usage` + `build_report`, kept callable).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from slurm_gpu.access import Caller, Scope
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.ledger.figures import FIGURE_KEYS
from slurm_gpu.models import GpuInterval, JobGpuSummary, Measurement, SlotKind
from slurm_gpu.reports.grouped import BUCKET_NOTE, build_report
from slurm_gpu.reports.rollups import boundary_cells, build_report_from_rollups
from slurm_gpu.reports.summary import GROUP_KEYS, Report
from slurm_gpu.reports.usage import JobFilter, load_usage
from slurm_gpu.store import Store, rollup_reads
from slurm_gpu.store.schema import (
    job_usage,
    usage_across,
    usage_daily,
    usage_extent,
    usage_monthly,
    usage_unfolded,
)
from slurm_gpu.store.usage_rollup import wait_bucket

UTC = dt.UTC
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
DEC = dt.datetime(2026, 12, 1, tzinfo=UTC).timestamp()
H = 3600.0
NOW = DEC + 5 * 24 * H
LAG = 300.0
NO_FILTER = JobFilter()
ROOT = Scope(Caller(0, "root"), True, reason="root")
A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
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


def _summary(
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
                        _summary(
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
                    _summary(
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
                    _summary(
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
                    _summary(job, restart, node, f"GPU-{node}-x", "", start, seconds, rng)
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
    from slurm_gpu.models import GpuDevice

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


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'store.db'}", cluster="c1") as s:
        s.upgrade()
        fill(s)
        yield s


def old_report(
    store: Store,
    group: str,
    since: float,
    until: float,
    cost: CostSettings,
    filters: JobFilter = NO_FILTER,
) -> Report:
    """The report from raw rows, as before revision 0010."""
    usage = load_usage(
        store,
        since=since,
        until=until,
        now=NOW,
        sacct_jobs=None,
        scope=ROOT,
        filters=filters,
        cost=cost,
        lag=LAG,
    )
    return build_report(
        usage,
        group,
        since=since,
        until=until,
        now=NOW,
        cluster="c1",
        all_nodes=["gpu1", "gpu2", "gpu3", "gpu9"],
    )


def new_report(
    store: Store,
    group: str,
    since: float,
    until: float,
    cost: CostSettings,
    filters: JobFilter = NO_FILTER,
) -> Report:
    return build_report_from_rollups(
        store,
        group,
        since=since,
        until=until,
        now=NOW,
        scope=ROOT,
        filters=filters,
        cost=cost,
        lag=LAG,
        cluster="c1",
        all_nodes=["gpu1", "gpu2", "gpu3", "gpu9"],
    )


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) or isinstance(b, str):
        return bool(a == b)
    return bool(a == pytest.approx(b, rel=1e-9, abs=1e-9))


def _same_bucket(exact: Any, folded: Any) -> bool:
    """The 95th percentile of waits from histogram buckets is within one bucket of numpy's."""
    if exact is None or folded is None:
        return exact is None and folded is None
    return abs(wait_bucket(float(exact)) - wait_bucket(float(folded))) <= 1


def assert_same_report(expected: Report, actual: Report) -> None:
    names = [n for n in (*FIGURE_KEYS, "physical_gpu_hours", "share_percent", "busy")]
    names.remove("queue_wait_p95")
    pairs = zip([*expected.rows, expected.total], [*actual.rows, actual.total], strict=True)
    for exact, folded in pairs:
        p95 = (exact["queue_wait_p95"], folded["queue_wait_p95"])
        assert _same_bucket(*p95), (exact["key"], p95)

    def table(report: Report) -> list[tuple[Any, ...]]:
        rows = [*report.rows, report.total]
        return [(r["key"], *(r.get(n) for n in names)) for r in rows]

    want, got = table(expected), table(actual)
    assert [r[0] for r in want] == [r[0] for r in got]
    for w, g in zip(want, got, strict=True):
        diff = [(n, x, y) for n, x, y in zip(["key", *names], w, g, strict=True) if not _same(x, y)]
        assert diff == [], w[0]
    assert [w["key"] for w in expected.top_waste] == [w["key"] for w in actual.top_waste]
    assert [w["idle_gpu_hours"] for w in expected.top_waste] == pytest.approx(
        [w["idle_gpu_hours"] for w in actual.top_waste], rel=1e-9
    )


@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("group", list(GROUP_KEYS.values()))
def test_every_group_from_rollups_equals_raw_rows(store: Store, group: str, window: str) -> None:
    """Every report group, over whole days and cut days, under every [cost] unit/charge."""
    since, until = WINDOWS[window]
    for cost in COSTS:
        assert_same_report(
            old_report(store, group, since, until, cost),
            new_report(store, group, since, until, cost),
        )


def test_user_account_partition_filters_from_rollups_equal_raw_rows(store: Store) -> None:
    """-u/-A/-r select the same usage from the rollups as from raw rows."""
    filters = JobFilter(users=("u1", "u3"), accounts=("acct0", "acct1"), partitions=("gpu",))
    since, until = WINDOWS["cut days"]
    for group in ("user", "node", "slot"):
        assert_same_report(
            old_report(store, group, since, until, COSTS[1], filters),
            new_report(store, group, since, until, COSTS[1], filters),
        )


def test_a_scoped_report_from_rollups_equals_raw_rows(store: Store) -> None:
    """A user who coordinates an account sees the same rows from the rollups as raw."""
    scope = Scope(Caller(1001, "u1"), False, frozenset({"acct2"}), reason="coordinator")
    since, until = WINDOWS["cut days"]
    for group in ("user", "account"):
        usage = load_usage(
            store, since=since, until=until, now=NOW, sacct_jobs=None, scope=scope,
            cost=COSTS[0], lag=LAG,
        )  # fmt: skip
        expected = build_report(usage, group, since=since, until=until, now=NOW, cluster="c1")
        actual = build_report_from_rollups(
            store, group, since=since, until=until, now=NOW, scope=scope, cost=COSTS[0],
            lag=LAG, cluster="c1",
        )  # fmt: skip
        assert_same_report(expected, actual)
    everyone = new_report(store, "account", since, until, COSTS[0])
    assert 0 < actual.total["gpu_hours"] < everyone.total["gpu_hours"]  # not vacuous


def _tables(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    with store.reading("test") as conn:
        return {
            t.name: sorted(tuple(r) for r in conn.execute(sa.select(t)))
            for t in (job_usage, usage_daily, usage_monthly, usage_unfolded, usage_across)
        }


def _approx_tables(
    a: dict[str, list[tuple[Any, ...]]], b: dict[str, list[tuple[Any, ...]]]
) -> None:
    for name in a:
        assert len(a[name]) == len(b[name]), name
        for x, y in zip(a[name], b[name], strict=True):
            assert all(_same(p, q) for p, q in zip(x, y, strict=True)), (name, x, y)


def test_rebuilt_rollups_equal_those_written_at_ingest(store: Store) -> None:
    """`rebuild_rollups` (all, and --since a day) writes what ingest wrote."""
    ingested = _tables(store)
    assert ingested["job_usage"] and ingested["usage_daily"] and ingested["usage_monthly"]
    assert ingested["usage_across"]
    # The running job and the ended one whose summary never came: read from raw rows.
    assert [r[1] for r in ingested["usage_unfolded"]] == [900, 901]
    store.rebuild_rollups()
    _approx_tables(ingested, _tables(store))
    store.rebuild_rollups(since=NOV + 10.5 * 24 * H)
    _approx_tables(ingested, _tables(store))


def test_changed_job_facts_refold_the_rollups(store: Store) -> None:
    """A job moved to another account and time (sacct sync) moves its usage with it."""
    store.upsert_jobs(
        [{"job_id": 104, "account": "moved", "start_time": NOV + 3 * H, "end_time": NOV + 40 * H}]
    )
    after = _tables(store)
    store.rebuild_rollups()
    _approx_tables(after, _tables(store))
    since, until = WINDOWS["month"]
    assert_same_report(
        old_report(store, "account", since, until, COSTS[0]),
        new_report(store, "account", since, until, COSTS[0]),
    )


def downgrade(store: Store, revision: str) -> None:
    """The store's schema taken back to `revision` (Store.upgrade only goes forward)."""
    import alembic.command

    with store.writing(f"test: downgrade to {revision}") as conn:
        alembic.command.downgrade(store._alembic_config(conn), revision)
    assert revision == store.current_revision()


def test_upgrade_from_0009_builds_the_rollups(store: Store) -> None:
    """A store at 0009 upgraded to 0010 gets its rollups built, and the same reports."""
    ingested = _tables(store)
    downgrade(store, "0009")
    store.upgrade()
    assert (store.current_revision() or "") >= "0010"
    _approx_tables(ingested, _tables(store))
    since, until = WINDOWS["cut days"]
    assert_same_report(
        old_report(store, "slot", since, until, COSTS[1]),
        new_report(store, "slot", since, until, COSTS[1]),
    )


def test_db_rebuild_rollups_command_rebuilds_them(store: Store) -> None:
    """`slurm-gpu db rebuild-rollups [--since DATE]` rewrites the rollups ingest wrote."""
    from click.testing import CliRunner

    from slurm_gpu.cli.main import cli

    ingested = _tables(store)
    with store.writing("test") as conn:
        conn.execute(sa.delete(usage_unfolded))
        conn.execute(sa.delete(usage_across))
        conn.execute(sa.delete(usage_monthly))
        conn.execute(sa.delete(usage_daily))
        conn.execute(sa.delete(job_usage))
    url = str(store.engine.url)
    result = CliRunner().invoke(cli, ["db", "rebuild-rollups", "--url", url])
    assert result.exit_code == 0, result.output
    assert f"{len(ingested['job_usage'])} job usage rows" in result.output
    _approx_tables(ingested, _tables(store))
    result = CliRunner().invoke(
        cli, ["db", "rebuild-rollups", "--url", url, "--since", "2026-11-20"]
    )
    assert result.exit_code == 0, result.output
    _approx_tables(ingested, _tables(store))
    result = CliRunner().invoke(cli, ["db", "rebuild-rollups", "--url", url, "--since", "nope"])
    assert result.exit_code == 2
    assert "--since" in result.output


def test_queue_wait_p95_from_buckets_is_said_and_exact_without_them(store: Store) -> None:
    """The report says where its p95 comes from buckets; inside a day it is exact.

    Inside a day every job is counted one by one from its `job_usage` rows.
    """
    month = new_report(store, "account", *WINDOWS["month"], COSTS[0])
    assert month.notes == [BUCKET_NOTE]
    assert month.total["queue_wait_p95"] is not None
    exact = old_report(store, "account", *WINDOWS["inside a day"], COSTS[0])
    inside = new_report(store, "account", *WINDOWS["inside a day"], COSTS[0])
    assert inside.notes == []
    assert inside.total["jobs"] > 0
    assert [r["queue_wait_p95"] for r in [*inside.rows, inside.total]] == pytest.approx(
        [r["queue_wait_p95"] for r in [*exact.rows, exact.total]], rel=1e-12
    )


def test_a_job_across_both_ends_of_a_period_is_read_once(store: Store) -> None:
    """Not vacuous: in "one whole day" some job starts before it and ends after it."""
    since, until = WINDOWS["one whole day"]
    first, last = NOV + 14 * 24 * H, NOV + 15 * 24 * H
    cells = boundary_cells(store, since, until, first, last)
    across = cells[(cells["start_time"] < first) & (cells["end_time"] >= last)]
    assert len(across) > 0
    assert not cells.duplicated(["job_id", "restart", "node", "slot_kind", "share"]).any()


def _job_usage_reads(store: Store) -> Any:
    """A context that keeps the `job_usage` rows each read of the store returned."""
    import contextlib

    @contextlib.contextmanager
    def kept() -> Any:
        seen: list[Any] = []

        def keep(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
            if "FROM job_usage" in statement:
                seen.append((statement, params))

        sa.event.listen(store.engine, "before_cursor_execute", keep)
        try:
            yield seen
        finally:
            sa.event.remove(store.engine, "before_cursor_execute", keep)

    return kept()


def test_a_period_of_whole_days_reads_no_job_across_its_ends(store: Store) -> None:
    """A month's report reads no job across its ends from `job_usage` (revision 0013).

    The jobs across its start are in `usage_daily`, those across its end in
    `usage_across`. A job of 20 hours started 5 hours before the month, one of 30 hours
    started 6 before its end, and one of 40 days across both ends, are each counted once
    with their waits; every report (by owner, node, GPU model, slot; of the month, and
    from noon of its first day) is that of raw rows. Without `usage_across` the jobs
    across the end are not counted at all.
    """
    since, until = WINDOWS["month"]
    for job, start, hours in ((950, since - 5 * H, 20), (951, until - 6 * H, 30)):
        _job_across(store, job, start, start + hours * H)
    _job_across(store, 952, since - 5 * 24 * H, until + 5 * 24 * H)
    with store.reading("test") as conn:
        u = job_usage.c
        across = conn.execute(
            sa.select(sa.func.count(sa.distinct(u.job_id))).where(
                u.start_time < until, u.end_time > until
            )
        ).scalar_one()
    assert across >= 3
    with _job_usage_reads(store) as reads:
        new_report(store, "user", since, until, COSTS[0])
    with store.reading("test") as conn:
        for statement, params in reads:
            for row in conn.exec_driver_sql(statement, params).mappings():
                assert row["start_time"] >= until, row  # an instant at the end, at most
    # And from noon of its first day: the jobs started before it are read, 952 too, and
    # counted once.
    for a in (since, since + 12 * H):
        for group in ("user", "account", "node", "gpu_model", "slot"):
            for cost in (COSTS[0], COSTS[3]):
                assert_same_report(
                    old_report(store, group, a, until, cost),
                    new_report(store, group, a, until, cost),
                )
    expected = old_report(store, "account", since, until, COSTS[0]).total["jobs"]
    with store.writing("test") as conn:
        conn.execute(sa.delete(usage_across))
    assert new_report(store, "account", since, until, COSTS[0]).total["jobs"] < expected


def test_a_job_across_the_end_counts_where_it_ran_after_a_refold(store: Store) -> None:
    """A job across the month's end, refolded, is counted where it is now.

    A sacct sync moves it to another account, then ends it before the month's end: its
    count across the end moves, then goes.
    """
    since, until = WINDOWS["month"]
    _job_across(store, 955, until - 10 * H, until + 10 * H)
    store.upsert_jobs([{"job_id": 955, "account": "moved"}])
    report = new_report(store, "account", since, until, COSTS[0])
    assert "moved" in {r["key"] for r in report.rows}
    assert_same_report(old_report(store, "account", since, until, COSTS[0]), report)
    store.upsert_jobs([{"job_id": 955, "end_time": until - 2 * H}])
    with store.reading("test") as conn:
        a = usage_across.c
        assert not conn.execute(sa.select(a.day).where(a.account == "moved")).all()
    assert_same_report(
        old_report(store, "account", since, until, COSTS[0]),
        new_report(store, "account", since, until, COSTS[0]),
    )


def test_upgrade_to_0013_counts_the_jobs_across_each_midnight(store: Store) -> None:
    """The 0013 upgrade builds `usage_across` as ingest keeps it.

    At 0012 the report reads the jobs across the end one by one; after the upgrade it
    reads `usage_across`, and the reports are those of raw rows both ways.
    """
    ingested = _tables(store)
    downgrade(store, "0012")
    since, until = WINDOWS["month"]
    assert not rollup_reads.counts_across(store)
    assert_same_report(
        old_report(store, "account", since, until, COSTS[1]),
        new_report(store, "account", since, until, COSTS[1]),
    )
    store.upgrade()
    assert rollup_reads.counts_across(store)
    _approx_tables(ingested, _tables(store))
    assert_same_report(
        old_report(store, "gpu_model", since, until, COSTS[1]),
        new_report(store, "gpu_model", since, until, COSTS[1]),
    )


def test_report_command_says_where_queue_wait_p95_comes_from(store: Store, tmp_path: Path) -> None:
    """`slurm-gpu report accounts` says QueueWaitP95 came from buckets.

    Under a QueueWait column and in --json; a report without one has no note to make.
    """
    from click.testing import CliRunner

    from slurm_gpu.cli.main import cli

    config = tmp_path / "c.toml"
    config.write_text(
        f'[cluster]\nname = "c1"\n[store]\nurl = "{store.engine.url}"\n'
        "[reports]\nlive_sacct = false\n[access]\nslurm_roles = false\n"
    )
    period = ["-S", "2026-11-01T00:00", "-E", "2026-12-01T00:00"]

    def report(*args: str) -> str:
        done = CliRunner().invoke(cli, ["--config", str(config), "report", "accounts", *args])
        assert 0 == done.exit_code, done.output
        return done.output

    assert f"Note: {BUCKET_NOTE}" in report(*period, "-o", "Account,QueueWaitP95").splitlines()
    assert [BUCKET_NOTE] == json.loads(report(*period, "--json"))["notes"]
    assert "Note:" not in report(*period, "-o", "Account,GPUHours")


def _longest_folded(store: Store) -> float:
    with store.reading("test") as conn:
        u = job_usage.c
        return float(conn.execute(sa.select(sa.func.max(u.end_time - u.start_time))).scalar_one())


def _job_across(store: Store, job: int, start: float, end: float) -> None:
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
    store.add_summaries([_summary(job, 0, "gpu2", "GPU-gpu2-1", H100, start, end - start, rng)])


def test_a_job_longer_than_any_before_across_the_end_is_read(store: Store) -> None:
    """The reads of the jobs across an end reach back the longest job (revision 0012).

    A job of 53 days (the others: at most 50 hours) across the month's end, then one
    whose start a sacct sync moves 60 days back: each is read, counted once with its
    wait, and every report by user and account is that of raw rows.
    """
    since, until = WINDOWS["month"]
    assert rollup_reads.longest_job(store) == pytest.approx(_longest_folded(store))
    assert _longest_folded(store) <= 50 * H
    _job_across(store, 960, since - 20 * 24 * H, until + 3 * 24 * H)
    assert rollup_reads.longest_job(store) == pytest.approx(53 * 24 * H)
    cells = boundary_cells(store, since, until, since, until)
    assert 960 in set(cells["job_id"])
    store.upsert_jobs([{"job_id": 961, "start_time": until - 2 * H, "end_time": until + H}])
    _job_across(store, 961, until - 2 * H, until + H)
    store.upsert_jobs([{"job_id": 961, "start_time": until - 60 * 24 * H}])  # a sacct sync
    assert rollup_reads.longest_job(store) == pytest.approx(60 * 24 * H + H)
    cells = boundary_cells(store, since, until, since, until)
    assert {960, 961} <= set(cells["job_id"])
    for group in ("user", "account"):
        assert_same_report(
            old_report(store, group, since, until, COSTS[0]),
            new_report(store, group, since, until, COSTS[0]),
        )


def test_rebuild_and_upgrade_compute_the_longest_job_and_0011_reads_unbounded(
    store: Store,
) -> None:
    """`rebuild_rollups` and the 0011 -> 0012 upgrade set the exact longest job.

    A too long one (the job since shortened) is lowered by both; at 0011 the reads are
    those of before, and the reports still those of raw rows.
    """
    exact = _longest_folded(store)
    with store.writing("test") as conn:
        conn.execute(sa.update(usage_extent).values(longest_job_seconds=400 * 24 * H))
    store.rebuild_rollups()
    assert rollup_reads.longest_job(store) == pytest.approx(exact)
    downgrade(store, "0011")
    assert rollup_reads.longest_job(store) is None
    since, until = WINDOWS["month and days"]
    for group in ("user", "node"):
        assert_same_report(
            old_report(store, group, since, until, COSTS[1]),
            new_report(store, group, since, until, COSTS[1]),
        )
    store.upgrade()
    assert rollup_reads.longest_job(store) == pytest.approx(exact)


def test_the_jobs_across_an_end_are_a_range_of_start_times(store: Store) -> None:
    """SQLite answers every read of `boundary_cells` from a bounded range of start times.

    By end time (or by start time with no lower bound), a read would also pass every
    job that ended after the period (or started before it): a month's report would cost
    more with every month stored after it.
    """
    seen: list[tuple[str, Any]] = []

    def keep(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "FROM job_usage" in statement:
            seen.append((statement, params))

    sa.event.listen(store.engine, "before_cursor_execute", keep)
    try:
        for since, until in WINDOWS.values():
            first = math.ceil(since / (24 * H)) * 24 * H
            last = math.floor(until / (24 * H)) * 24 * H
            boundary_cells(store, since, until, first if first < last else None, last)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", keep)
    assert len(seen) >= len(WINDOWS)
    with store.reading("test") as conn:
        for statement, params in seen:
            plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params).all()
            # Both bounds: from the longest job before the end up to the period's end.
            bounded = "ix_job_usage_cluster_start_time_end_time (cluster=? AND start_time>? AND"
            assert any(bounded in str(row[-1]) for row in plan), (statement, plan)


def test_a_rebuild_holds_only_the_days_of_the_jobs_it_folds(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rebuild` writes each day once it is whole: memory follows a job's days, not the store.

    The store spans 36 days with jobs of at most 50 hours (3 days), their ids in no
    order of start; folded in order of start, 4 jobs at a time here, only the days from
    the first start of those 4 to the last day of their longest are held at once. The
    rollups are those written at ingest.
    """
    from slurm_gpu.store import usage_rollup

    held: list[int] = []
    fold = usage_rollup.fold_daily

    def spy(out: dict[tuple[Any, ...], dict[str, Any]], *args: Any, **kw: Any) -> None:
        fold(out, *args, **kw)
        held.append(len({row["day"] for row in out.values()}))

    monkeypatch.setattr(usage_rollup, "fold_daily", spy)
    monkeypatch.setattr(usage_rollup, "CHUNK", 4)  # jobs are folded 4 at a time, not 500
    ingested = _tables(store)
    store.rebuild_rollups()
    assert held and max(held) <= 8, held  # 4 jobs' start days and 3 days after, not 35
    _approx_tables(ingested, _tables(store))
    with store.reading("test") as conn:
        days = conn.execute(sa.select(sa.func.count(sa.distinct(usage_daily.c.day)))).scalar_one()
    assert days > 30
