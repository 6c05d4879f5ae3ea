"""Alembic revisions of the ledger (ledger/store/migrations); Alembic skips this file."""
