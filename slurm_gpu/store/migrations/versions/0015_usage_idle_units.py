"""Idle cost under every [cost] unit from the rollups (issue 24): two idle-unit sums.

A GPU row's idle cost is its held charge x its measured idle share. Under [cost] unit
gpu_hour that is the price x the row's idle seconds, which the rollups already sum; under
gpu_mem_hour and job_hour it needs the part of the row's GiB-seconds and of its share of
the job's elapsed time spent idle (slurm_gpu/ledger/sums.py `mem_idle_gib_seconds`,
`job_hour_idle_seconds`). With them every sums row prices its idle time by the ledger's
one rule (`ledger.pricing.charge`), whichever road the row came by, so the monthly
report and the statements read the rollups under every unit.

The new columns of `job_usage`, `usage_daily` and `usage_monthly` are filled by the
refold that follows the upgrade (store/migrations/env.py: `REFOLDS`).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 16:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The rollups are rebuilt after the upgrade, by the code of the revision it ends at.
REFOLDS = True

TABLES = ("job_usage", "usage_daily", "usage_monthly")
COLUMNS = ("mem_idle_gib_seconds", "job_hour_idle_seconds")


def upgrade() -> None:
    """Apply this revision (the columns at 0 until the refold)."""
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
