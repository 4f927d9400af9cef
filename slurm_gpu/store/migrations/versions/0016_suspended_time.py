"""Suspended time, a category of its own (issue 25 item 2): jobs and rollups.

`jobs.suspended_seconds` is how long Slurm had the job suspended (sacct's Suspended:
`scontrol suspend`, preemption or gang scheduling in SUSPEND mode). The ledger takes it
out of the job's held GPU time, idle time first (slurm_gpu/ledger/time.py), as Slurm
takes it out of Elapsed; the rollups sum it (`suspended_seconds`) and its job-hour part
(`job_hour_suspended_seconds`, [cost] charge_suspended under unit job_hour).

The new rollup columns are filled by the refold that follows the upgrade
(store/migrations/env.py: `REFOLDS`); no job stored before knows a suspension (NULL).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 03:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The rollups are rebuilt after the upgrade, by the code of the revision it ends at.
REFOLDS = True

TABLES = ("job_usage", "usage_daily", "usage_monthly")
COLUMNS = ("suspended_seconds", "job_hour_suspended_seconds")


def upgrade() -> None:
    """Apply this revision (the rollup columns at 0 until the refold)."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("suspended_seconds", sa.Double(), nullable=True))
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name in COLUMNS:
                batch_op.add_column(
                    sa.Column(name, sa.Double(), nullable=False, server_default="0")
                )


def downgrade() -> None:
    """Revert this revision."""
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name in COLUMNS:
                batch_op.drop_column(name)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("suspended_seconds")
