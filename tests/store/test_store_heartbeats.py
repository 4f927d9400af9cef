# The project writes `expected == actual` (DESIGN.md); ruff calls that a Yoda condition.
"""Revision 0011 on every backend: node heartbeats carry activity rows forward (issue 16).

`Store.add_heartbeats` keeps each node's newest heartbeat (an older or repeated one never
moves it back); `Store.activity` shows each activity row read up to its node's heartbeat
where that lists the row's slot, and as stored otherwise. A store at 0010 with activity
rows upgrades to 0011 and reads them as before until a heartbeat arrives.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from slurm_gpu.models import GpuActivity, NodeHeartbeat, SlotKind
from slurm_gpu.store import Store

T0 = 1_800_000_000.0
MIG = "MIG-1c2d"


def activity(job: int, node: str = "gpu1", uuid: str = "GPU-0", **fields: object) -> GpuActivity:
    values: dict[str, object] = {
        "job_id": job,
        "node": node,
        "gpu_uuid": uuid,
        "slurm_index": 0,
        "start": T0,
        "last_reading": T0 + 30,
        "last_active": None,
        "util_recent_percent": 0.0,
        "mem_used_bytes": 2**30,
        "process_count": 1,
        "measured_since": T0,
    }
    values.update(fields)
    return GpuActivity(**values)  # type: ignore[arg-type]


def readings(store: Store) -> dict[int, tuple[float, float | None, float | None]]:
    """job -> (last_reading, last_active, last_sm_active) as Store.activity shows them."""
    return {r.job_id: (r.last_reading, r.last_active, r.last_sm_active) for r in store.activity()}


def test_heartbeat_carries_a_listed_slot_to_its_tick(store: Store) -> None:
    """gpu1 read GPU-0 at T0+300: job 7's row (read T0+30) shows T0+300, its figures kept."""
    row = activity(7)
    store.add_activity([row])
    store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 300, ("GPU-0", "GPU-1"))])

    (shown,) = store.activity()
    assert GpuActivity(**{**vars(row), "last_reading": T0 + 300}) == shown


def test_active_at_its_reading_stays_active_to_the_tick(store: Store) -> None:
    """last_active (and last_sm_active) equal to the row's reading move with it; older ones stay."""
    store.add_activity(
        [
            activity(7, last_active=T0 + 30, last_sm_active=T0 + 30),
            activity(8, uuid="GPU-1", last_active=T0 + 12, last_sm_active=T0 + 30),
        ]
    )
    store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 300, ("GPU-0", "GPU-1"))])

    assert {7: (T0 + 300, T0 + 300, T0 + 300), 8: (T0 + 300, T0 + 12, T0 + 300)} == readings(store)


def test_a_slot_or_node_the_heartbeat_does_not_vouch_for_stays_as_stored(store: Store) -> None:
    """GPU-1 not in gpu1's heartbeat (lost), gpu2 without any, gpu3's older than its row."""
    store.add_activity(
        [
            activity(7),
            activity(8, uuid="GPU-1"),
            activity(9, node="gpu2"),
            activity(10, node="gpu3", last_reading=T0 + 400),
        ]
    )
    store.add_heartbeats(
        [NodeHeartbeat("gpu1", T0 + 300, ("GPU-0",)), NodeHeartbeat("gpu3", T0 + 300, ("GPU-0",))]
    )

    shown = {job: reading for job, (reading, _, _) in readings(store).items()}
    assert {7: T0 + 300, 8: T0 + 30, 9: T0 + 30, 10: T0 + 400} == shown


def test_a_slot_row_is_carried_by_its_slot_id(store: Store) -> None:
    """A MIG slice's row is vouched for by its MIG UUID, not by its parent GPU's."""
    mig: dict[str, object] = {
        "slot_id": MIG, "slot_kind": SlotKind.MIG, "mig_profile": "1g.10gb", "share": 1 / 7,
    }  # fmt: skip
    other = activity(8, uuid="GPU-1", slot_id="MIG-other", slot_kind=SlotKind.MIG)
    store.add_activity([activity(7, "gpu1", "GPU-0", **mig), other])
    store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 300, ("GPU-0", "GPU-1", MIG))])

    shown = {job: reading for job, (reading, _, _) in readings(store).items()}
    assert {7: T0 + 300, 8: T0 + 30} == shown


