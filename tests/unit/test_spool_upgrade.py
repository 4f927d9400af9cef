"""A spool left by an earlier release is read and shipped by this agent, nothing lost.

The agent is upgraded on nodes whose spool still holds rows (a store outage, jobs running
across the upgrade). `PREVIOUS_LAYOUT` and the `INSERT`s below are the previous release's
DDL and row shapes as it wrote them (unversioned, positional), copied here on purpose:
they must not follow later changes to spool.py, or this test would prove nothing.
`LAYOUT_2` is the same for the release before GPM (issue #13): layout 2, runs of
requeued jobs, before the GPM columns of layout 3.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.models import (
    GpuActivity,
    GpuDevice,
    GpuInterval,
    GpuPhysicalInterval,
    JobEvent,
    JobEventKind,
    JobGpuSummary,
    NodeHeartbeat,
)
from slurm_gpu.node.attribution import JobSpan, Piece
from slurm_gpu.node.shipper import DecodedBatch, Shipper
from slurm_gpu.node.spool import SCHEMA_VERSION, Spool, SpoolError
from slurm_gpu.node.spool_layout import MIGRATIONS

T0 = 1_800_000_000.0
GIB = 2**30

# slurm_gpu/node/spool.py's SCHEMA before spool versions (user_version 0).
PREVIOUS_LAYOUT = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    key TEXT NOT NULL UNIQUE,
    payload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pieces (
    uuid TEXT NOT NULL, job_id INTEGER NOT NULL, period_start REAL NOT NULL,
    start REAL NOT NULL, end REAL NOT NULL,
    util_sum REAL NOT NULL, util_count INTEGER NOT NULL,
    util_max REAL, util_min REAL, active_seconds REAL NOT NULL,
    covered_seconds REAL NOT NULL, mem_max INTEGER, mem_total INTEGER,
    power_joules REAL, power_seconds REAL NOT NULL, energy REAL,
    temp_max REAL, ecc INTEGER, unallocated TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (uuid, job_id, period_start)
);
CREATE TABLE IF NOT EXISTS spans (
    job_id INTEGER NOT NULL, slurm_index INTEGER NOT NULL,
    start REAL NOT NULL, end REAL, user TEXT, account TEXT, partition TEXT,
    PRIMARY KEY (job_id, slurm_index)
);
CREATE TABLE IF NOT EXISTS job_acc (
    job_id INTEGER NOT NULL, uuid TEXT NOT NULL, model TEXT NOT NULL,
    covered REAL NOT NULL DEFAULT 0, util_sum REAL NOT NULL DEFAULT 0,
    util_count INTEGER NOT NULL DEFAULT 0, util_max REAL,
    active_seconds REAL NOT NULL DEFAULT 0, mem_max INTEGER,
    mem_gib_seconds REAL NOT NULL DEFAULT 0, energy REAL, readings INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, uuid)
);
CREATE TABLE IF NOT EXISTS gpu_state (
    uuid TEXT PRIMARY KEY, last_read REAL, last_sample REAL, last_energy REAL
);
CREATE TABLE IF NOT EXISTS quarantine (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    error TEXT NOT NULL,
    quarantined_at REAL NOT NULL
);
"""

