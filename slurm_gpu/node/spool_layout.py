"""The spool's layouts: the statements that create it and bring an older one up to date.

The spool outlives upgrades of the agent with rows still in it, so its layout carries a
version (`PRAGMA user_version`, read and written by spool.py). Each step here brings a
spool of one version to the next; a new spool runs them all from 0. A step, once
released, is never edited: a layout change appends one.
"""

from __future__ import annotations

SCHEMA_VERSION = 5
"""The spool layout this agent writes. Raising it needs a step in `MIGRATIONS`."""

_VERSION_1_TABLES = (
    """CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    key TEXT NOT NULL UNIQUE,
    payload TEXT NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS pieces (
    uuid TEXT NOT NULL, job_id INTEGER NOT NULL, period_start REAL NOT NULL,
    start REAL NOT NULL, end REAL NOT NULL,
    util_sum REAL NOT NULL, util_count INTEGER NOT NULL,
    util_max REAL, util_min REAL, active_seconds REAL NOT NULL,
    covered_seconds REAL NOT NULL, mem_max INTEGER, mem_total INTEGER,
    power_joules REAL, power_seconds REAL NOT NULL, energy REAL,
    temp_max REAL, ecc INTEGER, unallocated TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (uuid, job_id, period_start)
)""",
    """CREATE TABLE IF NOT EXISTS spans (
    job_id INTEGER NOT NULL, slurm_index INTEGER NOT NULL,
    start REAL NOT NULL, end REAL, user TEXT, account TEXT, partition TEXT,
    PRIMARY KEY (job_id, slurm_index)
)""",
    """CREATE TABLE IF NOT EXISTS job_acc (
    job_id INTEGER NOT NULL, uuid TEXT NOT NULL, model TEXT NOT NULL,
    covered REAL NOT NULL DEFAULT 0, util_sum REAL NOT NULL DEFAULT 0,
    util_count INTEGER NOT NULL DEFAULT 0, util_max REAL,
    active_seconds REAL NOT NULL DEFAULT 0, mem_max INTEGER,
    mem_gib_seconds REAL NOT NULL DEFAULT 0, energy REAL, readings INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, uuid)
)""",
    """CREATE TABLE IF NOT EXISTS gpu_state (
    uuid TEXT PRIMARY KEY, last_read REAL, last_sample REAL, last_energy REAL
)""",
    """CREATE TABLE IF NOT EXISTS quarantine (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    error TEXT NOT NULL,
    quarantined_at REAL NOT NULL
)""",
)


def _with_restart(table: str, columns: str, names: str, key: str) -> tuple[str, ...]:
    """Statements that add `restart` (0: the first run) to `table` and to its key.

    SQLite cannot change a primary key in place: the rows are copied into the new layout.
    """
    return (
        f"CREATE TABLE {table}_v2 ({columns}, restart INTEGER NOT NULL DEFAULT 0,"
        f" PRIMARY KEY ({key}))",
        f"INSERT INTO {table}_v2 ({names}, restart) SELECT {names}, 0 FROM {table}",
        f"DROP TABLE {table}",
        f"ALTER TABLE {table}_v2 RENAME TO {table}",
    )


_VERSION_2_STEP = (
    *_with_restart(
        "pieces",
        """uuid TEXT NOT NULL, job_id INTEGER NOT NULL, period_start REAL NOT NULL,
    start REAL NOT NULL, end REAL NOT NULL,
    util_sum REAL NOT NULL, util_count INTEGER NOT NULL,
    util_max REAL, util_min REAL, active_seconds REAL NOT NULL,
    covered_seconds REAL NOT NULL, mem_max INTEGER, mem_total INTEGER,
    power_joules REAL, power_seconds REAL NOT NULL, energy REAL,
    temp_max REAL, ecc INTEGER, unallocated TEXT NOT NULL DEFAULT ''""",
        "uuid, job_id, period_start, start, end, util_sum, util_count, util_max, util_min,"
        " active_seconds, covered_seconds, mem_max, mem_total, power_joules, power_seconds,"
        " energy, temp_max, ecc, unallocated",
        "uuid, job_id, restart, period_start",
    ),
    *_with_restart(
        "spans",
        """job_id INTEGER NOT NULL, slurm_index INTEGER NOT NULL,
    start REAL NOT NULL, end REAL, user TEXT, account TEXT, partition TEXT""",
        "job_id, slurm_index, start, end, user, account, partition",
        "job_id, restart, slurm_index",
    ),
    *_with_restart(
        "job_acc",
        """job_id INTEGER NOT NULL, uuid TEXT NOT NULL, model TEXT NOT NULL,
    covered REAL NOT NULL DEFAULT 0, util_sum REAL NOT NULL DEFAULT 0,
    util_count INTEGER NOT NULL DEFAULT 0, util_max REAL,
    active_seconds REAL NOT NULL DEFAULT 0, mem_max INTEGER,
    mem_gib_seconds REAL NOT NULL DEFAULT 0, energy REAL, readings INTEGER NOT NULL DEFAULT 0""",
        "job_id, uuid, model, covered, util_sum, util_count, util_max, active_seconds, mem_max,"
        " mem_gib_seconds, energy, readings",
        "job_id, restart, uuid",
    ),
)


