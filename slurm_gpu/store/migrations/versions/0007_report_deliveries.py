"""What the monthly delivery mailed: `report_deliveries`.

One row per month, kind ("report": the whole report to an admin; "statement": one
account's statement to one of its coordinators), account ("" for the report) and
recipient address, with when it went out and its Message-ID. `slurm-gpu report monthly
--deliver` sends nothing a row already records (unless --resend).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 13:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "report_deliveries",
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("month", sa.String(length=7), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("account", sa.String(length=128), nullable=False),
        sa.Column("recipient", sa.String(length=255), nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("message_id", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint(
            "cluster", "month", "kind", "account", "recipient", name=op.f("pk_report_deliveries")
        ),
    )


def downgrade() -> None:
    """Revert this revision (the record of what went out is dropped)."""
    op.drop_table("report_deliveries")
