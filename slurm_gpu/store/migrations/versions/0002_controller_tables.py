"""Controller tables: activity, audit, exemptions, lease, notifications, quota actions.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 19:38:50.530709
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("cycle", sa.String(length=64), nullable=False),
        sa.Column("controller", sa.String(length=128), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("policy", sa.String(length=32), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("user", sa.String(length=128), nullable=False),
        sa.Column("account", sa.String(length=128), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("details", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_log_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_log_time"), ["time"], unique=False)

    op.create_table(
        "controller_lease",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_controller_lease")),
    )
    op.create_table(
        "exemptions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=128), nullable=False),
        sa.Column("policy", sa.String(length=32), nullable=False),
        sa.Column("until", sa.Double(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_exemptions")),
    )
    op.create_table(
        "gpu_activity",
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("slurm_index", sa.Integer(), nullable=False),
        sa.Column("start", sa.Double(), nullable=False),
        sa.Column("last_reading", sa.Double(), nullable=False),
        sa.Column("last_active", sa.Double(), nullable=True),
        sa.Column("util_recent_percent", sa.Double(), nullable=True),
        sa.Column("mem_used_bytes", sa.BigInteger(), nullable=True),
        sa.Column("process_count", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint(
            "cluster", "job_id", "node", "gpu_uuid", name=op.f("pk_gpu_activity")
        ),
    )
    op.create_table(
        "notifications",
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("channels", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "key", name=op.f("pk_notifications")),
    )
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_notifications_user_time"), ["user", "time"], unique=False
        )

    op.create_table(
        "quota_actions",
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("scope", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("applied_at", sa.Double(), nullable=False),
        sa.Column("details", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint(
            "cluster", "scope", "action", "target", name=op.f("pk_quota_actions")
        ),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("quota_actions")
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_notifications_user_time"))

    op.drop_table("notifications")
    op.drop_table("gpu_activity")
    op.drop_table("exemptions")
    op.drop_table("controller_lease")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_log_time"))
        batch_op.drop_index(batch_op.f("ix_audit_log_job_id"))

    op.drop_table("audit_log")
