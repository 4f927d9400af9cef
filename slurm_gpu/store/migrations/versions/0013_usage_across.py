"""The jobs running across each UTC midnight (issue 16): `usage_across`.

A report of whole days counts each folded job on its last day with usage (`usage_daily`);
the jobs across its end have their last day after it, so the report read each of them
from `job_usage`: at the end of a month, every job running then. Their counts (weights,
queue waits, wait histogram) are now kept per midnight, owner and place but the node (as
`usage_monthly`): the report adds those of its end instead (`report node` still reads
the jobs). Filled for the rows already folded by the refold after the upgrade
(`REFOLDS`, migrations/env.py), kept by every refold, recomputed by `slurm-gpu db
rebuild-rollups`.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 07:00:00.000000
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The rows stored before this revision are folded after the upgrade (migrations/env.py).
REFOLDS = True

NODE = 128
NAME = 128
PLACE = ("node", "gpu_model", "slot_kind", "mig_profile", "share")
WEIGHTS = ("jobs", "node_jobs", "model_jobs", "slot_jobs")
WAITS = (*(f"{w}_waited" for w in WEIGHTS), *(f"{w}_wait_seconds" for w in WEIGHTS))
HISTOGRAM = tuple(f"{w}_wait_h{i:02d}" for w in WEIGHTS for i in range(26))


def _counts() -> list[sa.Column[Any]]:
    return [
        sa.Column(n, sa.Double(), nullable=False, server_default="0")
        for n in (*WEIGHTS, *WAITS, *HISTOGRAM)
    ]


def upgrade() -> None:
    """Apply this revision, with the counts of the jobs already folded."""
    op.create_table(
        "usage_across",
        sa.Column("cluster", sa.String(length=NAME), nullable=False),
        sa.Column("day", sa.Double(), autoincrement=False, nullable=False),
        sa.Column("user", sa.String(length=NAME), nullable=False),
        sa.Column("account", sa.String(length=NAME), nullable=False),
        sa.Column("partition", sa.String(length=NAME), nullable=False),
        sa.Column("node", sa.String(length=NODE), nullable=False),
        sa.Column("gpu_model", sa.String(length=NAME), nullable=False),
        sa.Column("slot_kind", sa.String(length=16), nullable=False),
        sa.Column("mig_profile", sa.String(length=32), nullable=False),
        sa.Column("share", sa.Double(), nullable=False),
        *_counts(),
        sa.PrimaryKeyConstraint(
            "cluster", "day", "user", "account", "partition", *PLACE, name=op.f("pk_usage_across")
        ),
    )


def downgrade() -> None:
    """Revert this revision (the reports read the jobs across an end one by one again)."""
    op.drop_table("usage_across")
