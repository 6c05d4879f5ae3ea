"""Alembic revisions of the ledger (ledger/migrations); Alembic skips this file."""
