"""Schema version 2: topic ids on ranges, the decisions a batch was planned on, and the
operator decisions table (invariants 10, 15).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """New columns are NULL in existing rows: a range's topic id is then unknown, adopted
    on the next plan and recorded as a decision (ledger/core/protocol.py check_topic_identity)."""
    op.add_column("exactly_ranges", sa.Column("topic_id", sa.String(64)))
    op.add_column("exactly_batches", sa.Column("decisions", sa.JSON))
    op.create_table(
        "exactly_decisions",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(32), nullable=False, unique=True),
        sa.Column("pipeline", sa.String(255), nullable=False),
        sa.Column("app_id", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("topic_id", sa.String(64)),
        sa.Column("previous_topic_id", sa.String(64)),
        sa.Column("after_batch_id", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("decided_by", sa.String(255), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("forced", sa.Boolean, nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
    )
    op.create_index("ix_exactly_decisions_app_id", "exactly_decisions", ["app_id"])
    op.execute("UPDATE exactly_meta SET value = '2' WHERE key = 'schema_version'")