def _add_gpm_columns(table: str) -> tuple[str, ...]:
    """Version 3's columns of `table`: seconds measured by GPM and its figures' sums."""
    return tuple(
        f"ALTER TABLE {table} ADD COLUMN {column}"
        for column in (
            "gpm_seconds REAL NOT NULL DEFAULT 0",
            "sm_active_psec REAL NOT NULL DEFAULT 0",
            "sm_active_sec REAL NOT NULL DEFAULT 0",
            "sm_occupancy_psec REAL NOT NULL DEFAULT 0",
            "sm_occupancy_sec REAL NOT NULL DEFAULT 0",
            "tensor_active_psec REAL NOT NULL DEFAULT 0",
            "tensor_active_sec REAL NOT NULL DEFAULT 0",
            "dram_bw_psec REAL NOT NULL DEFAULT 0",
            "dram_bw_sec REAL NOT NULL DEFAULT 0",
        )
    )


_VERSION_3_STEP = (*_add_gpm_columns("pieces"), *_add_gpm_columns("job_acc"))


def _add_slot_columns(table: str) -> tuple[str, ...]:
    """Version 4's slot columns of `table` (issue 14): a row of version 3 is a whole GPU.

    `uuid` is then the slot's id (a whole GPU's UUID, a MIG UUID or a share's id) and
    `parent` its physical GPU ("": `uuid` is itself the GPU).
    """
    return tuple(
        f"ALTER TABLE {table} ADD COLUMN {column}"
        for column in (
            "parent TEXT NOT NULL DEFAULT ''",
            "slot_kind TEXT NOT NULL DEFAULT 'gpu'",
            "share REAL NOT NULL DEFAULT 1",
            "mig_profile TEXT NOT NULL DEFAULT ''",
            "measured_by TEXT NOT NULL DEFAULT 'nvml'",
        )
    )


_VERSION_4_STEP = (
    *_add_slot_columns("pieces"),
    *_add_slot_columns("job_acc"),
    # gres/shard or gres/mps units a run holds on the GPU of the span (0: the whole slot)
    "ALTER TABLE spans ADD COLUMN shards INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE spans ADD COLUMN shard_kind TEXT NOT NULL DEFAULT ''",
    # Each physical GPU's own open shipping period: power, energy, temperature, ECC and
    # memory whatever its slots (GpuPhysicalInterval), sealed into `physical` outbox rows.
    """CREATE TABLE IF NOT EXISTS physical (
    uuid TEXT NOT NULL, period_start REAL NOT NULL, start REAL NOT NULL, end REAL NOT NULL,
    covered_seconds REAL NOT NULL, power_joules REAL, power_seconds REAL NOT NULL,
    energy REAL, temp_max REAL, ecc INTEGER, mem_max INTEGER, mem_total INTEGER,
    PRIMARY KEY (uuid, period_start)
)""",
)

# Each open period's GPU-memory GiB-seconds (issue 24), summed as its run's `job_acc` sums
# them, so an interval carries what its summary will. NULL in a period of version 4, and
# it stays NULL when later pieces join it (NULL + x): the reads before the upgrade were
# not summed, and the store reads a NULL as the period's peak x covered seconds.
_VERSION_5_STEP = ("ALTER TABLE pieces ADD COLUMN mem_gib_seconds REAL",)

MIGRATIONS: dict[int, tuple[str, ...]] = {
    # Version 0 is a new file, or a spool of the releases before versions: they wrote
    # version 1's tables unstamped, creating any that were missing at every open.
    0: _VERSION_1_TABLES,
    # Version 2: runs of requeued jobs (issue #11). The rows of version 1 are run 0.
    1: _VERSION_2_STEP,
    # Version 3: GPM figures (issue #13). Rows of version 2 were never measured by GPM.
    2: _VERSION_3_STEP,
    # Version 4: GPU slots (issue 14): MIG slices and shares, per-GPU physical totals.
    # Rows of version 3 are whole GPUs and spans hold no shares.
    3: _VERSION_4_STEP,
    # Version 5: each period's GPU-memory GiB-seconds (issue 24); NULL in periods of 4.
    4: _VERSION_5_STEP,
}
"""{version: the statements that bring a spool of that version to the next one}.

A new spool runs them all from 0. A layout change appends a step (e.g. `ALTER TABLE ...
ADD COLUMN`) and raises SCHEMA_VERSION; never edit a released step.
"""