# Outbox payloads as the previous release encoded them (json.dumps of the models' fields).
EVENT: dict[str, Any] = {
    "node": "gpu1",
    "job_id": 7,
    "kind": "started",
    "time": T0,
    "user": "alice",
    "uid": 1001,
    "account": "physics",
    "partition": "gpu",
    "gpu_indices": [0],
    "array_job_id": None,
    "array_task_id": None,
    "het_job_id": None,
    "het_job_offset": None,
    "exit_code": None,
}
INVENTORY: dict[str, Any] = {
    "devices": [
        {
            "uuid": "GPU-A",
            "name": "NVIDIA A100",
            "minor": 0,
            "nvml_index": 0,
            "pci_bus_id": "00:01",
            "memory_total_bytes": 80 * GIB,
        }
    ],
    "seen_at": T0,
}
ACTIVITY: dict[str, Any] = {
    "job_id": 7,
    "node": "gpu1",
    "gpu_uuid": "GPU-A",
    "slurm_index": 0,
    "start": T0,
    "last_reading": T0 + 60,
    "last_active": T0 + 59,
    "util_recent_percent": 50.0,
    "mem_used_bytes": GIB,
    "process_count": 1,
}
INTERVAL: dict[str, Any] = {
    "node": "gpu1",
    "gpu_uuid": "GPU-A",
    "period_start": T0,
    "period_end": T0 + 60,
    "job_id": 7,
    "util_mean_percent": 50.0,
    "util_max_percent": 90.0,
    "util_min_percent": 10.0,
    "util_sample_count": 6,
    "active_seconds": 50.0,
    "covered_seconds": 60.0,
    "mem_used_max_bytes": GIB,
    "mem_total_bytes": 80 * GIB,
    "power_mean_watts": 100.0,
    "energy_joules": 6000.0,
    "temperature_max_celsius": 45.0,
    "ecc_errors_total": 0,
    "unallocated_pids": [],
}
SUMMARY: dict[str, Any] = {
    "job_id": 5,
    "node": "gpu1",
    "gpu_uuid": "GPU-B",
    "gpu_model": "NVIDIA A100",
    "start": T0 - 600,
    "end": T0 - 300,
    "gpu_seconds": 300.0,
    "util_mean_percent": 20.0,
    "util_max_percent": 40.0,
    "active_seconds": 100.0,
    "mem_max_bytes": GIB,
    "mem_gib_seconds": 300.0,
    "energy_joules": 9000.0,
    "reading_count": 30,
    "missing_seconds": 0.0,
    "user": "bob",
    "account": "chem",
    "partition": "gpu",
}


def write_previous_release_spool(path: Path) -> None:
    """A spool as the previous release left it: rows in every table, job 7 ended."""
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(PREVIOUS_LAYOUT)
    outbox = [
        ("event", "gpu1:7:started", EVENT),
        ("inventory", "inventory:gpu1", INVENTORY),
        ("activity", "activity:7:GPU-A", ACTIVITY),
        ("interval", f"gpu1:GPU-A:{T0!r}", INTERVAL),
        ("summary", "5:gpu1:GPU-B", SUMMARY),
    ]
    for kind, key, payload in outbox:
        db.execute(
            "INSERT INTO outbox (kind, key, payload) VALUES (?, ?, ?)",
            (kind, key, json.dumps(payload)),
        )
    # Job 7's second minute on GPU-A, and GPU-B's idle minute: still open periods.
    # uuid job_id period_start start end util_sum util_count util_max util_min active_seconds
    # covered_seconds mem_max mem_total power_joules power_seconds energy temp_max ecc unallocated
    job_piece = ("GPU-A", 7, T0 + 60, T0 + 60, T0 + 120, 300.0, 6, 80.0, 20.0, 50.0, 60.0)
    job_piece_rest = (GIB, 80 * GIB, 6000.0, 60.0, 6000.0, 46.0, 0, "4242")
    idle_piece = ("GPU-B", 0, T0 + 60, T0 + 60, T0 + 120, 0.0, 0, None, None, 0.0, 60.0)
    idle_piece_rest = (None, None, None, 0.0, None, None, None, "")
    for first, rest in ((job_piece, job_piece_rest), (idle_piece, idle_piece_rest)):
        db.execute(
            "INSERT INTO pieces VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", (*first, *rest)
        )
    db.execute(
        "INSERT INTO spans VALUES (?, ?, ?, ?, ?, ?, ?)",
        (7, 0, T0, T0 + 120, "alice", "physics", "gpu"),
    )
    db.execute(
        "INSERT INTO job_acc VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        (7, "GPU-A", "NVIDIA A100", 120.0, 600.0, 12, 90.0, 100.0, GIB, 120.0, 12000.0, 12),
    )
    db.execute("INSERT INTO gpu_state VALUES (?, ?, ?, ?)", ("GPU-A", T0 + 120, T0 + 119, 5e6))
    db.execute(
        "INSERT INTO quarantine (kind, key, payload, error, quarantined_at)"
        " VALUES ('interval', 'bad', '{\"node\": 1', 'outbox interval row: not JSON', ?)",
        (T0,),
    )
    db.close()


