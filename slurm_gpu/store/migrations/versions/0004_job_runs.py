"""Runs of requeued jobs: a `restart` number in jobs, job_events, job_gpus, job_gpu_summaries.

Slurm keeps the job id of a requeued job and counts its runs (SLURM_RESTART_COUNT; `sacct
-D` lists each run). Each run's GPUs and summaries are now their own rows, so a job's
totals add up over all its runs. Rows written before this revision are run 0, the first
(and, for a job never requeued, the only) run.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEYS = {
    "job_gpus": ("cluster", "job_id", "node", "slurm_index"),
    "job_gpu_summaries": ("cluster", "job_id", "node", "gpu_uuid"),
}


def _restart() -> sa.Column[int]:
    return sa.Column("restart", sa.Integer(), nullable=False, server_default="0")


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("restart", sa.Integer(), nullable=True))
    op.add_column("job_events", _restart())
    for table, key in _KEYS.items():
        # SQLite cannot change a primary key in place: batch mode copies the table there
        # (PostgreSQL and MariaDB alter it).
        with op.batch_alter_table(table, recreate="auto") as batch:
            batch.add_column(_restart())
            batch.drop_constraint(op.f(f"pk_{table}"), type_="primary")
            batch.create_primary_key(op.f(f"pk_{table}"), [*key, "restart"])


def downgrade() -> None:
    """Revert this revision: only run 0 of each job is kept (later runs' rows are deleted)."""
    for table, key in _KEYS.items():
        op.execute(sa.text(f"DELETE FROM {table} WHERE restart <> 0"))
        with op.batch_alter_table(table, recreate="auto") as batch:
            batch.drop_constraint(op.f(f"pk_{table}"), type_="primary")
            batch.create_primary_key(op.f(f"pk_{table}"), list(key))
            batch.drop_column("restart")
    op.drop_column("job_events", "restart")
    op.drop_column("jobs", "restart")
