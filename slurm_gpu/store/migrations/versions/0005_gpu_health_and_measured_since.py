"""Lost GPUs in the inventory, and where each running job's unbroken readings began.

`gpu_inventory.lost_since` / `lost_reason`: the node agent's word that a GPU stopped
answering NVML (fell off the bus), NULL while it answers; the controller's hot_node policy
reads them. `gpu_activity.measured_since`: the start of the GPU's current unbroken run of
readings, so that idle_gpu never counts time nobody measured as idle.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 09:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("gpu_inventory", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lost_since", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("lost_reason", sa.String(length=255), nullable=True))
    with op.batch_alter_table("gpu_activity", schema=None) as batch_op:
        batch_op.add_column(sa.Column("measured_since", sa.Double(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("gpu_activity", schema=None) as batch_op:
        batch_op.drop_column("measured_since")
    with op.batch_alter_table("gpu_inventory", schema=None) as batch_op:
        batch_op.drop_column("lost_reason")
        batch_op.drop_column("lost_since")