class RecordingStore:
    """A StoreSink that keeps everything it is given."""

    def __init__(self) -> None:
        self.events: list[JobEvent] = []
        self.intervals: list[GpuInterval] = []
        self.summaries: list[JobGpuSummary] = []
        self.inventory: list[tuple[str, list[GpuDevice], float]] = []
        self.activity: list[GpuActivity] = []
        self.physical: list[GpuPhysicalInterval] = []
        self.heartbeats: list[NodeHeartbeat] = []

    def write_batches(self, batches: Sequence[tuple[str, DecodedBatch]]) -> int:
        for node, batch in batches:
            self.events += batch.events
            self.intervals += batch.intervals
            self.summaries += batch.summaries
            self.inventory += [(node, list(seen), at) for seen, at, _lost in batch.inventory]
            self.activity += batch.activity
            self.physical += batch.physical
            self.heartbeats += batch.heartbeats
        return len(batches)


@pytest.fixture
def upgraded(tmp_path: Path) -> Spool:
    """The previous release's spool, opened by this agent."""
    path = tmp_path / "spool.db"
    write_previous_release_spool(path)
    return Spool(path)


def finish_and_ship(spool: Spool) -> RecordingStore:
    """What the agent does next: job 7's end is summarized, GPU-B's period sealed, all shipped."""
    with spool.transaction() as db:
        Spool.finish_job(db, "gpu1", 7, {0: "GPU-A"})
        Spool.seal_periods(db, "gpu1", "GPU-B", T0 + 60)
    store = RecordingStore()
    Shipper(spool, store, "gpu1").drain()
    return store


def user_version(path: Path) -> int:
    db = sqlite3.connect(str(path))
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def test_previous_release_spool_is_migrated_in_place(upgraded: Spool) -> None:
    """Opening an unversioned spool stamps it with this agent's version, rows kept."""
    assert (SCHEMA_VERSION, 5) == (user_version(upgraded.path), upgraded.backlog())


def test_previous_release_outbox_rows_reach_the_store_unchanged(upgraded: Spool) -> None:
    """The rows the previous release queued are shipped as they were written."""
    store = finish_and_ship(upgraded)

    assert [JobEvent(**{**EVENT, "kind": JobEventKind.STARTED, "gpu_indices": (0,)})] == (
        store.events
    )
    device = GpuDevice(**INVENTORY["devices"][0])
    assert [("gpu1", [device], T0)] == store.inventory
    assert [GpuActivity(**ACTIVITY)] == store.activity
    assert GpuInterval(**{**INTERVAL, "unallocated_pids": ()}) in store.intervals
    assert JobGpuSummary(**SUMMARY) in store.summaries


def test_previous_release_open_period_is_sealed_into_an_interval(upgraded: Spool) -> None:
    """Job 7's open period (a positional `pieces` row) ships as its interval."""
    expected = GpuInterval(
        node="gpu1",
        gpu_uuid="GPU-A",
        period_start=T0 + 60,
        period_end=T0 + 120,
        job_id=7,
        util_mean_percent=50.0,
        util_max_percent=80.0,
        util_min_percent=20.0,
        util_sample_count=6,
        active_seconds=50.0,
        covered_seconds=60.0,
        mem_used_max_bytes=GIB,
        mem_total_bytes=80 * GIB,
        power_mean_watts=100.0,
        energy_joules=6000.0,
        temperature_max_celsius=46.0,
        ecc_errors_total=0,
        unallocated_pids=(4242,),
    )

    store = finish_and_ship(upgraded)

    assert expected in store.intervals


def test_previous_release_idle_period_is_sealed_with_unknowns_kept(upgraded: Spool) -> None:
    """GPU-B's period held by no job ships with job None and its unread fields None."""
    expected = GpuInterval(
        node="gpu1",
        gpu_uuid="GPU-B",
        period_start=T0 + 60,
        period_end=T0 + 120,
        job_id=None,
        util_mean_percent=None,
        util_max_percent=None,
        util_min_percent=None,
        util_sample_count=0,
        active_seconds=0.0,
        covered_seconds=60.0,
        mem_used_max_bytes=None,
        mem_total_bytes=None,
        power_mean_watts=None,
        energy_joules=None,
        temperature_max_celsius=None,
        ecc_errors_total=None,
    )

    store = finish_and_ship(upgraded)

    assert expected in store.intervals


