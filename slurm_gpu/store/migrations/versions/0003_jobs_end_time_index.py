"""Index jobs.end_time: the reports' period selection (end_time >= since).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 20:45:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_index(op.f("ix_jobs_end_time"), "jobs", ["end_time"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(op.f("ix_jobs_end_time"), table_name="jobs")
