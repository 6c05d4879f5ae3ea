"""Spark: sessions (local, standalone, Spark Connect), the shared Connect server, the
standalone cluster launcher, and the progress of a running stage.

An edge: may import `ledger.core` and the other edges it configures (object storage, JVM).
"""
