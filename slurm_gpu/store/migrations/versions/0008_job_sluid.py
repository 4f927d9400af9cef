"""Slurm's SLUID of a job (25.11+): `jobs.sluid`.

The hooks record SLURM_JOB_SLUID ("s" and 13 base-32 characters) with the job's events;
`slurm-gpu sacct --json` and `slurm-gpu job` show it. NULL for a job of a Slurm without
SLUIDs and for every row stored before this revision.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sluid", sa.String(length=32), nullable=True))


def downgrade() -> None:
    """Revert this revision (the SLUIDs are dropped)."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("sluid")
