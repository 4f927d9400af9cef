"""The usage rollups (revisions 0010-0015, issues 16 and 24): their fold, and reports from them.

On the synthetic store of tests/synthetic_usage.py: the rollups that ingest writes are
those that a rebuild (`rebuild_rollups`, `slurm-gpu db rebuild-rollups`) and the refold
at the end of an upgrade (from 0009, 0011, 0012) write; a changed job is refolded; the
jobs across each midnight are counted (`usage_across`) and the longest job kept
(`usage_extent`), so that a period's report reads its ends as ranges of start times and
a month's no job one by one; a rebuild holds only a few days at once. A report needs the
store at the head revision.

`slurm-gpu report` has one road: the rollups of folded jobs and the raw rows of the
others. Every report group, over a UTC month, windows that cut days and one inside a day,
under every [cost] unit and charge, with -u/-A/-r and for a scoped user, is the same from
each source of sums (tests/usage_sources.py: folded, raw-only, half-folded), the queue
wait p95 from the rollups' buckets within one bucket of the raw source's exact one.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from slurm_gpu.access import Caller, Scope
from slurm_gpu.errors import StoreError
from slurm_gpu.reports.grouped import BUCKET_NOTE
from slurm_gpu.reports.rollups import boundary_cells
from slurm_gpu.reports.summary import GROUP_KEYS, Report
from slurm_gpu.reports.usage import JobFilter
from slurm_gpu.store import Store, rollup_reads
from slurm_gpu.store.schema import (
    job_usage,
    usage_across,
    usage_daily,
    usage_extent,
    usage_monthly,
    usage_unfolded,
)
from tests.synthetic_usage import (
    COSTS,
    NOV,
    WINDOWS,
    H,
    approx_tables,
    assert_same_reports,
    copied,
    downgrade,
    job_across,
    longest_folded,
    report,
    suspensions,
    synthetic_file,
    tables,
)
from tests.usage_sources import by_source


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_file(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture
def store(synthetic: Path, tmp_path: Path) -> Iterator[Store]:
    """A copy of the synthetic store (tests/synthetic_usage.py), folded as ingest left it."""
    with copied(synthetic, tmp_path) as s:
        yield s


@pytest.mark.parametrize("window", list(WINDOWS))
def test_every_group_is_the_same_from_every_source(store: Store, window: str) -> None:
    """Every report group, over whole days and cut days, under every [cost] unit/charge."""
    since, until = WINDOWS[window]
    reports = by_source(
        store,
        lambda s: {
            (group, n): report(s, group, since, until, cost)
            for group in GROUP_KEYS.values()
            for n, cost in enumerate(COSTS)
        },
    )
    assert_same_reports(reports)
    assert reports["folded"][("user", 0)].total["jobs"] > 0  # not vacuous


def test_user_account_partition_filters_are_the_same_from_every_source(store: Store) -> None:
    """-u/-A/-r select the same usage from the rollups as from raw rows."""
    filters = JobFilter(users=("u1", "u3"), accounts=("acct0", "acct1"), partitions=("gpu",))
    since, until = WINDOWS["cut days"]
    reports = by_source(
        store,
        lambda s: {
            g: report(s, g, since, until, COSTS[1], filters) for g in ("user", "node", "slot")
        },
    )
    assert_same_reports(reports)
    assert {r["key"] for r in reports["folded"]["user"].rows} <= {"u1", "u3"}


def test_a_scoped_report_is_the_same_from_every_source(store: Store) -> None:
    """A user who coordinates an account sees the same rows from every source."""
    scope = Scope(Caller(1001, "u1"), False, frozenset({"acct2"}), reason="coordinator")
    since, until = WINDOWS["cut days"]
    reports = by_source(
        store,
        lambda s: {
            g: report(s, g, since, until, COSTS[0], scope=scope) for g in ("user", "account")
        },
    )
    assert_same_reports(reports)
    everyone = report(store, "account", since, until, COSTS[0])
    scoped = reports["folded"]["account"].total["gpu_hours"]
    assert 0 < scoped < everyone.total["gpu_hours"]  # not vacuous


def test_rebuilt_rollups_equal_those_written_at_ingest(store: Store) -> None:
    """`rebuild_rollups` (all, and --since a day) writes what ingest wrote."""
    ingested = tables(store)
    assert ingested["job_usage"] and ingested["usage_daily"] and ingested["usage_monthly"]
    assert ingested["usage_across"]
    # The running job and the ended one whose summary never came: read from raw rows.
    assert [r[1] for r in ingested["usage_unfolded"]] == [900, 901]
    store.rebuild_rollups()
    approx_tables(ingested, tables(store))
    store.rebuild_rollups(since=NOV + 10.5 * 24 * H)
    approx_tables(ingested, tables(store))


def test_changed_job_facts_refold_the_rollups(store: Store) -> None:
    """A job moved to another account and time (sacct sync) moves its usage with it."""
    store.upsert_jobs(
        [{"job_id": 104, "account": "moved", "start_time": NOV + 3 * H, "end_time": NOV + 40 * H}]
    )
    after = tables(store)
    store.rebuild_rollups()
    approx_tables(after, tables(store))
    since, until = WINDOWS["month"]
    reports = by_source(store, lambda s: {"account": report(s, "account", since, until, COSTS[0])})
    assert_same_reports(reports)
    assert "moved" in {r["key"] for r in reports["folded"]["account"].rows}


def test_upgrade_from_0009_builds_the_rollups(store: Store) -> None:
    """A store at 0009 upgraded to the head gets its rollups built, and the same reports.

    The migrations fold nothing themselves: the upgrade refolds once at its end.
    """
    ingested = tables(store)
    suspended = suspensions(store)
    downgrade(store, "0009")
    store.upgrade()
    assert store.head_revision() == store.current_revision()
    store.upsert_jobs(suspended)  # `slurm-gpu sync`: sacct's Suspended, dropped below 0016
    approx_tables(ingested, tables(store))
    since, until = WINDOWS["cut days"]
    assert_same_reports(
        by_source(store, lambda s: {"slot": report(s, "slot", since, until, COSTS[1])})
    )


def test_a_report_below_the_head_revision_asks_for_db_upgrade(store: Store) -> None:
    """A report of a store below the head refuses, naming `slurm-gpu db upgrade`.

    The rollups hold the sums of the newest revision. At 0012 (no `usage_across`), the
    report refuses; the upgrade counts the jobs across each midnight as ingest does, and
    the reports are then the same from every source.
    """
    ingested = tables(store)
    suspended = suspensions(store)
    downgrade(store, "0012")
    since, until = WINDOWS["month"]
    with Store(str(store.engine.url), cluster="c1") as old:
        with pytest.raises(StoreError, match="slurm-gpu db upgrade"):
            report(old, "account", since, until, COSTS[1])
        old.upgrade()
        old.upsert_jobs(suspended)  # `slurm-gpu sync`: sacct's Suspended, dropped below 0016
        approx_tables(ingested, tables(old))
        assert_same_reports(
            by_source(old, lambda s: {"gpu_model": report(s, "gpu_model", since, until, COSTS[1])})
        )


def test_db_rebuild_rollups_command_rebuilds_them(store: Store) -> None:
    """`slurm-gpu db rebuild-rollups [--since DATE]` rewrites the rollups ingest wrote."""
    from click.testing import CliRunner

    from slurm_gpu.cli.main import cli

    ingested = tables(store)
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
    approx_tables(ingested, tables(store))
    result = CliRunner().invoke(
        cli, ["db", "rebuild-rollups", "--url", url, "--since", "2026-11-20"]
    )
    assert result.exit_code == 0, result.output
    approx_tables(ingested, tables(store))
    result = CliRunner().invoke(cli, ["db", "rebuild-rollups", "--url", url, "--since", "nope"])
    assert result.exit_code == 2
    assert "--since" in result.output


def test_queue_wait_p95_from_buckets_is_said_and_exact_without_them(store: Store) -> None:
    """The report says where its p95 comes from buckets; inside a day it is exact.

    Over the month, the folded jobs' waits come from the rollups' buckets (and the report
    says so); with no job folded, none does. Inside a day every job is counted one by one
    from its `job_usage` rows: the p95 is that of raw rows from every source.
    """

    def build(s: Store) -> dict[str, Report]:
        return {w: report(s, "account", *WINDOWS[w], COSTS[0]) for w in ("month", "inside a day")}

    reports = by_source(store, build)
    assert reports["folded"]["month"].notes == [BUCKET_NOTE]
    assert reports["half"]["month"].notes == [BUCKET_NOTE]
    assert reports["raw"]["month"].notes == []
    assert reports["folded"]["month"].total["queue_wait_p95"] is not None
    exact = reports["raw"]["inside a day"]
    assert exact.total["jobs"] > 0
    for source in ("folded", "half"):
        inside = reports[source]["inside a day"]
        assert inside.notes == []
        assert [r["queue_wait_p95"] for r in [*inside.rows, inside.total]] == pytest.approx(
            [r["queue_wait_p95"] for r in [*exact.rows, exact.total]], rel=1e-12
        ), source
    assert_same_reports(reports)


def test_a_job_across_both_ends_of_a_period_is_read_once(store: Store) -> None:
    """Not vacuous: in "one whole day" some job starts before it and ends after it."""
    since, until = WINDOWS["one whole day"]
    first, last = NOV + 14 * 24 * H, NOV + 15 * 24 * H
    cells = boundary_cells(store, since, until, first, last)
    across = cells[(cells["start_time"] < first) & (cells["end_time"] >= last)]
    assert len(across) > 0
    assert not cells.duplicated(["job_id", "restart", "node", "slot_kind", "share"]).any()


@contextlib.contextmanager
def job_usage_reads(store: Store) -> Iterator[list[tuple[str, Any]]]:
    """The statements (and parameters) of every read of `job_usage` inside the block."""
    seen: list[tuple[str, Any]] = []

    def keep(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "FROM job_usage" in statement:
            seen.append((statement, params))

    sa.event.listen(store.engine, "before_cursor_execute", keep)
    try:
        yield seen
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", keep)


def test_a_period_of_whole_days_reads_no_job_across_its_ends(store: Store) -> None:
    """A month's report reads no job across its ends from `job_usage` (revision 0013).

    The jobs across its start are in `usage_daily`, those across its end in
    `usage_across`. A job of 20 hours started 5 hours before the month, one of 30 hours
    started 6 before its end, and one of 40 days across both ends, are each counted once
    with their waits; every report (by owner, node, GPU model, slot; of the month, and
    from noon of its first day) is the same from every source. Without `usage_across`
    the jobs across the end are not counted at all.
    """
    since, until = WINDOWS["month"]
    for job, start, hours in ((950, since - 5 * H, 20), (951, until - 6 * H, 30)):
        job_across(store, job, start, start + hours * H)
    job_across(store, 952, since - 5 * 24 * H, until + 5 * 24 * H)
    with store.reading("test") as conn:
        u = job_usage.c
        across = conn.execute(
            sa.select(sa.func.count(sa.distinct(u.job_id))).where(
                u.start_time < until, u.end_time > until
            )
        ).scalar_one()
    assert across >= 3
    with job_usage_reads(store) as reads:
        report(store, "user", since, until, COSTS[0])
    with store.reading("test") as conn:
        for statement, params in reads:
            for row in conn.exec_driver_sql(statement, params).mappings():
                assert row["start_time"] >= until, row  # an instant at the end, at most
    # And from noon of its first day: the jobs started before it are read, 952 too, and
    # counted once.
    reports = by_source(
        store,
        lambda s: {
            (a, group, n): report(s, group, a, until, COSTS[n])
            for a in (since, since + 12 * H)
            for group in ("user", "account", "node", "gpu_model", "slot")
            for n in (0, 3)
        },
    )
    assert_same_reports(reports)
    expected = reports["raw"][(since, "account", 0)].total["jobs"]
    with store.writing("test") as conn:
        conn.execute(sa.delete(usage_across))
    assert report(store, "account", since, until, COSTS[0]).total["jobs"] < expected


def test_a_job_across_the_end_counts_where_it_ran_after_a_refold(store: Store) -> None:
    """A job across the month's end, refolded, is counted where it is now.

    A sacct sync moves it to another account, then ends it before the month's end: its
    count across the end moves, then goes.
    """
    since, until = WINDOWS["month"]
    job_across(store, 955, until - 10 * H, until + 10 * H)
    store.upsert_jobs([{"job_id": 955, "account": "moved"}])

    def build(s: Store) -> dict[str, Report]:
        return {"account": report(s, "account", since, until, COSTS[0])}

    moved = by_source(store, build)
    assert "moved" in {r["key"] for r in moved["folded"]["account"].rows}
    assert_same_reports(moved)
    store.upsert_jobs([{"job_id": 955, "end_time": until - 2 * H}])
    with store.reading("test") as conn:
        a = usage_across.c
        assert not conn.execute(sa.select(a.day).where(a.account == "moved")).all()
    assert_same_reports(by_source(store, build))


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

    def run(*args: str) -> str:
        done = CliRunner().invoke(cli, ["--config", str(config), "report", "accounts", *args])
        assert 0 == done.exit_code, done.output
        return done.output

    assert f"Note: {BUCKET_NOTE}" in run(*period, "-o", "Account,QueueWaitP95").splitlines()
    assert [BUCKET_NOTE] == json.loads(run(*period, "--json"))["notes"]
    assert "Note:" not in run(*period, "-o", "Account,GPUHours")


def test_a_job_longer_than_any_before_across_the_end_is_read(store: Store) -> None:
    """The reads of the jobs across an end reach back the longest job (revision 0012).

    A job of 53 days (the others: at most 50 hours) across the month's end, then one
    whose start a sacct sync moves 60 days back: each is read, counted once with its
    wait, and every report by user and account is the same from every source.
    """
    since, until = WINDOWS["month"]
    assert rollup_reads.longest_job(store) == pytest.approx(longest_folded(store))
    assert longest_folded(store) <= 50 * H
    job_across(store, 960, since - 20 * 24 * H, until + 3 * 24 * H)
    assert rollup_reads.longest_job(store) == pytest.approx(53 * 24 * H)
    cells = boundary_cells(store, since, until, since, until)
    assert 960 in set(cells["job_id"])
    store.upsert_jobs([{"job_id": 961, "start_time": until - 2 * H, "end_time": until + H}])
    job_across(store, 961, until - 2 * H, until + H)
    store.upsert_jobs([{"job_id": 961, "start_time": until - 60 * 24 * H}])  # a sacct sync
    assert rollup_reads.longest_job(store) == pytest.approx(60 * 24 * H + H)
    cells = boundary_cells(store, since, until, since, until)
    assert {960, 961} <= set(cells["job_id"])
    assert_same_reports(
        by_source(
            store, lambda s: {g: report(s, g, since, until, COSTS[0]) for g in ("user", "account")}
        )
    )


def test_rebuild_and_upgrade_compute_the_longest_job(store: Store) -> None:
    """`rebuild_rollups` and the refold after an upgrade from 0011 set the exact longest job.

    A too long one (the job since shortened) is lowered by the rebuild; an upgrade from
    0011 (no `usage_extent`) computes it, and the reports are the same from every source.
    An empty store's longest job is 0 (nothing folded: no job across an end).
    """
    exact = longest_folded(store)
    with store.writing("test") as conn:
        conn.execute(sa.update(usage_extent).values(longest_job_seconds=400 * 24 * H))
    store.rebuild_rollups()
    assert rollup_reads.longest_job(store) == pytest.approx(exact)
    downgrade(store, "0011")
    store.upgrade()
    assert rollup_reads.longest_job(store) == pytest.approx(exact)
    since, until = WINDOWS["month and days"]
    assert_same_reports(
        by_source(
            store, lambda s: {g: report(s, g, since, until, COSTS[1]) for g in ("user", "node")}
        )
    )
    with store.writing("test") as conn:
        conn.execute(sa.delete(usage_extent))
    assert rollup_reads.longest_job(store) == 0.0


def test_the_jobs_across_an_end_are_a_range_of_start_times(store: Store) -> None:
    """SQLite answers every read of `boundary_cells` from a bounded range of start times.

    By end time (or by start time with no lower bound), a read would also pass every
    job that ended after the period (or started before it): a month's report would cost
    more with every month stored after it.
    """
    with job_usage_reads(store) as seen:
        for since, until in WINDOWS.values():
            first = math.ceil(since / (24 * H)) * 24 * H
            last = math.floor(until / (24 * H)) * 24 * H
            boundary_cells(store, since, until, first if first < last else None, last)
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
    ingested = tables(store)
    store.rebuild_rollups()
    assert held and max(held) <= 8, held  # 4 jobs' start days and 3 days after, not 35
    approx_tables(ingested, tables(store))
    with store.reading("test") as conn:
        days = conn.execute(sa.select(sa.func.count(sa.distinct(usage_daily.c.day)))).scalar_one()
    assert days > 30
