"""The longest folded job per cluster (issue 16): `usage_extent`.

A report reads the jobs across its period's ends one by one (their job counts and queue
waits are not in the period's days). Found by end time, that read also passed every job
that ended after the period: a month's report cost grew with the months stored after it.
A job across an end started at most the cluster's longest job before it, so the reports
now read a range of start times (the new `job_usage` index by cluster, start and end).
`usage_extent` keeps that longest job: computed here from the rows already folded, raised
by every refold, recomputed by `slurm-gpu db rebuild-rollups`.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 03:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = 128


def upgrade() -> None:
    """Apply this revision, with the longest job of the rows already folded."""
    op.create_table(
        "usage_extent",
        sa.Column("cluster", sa.String(length=NAME), nullable=False),
        sa.Column("longest_job_seconds", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", name=op.f("pk_usage_extent")),
    )
    op.create_index(
        op.f("ix_job_usage_cluster_start_time_end_time"),
        "job_usage",
        ["cluster", "start_time", "end_time"],
        unique=False,
    )
    op.execute(
        "INSERT INTO usage_extent (cluster, longest_job_seconds)"
        " SELECT cluster, CASE WHEN MAX(end_time - start_time) > 0"
        " THEN MAX(end_time - start_time) ELSE 0 END FROM job_usage GROUP BY cluster"
    )


def downgrade() -> None:
    """Revert this revision (the reports read the jobs across an end by end time again)."""
    op.drop_index(op.f("ix_job_usage_cluster_start_time_end_time"), table_name="job_usage")
    op.drop_table("usage_extent")