def test_previous_release_job_totals_become_the_summary(upgraded: Spool) -> None:
    """Job 7's span and running totals (positional rows) become its summary at its end."""
    expected = JobGpuSummary(
        job_id=7,
        node="gpu1",
        gpu_uuid="GPU-A",
        gpu_model="NVIDIA A100",
        start=T0,
        end=T0 + 120,
        gpu_seconds=120.0,
        util_mean_percent=50.0,
        util_max_percent=90.0,
        active_seconds=100.0,
        mem_max_bytes=GIB,
        mem_gib_seconds=120.0,
        energy_joules=12000.0,
        reading_count=12,
        missing_seconds=0.0,
        user="alice",
        account="physics",
        partition="gpu",
    )

    store = finish_and_ship(upgraded)

    assert expected in store.summaries


def test_previous_release_spool_ships_every_row_and_keeps_nothing(upgraded: Spool) -> None:
    """Five queued rows, two open periods and one job: eight rows shipped, none left."""
    store = finish_and_ship(upgraded)

    shipped = (store.events, store.inventory, store.activity, store.intervals, store.summaries)
    assert ([1, 1, 1, 3, 2], 0) == ([len(rows) for rows in shipped], upgraded.backlog())


def test_previous_release_gpu_state_and_spans_are_read(upgraded: Spool) -> None:
    """Where each GPU's next read starts, and the running spans, survive the upgrade."""
    assert (
        {"GPU-A": (T0 + 120, T0 + 119, 5e6)},
        [JobSpan(7, 0, T0, T0 + 120, "alice", "physics", "gpu")],
    ) == (upgraded.gpu_state(), upgraded.spans())


def test_previous_release_quarantine_is_kept(upgraded: Spool) -> None:
    """Rows the previous release quarantined stay there for the admin."""
    expected = [("interval", "bad", '{"node": 1', "outbox interval row: not JSON")]

    assert expected == upgraded.quarantined()


def test_newer_spool_is_refused_naming_the_file(tmp_path: Path) -> None:
    """A spool written by a newer agent is a SpoolError that names the file and versions."""
    path = tmp_path / "spool.db"
    write_previous_release_spool(path)
    db = sqlite3.connect(str(path))
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()

    with pytest.raises(SpoolError) as caught:
        Spool(path)

    assert (
        f"spool {path}: layout version {SCHEMA_VERSION + 1} is newer than this agent's"
        f" ({SCHEMA_VERSION})"
    ) in str(caught.value)


def test_newer_spool_is_left_untouched(tmp_path: Path) -> None:
    """Refusing a newer spool loses nothing: its version and every row stay as they were."""
    path = tmp_path / "spool.db"
    write_previous_release_spool(path)
    db = sqlite3.connect(str(path))
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()

    with pytest.raises(SpoolError):
        Spool(path)

    db = sqlite3.connect(str(path))
    tables = ("outbox", "pieces", "spans", "job_acc", "gpu_state", "quarantine")
    counts = [db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables]
    db.close()
    assert (SCHEMA_VERSION + 1, [5, 2, 1, 1, 1, 1]) == (user_version(path), counts)


def test_new_spool_is_created_at_the_current_version(tmp_path: Path) -> None:
    """A spool that did not exist is created empty and stamped with this agent's version."""
    spool = Spool(tmp_path / "new" / "spool.db")

    assert (SCHEMA_VERSION, 0) == (user_version(spool.path), spool.backlog())


def test_reopening_a_current_spool_keeps_its_rows(upgraded: Spool) -> None:
    """Opening a spool of this version again changes nothing."""
    upgraded.close()

    again = Spool(upgraded.path)

    assert (SCHEMA_VERSION, 5) == (user_version(again.path), again.backlog())


# --- layout 2 (runs of requeued jobs, issue #11) -> layout 3 (GPM, issue #13) ----------

