"""Usage rollups at ingest (issue 16): `job_usage` and `usage_daily`.

`job_usage`: one row per job, run and place (node, GPU model, slot kind, MIG profile,
share), the job's summaries there summed as the reports sum them, with the job's owner
and times, and its count weights. `usage_daily`: per UTC day, owner and place, those sums
prorated by the part of each job inside the day, and the jobs counted on their last day
with their queue waits (weights, sums and a log2 histogram). `usage_monthly`: the same
per UTC month, without the node. `slurm-gpu report` reads them for whole months and days
instead of the raw summaries (slurm_gpu/store/usage_rollup.py).

The rows already stored are folded after the upgrade (`REFOLDS`: migrations/env.py
rebuilds the rollups with the head's fold once the upgrade reaches the head), as
`slurm-gpu db rebuild-rollups` does later.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-10 10:00:00.000000
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The rows stored before this revision are folded after the upgrade (migrations/env.py).
REFOLDS = True

NODE = 128
NAME = 128
GPM_METRICS = ("sm_active", "sm_occupancy", "tensor_active", "dram_bw")
SUMS = (
    "gpu_seconds",
    "active_seconds",
    "missing_seconds",
    "mem_gib_seconds",
    "energy_joules",
    "util_weighted_sum",
    "util_seconds",
    "physical_seconds",
    "gpm_seconds",
    *(f"{m}_{part}" for m in GPM_METRICS for part in ("weighted_sum", "gpm_seconds")),
    "job_hour_seconds",
    "gpu_unused_seconds",
    "mem_unused_gib_seconds",
    "job_hour_unused_seconds",
)
COUNTS = ("energy_rows", "summary_rows")
PLACE = ("node", "gpu_model", "slot_kind", "mig_profile", "share")
# Who is counted, on the last day a job has usage in (schema.py MEMBER_WEIGHTS, WAIT_SUMS,
# WAIT_HISTOGRAM): weights per row, the known waits' weights and sums, a log2 histogram.
WEIGHTS = ("jobs", "node_jobs", "model_jobs", "slot_jobs")
WAITS = (*(f"{w}_waited" for w in WEIGHTS), *(f"{w}_wait_seconds" for w in WEIGHTS))
HISTOGRAM = tuple(f"{w}_wait_h{i:02d}" for w in WEIGHTS for i in range(26))


def _place() -> list[sa.Column[object]]:
    return [
        sa.Column("node", sa.String(length=NODE), nullable=False),
        sa.Column("gpu_model", sa.String(length=NAME), nullable=False),
        sa.Column("slot_kind", sa.String(length=16), nullable=False),
        sa.Column("mig_profile", sa.String(length=32), nullable=False),
        sa.Column("share", sa.Double(), nullable=False),
    ]


def _figures() -> list[sa.Column[Any]]:
    return [
        *(sa.Column(n, sa.Double(), nullable=False, server_default="0") for n in SUMS),
        *(sa.Column(n, sa.BigInteger(), nullable=False, server_default="0") for n in COUNTS),
    ]


def _members(names: tuple[str, ...]) -> list[sa.Column[Any]]:
    return [sa.Column(n, sa.Double(), nullable=False, server_default="0") for n in names]


def upgrade() -> None:
    """Apply this revision, and build the rollups of the rows already stored."""
    op.create_table(
        "job_usage",
        sa.Column("cluster", sa.String(length=NAME), nullable=False),
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("restart", sa.Integer(), autoincrement=False, nullable=False),
        *_place(),
        sa.Column("user", sa.String(length=NAME), nullable=False),
        sa.Column("account", sa.String(length=NAME), nullable=False),
        sa.Column("partition", sa.String(length=NAME), nullable=False),
        sa.Column("submit_time", sa.Double(), nullable=True),
        sa.Column("start_time", sa.Double(), nullable=False),
        sa.Column("end_time", sa.Double(), nullable=False),
        *_figures(),
        *_members(WEIGHTS),
        sa.PrimaryKeyConstraint("cluster", "job_id", "restart", *PLACE, name=op.f("pk_job_usage")),
    )
    op.create_index(
        op.f("ix_job_usage_cluster_end_time_start_time"),
        "job_usage",
        ["cluster", "end_time", "start_time"],
        unique=False,
    )
    op.create_index(op.f("ix_job_usage_start_time"), "job_usage", ["start_time"], unique=False)
    op.create_index(
        op.f("ix_job_usage_cluster_user_end_time"),
        "job_usage",
        ["cluster", "user", "end_time"],
        unique=False,
    )
    op.create_table(
        "usage_daily",
        sa.Column("cluster", sa.String(length=NAME), nullable=False),
        sa.Column("day", sa.Double(), autoincrement=False, nullable=False),
        sa.Column("user", sa.String(length=NAME), nullable=False),
        sa.Column("account", sa.String(length=NAME), nullable=False),
        sa.Column("partition", sa.String(length=NAME), nullable=False),
        *_place(),
        *_figures(),
        *_members((*WEIGHTS, *WAITS, *HISTOGRAM)),
        sa.PrimaryKeyConstraint(
            "cluster", "day", "user", "account", "partition", *PLACE, name=op.f("pk_usage_daily")
        ),
    )
    op.create_table(
        "usage_monthly",
        sa.Column("cluster", sa.String(length=NAME), nullable=False),
        sa.Column("month", sa.Double(), autoincrement=False, nullable=False),
        sa.Column("user", sa.String(length=NAME), nullable=False),
        sa.Column("account", sa.String(length=NAME), nullable=False),
        sa.Column("partition", sa.String(length=NAME), nullable=False),
        *_place(),
        *_figures(),
        *_members((*WEIGHTS, *WAITS, *HISTOGRAM)),
        sa.PrimaryKeyConstraint(
            "cluster",
            "month",
            "user",
            "account",
            "partition",
            *PLACE,
            name=op.f("pk_usage_monthly"),
        ),
    )
    op.create_table(
        "usage_unfolded",
        sa.Column("cluster", sa.String(length=NAME), nullable=False),
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("began", sa.Double(), nullable=True),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("cluster", "job_id", name=op.f("pk_usage_unfolded")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("usage_unfolded")
    op.drop_table("usage_monthly")
    op.drop_table("usage_daily")
    op.drop_index(op.f("ix_job_usage_cluster_user_end_time"), "job_usage")
    op.drop_index(op.f("ix_job_usage_start_time"), "job_usage")
    op.drop_index(op.f("ix_job_usage_cluster_end_time_start_time"), "job_usage")
    op.drop_table("job_usage")
