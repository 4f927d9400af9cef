"""Initial schema: every table of the accounting store.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "gpu_intervals",
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("period_start", sa.Double(), autoincrement=False, nullable=False),
        sa.Column("period_end", sa.Double(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("util_mean_percent", sa.Double(), nullable=True),
        sa.Column("util_max_percent", sa.Double(), nullable=True),
        sa.Column("util_min_percent", sa.Double(), nullable=True),
        sa.Column("util_sample_count", sa.Integer(), nullable=False),
        sa.Column("active_seconds", sa.Double(), nullable=False),
        sa.Column("covered_seconds", sa.Double(), nullable=False),
        sa.Column("mem_used_max_bytes", sa.BigInteger(), nullable=True),
        sa.Column("mem_total_bytes", sa.BigInteger(), nullable=True),
        sa.Column("power_mean_watts", sa.Double(), nullable=True),
        sa.Column("energy_joules", sa.Double(), nullable=True),
        sa.Column("temperature_max_celsius", sa.Double(), nullable=True),
        sa.Column("ecc_errors_total", sa.BigInteger(), nullable=True),
        sa.Column("unallocated_pids", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("node", "gpu_uuid", "period_start", name=op.f("pk_gpu_intervals")),
    )
    op.create_index(op.f("ix_gpu_intervals_job_id"), "gpu_intervals", ["job_id"], unique=False)
    op.create_index(
        op.f("ix_gpu_intervals_period_start"), "gpu_intervals", ["period_start"], unique=False
    )

    op.create_table(
        "gpu_intervals_hourly",
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("hour_start", sa.Double(), autoincrement=False, nullable=False),
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("interval_count", sa.Integer(), nullable=False),
        sa.Column("first_period_start", sa.Double(), nullable=False),
        sa.Column("last_period_end", sa.Double(), nullable=False),
        sa.Column("period_seconds", sa.Double(), nullable=False),
        sa.Column("covered_seconds", sa.Double(), nullable=False),
        sa.Column("active_seconds", sa.Double(), nullable=False),
        sa.Column("util_weighted_sum", sa.Double(), nullable=False),
        sa.Column("util_covered_seconds", sa.Double(), nullable=False),
        sa.Column("util_max_percent", sa.Double(), nullable=True),
        sa.Column("util_min_percent", sa.Double(), nullable=True),
        sa.Column("util_sample_count", sa.BigInteger(), nullable=False),
        sa.Column("mem_used_max_bytes", sa.BigInteger(), nullable=True),
        sa.Column("mem_total_bytes", sa.BigInteger(), nullable=True),
        sa.Column("energy_joules", sa.Double(), nullable=True),
        sa.Column("power_weighted_sum", sa.Double(), nullable=False),
        sa.Column("power_covered_seconds", sa.Double(), nullable=False),
        sa.Column("temperature_max_celsius", sa.Double(), nullable=True),
        sa.Column("ecc_errors_total", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint(
            "node", "gpu_uuid", "hour_start", "job_id", name=op.f("pk_gpu_intervals_hourly")
        ),
    )
    op.create_index(
        op.f("ix_gpu_intervals_hourly_hour_start"),
        "gpu_intervals_hourly",
        ["hour_start"],
        unique=False,
    )
    op.create_index(
        op.f("ix_gpu_intervals_hourly_job_id"), "gpu_intervals_hourly", ["job_id"], unique=False
    )

    op.create_table(
        "gpu_inventory",
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("uuid", sa.String(length=96), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("minor", sa.Integer(), nullable=False),
        sa.Column("nvml_index", sa.Integer(), nullable=False),
        sa.Column("pci_bus_id", sa.String(length=64), nullable=False),
        sa.Column("memory_total_bytes", sa.BigInteger(), nullable=True),
        sa.Column("first_seen", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("node", "uuid", name=op.f("pk_gpu_inventory")),
    )
    op.create_table(
        "job_events",
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("event_key", sa.String(length=255), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "event_key", name=op.f("pk_job_events")),
    )
    op.create_index(op.f("ix_job_events_job_id"), "job_events", ["job_id"], unique=False)

    op.create_table(
        "job_gpu_summaries",
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("gpu_model", sa.String(length=128), nullable=False),
        sa.Column("start", sa.Double(), nullable=False),
        sa.Column("end", sa.Double(), nullable=False),
        sa.Column("gpu_seconds", sa.Double(), nullable=False),
        sa.Column("util_mean_percent", sa.Double(), nullable=True),
        sa.Column("util_max_percent", sa.Double(), nullable=True),
        sa.Column("active_seconds", sa.Double(), nullable=False),
        sa.Column("mem_max_bytes", sa.BigInteger(), nullable=True),
        sa.Column("mem_gib_seconds", sa.Double(), nullable=False),
        sa.Column("energy_joules", sa.Double(), nullable=True),
        sa.Column("reading_count", sa.Integer(), nullable=False),
        sa.Column("missing_seconds", sa.Double(), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=False),
        sa.Column("account", sa.String(length=128), nullable=False),
        sa.Column("partition", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint(
            "cluster", "job_id", "node", "gpu_uuid", name=op.f("pk_job_gpu_summaries")
        ),
    )
    op.create_index(
        op.f("ix_job_gpu_summaries_account"), "job_gpu_summaries", ["account"], unique=False
    )
    op.create_index(op.f("ix_job_gpu_summaries_end"), "job_gpu_summaries", ["end"], unique=False)
    op.create_index(op.f("ix_job_gpu_summaries_user"), "job_gpu_summaries", ["user"], unique=False)

    op.create_table(
        "job_gpus",
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("slurm_index", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), server_default="", nullable=False),
        sa.Column("start", sa.Double(), nullable=True),
        sa.Column("end", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint(
            "cluster", "job_id", "node", "slurm_index", name=op.f("pk_job_gpus")
        ),
    )
    op.create_table(
        "jobs",
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("array_job_id", sa.BigInteger(), nullable=True),
        sa.Column("array_task_id", sa.BigInteger(), nullable=True),
        sa.Column("het_job_id", sa.BigInteger(), nullable=True),
        sa.Column("het_job_offset", sa.BigInteger(), nullable=True),
        sa.Column("user", sa.String(length=128), nullable=True),
        sa.Column("uid", sa.BigInteger(), nullable=True),
        sa.Column("account", sa.String(length=128), nullable=True),
        sa.Column("partition", sa.String(length=128), nullable=True),
        sa.Column("job_name", sa.String(length=255), nullable=True),
        sa.Column("state", sa.String(length=32), nullable=True),
        sa.Column("exit_code", sa.BigInteger(), nullable=True),
        sa.Column("submit_time", sa.Double(), nullable=True),
        sa.Column("start_time", sa.Double(), nullable=True),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.Column("nodes", sa.Text(), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("cluster", "job_id", name=op.f("pk_jobs")),
    )
    op.create_index(op.f("ix_jobs_account"), "jobs", ["account"], unique=False)
    op.create_index(op.f("ix_jobs_start_time"), "jobs", ["start_time"], unique=False)
    op.create_index(op.f("ix_jobs_user"), "jobs", ["user"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(op.f("ix_jobs_user"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_start_time"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_account"), table_name="jobs")

    op.drop_table("jobs")
    op.drop_table("job_gpus")
    op.drop_index(op.f("ix_job_gpu_summaries_user"), table_name="job_gpu_summaries")
    op.drop_index(op.f("ix_job_gpu_summaries_end"), table_name="job_gpu_summaries")
    op.drop_index(op.f("ix_job_gpu_summaries_account"), table_name="job_gpu_summaries")

    op.drop_table("job_gpu_summaries")
    op.drop_index(op.f("ix_job_events_job_id"), table_name="job_events")

    op.drop_table("job_events")
    op.drop_table("gpu_inventory")
    op.drop_index(op.f("ix_gpu_intervals_hourly_job_id"), table_name="gpu_intervals_hourly")
    op.drop_index(op.f("ix_gpu_intervals_hourly_hour_start"), table_name="gpu_intervals_hourly")

    op.drop_table("gpu_intervals_hourly")
    op.drop_index(op.f("ix_gpu_intervals_period_start"), table_name="gpu_intervals")
    op.drop_index(op.f("ix_gpu_intervals_job_id"), table_name="gpu_intervals")

    op.drop_table("gpu_intervals")
