"""The ledger's schema migrations, as Alembic revisions (versions/), run by ledger/store/schema.py
`ensure_schema` in the transaction that opens a ledger.

Revision `000N` is the ledger's schema version N (`exactly_meta.schema_version`, which every
revision still writes: an older exactly reads only that, and must keep refusing a ledger
newer than it). A ledger from before Alembic has no version table; it is stamped at the
revision of its schema version, then upgraded. The revisions spell out each version's
layout instead of importing ledger/store/schema.py's tables, which only ever describe the newest.
"""