# The tables as spool layout 2 left them (user_version 2): layout 1's, with `restart`
# appended to pieces, spans and job_acc and in their keys.
LAYOUT_2 = """
CREATE TABLE outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    key TEXT NOT NULL UNIQUE,
    payload TEXT NOT NULL
);
CREATE TABLE pieces (uuid TEXT NOT NULL, job_id INTEGER NOT NULL, period_start REAL NOT NULL,
    start REAL NOT NULL, end REAL NOT NULL,
    util_sum REAL NOT NULL, util_count INTEGER NOT NULL,
    util_max REAL, util_min REAL, active_seconds REAL NOT NULL,
    covered_seconds REAL NOT NULL, mem_max INTEGER, mem_total INTEGER,
    power_joules REAL, power_seconds REAL NOT NULL, energy REAL,
    temp_max REAL, ecc INTEGER, unallocated TEXT NOT NULL DEFAULT '',
    restart INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (uuid, job_id, restart, period_start));
CREATE TABLE spans (job_id INTEGER NOT NULL, slurm_index INTEGER NOT NULL,
    start REAL NOT NULL, end REAL, user TEXT, account TEXT, partition TEXT,
    restart INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job_id, restart, slurm_index));
CREATE TABLE job_acc (job_id INTEGER NOT NULL, uuid TEXT NOT NULL, model TEXT NOT NULL,
    covered REAL NOT NULL DEFAULT 0, util_sum REAL NOT NULL DEFAULT 0,
    util_count INTEGER NOT NULL DEFAULT 0, util_max REAL,
    active_seconds REAL NOT NULL DEFAULT 0, mem_max INTEGER,
    mem_gib_seconds REAL NOT NULL DEFAULT 0, energy REAL, readings INTEGER NOT NULL DEFAULT 0,
    restart INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job_id, restart, uuid));
CREATE TABLE gpu_state (
    uuid TEXT PRIMARY KEY, last_read REAL, last_sample REAL, last_energy REAL
);
CREATE TABLE quarantine (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    error TEXT NOT NULL,
    quarantined_at REAL NOT NULL
);
PRAGMA user_version = 2;
"""

# Run 1 of job 9 (requeued once) on GPU-H, an H100 read by the release before GPM.
SUMMARY_2: dict[str, Any] = {**SUMMARY, "job_id": 4, "restart": 1}
INTERVAL_2: dict[str, Any] = {**INTERVAL, "job_id": 9, "gpu_uuid": "GPU-H"}


def write_layout_2_spool(path: Path) -> None:
    """A layout-2 spool: queued rows, and run 1 of job 9 ended with an open period."""
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(LAYOUT_2)
    for kind, key, payload in (
        ("interval", f"gpu1:GPU-H:{T0!r}", INTERVAL_2),
        ("summary", "4:gpu1:GPU-B:1", SUMMARY_2),
    ):
        db.execute(
            "INSERT INTO outbox (kind, key, payload) VALUES (?, ?, ?)",
            (kind, key, json.dumps(payload)),
        )
    db.execute(
        "INSERT INTO pieces (uuid, job_id, period_start, start, end, util_sum, util_count,"
        " util_max, util_min, active_seconds, covered_seconds, mem_max, mem_total,"
        " power_joules, power_seconds, energy, temp_max, ecc, unallocated, restart)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        ("GPU-H", 9, T0 + 60, T0 + 60, T0 + 90, 240.0, 3, 90.0, 70.0, 30.0, 30.0, GIB, None,
         3000.0, 30.0, 3000.0, 50.0, 0, "", 1),
    )  # fmt: skip
    db.execute(
        "INSERT INTO spans (job_id, slurm_index, start, end, user, account, partition, restart)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (9, 0, T0, T0 + 90, "alice", "physics", "gpu", 1),
    )
    db.execute(
        "INSERT INTO job_acc (job_id, uuid, model, covered, util_sum, util_count, util_max,"
        " active_seconds, mem_max, mem_gib_seconds, energy, readings, restart)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (9, "GPU-H", "NVIDIA H100", 80.0, 640.0, 8, 90.0, 80.0, GIB, 80.0, 8000.0, 8, 1),
    )
    db.close()


