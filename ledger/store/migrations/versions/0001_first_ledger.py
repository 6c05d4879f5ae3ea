"""Schema version 1: the ledger of the first exactly (batches, their ranges and files).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the version-1 tables, and record version 1 where older exactly reads it."""
    meta = op.create_table(
        "exactly_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False),
    )
    op.create_table(
        "exactly_batches",
        sa.Column("app_id", sa.String(255), primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("pipeline", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("token", sa.String(32), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("prepared_at", sa.DateTime(timezone=True)),
        sa.Column("committed_at", sa.DateTime(timezone=True)),
        sa.Column("table_version", sa.BigInteger),
        sa.Column("error", sa.Text),
        sa.Column("schemas", sa.JSON),
        sa.Column("metrics", sa.JSON),
        sa.Column("params", sa.JSON),
    )
    op.create_index("ix_exactly_batches_pipeline", "exactly_batches", ["pipeline"])
    op.create_table(
        "exactly_ranges",
        sa.Column("app_id", sa.String(255), primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("topic", sa.String(255), primary_key=True),
        sa.Column("partition", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("start_offset", sa.BigInteger, nullable=False),
        sa.Column("end_offset", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(
            ["app_id", "batch_id"], ["exactly_batches.app_id", "exactly_batches.batch_id"]
        ),
    )
    op.create_table(
        "exactly_files",
        sa.Column("app_id", sa.String(255), primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("target", sa.String(16), primary_key=True),
        sa.Column("path", sa.String(1024), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("records", sa.BigInteger, nullable=False),
        sa.Column("modification_time", sa.BigInteger, nullable=False),
        sa.Column("stats", sa.Text, nullable=False),
        sa.ForeignKeyConstraint(
            ["app_id", "batch_id"], ["exactly_batches.app_id", "exactly_batches.batch_id"]
        ),
    )
    op.bulk_insert(meta, [{"key": "schema_version", "value": "1"}])
