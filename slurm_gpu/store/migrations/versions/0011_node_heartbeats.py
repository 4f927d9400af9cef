"""Node heartbeats (issue 16, "ship less"): `node_heartbeats`.

The agent ships a job's GPU activity row only when it changed (or every `[node]
activity_refresh`), and one heartbeat per tick: alive at `tick`, these slots read.
`node_heartbeats` keeps each node's newest; `Store.activity` extends the node's activity
rows to it (slurm_gpu/store/heartbeats.py). Empty after the upgrade: until a node's agent
ships heartbeats, its rows are read as they were stored, as before this revision.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-12 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NODE = 128
NAME = 128


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "node_heartbeats",
        sa.Column("cluster", sa.String(length=NAME), nullable=False),
        sa.Column("node", sa.String(length=NODE), nullable=False),
        sa.Column("tick", sa.Double(), nullable=False),
        sa.Column("slots", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "node", name=op.f("pk_node_heartbeats")),
    )


def downgrade() -> None:
    """Revert this revision (the heartbeats are dropped: rows read as stored)."""
    op.drop_table("node_heartbeats")