@pytest.fixture
def from_layout_2(tmp_path: Path) -> Spool:
    """A layout-2 spool, opened by this agent."""
    path = tmp_path / "spool.db"
    write_layout_2_spool(path)
    return Spool(path)


def test_layout_2_spool_is_upgraded_in_place(from_layout_2: Spool) -> None:
    """Opening a layout-2 spool stamps it with this version; its queued rows and spans stay."""
    expected = (SCHEMA_VERSION, 2, [JobSpan(9, 0, T0, T0 + 90, "alice", "physics", "gpu", 1)])

    assert expected == (
        user_version(from_layout_2.path),
        from_layout_2.backlog(),
        from_layout_2.spans(),
    )


def test_layout_2_queued_rows_ship_unchanged_and_unmeasured(from_layout_2: Spool) -> None:
    """Rows queued before GPM decode as they were, with gpm_seconds 0 and no GPM figures."""
    store = RecordingStore()
    Shipper(from_layout_2, store, "gpu1").drain()

    assert (
        [GpuInterval(**{**INTERVAL_2, "unallocated_pids": ()})],
        [JobGpuSummary(**SUMMARY_2)],
        (0.0, None),
    ) == (
        store.intervals,
        store.summaries,
        (store.summaries[0].gpm_seconds, store.summaries[0].sm_active_mean_percent),
    )


def test_layout_2_run_totals_become_its_summary_unmeasured(from_layout_2: Spool) -> None:
    """Run 1 of job 9, totalled by layout 2, is summarized whole: GPM not measured."""
    with from_layout_2.transaction() as db:
        (summary,) = Spool.finish_job(db, "gpu1", 9, {0: "GPU-H"}, restart=1)

    expected = JobGpuSummary(
        job_id=9,
        node="gpu1",
        gpu_uuid="GPU-H",
        gpu_model="NVIDIA H100",
        start=T0,
        end=T0 + 90,
        gpu_seconds=90.0,
        util_mean_percent=80.0,
        util_max_percent=90.0,
        active_seconds=80.0,
        mem_max_bytes=GIB,
        mem_gib_seconds=80.0,
        energy_joules=8000.0,
        reading_count=8,
        missing_seconds=10.0,
        user="alice",
        account="physics",
        partition="gpu",
        restart=1,
        gpm_seconds=0.0,
        sm_active_mean_percent=None,
    )
    assert expected == summary


def test_layout_2_open_period_gains_gpm_read_after_the_upgrade(from_layout_2: Spool) -> None:
    """The first GPM piece after the upgrade merges into the period layout 2 left open.

    (T0+90, T0+100] at 40% SM activity joins the 30 s read before GPM: the interval's
    mean is over the 10 GPM seconds only, and its other totals keep the older reads.
    """
    piece = Piece(
        start=T0 + 90,
        end=T0 + 100,
        period_start=T0 + 60,
        job_id=9,
        restart=1,
        util_sum=800.0,
        util_count=10,
        util_max=80.0,
        util_min=80.0,
        active_count=10,
        mem_used_bytes=GIB,
        power_watts=100.0,
        energy_joules=1000.0,
        gpm_seconds=10.0,
        sm_active_percent=40.0,
        tensor_active_percent=55.0,
    )
    with from_layout_2.transaction() as db:
        Spool.add_piece(db, "GPU-H", "NVIDIA H100", piece, None, 50.0, 0, ())
        Spool.seal_job(db, "gpu1", 9, 1)
    store = RecordingStore()
    Shipper(from_layout_2, store, "gpu1").drain()

    (interval,) = [i for i in store.intervals if i.period_start == T0 + 60]
    assert (T0 + 100, 40.0, 13, 10.0, 40.0, None, 55.0, None) == (
        interval.period_end,
        interval.covered_seconds,
        interval.util_sample_count,
        interval.gpm_seconds,
        interval.sm_active_mean_percent,
        interval.sm_occupancy_mean_percent,
        interval.tensor_active_mean_percent,
        interval.dram_bw_mean_percent,
    )


