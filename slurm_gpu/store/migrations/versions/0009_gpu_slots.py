"""GPU slots (issue 14): what a job holds is a slot, a whole GPU, a MIG slice or a share.

`gpu_intervals`, `gpu_intervals_hourly`, `job_gpu_summaries` and `gpu_activity` gain
`slot_id` (NOT NULL), `slot_kind`, `share`, `mig_profile` and `measured_by`; `slot_id`
replaces `gpu_uuid` in their primary keys, so two jobs sharing one GPU in one period
(two shard slots) are two rows. `gpu_uuid` stays, NOT NULL: the physical GPU, the slot's
parent (indexed in the interval tables: "everything on GPU X" is one filter). `job_gpus`
gains `slot_id`. New table `gpu_physical_intervals` (node, gpu_uuid, period_start): each
physical GPU's own power, energy, temperature, ECC and memory per shipping period.

Every row stored before this revision is a whole GPU: slot_id = gpu_uuid, slot_kind
'gpu', share 1, mig_profile '', measured_by 'nvml'; its keys and every report figure over
it are unchanged (docs/design/gpu-slots.md).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SLOT = 160
# Each table's primary key before and after: slot_id where gpu_uuid was.
_KEYS = {
    "gpu_intervals": ("node", "gpu_uuid", "period_start"),
    "gpu_intervals_hourly": ("node", "gpu_uuid", "hour_start", "job_id"),
    "job_gpu_summaries": ("cluster", "job_id", "node", "gpu_uuid", "restart"),
    "gpu_activity": ("cluster", "job_id", "node", "gpu_uuid"),
}
# The tables whose queries select by the physical GPU.
_PARENT_INDEXED = ("gpu_intervals", "gpu_intervals_hourly")


def _slot_key(key: Sequence[str]) -> list[str]:
    return ["slot_id" if name == "gpu_uuid" else name for name in key]


def _described() -> list[sa.Column[object]]:
    return [
        sa.Column("slot_kind", sa.String(length=16), nullable=False, server_default="gpu"),
        sa.Column("share", sa.Double(), nullable=False, server_default="1"),
        sa.Column("mig_profile", sa.String(length=32), nullable=False, server_default=""),
        sa.Column("measured_by", sa.String(length=16), nullable=False, server_default="nvml"),
    ]


def upgrade() -> None:
    """Apply this revision."""
    for table, key in _KEYS.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("slot_id", sa.String(length=SLOT), nullable=True))
            for column in _described():
                batch_op.add_column(column)
        op.execute(sa.text(f"UPDATE {table} SET slot_id = gpu_uuid"))
        # SQLite cannot change a primary key in place: batch mode copies the table there
        # (PostgreSQL and MariaDB alter it).
        with op.batch_alter_table(table, recreate="auto") as batch_op:
            batch_op.alter_column("slot_id", existing_type=sa.String(length=SLOT), nullable=False)
            batch_op.drop_constraint(op.f(f"pk_{table}"), type_="primary")
            batch_op.create_primary_key(op.f(f"pk_{table}"), _slot_key(key))
            if table in _PARENT_INDEXED:
                batch_op.create_index(op.f(f"ix_{table}_gpu_uuid"), ["gpu_uuid"], unique=False)
    with op.batch_alter_table("job_gpus", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("slot_id", sa.String(length=SLOT), nullable=False, server_default="")
        )
    op.execute(sa.text("UPDATE job_gpus SET slot_id = gpu_uuid"))
    op.create_table(
        "gpu_physical_intervals",
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("period_start", sa.Double(), autoincrement=False, nullable=False),
        sa.Column("period_end", sa.Double(), nullable=False),
        sa.Column("covered_seconds", sa.Double(), nullable=False),
        sa.Column("power_mean_watts", sa.Double(), nullable=True),
        sa.Column("energy_joules", sa.Double(), nullable=True),
        sa.Column("temperature_max_celsius", sa.Double(), nullable=True),
        sa.Column("ecc_errors_total", sa.BigInteger(), nullable=True),
        sa.Column("mem_used_max_bytes", sa.BigInteger(), nullable=True),
        sa.Column("mem_total_bytes", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint(
            "node", "gpu_uuid", "period_start", name=op.f("pk_gpu_physical_intervals")
        ),
    )
    op.create_index(
        op.f("ix_gpu_physical_intervals_period_start"),
        "gpu_physical_intervals",
        ["period_start"],
        unique=False,
    )


def downgrade() -> None:
    """Revert this revision: only whole-GPU rows are kept (slot rows are deleted)."""
    op.drop_index(op.f("ix_gpu_physical_intervals_period_start"), "gpu_physical_intervals")
    op.drop_table("gpu_physical_intervals")
    with op.batch_alter_table("job_gpus", schema=None) as batch_op:
        batch_op.drop_column("slot_id")
    for table, key in reversed(_KEYS.items()):
        op.execute(sa.text(f"DELETE FROM {table} WHERE slot_id <> gpu_uuid"))
        with op.batch_alter_table(table, recreate="auto") as batch_op:
            if table in _PARENT_INDEXED:
                batch_op.drop_index(op.f(f"ix_{table}_gpu_uuid"))
            batch_op.drop_constraint(op.f(f"pk_{table}"), type_="primary")
            batch_op.create_primary_key(op.f(f"pk_{table}"), list(key))
            for name in ("measured_by", "mig_profile", "share", "slot_kind", "slot_id"):
                batch_op.drop_column(name)
