"""GPU-memory GiB-seconds per interval (issue 24): `gpu_intervals.mem_gib_seconds`.

The agent sums each interval's GPU-memory GiB-seconds piece by piece, with the one
function that sums its job summary's (`Piece.mem_gib_seconds`), so a running job's
memory-hours read from its intervals are those its summary says once it lands: they no
longer jump from peak x covered to the summary's figure. NULL in every row stored before
this revision, and in rows an older agent ships: those are read as before, the row's
peak memory (`mem_used_max_bytes`) x its `covered_seconds`.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 13:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision (a nullable column: no row is rewritten)."""
    with op.batch_alter_table("gpu_intervals", schema=None) as batch_op:
        batch_op.add_column(sa.Column("mem_gib_seconds", sa.Double(), nullable=True))


def downgrade() -> None:
    """Revert this revision (the sums are dropped: intervals read as peak x covered)."""
    with op.batch_alter_table("gpu_intervals", schema=None) as batch_op:
        batch_op.drop_column("mem_gib_seconds")
