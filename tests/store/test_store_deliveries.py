"""Revision 0007 on every backend: what the monthly delivery mailed (`store.deliveries`).

A delivery is claimed once per (month, kind, account, recipient) and cluster; a resend
claims it again and records the new time; a release puts back what was recorded before.
A store at 0006 upgrades to 0007 with every row kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from slurm_gpu.models import Action, GpuInterval, JobGpuSummary, Verdict
from slurm_gpu.store import Store, convert
from slurm_gpu.store.deliveries import Delivery
from slurm_gpu.store.schema import ALL_TABLES

T0 = 1_790_000_000.0


def delivery(recipient: str = "dana@example.org", time: float = T0, **kw: Any) -> Delivery:
    fields = {"month": "2026-11", "kind": "statement", "account": "physics"} | kw
    return Delivery(recipient=recipient, time=time, message_id=f"<{time}@example.org>", **fields)


def test_a_delivery_is_claimed_once(store: Store) -> None:
    """The first claim wins; a second one is refused and names the first's time."""
    assert (True, None) == store.deliveries.claim(delivery())
    assert (False, delivery()) == store.deliveries.claim(delivery(time=T0 + 60))
    assert [delivery()] == store.deliveries.sent("2026-11")


def test_month_kind_account_and_recipient_each_make_a_delivery_of_their_own(store: Store) -> None:
    """Another month, kind, account or recipient is another message."""
    others = [
        delivery(),
        delivery(month="2026-10"),
        delivery(kind="report", account=""),
        delivery(account="bio"),
        delivery("erin@example.org"),
    ]
    assert [(True, None)] * 5 == [store.deliveries.claim(d) for d in others]
    assert 4 == len(store.deliveries.sent("2026-11"))


def test_resend_claims_again_and_a_failed_resend_keeps_the_first_record(store: Store) -> None:
    """A resend records its own time; released, the row says the first sending again."""
    store.deliveries.claim(delivery())
    again = delivery(time=T0 + 3600)
    assert (True, delivery()) == store.deliveries.claim(again, resend=True)
    assert [again] == store.deliveries.sent("2026-11")
    store.deliveries.release(again, delivery())
    assert [delivery()] == store.deliveries.sent("2026-11")


def test_a_released_claim_is_forgotten(store: Store) -> None:
    """A message that did not go out is claimed again by the next run."""
    store.deliveries.claim(delivery())
    store.deliveries.release(delivery())
    assert [] == store.deliveries.sent("2026-11")
    assert (True, None) == store.deliveries.claim(delivery())


def test_clusters_sharing_a_store_keep_their_own_record(store_url: str) -> None:
    """Cluster beta's delivery of physics is not alpha's."""
    alpha, beta = Store(store_url, cluster="alpha"), Store(store_url, cluster="beta")
    try:
        alpha.upgrade()
        alpha.deliveries.claim(delivery())
        assert ([], (True, None)) == (beta.deliveries.sent("2026-11"),
                                      beta.deliveries.claim(delivery()))  # fmt: skip
    finally:
        alpha.dispose()
        beta.dispose()


# ---------------------------------------------------------------------- migration


@pytest.fixture
def store_at_0006(store_url: str) -> Iterator[Store]:
    old = Store(store_url, cluster="alpha")
    old.upgrade("0006")
    yield old
    old.dispose()


def _dump(conn: sa.Connection, names: set[str]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the tables `names`, every column, in key order."""
    out = {}
    inspector = sa.inspect(conn)
    for table in ALL_TABLES:
        if table.name in names:
            # The columns the database has (a later revision's are not there yet), key
            # first: one order at any revision (slot_id, 0009, replaced gpu_uuid in keys).
            present = [table.c[c["name"]] for c in inspector.get_columns(table.name)]
            keys = [c for c in table.primary_key.columns if c in present]
            query = sa.select(*present).order_by(*keys, *(c for c in present if c not in keys))
            out[table.name] = [tuple(r) for r in conn.execute(query)]
    return out


def _insert_present(conn: sa.Connection, table: str, row: dict[str, Any]) -> None:
    """Insert `row`'s values of the columns `table` has at the database's revision."""
    present = {c["name"] for c in sa.inspect(conn).get_columns(table)}
    kept = {k: v for k, v in row.items() if k in present}
    conn.execute(sa.insert(sa.table(table, *map(sa.column, kept))), [kept])


def test_upgrade_from_0006_keeps_every_row(store_at_0006: Store) -> None:
    """0006 -> 0007: every table's rows identical after it, and deliveries start empty."""
    store = store_at_0006
    job = {"cluster": "alpha", "job_id": 42, "user": "alice", "account": "physics", "gpus": 1,
           "start_time": T0, "end_time": T0 + 60}  # fmt: skip
    with store.writing("a job at 0006") as conn:  # jobs as 0006 has it (no sluid, 0008)
        conn.execute(sa.insert(sa.table("jobs", *map(sa.column, job))), [job])
    interval = GpuInterval(node="gpu1", gpu_uuid="GPU-1", period_start=T0, period_end=T0 + 60,
                           job_id=42, util_mean_percent=50.0, util_max_percent=60.0,
                           util_min_percent=40.0, util_sample_count=6, active_seconds=30.0,
                           covered_seconds=60.0, mem_used_max_bytes=2**30,
                           mem_total_bytes=2**34, power_mean_watts=200.0,
                           energy_joules=12_000.0, temperature_max_celsius=50.0,
                           ecc_errors_total=0)  # fmt: skip
    summary = JobGpuSummary(job_id=42, node="gpu1", gpu_uuid="GPU-1", gpu_model="NVIDIA A100",
                            start=T0, end=T0 + 60, gpu_seconds=60.0, util_mean_percent=50.0,
                            util_max_percent=60.0, active_seconds=30.0, mem_max_bytes=2**30,
                            mem_gib_seconds=60.0, energy_joules=12_000.0, reading_count=6,
                            missing_seconds=0.0, user="alice", account="physics")  # fmt: skip
    with store.writing("rows at 0006") as conn:  # the columns 0006 has (no slots, 0009)
        _insert_present(conn, "gpu_intervals", convert.interval_to_row(interval))
        _insert_present(conn, "job_gpu_summaries", convert.summary_to_row(summary, "alpha"))
    verdict = Verdict("idle_gpu", Action.WARN, "job:42", "idle", job_id=42, user="alice")
    store.control.audit([verdict], time=T0, cycle="c", controller="h", dry_run=False,
                        outcome="recorded")  # fmt: skip
    store.control.claim_notification("job:42:idle_gpu:warn", "alice", T0, "email")
    with store.reading("tables at 0006") as conn:
        names = set(sa.inspect(conn).get_table_names())
        before = _dump(conn, names)
    assert "report_deliveries" not in names
    assert all(before[t] for t in ("jobs", "gpu_intervals", "job_gpu_summaries", "audit_log",
                                   "notifications"))  # fmt: skip

    store.upgrade("0007")
    assert "0007" == store.current_revision()
    with store.reading("tables at 0007") as conn:
        assert before == _dump(conn, names)
    assert [] == store.deliveries.sent("2026-11")
    assert (True, None) == store.deliveries.claim(delivery())
