"""NVML GPM figures (Hopper and newer): SM activity, occupancy, tensor and DRAM bandwidth.

`gpu_intervals` and `job_gpu_summaries`: `gpm_seconds` (the seconds of the row GPM
measured; 0 where the GPU has no GPM or an older agent wrote the row) and the four means
over them, NULL where not measured (unknown is never 0%). `gpu_intervals_hourly`: sums
that fold exactly, as util's do: `gpm_seconds`, and per metric the percent-seconds
`<metric>_weighted_sum` over `<metric>_gpm_seconds` (the GPM seconds with that metric).
`gpu_activity`: the newest GPM window's SM activity and the end of the newest window
with the SM active (NULL: not measured). `gpu_inventory.gpm_supported`: the GPU has GPM.

Rows stored before this revision read back as not measured (0 seconds, NULL means).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 12:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

METRICS = ("sm_active", "sm_occupancy", "tensor_active", "dram_bw")


def _seconds(name: str) -> sa.Column[float]:
    return sa.Column(name, sa.Double(), nullable=False, server_default="0")


def _means() -> list[sa.Column[float]]:
    return [sa.Column(f"{m}_mean_percent", sa.Double(), nullable=True) for m in METRICS]


def upgrade() -> None:
    """Apply this revision."""
    for table in ("gpu_intervals", "job_gpu_summaries"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(_seconds("gpm_seconds"))
            for column in _means():
                batch_op.add_column(column)
    with op.batch_alter_table("gpu_intervals_hourly", schema=None) as batch_op:
        batch_op.add_column(_seconds("gpm_seconds"))
        for m in METRICS:
            batch_op.add_column(_seconds(f"{m}_weighted_sum"))
            batch_op.add_column(_seconds(f"{m}_gpm_seconds"))
    with op.batch_alter_table("gpu_activity", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sm_active_recent_percent", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("last_sm_active", sa.Double(), nullable=True))
    with op.batch_alter_table("gpu_inventory", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("gpm_supported", sa.Boolean(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    """Revert this revision (the GPM figures are dropped)."""
    with op.batch_alter_table("gpu_inventory", schema=None) as batch_op:
        batch_op.drop_column("gpm_supported")
    with op.batch_alter_table("gpu_activity", schema=None) as batch_op:
        batch_op.drop_column("last_sm_active")
        batch_op.drop_column("sm_active_recent_percent")
    with op.batch_alter_table("gpu_intervals_hourly", schema=None) as batch_op:
        for m in reversed(METRICS):
            batch_op.drop_column(f"{m}_gpm_seconds")
            batch_op.drop_column(f"{m}_weighted_sum")
        batch_op.drop_column("gpm_seconds")
    for table in ("job_gpu_summaries", "gpu_intervals"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for m in reversed(METRICS):
                batch_op.drop_column(f"{m}_mean_percent")
            batch_op.drop_column("gpm_seconds")
