"""The accounting store's tables (SQLAlchemy Core), identical on SQLite, PostgreSQL, MariaDB.

Times are POSIX seconds in 8-byte floats (`DOUBLE`/`DOUBLE PRECISION`/`REAL`), so a model's
float round-trips exactly on every backend (MySQL's `FLOAT` would be 4 bytes: never use
`sa.Float` here). Strings have explicit lengths so that composite keys stay within InnoDB's
3072-byte index limit under utf8mb4.

The migration in `migrations/versions/` creates exactly these tables; a test compares the two.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from slurm_gpu.ledger import sums

NODE = 128
UUID = 96
NAME = 128
# A slot id (revision 0009): a GPU or MIG UUID, or "<GPU UUID>/shard/<job>[.<restart>]".
SLOT = 160

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def _time(name: str, nullable: bool = False) -> sa.Column[float]:
    return sa.Column(name, sa.Double(), nullable=nullable)


# NVML GPM metrics (revision 0006), in the order of the models' fields: each is a
# `<metric>_mean_percent` column of intervals and summaries, two sums in the rollup.
GPM_METRICS = sums.GPM_METRICS


def _gpm_columns() -> list[sa.Column[float]]:
    """`gpm_seconds` (0: not measured) and the four means over it (NULL: not measured)."""
    return [
        sa.Column("gpm_seconds", sa.Double(), nullable=False, server_default="0"),
        *(sa.Column(f"{m}_mean_percent", sa.Double()) for m in GPM_METRICS),
    ]


def _slot_columns() -> list[sa.Column[Any]]:
    """Revision 0009: what a row's GPU slot is (docs/design/gpu-slots.md).

    `slot_id` keys the row where `gpu_uuid` did (a whole GPU's is its UUID); `gpu_uuid`
    stays the physical GPU, the slot's parent. Rows from before 0009 are whole GPUs.
    """
    return [
        sa.Column("slot_id", sa.String(SLOT), nullable=False),
        sa.Column("slot_kind", sa.String(16), nullable=False, server_default="gpu"),
        sa.Column("share", sa.Double(), nullable=False, server_default="1"),
        sa.Column("mig_profile", sa.String(32), nullable=False, server_default=""),
        sa.Column("measured_by", sa.String(16), nullable=False, server_default="nvml"),
    ]


def _gpm_sums() -> list[sa.Column[float]]:
    """The rollup's GPM columns: mean = `<metric>_weighted_sum / <metric>_gpm_seconds`."""
    columns: list[sa.Column[float]] = [
        sa.Column("gpm_seconds", sa.Double(), nullable=False, server_default="0")
    ]
    for m in GPM_METRICS:
        columns.append(
            sa.Column(f"{m}_weighted_sum", sa.Double(), nullable=False, server_default="0")
        )
        columns.append(
            sa.Column(f"{m}_gpm_seconds", sa.Double(), nullable=False, server_default="0")
        )
    return columns


jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("cluster", sa.String(NAME), primary_key=True),
    sa.Column("job_id", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("array_job_id", sa.BigInteger()),
    sa.Column("array_task_id", sa.BigInteger()),
    sa.Column("het_job_id", sa.BigInteger()),
    sa.Column("het_job_offset", sa.BigInteger()),
    sa.Column("user", sa.String(NAME)),
    sa.Column("uid", sa.BigInteger()),
    sa.Column("account", sa.String(NAME)),
    sa.Column("partition", sa.String(NAME)),
    sa.Column("job_name", sa.String(255)),
    sa.Column("state", sa.String(32)),
    sa.Column("exit_code", sa.BigInteger()),
    _time("submit_time", nullable=True),
    _time("start_time", nullable=True),
    _time("end_time", nullable=True),
    sa.Column("nodes", sa.Text()),
    # GPUs held at once: the most any one run of the job held (revision 0004).
    sa.Column("gpus", sa.Integer()),
    # The newest run the hooks reported (Slurm's restart count; None before 0004 or from
    # sacct only): start, end, exit code and state are that run's, as sacct shows them.
    sa.Column("restart", sa.Integer()),
    # Slurm's SLUID of the job (25.11+, SLURM_JOB_SLUID; revision 0008), NULL without one.
    sa.Column("sluid", sa.String(32)),
    # Seconds Slurm had the job suspended (sacct's Suspended; revision 0016): not in its
    # Elapsed nor in its GPU-hours (ledger/time.py). NULL: none recorded (yet).
    sa.Column("suspended_seconds", sa.Double()),
)
sa.Index(None, jobs.c.start_time)
# Reports select a period by end_time >= since (a month of a year-long store); see
# store/queries.py `_window` and migration 0003.
sa.Index(None, jobs.c.end_time)
sa.Index(None, jobs.c.user)
sa.Index(None, jobs.c.account)

job_gpus = sa.Table(
    "job_gpus",
    metadata,
    sa.Column("cluster", sa.String(NAME), primary_key=True),
    sa.Column("job_id", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("node", sa.String(NODE), primary_key=True),
    sa.Column("slurm_index", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("gpu_uuid", sa.String(UUID), nullable=False, server_default=""),
    _time("start", nullable=True),
    _time("end", nullable=True),
    # Which run of the job (Slurm's restart count; a requeued job runs again under its
    # id): each run's GPUs are their own rows (revision 0004; older rows are run 0).
    sa.Column("restart", sa.Integer(), primary_key=True, autoincrement=False, server_default="0"),
    # Revision 0009: the slot the GPU row is ("" where gpu_uuid is unknown yet).
    sa.Column("slot_id", sa.String(SLOT), nullable=False, server_default=""),
)

gpu_intervals = sa.Table(
    "gpu_intervals",
    metadata,
    sa.Column("node", sa.String(NODE)),
    sa.Column("gpu_uuid", sa.String(UUID), nullable=False),
    sa.Column("period_start", sa.Double(), autoincrement=False),
    _time("period_end"),
    sa.Column("job_id", sa.BigInteger()),
    sa.Column("util_mean_percent", sa.Double()),
    sa.Column("util_max_percent", sa.Double()),
    sa.Column("util_min_percent", sa.Double()),
    sa.Column("util_sample_count", sa.Integer(), nullable=False),
    sa.Column("active_seconds", sa.Double(), nullable=False),
    sa.Column("covered_seconds", sa.Double(), nullable=False),
    sa.Column("mem_used_max_bytes", sa.BigInteger()),
    sa.Column("mem_total_bytes", sa.BigInteger()),
    sa.Column("power_mean_watts", sa.Double()),
    sa.Column("energy_joules", sa.Double()),
    sa.Column("temperature_max_celsius", sa.Double()),
    sa.Column("ecc_errors_total", sa.BigInteger()),
    # Comma-separated pids; "" for none (the common case costs one byte).
    sa.Column("unallocated_pids", sa.Text(), nullable=False),
    # Revision 0006: NVML GPM, time-weighted over gpm_seconds of the row.
    *_gpm_columns(),
    *_slot_columns(),  # revision 0009
    # Revision 0014: the agent's GPU-memory GiB-seconds of the row, summed as its job's
    # summary sums them (issue 24). NULL in rows stored before it (or shipped by an older
    # agent): read as mem_used_max_bytes x covered_seconds (queries.interval_totals_for).
    sa.Column("mem_gib_seconds", sa.Double()),
    sa.PrimaryKeyConstraint("node", "slot_id", "period_start"),
)
sa.Index(None, gpu_intervals.c.job_id)
sa.Index(None, gpu_intervals.c.period_start)
sa.Index(None, gpu_intervals.c.gpu_uuid)  # everything on one physical GPU

gpu_intervals_hourly = sa.Table(
    "gpu_intervals_hourly",
    metadata,
    sa.Column("node", sa.String(NODE)),
    sa.Column("gpu_uuid", sa.String(UUID), nullable=False),
    sa.Column("hour_start", sa.Double(), autoincrement=False),
    # 0 = not attributed to a job (Slurm never uses job id 0); keeps the key NOT NULL.
    sa.Column("job_id", sa.BigInteger(), autoincrement=False),
    sa.Column("interval_count", sa.Integer(), nullable=False),
    _time("first_period_start"),
    _time("last_period_end"),
    sa.Column("period_seconds", sa.Double(), nullable=False),
    sa.Column("covered_seconds", sa.Double(), nullable=False),
    sa.Column("active_seconds", sa.Double(), nullable=False),
    # mean util = util_weighted_sum / util_covered_seconds (weighted by covered seconds).
    sa.Column("util_weighted_sum", sa.Double(), nullable=False),
    sa.Column("util_covered_seconds", sa.Double(), nullable=False),
    sa.Column("util_max_percent", sa.Double()),
    sa.Column("util_min_percent", sa.Double()),
    sa.Column("util_sample_count", sa.BigInteger(), nullable=False),
    sa.Column("mem_used_max_bytes", sa.BigInteger()),
    sa.Column("mem_total_bytes", sa.BigInteger()),
    sa.Column("energy_joules", sa.Double()),
    # mean power = power_weighted_sum / power_covered_seconds.
    sa.Column("power_weighted_sum", sa.Double(), nullable=False),
    sa.Column("power_covered_seconds", sa.Double(), nullable=False),
    sa.Column("temperature_max_celsius", sa.Double()),
    sa.Column("ecc_errors_total", sa.BigInteger()),
    # Revision 0006: NVML GPM seconds, and per metric its percent-seconds over the GPM
    # seconds that had it (sums: the rollup folds exactly).
    *_gpm_sums(),
    *_slot_columns(),  # revision 0009
    sa.PrimaryKeyConstraint("node", "slot_id", "hour_start", "job_id"),
)
sa.Index(None, gpu_intervals_hourly.c.hour_start)
sa.Index(None, gpu_intervals_hourly.c.job_id)
sa.Index(None, gpu_intervals_hourly.c.gpu_uuid)

job_gpu_summaries = sa.Table(
    "job_gpu_summaries",
    metadata,
    sa.Column("cluster", sa.String(NAME)),
    sa.Column("job_id", sa.BigInteger(), autoincrement=False),
    sa.Column("node", sa.String(NODE)),
    sa.Column("gpu_uuid", sa.String(UUID), nullable=False),
    sa.Column("gpu_model", sa.String(NAME), nullable=False),
    _time("start"),
    _time("end"),
    sa.Column("gpu_seconds", sa.Double(), nullable=False),
    sa.Column("util_mean_percent", sa.Double()),
    sa.Column("util_max_percent", sa.Double()),
    sa.Column("active_seconds", sa.Double(), nullable=False),
    sa.Column("mem_max_bytes", sa.BigInteger()),
    sa.Column("mem_gib_seconds", sa.Double(), nullable=False),
    sa.Column("energy_joules", sa.Double()),
    sa.Column("reading_count", sa.Integer(), nullable=False),
    sa.Column("missing_seconds", sa.Double(), nullable=False),
    sa.Column("user", sa.String(NAME), nullable=False),
    sa.Column("account", sa.String(NAME), nullable=False),
    sa.Column("partition", sa.String(NAME), nullable=False),
    # One summary per run of a job and GPU (revision 0004; older rows are run 0).
    sa.Column("restart", sa.Integer(), autoincrement=False, nullable=False, server_default="0"),
    *_gpm_columns(),  # revision 0006
    *_slot_columns(),  # revision 0009
    sa.PrimaryKeyConstraint("cluster", "job_id", "node", "slot_id", "restart"),
)
sa.Index(None, job_gpu_summaries.c.end)
sa.Index(None, job_gpu_summaries.c.user)
sa.Index(None, job_gpu_summaries.c.account)

# Revision 0009: each physical GPU's own totals per shipping period, whole or partitioned
# into slots (power, energy, temperature and ECC belong to the GPU, not to a slice).
gpu_physical_intervals = sa.Table(
    "gpu_physical_intervals",
    metadata,
    sa.Column("node", sa.String(NODE), primary_key=True),
    sa.Column("gpu_uuid", sa.String(UUID), primary_key=True),
    sa.Column("period_start", sa.Double(), primary_key=True, autoincrement=False),
    _time("period_end"),
    sa.Column("covered_seconds", sa.Double(), nullable=False),
    sa.Column("power_mean_watts", sa.Double()),
    sa.Column("energy_joules", sa.Double()),
    sa.Column("temperature_max_celsius", sa.Double()),
    sa.Column("ecc_errors_total", sa.BigInteger()),
    sa.Column("mem_used_max_bytes", sa.BigInteger()),
    sa.Column("mem_total_bytes", sa.BigInteger()),
)
sa.Index(None, gpu_physical_intervals.c.period_start)

gpu_inventory = sa.Table(
    "gpu_inventory",
    metadata,
    sa.Column("node", sa.String(NODE), primary_key=True),
    sa.Column("uuid", sa.String(UUID), primary_key=True),
    sa.Column("model", sa.String(NAME), nullable=False),
    sa.Column("minor", sa.Integer(), nullable=False),
    sa.Column("nvml_index", sa.Integer(), nullable=False),
    sa.Column("pci_bus_id", sa.String(64), nullable=False),
    sa.Column("memory_total_bytes", sa.BigInteger()),
    _time("first_seen"),
    _time("last_seen"),
    # Revision 0005: set while the node's agent cannot read the GPU (NVML: lost).
    _time("lost_since", nullable=True),
    sa.Column("lost_reason", sa.String(255)),
    # Revision 0006: NVML GPM (Hopper and newer); false for rows before it.
    sa.Column("gpm_supported", sa.Boolean(), nullable=False, server_default="0"),
)

job_events = sa.Table(
    "job_events",
    metadata,
    sa.Column("cluster", sa.String(NAME), primary_key=True),
    sa.Column("event_key", sa.String(255), primary_key=True),
    sa.Column("node", sa.String(NODE), nullable=False),
    sa.Column("job_id", sa.BigInteger(), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    _time("time"),
    # The whole JobEvent as JSON, so nothing a hook reported is lost.
    sa.Column("payload", sa.Text(), nullable=False),
    sa.Column("restart", sa.Integer(), nullable=False, server_default="0"),  # revision 0004
)
sa.Index(None, job_events.c.job_id)

# ---- revision 0002: what the controller needs --------------------------------------

# The agent's newest knowledge per running job and GPU, replaced every tick.
gpu_activity = sa.Table(
    "gpu_activity",
    metadata,
    sa.Column("cluster", sa.String(NAME)),
    sa.Column("job_id", sa.BigInteger(), autoincrement=False),
    sa.Column("node", sa.String(NODE)),
    sa.Column("gpu_uuid", sa.String(UUID), nullable=False),
    sa.Column("slurm_index", sa.Integer(), nullable=False),
    _time("start"),
    _time("last_reading"),
    _time("last_active", nullable=True),
    sa.Column("util_recent_percent", sa.Double()),
    sa.Column("mem_used_bytes", sa.BigInteger()),
    sa.Column("process_count", sa.Integer()),
    _time("measured_since", nullable=True),  # revision 0005
    # Revision 0006 (GPM): the newest window's SM activity, and the end of the newest
    # window with the SM active at or above the threshold (never goes back).
    sa.Column("sm_active_recent_percent", sa.Double()),
    _time("last_sm_active", nullable=True),
    *_slot_columns(),  # revision 0009
    sa.PrimaryKeyConstraint("cluster", "job_id", "node", "slot_id"),
)

# Revision 0011 (issue 16, "ship less"): each node's newest agent heartbeat, which extends
# its activity rows to `tick` for the slots in `slots` (a JSON list of slot ids; store/
# heartbeats.py). An older heartbeat never replaces a newer one.
node_heartbeats = sa.Table(
    "node_heartbeats",
    metadata,
    sa.Column("cluster", sa.String(NAME), nullable=False),
    sa.Column("node", sa.String(NODE), nullable=False),
    _time("tick"),
    sa.Column("slots", sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint("cluster", "node"),
)

# Every controller decision, dry-run or real, written before it is acted on.
audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    sa.Column("cluster", sa.String(NAME), nullable=False),
    _time("time"),
    sa.Column("cycle", sa.String(64), nullable=False),
    sa.Column("controller", sa.String(NAME), nullable=False),
    sa.Column("dry_run", sa.Boolean(), nullable=False),
    sa.Column("policy", sa.String(32), nullable=False),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("target", sa.String(255), nullable=False),
    sa.Column("job_id", sa.BigInteger()),
    sa.Column("user", sa.String(NAME), nullable=False),
    sa.Column("account", sa.String(NAME), nullable=False),
    sa.Column("node", sa.String(NODE), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("details", sa.Text(), nullable=False),
    sa.Column("outcome", sa.String(255), nullable=False),
)
sa.Index(None, audit_log.c.time)
sa.Index(None, audit_log.c.job_id)

# Admins' exemptions (`slurm-gpu exempt`): a job, user or account, until a time.
exemptions = sa.Table(
    "exemptions",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    sa.Column("cluster", sa.String(NAME), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("target", sa.String(NAME), nullable=False),
    sa.Column("policy", sa.String(32), nullable=False),
    _time("until"),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("created_by", sa.String(NAME), nullable=False),
    _time("created_at"),
)

# Only one controller acts at a time: whoever holds an unexpired lease.
controller_lease = sa.Table(
    "controller_lease",
    metadata,
    sa.Column("name", sa.String(NAME), primary_key=True),
    sa.Column("holder", sa.String(NAME), nullable=False),
    _time("expires_at"),
)

# At most one notification per job and alert kind; per-user rate limiting reads this.
notifications = sa.Table(
    "notifications",
    metadata,
    sa.Column("cluster", sa.String(NAME), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("user", sa.String(NAME), nullable=False),
    _time("time"),
    sa.Column("channels", sa.String(255), nullable=False),
)
sa.Index(None, notifications.c.user, notifications.c.time)

# What the quota policy set through Slurm and must undo later.
quota_actions = sa.Table(
    "quota_actions",
    metadata,
    sa.Column("cluster", sa.String(NAME), primary_key=True),
    sa.Column("scope", sa.String(NAME), primary_key=True),
    sa.Column("action", sa.String(32), primary_key=True),
    sa.Column("target", sa.String(255), primary_key=True),
    _time("applied_at"),
    sa.Column("details", sa.Text(), nullable=False),
)

# What the monthly delivery mailed (revision 0007): each report or statement goes to each
# recipient once per month (`slurm-gpu report monthly --deliver`; --resend sends again).
report_deliveries = sa.Table(
    "report_deliveries",
    metadata,
    sa.Column("cluster", sa.String(NAME), primary_key=True),
    sa.Column("month", sa.String(7), primary_key=True),
    sa.Column("kind", sa.String(32), primary_key=True),
    sa.Column("account", sa.String(NAME), primary_key=True),
    sa.Column("recipient", sa.String(255), primary_key=True),
    _time("time"),
    sa.Column("message_id", sa.String(255), nullable=False),
)

# ---- revision 0010: usage rollups written at ingest (issue 16) ------------------------

# The sums a report figure is made of (reports/rollups.py), per job and place
# (`job_usage`) and per day (`usage_daily`, prorated like the reports: by the part of the
# job inside the day): slurm_gpu/ledger/sums.py defines them, once for every road.
USAGE_SUMS = sums.SUMS
USAGE_COUNTS = sums.COUNTS
# Who is counted (not prorated): a job counts on the last UTC day it has usage in, split
# over its rows so that a group holding all its rows counts it once: `jobs` 1/(its rows),
# for groups by owner; `node_jobs`, `model_jobs`, `slot_jobs` 1/(its rows on that node,
# of that GPU model, in that slot group), for `report node`, `gpu-models`, `slots`.
MEMBER_WEIGHTS = ("jobs", "node_jobs", "model_jobs", "slot_jobs")
# Queue wait (Start - Submit) of the jobs counted, per weight: the weight of the jobs
# whose wait is known, and their waits x weight (the mean is exact) ...
WAIT_SUMS = (
    *(f"{w}_waited" for w in MEMBER_WEIGHTS),
    *(f"{w}_wait_seconds" for w in MEMBER_WEIGHTS),
)
# ... and the known waits' histogram per weight in log2 buckets (the 95th percentile is
# read from it): bucket 0 below 1 s, bucket i in [2^(i-1), 2^i) s, the last one from
# 2^(WAIT_BUCKETS-2) s (97 days) on.
WAIT_BUCKETS = 26
WAIT_HISTOGRAMS = {
    w: tuple(f"{w}_wait_h{i:02d}" for i in range(WAIT_BUCKETS)) for w in MEMBER_WEIGHTS
}
WAIT_HISTOGRAM = tuple(c for w in MEMBER_WEIGHTS for c in WAIT_HISTOGRAMS[w])
# Where the usage was (a job's summaries on one node of one model and slot shape).
USAGE_PLACE = ("node", "gpu_model", "slot_kind", "mig_profile", "share")


def _usage_columns() -> list[sa.Column[Any]]:
    return [
        *(sa.Column(n, sa.Double(), nullable=False, server_default="0") for n in USAGE_SUMS),
        *(sa.Column(n, sa.BigInteger(), nullable=False, server_default="0") for n in USAGE_COUNTS),
    ]


def _member_columns(names: tuple[str, ...]) -> list[sa.Column[Any]]:
    return [sa.Column(n, sa.Double(), nullable=False, server_default="0") for n in names]


def _place_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("node", sa.String(NODE), nullable=False),
        sa.Column("gpu_model", sa.String(NAME), nullable=False),
        sa.Column("slot_kind", sa.String(16), nullable=False),
        sa.Column("mig_profile", sa.String(32), nullable=False),
        sa.Column("share", sa.Double(), nullable=False),
    ]


# One row per job, run and place: the job's summaries there, summed (not prorated), with
# the job facts the reports prorate and group by, as they were when folded.
job_usage = sa.Table(
    "job_usage",
    metadata,
    sa.Column("cluster", sa.String(NAME), nullable=False),
    sa.Column("job_id", sa.BigInteger(), nullable=False, autoincrement=False),
    sa.Column("restart", sa.Integer(), nullable=False, autoincrement=False),
    *_place_columns(),
    sa.Column("user", sa.String(NAME), nullable=False),
    sa.Column("account", sa.String(NAME), nullable=False),
    sa.Column("partition", sa.String(NAME), nullable=False),
    _time("submit_time", nullable=True),
    _time("start_time"),
    _time("end_time"),
    *_usage_columns(),
    *_member_columns(MEMBER_WEIGHTS),
    sa.PrimaryKeyConstraint("cluster", "job_id", "restart", *USAGE_PLACE),
)
# The jobs across a report period's ends (reports/rollups.py `boundary_cells`): found
# in the index, by end then start, without reading the rows of the others (the cluster
# first: SQLite without statistics prefers an index its equality test can use).
sa.Index(None, job_usage.c.cluster, job_usage.c.end_time, job_usage.c.start_time)
sa.Index(None, job_usage.c.start_time)
# The same jobs by start (revision 0012): a job across an end started at most the
# cluster's longest job (`usage_extent`) before it, a range of this index, where the one
# above would also read every job that ended after the period.
sa.Index(None, job_usage.c.cluster, job_usage.c.start_time, job_usage.c.end_time)
# Ingest recomputes a user's days (store/usage_rollup.py `refold`): that user's jobs then.
sa.Index(None, job_usage.c.cluster, job_usage.c.user, job_usage.c.end_time)


def _usage_per(name: str, period: str, *, sums: bool = True) -> sa.Table:
    """A usage rollup per `period` (a day's or month's first UTC midnight), owner and place.

    `sums` False: the job counts only (`usage_across`).
    """
    return sa.Table(
        name,
        metadata,
        sa.Column("cluster", sa.String(NAME), nullable=False),
        sa.Column(period, sa.Double(), nullable=False, autoincrement=False),
        sa.Column("user", sa.String(NAME), nullable=False),
        sa.Column("account", sa.String(NAME), nullable=False),
        sa.Column("partition", sa.String(NAME), nullable=False),
        *_place_columns(),
        *(_usage_columns() if sums else ()),
        *_member_columns((*MEMBER_WEIGHTS, *WAIT_SUMS, *WAIT_HISTOGRAM)),
        sa.PrimaryKeyConstraint("cluster", period, "user", "account", "partition", *USAGE_PLACE),
    )


# Per UTC day, owner and place: the prorated sums of `job_usage` (the days each job
# touches, by the part of the job inside each day).
usage_daily = _usage_per("usage_daily", "day")

# Per UTC month (`month`: its first midnight), owner and place but the node (blank, but
# for a blank GPU model, which the report fills from the node): the sums of that month's
# `usage_daily` rows. A month's report reads it instead of the month's days.
usage_monthly = _usage_per("usage_monthly", "month")

# Per UTC midnight (`day`), owner and place but the node (blank, but for a blank GPU
# model, as `usage_monthly`): the counts of the jobs running across it (revision 0013),
# started before it and counted (on their last day with usage) on it or after. A report
# of whole days to that midnight adds them to its days' counts, so it counts the jobs
# across its end without reading each one (reports/rollups.py; `report node` still
# reads them, and its `node_jobs` columns here are not read).
usage_across = _usage_per("usage_across", "day", sums=False)

# The jobs of `jobs` that have no `job_usage` row (running, no summary yet, no start or
# no end: the reports read them from raw rows), kept by every refold, so that a report
# finds them without testing every job of its period.
usage_unfolded = sa.Table(
    "usage_unfolded",
    metadata,
    sa.Column("cluster", sa.String(NAME), primary_key=True),
    sa.Column("job_id", sa.BigInteger(), primary_key=True, autoincrement=False),
    _time("began", nullable=True),  # start time, else submit time (jobs_in_window's test)
    _time("end_time", nullable=True),
)

# Per cluster, the longest end - start of any `job_usage` row folded (revision 0012):
# raised by every refold, never lowered but by a rebuild, so it bounds how long before a
# report period's end a job across that end can have started.
usage_extent = sa.Table(
    "usage_extent",
    metadata,
    sa.Column("cluster", sa.String(NAME), primary_key=True),
    sa.Column("longest_job_seconds", sa.Double(), nullable=False),
)

ALL_TABLES = (
    jobs,
    job_gpus,
    gpu_intervals,
    gpu_intervals_hourly,
    job_gpu_summaries,
    gpu_physical_intervals,
    gpu_inventory,
    job_events,
    gpu_activity,
    node_heartbeats,
    audit_log,
    exemptions,
    controller_lease,
    notifications,
    quota_actions,
    report_deliveries,
    job_usage,
    usage_daily,
    usage_monthly,
    usage_unfolded,
    usage_extent,
    usage_across,
)