def test_an_older_heartbeat_never_moves_a_node_back(store: Store) -> None:
    """T0+300 then (late, or shipped twice) T0+200 and T0+300 again: T0+300 and its slots stay.

    A newer one replaces tick and slots together; two of a node in one call keep the newer.
    """
    store.add_activity([activity(7), activity(8, uuid="GPU-1")])
    store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 300, ("GPU-0", "GPU-1"))])
    store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 200, ("GPU-0",))])
    store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 300, ())])
    kept = {job: reading for job, (reading, _, _) in readings(store).items()}
    store.add_heartbeats(
        [NodeHeartbeat("gpu1", T0 + 400, ("GPU-1",)), NodeHeartbeat("gpu1", T0 + 350, ("GPU-0",))]
    )
    newer = {job: reading for job, (reading, _, _) in readings(store).items()}

    assert ({7: T0 + 300, 8: T0 + 300}, {7: T0 + 30, 8: T0 + 400}) == (kept, newer)


def test_heartbeats_are_the_clusters_own(store: Store, store_url: str) -> None:
    """Another cluster's heartbeat of a node of the same name vouches for nothing here."""
    other = Store(store_url, cluster="beta")
    try:
        store.add_activity([activity(7)])
        other.add_heartbeats([NodeHeartbeat("gpu1", T0 + 300, ("GPU-0",))])
        assert {7: T0 + 30} == {j: r for j, (r, _, _) in readings(store).items()}
    finally:
        other.dispose()


def test_a_new_row_is_shown_as_stored_until_a_newer_heartbeat(store: Store) -> None:
    """A row read after the heartbeat is newer than it: its own reading shows."""
    store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 300, ("GPU-0",))])
    store.add_activity([activity(7, last_reading=T0 + 330, util_recent_percent=80.0)])

    (shown,) = store.activity([7])
    assert (T0 + 330, 80.0) == (shown.last_reading, shown.util_recent_percent)


@pytest.fixture
def store_at_0010(store_url: str) -> Iterator[Store]:
    old = Store(store_url, cluster="alpha")
    old.upgrade("0010")
    yield old
    old.dispose()


def test_upgrade_from_0010_keeps_activity_and_then_takes_heartbeats(store_at_0010: Store) -> None:
    """0010 -> 0011: the activity rows read as they were written; a heartbeat then carries them."""
    store = store_at_0010
    with store.writing("activity at 0010") as conn:
        assert "node_heartbeats" not in set(sa.inspect(conn).get_table_names())
    rows = [activity(7), activity(8, uuid="GPU-1")]
    store.add_activity(rows)  # gpu_activity is the same at 0010 and 0011

    store.upgrade("0011")
    after = store.activity()
    store.add_heartbeats([NodeHeartbeat("gpu1", T0 + 300, ("GPU-0",))])

    assert ("0011", rows) == (store.current_revision(), after)
    assert {7: T0 + 300, 8: T0 + 30} == {j: r for j, (r, _, _) in readings(store).items()}


def test_many_nodes_are_carried_each_by_its_own_heartbeat(store: Store) -> None:
    """600 nodes (beyond the IN list): each row carried by its node's heartbeat alone."""
    nodes = [f"n{i:03d}" for i in range(600)]
    store.add_activity([activity(i, node=node) for i, node in enumerate(nodes)])
    store.add_heartbeats(
        [NodeHeartbeat(node, T0 + 100 + i, ("GPU-0",)) for i, node in enumerate(nodes)]
    )
    store.add_heartbeats([NodeHeartbeat("elsewhere", T0 + 900, ("GPU-0",))])

    expected = {i: T0 + 100 + i for i in range(600)}
    assert expected == {j: r for j, (r, _, _) in readings(store).items()}
    assert {7: T0 + 107} == {r.job_id: r.last_reading for r in store.activity([7])}


def test_a_nodes_summary_forgets_only_that_nodes_rows(store: Store) -> None:
    """Job 7 runs on gpu1 and gpu2; gpu1's part ends: gpu2's row stays for the controller.

    gpu2's agent ships that row again only when it changes, so deleting it with gpu1's would
    leave gpu2's still-running part unknown until then.
    """
    store.add_activity([activity(7, "gpu1"), activity(7, "gpu2", "GPU-9")])
    store.forget_activity([7], "gpu1")
    assert [(7, "gpu2")] == [(r.job_id, r.node) for r in store.activity()]
    store.forget_activity([7])
    assert [] == store.activity()
