"""Schema version 4: the operator actions journal (ledger/core/actions.py): recoveries
asked for and derived outputs rebuilt, with who, why and what came of them.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """A new table only: every existing row stays as it is."""
    op.create_table(
        "exactly_actions",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(32), nullable=False, unique=True),
        sa.Column("pipeline", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("decided_by", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
    )
    op.create_index("ix_exactly_actions_pipeline", "exactly_actions", ["pipeline"])
    op.execute("UPDATE exactly_meta SET value = '4' WHERE key = 'schema_version'")