# --- layout 3 (GPM, issue #13) -> layout 4 (GPU slots, issue 14) -----------------------


def write_layout_3_spool(path: Path) -> None:
    """A layout-3 spool: layout 2's rows, with layout 3's released step applied to them."""
    write_layout_2_spool(path)
    db = sqlite3.connect(str(path), isolation_level=None)
    for statement in MIGRATIONS[2]:
        db.execute(statement)
    db.execute("PRAGMA user_version = 3")
    db.close()


@pytest.fixture
def from_layout_3(tmp_path: Path) -> Spool:
    path = tmp_path / "spool.db"
    write_layout_3_spool(path)
    return Spool(path)


def test_layout_3_spool_is_upgraded_in_place_its_rows_whole_gpus(from_layout_3: Spool) -> None:
    """Stamped with this version; spans hold no shares; the tables of slots are there."""
    (span,) = from_layout_3.spans()
    assert (user_version(from_layout_3.path), from_layout_3.backlog()) == (SCHEMA_VERSION, 2)
    assert (span.job_id, span.restart, span.shards, span.shard_kind) == (9, 1, 0, "")
    db = sqlite3.connect(str(from_layout_3.path))
    columns = [row[1] for row in db.execute("PRAGMA table_info(pieces)")]
    slot_columns = columns[columns.index("parent") :][:5]  # appended by layout 4
    assert slot_columns == ["parent", "slot_kind", "share", "mig_profile", "measured_by"]
    assert db.execute("SELECT count(*) FROM physical").fetchone() == (0,)
    db.close()


def test_layout_3_open_period_is_sealed_as_a_whole_gpu_with_its_physical_totals(
    from_layout_3: Spool,
) -> None:
    """The period layout 3 left open ships as before (no slot keys) and as GPU totals."""
    with from_layout_3.transaction() as db:
        Spool.seal_periods(db, "gpu1", "GPU-H", T0 + 60)
    rows = {kind: payload for _, kind, _, payload in from_layout_3.pending(100)}
    assert not {"slot_id", "slot_kind", "share", "measured_by"} & set(json.loads(rows["interval"]))
    store = RecordingStore()
    Shipper(from_layout_3, store, "gpu1").drain()

    (interval,) = [i for i in store.intervals if i.period_start == T0 + 60]
    assert (interval.effective_slot_id, interval.slot_kind, interval.share) == ("GPU-H", "gpu", 1)
    assert store.physical == [
        GpuPhysicalInterval(
            node="gpu1",
            gpu_uuid="GPU-H",
            period_start=T0 + 60,
            period_end=T0 + 90,
            covered_seconds=30.0,
            power_mean_watts=100.0,
            energy_joules=3000.0,
            temperature_max_celsius=50.0,
            ecc_errors_total=0,
            mem_used_max_bytes=GIB,
            mem_total_bytes=None,
        )
    ]


def test_layout_3_run_totals_become_a_whole_gpu_summary(from_layout_3: Spool) -> None:
    with from_layout_3.transaction() as db:
        (summary,) = Spool.finish_job(db, "gpu1", 9, {0: "GPU-H"}, restart=1)
    assert (summary.gpu_uuid, summary.slot_id, summary.slot_kind, summary.measured_by) == (
        "GPU-H",
        "",
        "gpu",
        "nvml",
    )
    assert (summary.gpu_seconds, summary.util_mean_percent) == (90.0, 80.0)


# --- layout 4 (GPU slots, issue 14) -> layout 5 (a period's GiB-seconds, issue 24) -------


def write_layout_4_spool(path: Path) -> None:
    """A layout-4 spool: layout 3's rows, with layout 4's released step applied to them.

    Run 1 of job 9 has an open period on GPU-H (T0+60..T0+90, 1 GiB read) and its totals
    (80 GiB-seconds so far) in `job_acc`.
    """
    write_layout_3_spool(path)
    db = sqlite3.connect(str(path), isolation_level=None)
    for statement in MIGRATIONS[3]:
        db.execute(statement)
    db.execute("PRAGMA user_version = 4")
    db.close()


