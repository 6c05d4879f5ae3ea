"""The ledger store: the SQLAlchemy schema and its migrations, batch records, planning under
one in-flight guard, decisions and rebuild inserts, on SQLite or PostgreSQL.

May import `ledger.core`; never the coordinator, an edge or a job.
"""
