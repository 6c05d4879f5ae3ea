"""Schema version 3: a voted file's target holds `derived:<name>` (a derived output's,
name up to 128 characters), so the column grows from 16 to 255 characters.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """PostgreSQL enforces the length; SQLite keeps whatever it is given, so a table copy
    (Alembic's batch mode, on a table holding every voted file) would buy nothing there."""
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column(
            "exactly_files",
            "target",
            type_=sa.String(255),
            existing_type=sa.String(16),
            existing_nullable=False,
        )
    op.execute("UPDATE exactly_meta SET value = '3' WHERE key = 'schema_version'")