@pytest.fixture
def from_layout_4(tmp_path: Path) -> Spool:
    path = tmp_path / "spool.db"
    write_layout_4_spool(path)
    return Spool(path)


def job_9_piece(start: float, period_start: float, mem_bytes: int) -> Piece:
    """Ten seconds of run 1 of job 9 on GPU-H, charged for `mem_bytes`."""
    return Piece(
        start=start,
        end=start + 10,
        period_start=period_start,
        job_id=9,
        restart=1,
        util_sum=800.0,
        util_count=10,
        util_max=80.0,
        util_min=80.0,
        active_count=10,
        mem_used_bytes=mem_bytes,
        power_watts=None,
        energy_joules=None,
        mem_estimate_bytes=mem_bytes,
    )


def test_layout_4_spool_is_upgraded_in_place_its_open_period_unsummed(
    from_layout_4: Spool,
) -> None:
    """Stamped with this version; the period layout 4 left open has no GiB-seconds (NULL)."""
    db = sqlite3.connect(str(from_layout_4.path))
    rows = db.execute("SELECT uuid, period_start, mem_gib_seconds FROM pieces").fetchall()
    db.close()
    assert (SCHEMA_VERSION, 2, [("GPU-H", T0 + 60, None)]) == (
        user_version(from_layout_4.path),
        from_layout_4.backlog(),
        rows,
    )


def test_layout_4_open_period_stays_unsummed_and_new_periods_carry_their_sum(
    from_layout_4: Spool,
) -> None:
    """After the upgrade, a period layout 4 opened ships None (the store reads peak x covered).

    A read joining it cannot make it whole: its reads before the upgrade were not summed.
    The next period, opened after the upgrade, ships the GiB-seconds its pieces added to
    the run's totals (2 GiB x 10 s); the summary has every read: 80 + 1 x 10 + 2 x 10.
    """
    with from_layout_4.transaction() as db:
        Spool.add_piece(db, "GPU-H", "NVIDIA H100", job_9_piece(T0 + 90, T0 + 60, GIB), None,
                        50.0, 0, ())  # fmt: skip
        Spool.add_piece(db, "GPU-H", "NVIDIA H100", job_9_piece(T0 + 120, T0 + 120, 2 * GIB),
                        None, 50.0, 0, ())  # fmt: skip
        (summary,) = Spool.finish_job(db, "gpu1", 9, {0: "GPU-H"}, restart=1)
    store = RecordingStore()
    Shipper(from_layout_4, store, "gpu1").drain()

    sealed = {i.period_start: i.mem_gib_seconds for i in store.intervals if i.job_id == 9}
    assert ({T0: None, T0 + 60: None, T0 + 120: 20.0}, 110.0) == (
        sealed,
        summary.mem_gib_seconds,
    )


def test_new_spool_sums_each_periods_gib_seconds_as_its_runs_totals(tmp_path: Path) -> None:
    """A period's GiB-seconds are the sum of its pieces' (Piece.mem_gib_seconds), as the run's.

    1 GiB for 10 s then 4 GiB for 10 s in one period: 50 GiB-seconds in the interval and in
    the summary; not the peak (4 GiB) x the 20 s covered.
    """
    spool = Spool(tmp_path / "spool.db")
    with spool.transaction() as db:
        Spool.add_span(db, JobSpan(9, 0, T0 + 60, T0 + 80, "alice", "physics", "gpu", 1))
        Spool.add_piece(db, "GPU-H", "NVIDIA H100", job_9_piece(T0 + 60, T0 + 60, GIB), None,
                        50.0, 0, ())  # fmt: skip
        Spool.add_piece(db, "GPU-H", "NVIDIA H100", job_9_piece(T0 + 70, T0 + 60, 4 * GIB),
                        None, 50.0, 0, ())  # fmt: skip
        (summary,) = Spool.finish_job(db, "gpu1", 9, {0: "GPU-H"}, restart=1)
    store = RecordingStore()
    Shipper(spool, store, "gpu1").drain()

    (interval,) = store.intervals
    assert (50.0, 50.0, 4 * GIB) == (
        interval.mem_gib_seconds,
        summary.mem_gib_seconds,
        interval.mem_used_max_bytes,
    )
